//! A public HTTP/1.1 listener: the router served on each connection, with the client's
//! address (`ConnectInfo`), deadlines for each request's head and body, a bound on open
//! connections, and a graceful stop.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::{BoxError, Router};
use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// What a public listener allows its clients.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// How long a client has to send a request's head (line and header fields), from the
    /// connection's start or the last answer: a client trickling bytes (slowloris) is let go.
    pub header_read: Duration,
    /// How long a request's body may take to arrive whole, from its head.
    pub body_read: Duration,
    /// Connections open at once; beyond, new ones wait in the kernel's backlog.
    pub connections: usize,
}

impl Default for Limits {
    /// 30 s for a head, 120 s for a body (the largest, 48 MiB, at 400 KB/s), 10,000
    /// connections.
    fn default() -> Self {
        Self {
            header_read: Duration::from_secs(30),
            body_read: Duration::from_secs(120),
            connections: 10_000,
        }
    }
}

/// The largest request head (line and header fields); a larger one is answered 431.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Serves `app` on `listener` until `stop`, then closes the listener and lets the requests
/// in flight finish.
pub async fn serve(listener: TcpListener, app: Router, limits: Limits, stop: CancellationToken) {
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read)
        .max_buf_size(MAX_HEAD_BYTES);
    let open = Arc::new(Semaphore::new(limits.connections));
    loop {
        let accepted = tokio::select! {
            accepted = async {
                let permit = open.clone().acquire_owned().await.expect("never closed");
                (permit, listener.accept().await)
            } => accepted,
            () = stop.cancelled() => break,
        };
        let (permit, (stream, peer)) = match accepted {
            (permit, Ok(accepted)) => (permit, accepted),
            (_, Err(e)) if connection_error(&e) => continue,
            (_, Err(e)) => {
                // Out of file descriptors, say: wait rather than spin.
                tracing::warn!(error = %e, "accepting a connection");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let app = app.clone();
        let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(peer));
            let req = req.map(|body| axum::body::Body::new(Deadline::new(body, limits.body_read)));
            app.clone().oneshot(req)
        });
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, %peer, "HTTP connection ended");
            }
            drop(permit);
        });
    }
    // No more connections are taken while the others drain: new ones are refused at once.
    drop(listener);
    graceful.shutdown().await;
}

/// An error of one connection, not of the listener.
fn connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    )
}

/// A request body that must arrive whole by a deadline; after it, reading fails.
struct Deadline {
    body: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl Deadline {
    fn new(body: Incoming, within: Duration) -> Self {
        Self {
            body,
            deadline: Box::pin(tokio::time::sleep(within)),
        }
    }
}

impl Body for Deadline {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>, cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err("the request body did not arrive in time".into())));
        }
        Pin::new(&mut self.body).poll_frame(cx).map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// A server of `/ip` (the client's address), `/echo` (the body) and `/slow` (an answer
    /// after a second) on a free port, with `limits`.
    async fn server(
        limits: Limits,
    ) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new()
            .route(
                "/ip",
                axum::routing::get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move {
                    peer.ip().to_string()
                }),
            )
            .route(
                "/echo",
                axum::routing::post(|body: Bytes| async move { body }),
            )
            .route(
                "/slow",
                axum::routing::get(|| async {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    "done"
                }),
            );
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(listener, app, limits, stop.clone()));
        (addr, stop, server)
    }

    /// Short deadlines, for tests.
    fn short() -> Limits {
        Limits {
            header_read: Duration::from_millis(500),
            body_read: Duration::from_millis(500),
            connections: 100,
        }
    }

    /// Sends `request` on a new connection and reads until the server closes it.
    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    /// Reads what `stream` gets until the server closes it: `None` if it is still held
    /// after five seconds.
    async fn closed_within(stream: &mut TcpStream) -> Option<Vec<u8>> {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest));
        read.await.ok().map(|_| rest)
    }

    #[tokio::test]
    async fn a_client_trickling_its_request_head_is_let_go_and_others_are_served() {
        let (addr, stop, server) = server(short()).await;
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /ip HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let answer = exchange(
            addr,
            b"GET /ip HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("127.0.0.1"), "{answer}");
        // The slow one is closed (a 408, then the end) within its deadline, not held.
        assert!(
            closed_within(&mut slow).await.is_some(),
            "the trickling client is still held"
        );
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("stops")
            .unwrap();
    }

    #[tokio::test]
    async fn a_body_that_never_arrives_whole_is_let_go_and_a_whole_one_is_read() {
        let (addr, stop, _server) = server(short()).await;
        let answer = exchange(
            addr,
            b"POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello",
        )
        .await;
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello"),
            "{answer}"
        );
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nhe")
            .await
            .unwrap();
        let rest = closed_within(&mut slow)
            .await
            .expect("the slow body is still held");
        let rest = String::from_utf8_lossy(&rest);
        assert!(rest.starts_with("HTTP/1.1 4"), "{rest}");
        stop.cancel();
    }

    #[tokio::test]
    async fn connections_beyond_the_bound_wait_for_one_to_close() {
        let (addr, stop, _server) = server(Limits {
            connections: 1,
            ..short()
        })
        .await;
        let mut first = TcpStream::connect(addr).await.unwrap();
        first
            .write_all(b"GET /ip HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut head = [0; 12];
        first.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        // The first is open (kept alive): the second is not served until it closes.
        let second = tokio::spawn(exchange(
            addr,
            b"GET /ip HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        ));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!second.is_finished(), "a second connection was served");
        drop(first);
        let answer = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .expect("served once the first closed")
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        stop.cancel();
    }

    #[tokio::test]
    async fn a_stopping_server_refuses_new_connections_while_the_last_answers_finish() {
        let (addr, stop, server) = server(short()).await;
        let in_flight = tokio::spawn(exchange(
            addr,
            b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.cancel();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "a new connection was taken in"
        );
        let answer = in_flight.await.unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("done"),
            "{answer}"
        );
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("stops")
            .unwrap();
    }
}
