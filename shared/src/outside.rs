//! HTTP to outside systems (Stripe, SES, Cloudflare): one way to build a client and to
//! exchange a request, so each client keeps only its own paths, signing and error shapes.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use reqwest::header::HeaderMap;
use reqwest::StatusCode;

/// A client with the kit's TLS, `timeout` for each call, and `user_agent`.
pub fn http_client(user_agent: &str, timeout: Duration) -> anyhow::Result<reqwest::Client> {
    crate::tls::install_provider();
    Ok(reqwest::Client::builder()
        .timeout(timeout)
        .user_agent(user_agent)
        .build()?)
}

/// An outside system's answer.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// Empty when a successful answer's body could not be read.
    pub body: Bytes,
}

/// The largest answer read from Stripe, SES or Cloudflare; a longer one is an error.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;

/// Reads at most `cap` bytes of `res`'s body, and whether more was left unread (never
/// read: the connection is dropped with it).
pub async fn read_capped(
    mut res: reqwest::Response, cap: usize,
) -> Result<(Bytes, bool), reqwest::Error> {
    let mut body = BytesMut::with_capacity(cap.min(16 * 1024));
    while let Some(chunk) = res.chunk().await? {
        let room = cap - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body.freeze(), true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body.freeze(), false))
}

/// Sends `req` and reads the answer (up to [`MAX_ANSWER_BYTES`]); the error is why no
/// answer came (unreachable, timed out, cut off, too long), which callers treat as
/// "unavailable, try again later".
pub async fn exchange(req: reqwest::RequestBuilder) -> Result<Reply, String> {
    let res = req.send().await.map_err(|e| e.to_string())?;
    let (status, headers) = (res.status(), res.headers().clone());
    let body = match read_capped(res, MAX_ANSWER_BYTES).await {
        Ok((body, false)) => body,
        // The work is done on their side: a 2xx is never turned into a retry.
        Ok(_) | Err(_) if status.is_success() => Bytes::new(),
        Ok(_) => return Err(format!("an answer over {MAX_ANSWER_BYTES} bytes")),
        Err(e) => return Err(e.to_string()),
    };
    Ok(Reply {
        status,
        headers,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serves `body_len` bytes (`None`: an endless body) with `status` on a local port.
    async fn serve(status: u16, body_len: Option<usize>) -> String {
        use axum::body::Body;
        let app = axum::Router::new().fallback(move || async move {
            let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
            let body = match body_len {
                Some(len) => Body::from(vec![b'x'; len]),
                None => Body::from_stream(futures::stream::repeat_with(move || {
                    Ok::<_, std::convert::Infallible>(chunk.clone())
                })),
            };
            (StatusCode::from_u16(status).unwrap(), body)
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}/")
    }

    #[tokio::test]
    async fn answers_are_read_up_to_their_cap() {
        let client = http_client("test", Duration::from_secs(5)).unwrap();
        let endless = serve(500, None).await;
        let res = client.get(&endless).send().await.unwrap();
        let (body, longer) = read_capped(res, 4096).await.unwrap();
        assert_eq!((body.len(), longer), (4096, true));
        let short = serve(200, Some(10)).await;
        let res = client.get(&short).send().await.unwrap();
        let (body, longer) = read_capped(res, 4096).await.unwrap();
        assert_eq!((body.len(), longer), (10, false));
        // An outside API's endless error answer is an error, not a 5 s read.
        let err = exchange(client.get(&endless))
            .await
            .err()
            .expect("too long");
        assert!(err.contains("over"), "{err}");
        // A 2xx stands whatever its body.
        let ok = exchange(client.get(serve(200, None).await)).await.unwrap();
        assert!(ok.status.is_success());
    }
}
