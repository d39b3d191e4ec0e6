//! Passes over due runs woken by new runs: one at a time, however many events wake them.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::workflows::runs::advance_due;
use crate::AppState;

/// Wakes asked for since the woken pass last looked: one pass runs at a time, and goes round
/// again while wakes came during it.
#[derive(Default)]
pub struct Wakes(AtomicUsize);

impl Wakes {
    /// Counts a wake; whether it must start the pass (none runs).
    fn ask(&self) -> bool {
        self.0.fetch_add(1, Ordering::AcqRel) == 0
    }

    /// The wakes counted so far, before a round of the pass.
    fn seen(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }

    /// After a round that began at `seen`: whether the pass may stop (no wake came since).
    fn done(&self, seen: usize) -> bool {
        self.0
            .compare_exchange(seen, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// Advances due runs in the background now (a new run's first steps). However many events
/// wake it at once, one pass runs, again as long as wakes come (each pass's sends hold
/// pooled connections: a pass per event ran the pool dry at hundreds of events a second).
pub fn wake(state: &AppState) {
    if !state.wakes.ask() {
        return;
    }
    let state = state.clone();
    state.tracker.clone().spawn(async move {
        loop {
            let seen = state.wakes.seen();
            if let Err(e) = advance_due(&state).await {
                tracing::warn!(error = %e, "workflow runs");
            }
            if state.wakes.done(seen) {
                break;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pass_runs_at_a_time_and_goes_round_while_wakes_come() {
        let wakes = Wakes::default();
        assert!(wakes.ask(), "the first wake starts the pass");
        let seen = wakes.seen();
        assert!(!wakes.ask() && !wakes.ask(), "later ones join it");
        assert!(!wakes.done(seen), "it goes round for them");
        let seen = wakes.seen();
        assert!(wakes.done(seen), "then stops");
        assert!(wakes.ask(), "and the next wake starts a pass again");
    }
}
