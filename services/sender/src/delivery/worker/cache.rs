//! The worker's cache of tasks: a task's recipients are delivered around the same time, so
//! each worker reads a task (and its attachments) once, within a memory budget.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use postmesh_shared::TaskId;

use crate::sending::tasks::LoadedTask;

/// Bytes of tasks kept at most; past it the cache starts over.
const BUDGET: usize = 64 * 1024 * 1024;

/// Recently loaded tasks.
#[derive(Default)]
pub(crate) struct TaskCache {
    inner: Mutex<(HashMap<TaskId, Arc<LoadedTask>>, usize)>,
}

impl TaskCache {
    /// The task, if cached.
    pub fn get(&self, id: TaskId) -> Option<Arc<LoadedTask>> {
        self.inner.lock().ok()?.0.get(&id).cloned()
    }

    /// Caches `task` (unless it alone is over the budget) and returns it shared.
    pub fn insert(&self, id: TaskId, task: LoadedTask) -> Arc<LoadedTask> {
        let weight = task.weight();
        let task = Arc::new(task);
        if weight > BUDGET {
            return task;
        }
        if let Ok(mut inner) = self.inner.lock() {
            if inner.1 + weight > BUDGET {
                *inner = (HashMap::new(), 0);
            }
            if inner.0.insert(id, task.clone()).is_none() {
                inner.1 += weight;
            }
        }
        task
    }
}
