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

/// Runs `n` passes of a periodic job at once, as `n` replicas would, round after round until
/// a round does nothing; the units of work all passes reported, to compare with what there
/// was (more: a unit was done twice).
pub async fn passes_at_once<E: std::fmt::Debug, F: Future<Output = Result<u64, E>>>(
    n: usize, pass: impl Fn() -> F,
) -> u64 {
    let mut done = 0;
    loop {
        let round: u64 = futures::future::join_all((0..n).map(|_| pass()))
            .await
            .into_iter()
            .map(|units| units.expect("a pass"))
            .sum();
        if round == 0 {
            return done;
        }
        done += round;
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

/// Statements of `pool`'s database waiting for a lock now.
pub async fn lock_waiters(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_one(pool)
    .await
    .expect("pg_stat_activity")
}

/// Waits until `n` statements of `pool`'s database wait for a lock.
pub async fn lock_waiters_reach(pool: &sqlx::PgPool, n: i64) {
    eventually(Duration::from_secs(10), || async {
        match lock_waiters(pool).await {
            waiting if waiting == n => Ok(()),
            waiting => Err(waiting),
        }
    })
    .await;
}
