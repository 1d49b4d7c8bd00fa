//! When a shard gets a replica and when it gives one back: a pure function of the figures
//! the manager reads each interval, so the hysteresis can be tested without a cluster.

use std::time::Duration;

/// The thresholds and patience of the shard manager (its flags).
#[derive(Clone, Debug)]
pub struct Policy {
    /// A shard is hot when its reads per serving member reach this...
    pub hot_reads_per_member: f64,
    /// ...or when its worst member's read p99 (server side) reaches this while it serves at
    /// least `cold_reads_per_member` per member (a slow member with little to do is not
    /// helped by another: its reads wait on something else).
    pub hot_read_p99: Duration,
    /// A shard with an added replica is cold when, with one member fewer, its reads per
    /// member would stay under this and its read p99 is under half of `hot_read_p99`.
    pub cold_reads_per_member: f64,
    /// Intervals in a row a shard must be hot before a replica is added.
    pub up_after: u32,
    /// Intervals in a row a shard must be cold before an added replica is removed.
    pub down_after: u32,
    /// Most members (voters and learners) a shard may have.
    pub max_replicas: usize,
    /// Intervals after a change of a shard before the next may start (its effect shows).
    pub settle: u32,
}

/// One shard's figures over the last interval.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShardLoad {
    /// Reads per second, summed over the members that serve reads.
    pub reads_per_sec: f64,
    /// Writes per second (as the leader applied them).
    pub writes_per_sec: f64,
    /// The worst read p99 of a member that served reads, microseconds.
    pub read_p99_us: f64,
    /// Members serving reads: voters and learners.
    pub members: usize,
    /// Of them, learners this manager added (it removes only those).
    pub added: usize,
}

impl ShardLoad {
    /// Reads per serving member.
    pub fn reads_per_member(&self) -> f64 {
        self.reads_per_sec / self.members.max(1) as f64
    }
}

/// What the manager does about a shard this interval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing.
    Hold,
    /// Add a learner; the reason, with the figures.
    Add(String),
    /// Remove the last learner it added; the reason, with the figures.
    Remove(String),
}

/// A shard's history as the policy keeps it.
#[derive(Clone, Debug, Default)]
pub struct ShardState {
    hot_streak: u32,
    cold_streak: u32,
    /// Intervals left before another change may start.
    settling: u32,
}

impl Policy {
    /// Updates `state` with this interval's `load` and says what to do; `spare_free` says
    /// whether a spare could take a replica of this shard now.
    pub fn decide(&self, state: &mut ShardState, load: &ShardLoad, spare_free: bool) -> Decision {
        let p99_ms = load.read_p99_us / 1000.0;
        let hot_p99_ms = self.hot_read_p99.as_secs_f64() * 1000.0;
        let busy = load.reads_per_member() >= self.cold_reads_per_member;
        let hot = load.reads_per_member() >= self.hot_reads_per_member || (busy && p99_ms >= hot_p99_ms);
        let fewer = load.reads_per_sec / load.members.saturating_sub(1).max(1) as f64;
        let cold = load.added > 0 && fewer < self.cold_reads_per_member && p99_ms < hot_p99_ms / 2.0;
        if state.settling > 0 {
            // The last change's effect is still showing: these intervals count for nothing.
            state.settling -= 1;
            return Decision::Hold;
        }
        state.hot_streak = if hot { state.hot_streak + 1 } else { 0 };
        state.cold_streak = if cold { state.cold_streak + 1 } else { 0 };
        let figures = format!(
            "{:.0} reads/s over {} member(s) ({:.0}/member), read p99 {:.1} ms, {:.0} writes/s",
            load.reads_per_sec,
            load.members,
            load.reads_per_member(),
            p99_ms,
            load.writes_per_sec
        );
        if state.hot_streak >= self.up_after && load.members < self.max_replicas && spare_free {
            *state = ShardState {
                settling: self.settle,
                ..ShardState::default()
            };
            return Decision::Add(format!(
                "hot for {} intervals (at least {:.0} reads/s per member, or read p99 {hot_p99_ms:.0} ms at {:.0}): {figures}",
                self.up_after, self.hot_reads_per_member, self.cold_reads_per_member
            ));
        }
        if state.cold_streak >= self.down_after {
            *state = ShardState {
                settling: self.settle,
                ..ShardState::default()
            };
            return Decision::Remove(format!(
                "cold for {} intervals (under {:.0} reads/s per member with one fewer): {figures}",
                self.down_after, self.cold_reads_per_member
            ));
        }
        Decision::Hold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            hot_reads_per_member: 100_000.0,
            hot_read_p99: Duration::from_millis(50),
            cold_reads_per_member: 25_000.0,
            up_after: 3,
            down_after: 5,
            max_replicas: 3,
            settle: 2,
        }
    }

    fn load(reads: f64, members: usize, added: usize) -> ShardLoad {
        ShardLoad {
            reads_per_sec: reads,
            members,
            added,
            read_p99_us: 1000.0,
            ..ShardLoad::default()
        }
    }

    fn run(p: &Policy, state: &mut ShardState, loads: &[ShardLoad]) -> Vec<char> {
        loads
            .iter()
            .map(|l| match p.decide(state, l, true) {
                Decision::Hold => '.',
                Decision::Add(_) => '+',
                Decision::Remove(_) => '-',
            })
            .collect()
    }

    #[test]
    fn a_replica_is_added_only_after_the_load_stays_high() {
        let p = policy();
        let mut s = ShardState::default();
        // Two hot intervals, a dip, then three: one add, on the third in a row.
        let loads = [200e3, 200e3, 50e3, 200e3, 200e3, 200e3].map(|r| load(r, 1, 0));
        assert_eq!(run(&p, &mut s, &loads), ['.', '.', '.', '.', '.', '+']);
    }

    #[test]
    fn a_flapping_load_never_changes_anything() {
        let p = policy();
        let mut s = ShardState::default();
        let loads: Vec<ShardLoad> = (0..40)
            .map(|i| load(if i % 2 == 0 { 300e3 } else { 10e3 }, 2, 1))
            .collect();
        assert!(run(&p, &mut s, &loads).iter().all(|c| *c == '.'));
    }

    #[test]
    fn a_cooled_shard_gives_back_what_was_added_and_only_that() {
        let p = policy();
        let mut s = ShardState::default();
        // Cold, but nothing added: nothing to remove.
        assert!(run(&p, &mut s, &vec![load(1e3, 1, 0); 10]).iter().all(|c| *c == '.'));
        // Cold with one added: removed after five cold intervals.
        let mut s = ShardState::default();
        assert_eq!(run(&p, &mut s, &vec![load(1e3, 2, 1); 5]), ['.', '.', '.', '.', '-']);
    }

    #[test]
    fn a_change_settles_before_the_next_and_the_cap_holds() {
        let p = policy();
        let mut s = ShardState::default();
        // Hot throughout: add at 3, settle 2, then hot 3 more before the next add.
        let mut loads = vec![load(900e3, 1, 0); 3];
        loads.extend(vec![load(900e3, 2, 1); 5]);
        loads.extend(vec![load(900e3, 3, 2); 6]);
        let got = run(&p, &mut s, &loads);
        let adds: Vec<usize> = got
            .iter()
            .enumerate()
            .filter(|(_, c)| **c == '+')
            .map(|(i, _)| i)
            .collect();
        // The second add comes after the 2 settling intervals and 3 hot ones; at 3 members
        // (the cap) no more.
        assert_eq!(adds, [2, 7], "{got:?}");
    }

    #[test]
    fn a_slow_busy_shard_is_hot_a_slow_idle_one_is_not_and_no_spare_means_no_add() {
        let p = policy();
        let mut s = ShardState::default();
        let idle = ShardLoad {
            reads_per_sec: 1e3,
            members: 1,
            read_p99_us: 80_000.0,
            ..ShardLoad::default()
        };
        for _ in 0..5 {
            assert_eq!(p.decide(&mut s, &idle, true), Decision::Hold);
        }
        let slow = ShardLoad {
            reads_per_sec: 30e3,
            ..idle
        };
        for _ in 0..5 {
            assert_eq!(p.decide(&mut s, &slow, false), Decision::Hold);
        }
        assert!(matches!(p.decide(&mut s, &slow, true), Decision::Add(_)));
    }
}
