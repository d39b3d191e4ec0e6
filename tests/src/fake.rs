//! What every fake of an outside system shares: where it listens and its books.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

/// A fake of an outside system: where it listens and its books. Cloning shares the books.
pub struct Fake<B> {
    /// `http://127.0.0.1:<port>` and the API's root path: what a client is pointed at.
    pub base: String,
    books: Arc<Mutex<B>>,
}

impl<B> Clone for Fake<B> {
    fn clone(&self) -> Self {
        Self {
            base: self.base.clone(),
            books: self.books.clone(),
        }
    }
}

impl<B: Default + Send + 'static> Fake<B> {
    /// Serves the router `app` builds (given the fake, for its state) on a free local port;
    /// `root` is the API's path under the port (empty for the host's root).
    pub(crate) async fn serve(root: &str, app: impl FnOnce(Self) -> axum::Router) -> Self {
        let fake = Self {
            base: String::new(),
            books: Arc::default(),
        };
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .expect("a local port");
        let addr = listener.local_addr().expect("address");
        let app = app(fake.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serves") });
        Self {
            base: format!("http://{addr}{root}"),
            ..fake
        }
    }

    /// The books, locked.
    pub(crate) fn books(&self) -> MutexGuard<'_, B> {
        self.books.lock().expect("books")
    }
}
