//! The shard's background tasks, owned: every task a shard starts is spawned through its
//! [`Tasks`], which ends them all when the shard shuts down or is dropped, so none outlives
//! the shard that started it (a second shard opened on the same directory in one process,
//! as the tests and an in-process restart do, never races the first one's tasks).

use std::future::Future;

use tokio::task::JoinSet;

/// A shard's tasks.
#[derive(Default)]
pub(crate) struct Tasks {
    set: parking_lot::Mutex<JoinSet<()>>,
}

impl Tasks {
    /// Runs `task` until it ends or the shard does.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let mut set = self.set.lock();
        // Finished tasks are reaped as new ones start, so the set stays as small as what runs.
        while set.try_join_next().is_some() {}
        set.spawn(task);
    }

    /// Ends every task.
    pub fn abort_all(&self) {
        self.set.lock().abort_all();
    }

    /// Tasks running (or finished and not yet reaped).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.set.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tasks_end_with_their_owner() {
        let tasks = Tasks::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn(async move {
            let _keep = tx;
            std::future::pending::<()>().await;
        });
        assert_eq!(tasks.len(), 1);
        drop(tasks);
        // The task was aborted: its sender is dropped.
        assert!(rx.await.is_err());
    }
}
