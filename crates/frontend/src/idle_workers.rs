//! [`IdleWorkers`]: when a front end's queued job is worth waking a worker
//! for. Both front ends run the export's blocking calls on worker threads
//! that wait on one condition variable for a queue of jobs; each wake-up
//! is a thread switch, and a worker that finishes a job takes the next
//! queued one itself. So a job wakes an idle worker only when the jobs
//! queued outnumber the workers already woken and on their way; the
//! others will find work without one.

/// Counts kept beside a job queue, under the same lock.
#[derive(Debug, Default)]
pub struct IdleWorkers {
    /// Workers waiting for a job.
    idle: usize,
    /// Of those, woken for a job and not yet back at the queue.
    woken: usize,
}

impl IdleWorkers {
    /// Call after queuing a job, with `queued` jobs now in the queue:
    /// whether to wake one waiting worker (`notify_one` after the lock is
    /// released). No job is left without a worker on its way: every
    /// queued job is matched by a woken worker or by a busy one that will
    /// come back to the queue when its job is done.
    pub fn wake_for(&mut self, queued: usize) -> bool {
        let wake = self.idle > self.woken && queued > self.woken;
        if wake {
            self.woken += 1;
        }
        wake
    }

    /// Whether no waiting worker is left to wake while the `queued` jobs
    /// outnumber the woken ones: a pool that starts workers on demand
    /// starts one then.
    pub fn none_to_wake(&self, queued: usize) -> bool {
        self.idle <= self.woken && queued > self.woken
    }

    /// Call when a worker finds the queue empty, just before it waits.
    pub fn waiting(&mut self) {
        self.idle += 1;
    }

    /// Call when a worker's wait returns (woken for a job, or at the end).
    pub fn back(&mut self) {
        self.idle -= 1;
        self.woken = self.woken.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_wakes_a_worker_only_when_the_woken_ones_are_too_few() {
        let mut w = IdleWorkers::default();
        // Nobody waits: nobody to wake (a busy worker takes the job).
        assert!(!w.wake_for(1));
        w.waiting();
        w.waiting();
        assert!(w.wake_for(1), "one job, one idle worker");
        assert!(w.wake_for(2), "a second job, the second idle worker");
        assert!(!w.wake_for(3), "no idle worker left to wake");
        w.back();
        w.back();
        assert!(!w.wake_for(1), "both are back: nobody waits");
        // A worker woken for a job that a busy one took waits again.
        w.waiting();
        assert!(w.wake_for(1));
        assert!(!w.wake_for(1), "the queue holds one job, one is on its way");
        assert!(!w.none_to_wake(1), "the woken one covers the job");
        assert!(w.none_to_wake(2), "a second job: nobody left to wake");
    }
}
