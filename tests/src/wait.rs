//! Waiting: for what a test expects, within a deadline, and for work run to completion on
//! a runtime of its own.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `probe` every 50 ms until it answers `Ok`, and fails the test with the last `Err`
/// (what it saw instead) once `within` has passed.
pub async fn eventually<T, E: std::fmt::Debug, F: Future<Output = Result<T, E>>>(
    within: Duration, mut probe: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        match probe().await {
            Ok(done) => return done,
            Err(seen) => assert!(Instant::now() < deadline, "not within {within:?}: {seen:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `work` to completion on a runtime of its own (for cleanup in `Drop`, or setup in a
/// plain function); none if it panicked.
pub(crate) fn on_a_fresh_runtime<T: Send + 'static, F: Future<Output = T>>(
    work: impl FnOnce() -> F + Send + 'static,
) -> Option<T> {
    let cleanup = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()
            .map(|rt| rt.block_on(work()))
    });
    cleanup.join().ok().flatten()
}
