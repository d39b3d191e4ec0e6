//! Delivery slots per target, so one slow receiver never holds up another's attempts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

use super::STALLED_FOR;

/// How long an attempt waits for a slot of its busy target. A target that frees none in
/// that time counts as stalled.
const BUSY_WAIT: Duration = Duration::from_secs(1);

/// Delivery slots per target, shared by the worker and the fan-outs' direct tries.
pub(crate) struct Slots {
    per_target: usize,
    targets: Mutex<HashMap<Uuid, Arc<TargetSlots>>>,
}

/// One target's slots, and until when it counts as stalled.
struct TargetSlots {
    slots: Arc<Semaphore>,
    stalled_until: Mutex<Option<Instant>>,
}

impl Slots {
    /// `per_target` slots for each target.
    pub(crate) fn new(per_target: usize) -> Self {
        Self {
            per_target: per_target.max(1),
            targets: Mutex::default(),
        }
    }

    /// Slots per target.
    pub(crate) fn per_target(&self) -> usize {
        self.per_target
    }

    /// A slot of `target`'s: at once, or within [`BUSY_WAIT`] unless the target is stalled;
    /// `None` when it has none to spare (it then counts as stalled for [`STALLED_FOR`]).
    pub(crate) async fn take(&self, target: Uuid) -> Option<OwnedSemaphorePermit> {
        let target = self.of(target);
        if let Ok(slot) = target.slots.clone().try_acquire_owned() {
            return Some(slot);
        }
        let stalled = |until: &Option<Instant>| until.is_some_and(|u| Instant::now() < u);
        if stalled(&target.stalled_until.lock().expect("stall lock")) {
            return None;
        }
        match tokio::time::timeout(BUSY_WAIT, target.slots.clone().acquire_owned()).await {
            Ok(Ok(slot)) => Some(slot),
            _ => {
                *target.stalled_until.lock().expect("stall lock") =
                    Some(Instant::now() + STALLED_FOR);
                None
            }
        }
    }

    /// `target`'s slots.
    fn of(&self, target: Uuid) -> Arc<TargetSlots> {
        let mut targets = self.targets.lock().expect("slots lock");
        if targets.len() > 10_000 {
            // Forget idle targets; a busy one keeps its semaphore alive through its permits.
            targets.retain(|_, t| t.slots.available_permits() < self.per_target);
        }
        targets
            .entry(target)
            .or_insert_with(|| {
                Arc::new(TargetSlots {
                    slots: Arc::new(Semaphore::new(self.per_target)),
                    stalled_until: Mutex::new(None),
                })
            })
            .clone()
    }
}
