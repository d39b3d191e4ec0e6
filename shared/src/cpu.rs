//! CPU-heavy work on outside input (parsing and rendering mail, rewriting links, reading
//! imports) runs off the async workers, on a pool of threads of the kernel's idle class
//! (`SCHED_IDLE`): a large input then neither holds up the requests that share its worker
//! nor, when the cores are busy, takes CPU from work that needs little of it — a request
//! thread that wakes takes the core from a pool thread at once, instead of waiting out its
//! time slice as it must behind a merely `nice` thread. Async work with heavy steps of its
//! own (a claim-checked body's digest) runs on a runtime of the same class.

use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc, Mutex, OnceLock};

use tokio::runtime::{Builder, Handle};
use tokio::sync::{oneshot, Semaphore};

/// Inputs smaller than this (bytes) are handled where they are: handing them over would
/// cost more than it spares.
pub const INLINE_BYTES: usize = 64 * 1024;
/// How much lower than the service's other threads the pool runs (a `nice` increment) where
/// the idle class is refused.
const NICENESS: i32 = 10;
/// Each pool thread's stack: the parsers are bounded well within it.
const STACK_BYTES: usize = 8 << 20;
/// Jobs waiting or running per pool thread; callers beyond wait their turn.
const QUEUED_PER_THREAD: usize = 16;

type Job = Box<dyn FnOnce() + Send>;

/// The pool: its job queue and the slots bounding it.
struct Pool {
    jobs: mpsc::Sender<Job>,
    slots: Semaphore,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..threads {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("cpu-{i}"))
                .stack_size(STACK_BYTES)
                .spawn(move || {
                    lower_priority();
                    // The lock is held while waiting for a job, not while running one.
                    while let Ok(job) = queue
                        .lock()
                        .map_err(drop)
                        .and_then(|q| q.recv().map_err(drop))
                    {
                        job();
                    }
                })
                .expect("a CPU pool thread starts");
        }
        Pool {
            jobs,
            slots: Semaphore::new(threads * QUEUED_PER_THREAD),
        }
    })
}

/// Moves the calling thread to the idle scheduling class (Linux keeps one per thread), or
/// lowers its priority by [`NICENESS`] where that is refused.
#[cfg(target_os = "linux")]
fn lower_priority() {
    // SAFETY: gettid, sched_setscheduler, getpriority and setpriority only read and change
    // this thread's scheduling values; a refusal leaves them as they were, which is
    // harmless.
    unsafe {
        let tid = libc::gettid();
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(tid, libc::SCHED_IDLE, &param) == 0 {
            return;
        }
        let tid = tid as libc::id_t;
        let now = libc::getpriority(libc::PRIO_PROCESS, tid);
        libc::setpriority(libc::PRIO_PROCESS, tid, now + NICENESS);
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() {}

/// Runs `work` on the pool and waits for it; a panic in it resumes in the caller.
pub async fn run<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    let pool = pool();
    let _slot = pool
        .slots
        .acquire()
        .await
        .expect("the pool's slots stay open");
    let (tx, rx) = oneshot::channel();
    let job: Job = Box::new(move || drop(tx.send(catch_unwind(AssertUnwindSafe(work)))));
    pool.jobs
        .send(job)
        .expect("the pool's threads live as long as the process");
    match rx.await.expect("a pool thread answers every job") {
        Ok(value) => value,
        Err(panic) => resume_unwind(panic),
    }
}

/// Runs `work`, a future with CPU-heavy steps of its own (a large body's digest), on the
/// pool's runtime: one thread of the pool's idle class; a panic in it resumes here.
pub async fn run_async<F>(work: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match background().spawn(work).await {
        Ok(value) => value,
        Err(e) => resume_unwind(e.try_into_panic().expect("the pool's runtime never stops")),
    }
}

/// The pool's runtime: a current-thread runtime on a thread of its own.
fn background() -> &'static Handle {
    static RUNTIME: OnceLock<Handle> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("cpu-async".into())
            .stack_size(STACK_BYTES)
            .spawn(move || {
                lower_priority();
                let runtime = Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the pool's runtime starts");
                drop(tx.send(runtime.handle().clone()));
                runtime.block_on(std::future::pending::<()>());
            })
            .expect("the pool's runtime thread starts");
        rx.recv().expect("the pool's runtime starts")
    })
}

/// Runs `work` about an input of `bytes` here when it is small, else on the pool.
pub async fn run_sized<T: Send + 'static>(
    bytes: usize, work: impl FnOnce() -> T + Send + 'static,
) -> T {
    if bytes < INLINE_BYTES {
        work()
    } else {
        run(work).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_on_a_pool_thread_of_the_idle_class() {
        let (name, class) = run(|| {
            // SAFETY: sched_getscheduler only reads this thread's scheduling class.
            let class = unsafe { libc::sched_getscheduler(libc::gettid()) };
            (std::thread::current().name().map(str::to_owned), class)
        })
        .await;
        assert!(name.is_some_and(|n| n.starts_with("cpu-")));
        assert_eq!(class, libc::SCHED_IDLE);
        let class = run_async(async {
            // SAFETY: as above.
            unsafe { libc::sched_getscheduler(libc::gettid()) }
        })
        .await;
        assert_eq!(class, libc::SCHED_IDLE);
        // SAFETY: as above, for the test's own thread.
        let ours = unsafe { libc::sched_getscheduler(libc::gettid()) };
        assert_eq!(
            ours,
            libc::SCHED_OTHER,
            "the caller's own class is left alone"
        );
    }

    #[tokio::test]
    async fn small_inputs_stay_and_panics_reach_the_caller() {
        let here = std::thread::current().id();
        assert_eq!(
            run_sized(10, move || std::thread::current().id()).await,
            here
        );
        assert_ne!(
            run_sized(INLINE_BYTES, move || std::thread::current().id()).await,
            here
        );
        let panicked = tokio::spawn(run(|| panic!("boom"))).await.unwrap_err();
        assert!(panicked.is_panic());
        assert_eq!(run(|| 7).await, 7, "the pool outlives a panicking job");
        let name = run_async(async { std::thread::current().name().map(str::to_owned) }).await;
        assert_eq!(name.as_deref(), Some("cpu-async"));
        let panicked = tokio::spawn(run_async(async { panic!("boom") }))
            .await
            .unwrap_err();
        assert!(panicked.is_panic());
    }
}
