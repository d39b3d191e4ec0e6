//! A public HTTP/1.1 listener: the router served on each connection, with the client's
//! address (`ConnectInfo`), a deadline for each request's head, and a graceful stop.

use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// How long a client has to send a request's head (line and header fields), from the
/// connection's start or the last answer: a client trickling bytes (slowloris) is let go.
pub const HEADER_READ: Duration = Duration::from_secs(30);

/// Serves `app` on `listener` until `stop`, then lets the requests in flight finish.
pub async fn serve(
    listener: TcpListener, app: Router, header_read: Duration, stop: CancellationToken,
) {
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_read);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, say: wait a moment rather than spin.
                    tracing::warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        let app = app.clone();
        let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(peer));
            app.clone().oneshot(req.map(axum::body::Body::new))
        });
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, %peer, "HTTP connection ended");
            }
        });
    }
    graceful.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_client_trickling_its_request_head_is_let_go_and_others_are_served() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route(
            "/ip",
            axum::routing::get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move {
                peer.ip().to_string()
            }),
        );
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(
            listener,
            app,
            Duration::from_millis(500),
            stop.clone(),
        ));
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /ip HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let mut fast = tokio::net::TcpStream::connect(addr).await.unwrap();
        fast.write_all(b"GET /ip HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        fast.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("127.0.0.1"), "{answer}");
        // The slow one is closed (a 408, then the end) within its deadline, not held.
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "the trickling client is still held");
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("stops")
            .unwrap();
    }
}
