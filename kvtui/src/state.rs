//! What the dashboard knows about the cluster: the latest sample of each node, rates between
//! samples, and a sliding window of history for the charts.
//!
//! Collection (the collector), this state, and drawing (`ui`) are separate: the state is
//! plain data that tests can build by hand and render.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use kvshared::latency::LatencyStats;
use kvshared::stats::{GroupRole, NodeRates, NodeStats, RateTracker};

/// One poll of one node.
#[derive(Debug, Clone)]
pub struct Sample {
    pub node: usize,
    pub at: Instant,
    pub result: Result<NodeStats, String>,
}

/// Whether a node answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Health {
    /// Not answered yet.
    Waiting,
    Up,
    /// Answered before, but a poll is overdue (one sample missed): a frozen process
    /// (SIGSTOP, a stall) or a cut network; its figures are as old as `last_seen`.
    Silent,
    /// The last poll failed with `error`.
    Down {
        error: String,
    },
}

/// Every member of `entries`, in order.
pub fn members(entries: &[String]) -> Vec<String> {
    kvshared::client::expand_members(entries)
        .into_iter()
        .map(|(_, m)| m)
        .collect()
}

/// History kept per series: enough for the longest selectable window.
pub const MAX_WINDOW: Duration = Duration::from_secs(300);

/// A time series of (seconds since the dashboard started, value).
pub type Series = VecDeque<(f64, f64)>;

fn push(series: &mut Series, t: f64, v: f64) {
    series.push_back((t, v));
    while series.front().is_some_and(|&(t0, _)| t - t0 > MAX_WINDOW.as_secs_f64()) {
        series.pop_front();
    }
}

/// How a node came to be shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `--nodes` (or the recording) lists it.
    Listed,
    /// A replica group reported it as a member (voter or learner) that `--nodes` left out,
    /// e.g. one `kvd admin add-replica` added, which may lead the group now.
    Learned,
}

/// A group member's standing in its group, as the group's leader reports the membership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// In no group, or its group's leader is not seen, or the leader lists it.
    Member,
    /// The leader of its group no longer lists it: it was removed (it may still think it
    /// follows, and its figures are not the group's).
    Removed,
}

/// Everything shown about one node.
#[derive(Debug, Clone)]
pub struct NodeView {
    pub addr: String,
    pub origin: Origin,
    pub standing: Standing,
    pub health: Health,
    /// The most recent stats that arrived (kept while the node is down).
    pub stats: Option<NodeStats>,
    /// Rates between the last two good samples (CPU and NICs: between kvd's last two
    /// samples of them; see `RateTracker`).
    pub rates: Option<NodeRates>,
    pub last_seen: Option<Instant>,
    tracker: RateTracker,
    pub ops: Series,
    pub cpu: Series,
    /// kvd's own socket bytes in + out per second.
    pub net: Series,
    /// Service times recorded between the last two good samples (server-side).
    pub latency: Option<LatencyStats>,
    /// Server-side p99 over all ops, per sample, in microseconds.
    pub p99_us: Series,
}

impl NodeView {
    pub fn new(addr: String) -> NodeView {
        NodeView {
            addr,
            origin: Origin::Listed,
            standing: Standing::Member,
            health: Health::Waiting,
            stats: None,
            rates: None,
            last_seen: None,
            tracker: RateTracker::default(),
            ops: Series::new(),
            cpu: Series::new(),
            net: Series::new(),
            latency: None,
            p99_us: Series::new(),
        }
    }

    /// Server-side p50 and p99 over every op between the last two samples, in ns.
    pub fn recent_quantiles_ns(&self) -> Option<(u64, u64)> {
        let all = self.latency.as_ref()?.all();
        Some((all.quantile_ns(0.5)?, all.quantile_ns(0.99)?))
    }

    pub fn is_up(&self) -> bool {
        self.health == Health::Up
    }

    /// A member of a replica group that does not lead it (or no longer belongs to it).
    pub fn is_follower(&self) -> bool {
        self.stats
            .as_ref()
            .is_some_and(|s| s.group.role.in_group() && s.group.role != GroupRole::Leader)
    }
}

/// Cluster-wide sums over the nodes that are up.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Totals {
    pub up: usize,
    pub nodes: usize,
    pub keys: u64,
    pub ops_per_sec: f64,
    pub gets_per_sec: f64,
    pub puts_per_sec: f64,
    pub errors_per_sec: f64,
    pub redirects_per_sec: f64,
    pub hit_ratio: Option<f64>,
    pub cpu_percent: f64,
    pub rss_bytes: u64,
    pub net_in_per_sec: f64,
    pub net_out_per_sec: f64,
    pub nic_rx_per_sec: f64,
    pub nic_tx_per_sec: f64,
}

/// The dashboard's model of the cluster.
#[derive(Debug, Clone)]
pub struct ClusterView {
    /// One per member: a single node, or each member of a replica group, in `--nodes` order;
    /// then the members learned from the groups ([`ClusterView::discover`]).
    pub nodes: Vec<NodeView>,
    /// How many of `nodes` `--nodes` lists (the first ones).
    pub listed: usize,
    /// The `--nodes` entries (a replica group's members joined by `|`).
    pub entries: Vec<String>,
    /// Whether to check the node list against what the nodes serve (not for a replay).
    pub judge_layout: bool,
    pub started: Instant,
    /// Total op/s over time (pushed by [`ClusterView::tick`]).
    pub total_ops: Series,
}

impl ClusterView {
    /// The view of `entries` (`--nodes`): a row per member.
    pub fn new(entries: &[String]) -> ClusterView {
        let nodes: Vec<NodeView> = members(entries).into_iter().map(NodeView::new).collect();
        ClusterView {
            listed: nodes.len(),
            nodes,
            entries: entries.to_vec(),
            judge_layout: true,
            started: Instant::now(),
            total_ops: Series::new(),
        }
    }

    pub fn secs(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.started).as_secs_f64()
    }

    /// Takes in one poll result.
    pub fn apply(&mut self, sample: Sample) {
        let t = self.secs(sample.at);
        let Some(node) = self.nodes.get_mut(sample.node) else {
            return;
        };
        match sample.result {
            Ok(stats) => {
                node.latency = match &node.stats {
                    Some(before) if node.is_up() && !stats.restarted_since(before) => {
                        Some(stats.latency.since(&before.latency))
                    }
                    _ => None,
                };
                if let Some((_, p99)) = node.recent_quantiles_ns() {
                    push(&mut node.p99_us, t, p99 as f64 / 1e3);
                }
                if let Some(r) = node.tracker.update(t, &stats) {
                    push(&mut node.ops, t, r.ops_per_sec);
                    if r.system_fresh() {
                        push(&mut node.cpu, t, r.process_cpu_percent);
                    }
                    push(&mut node.net, t, r.bytes_in_per_sec + r.bytes_out_per_sec);
                    node.rates = Some(r);
                }
                node.stats = Some(stats);
                node.health = Health::Up;
                node.last_seen = Some(sample.at);
            }
            Err(error) => {
                node.health = Health::Down { error };
                node.rates = None;
                node.latency = None;
                // A node that comes back starts its rates afresh (it may have restarted).
                node.tracker.reset();
            }
        }
        self.judge_standing();
    }

    /// Adds a row for every member a replica group reports (voters and learners) that no
    /// row shows yet, up to [`crate::collector::MAX_NODES`] rows; returns each new row's
    /// index and address, for the collector to poll. A leader that moved to a member
    /// `--nodes` left out is found this way, as the cluster client finds it.
    pub fn discover(&mut self) -> Vec<(usize, String)> {
        let mut known: std::collections::HashSet<String> = self.nodes.iter().map(|n| n.addr.clone()).collect();
        let mut found = Vec::new();
        for s in self.nodes.iter().filter(|n| n.is_up()).filter_map(|n| n.stats.as_ref()) {
            if !s.group.role.in_group() {
                continue;
            }
            for m in s.group.members.iter().chain(&s.group.learners) {
                if known.len() < crate::collector::MAX_NODES && known.insert(m.clone()) {
                    found.push(m.clone());
                }
            }
        }
        let mut added = Vec::new();
        for addr in found {
            let mut node = NodeView::new(addr.clone());
            node.origin = Origin::Learned;
            added.push((self.nodes.len(), addr));
            self.nodes.push(node);
        }
        added
    }

    /// Marks `Removed` each member whose group's leader (seen up, same group id) does not
    /// list it among its voters or learners.
    fn judge_standing(&mut self) {
        let leaders: Vec<(u64, Vec<String>)> = self
            .nodes
            .iter()
            .filter(|n| n.is_up())
            .filter_map(|n| n.stats.as_ref())
            .filter(|s| s.group.role == GroupRole::Leader && s.group.group_id != 0)
            .map(|s| {
                (
                    s.group.group_id,
                    s.group.members.iter().chain(&s.group.learners).cloned().collect(),
                )
            })
            .collect();
        for node in &mut self.nodes {
            let gone = node.stats.as_ref().is_some_and(|s| {
                s.group.role.in_group()
                    && s.group.role != GroupRole::Leader
                    && leaders
                        .iter()
                        .any(|(g, m)| *g == s.group.group_id && !m.contains(&node.addr))
            });
            node.standing = if gone { Standing::Removed } else { Standing::Member };
        }
    }

    /// Marks `Silent` every node that answered before but has not for two poll intervals
    /// (at least a second): it missed a sample. Its rates are dropped (they are not current);
    /// its next answer makes it `Up` again. (A frozen kvd used to look alive, with frozen
    /// figures, until its poll timed out 5-8 s later.)
    pub fn mark_silent(&mut self, now: Instant, interval: Duration) {
        let missed = (interval * 2).max(Duration::from_secs(1));
        for node in &mut self.nodes {
            let overdue = node
                .last_seen
                .is_some_and(|t| now.saturating_duration_since(t) > missed);
            if node.health == Health::Up && overdue {
                node.health = Health::Silent;
                node.rates = None;
                node.latency = None;
            }
        }
    }

    /// Records the current cluster total for the total-throughput series.
    pub fn tick(&mut self, now: Instant) {
        let t = self.secs(now);
        let total = self.totals().ops_per_sec;
        push(&mut self.total_ops, t, total);
    }

    /// What is wrong with the node list, from the shard each node last reported.
    /// The newest `n` membership changes the groups' leaders report (the shard manager's
    /// and `kvd admin`'s), oldest first, with their shards.
    pub fn recent_changes(&self, n: usize) -> Vec<(kvshared::routing::ShardId, kvshared::stats::GroupChange)> {
        let mut changes: Vec<_> = self
            .nodes
            .iter()
            .filter_map(|node| node.stats.as_ref().filter(|s| s.group.role == GroupRole::Leader))
            .flat_map(|s| s.group.changes.iter().map(|c| (s.shard, c.clone())))
            .collect();
        changes.sort_by_key(|(_, c)| c.unix_ms);
        changes.split_off(changes.len().saturating_sub(n))
    }

    pub fn layout_problems(&self) -> Vec<kvshared::client::LayoutProblem> {
        if !self.judge_layout {
            return Vec::new();
        }
        let listed = &self.nodes[..self.listed.min(self.nodes.len())];
        let member_shards: Vec<_> = listed.iter().map(|n| n.stats.as_ref().map(|s| s.shard)).collect();
        let (shards, mut problems) = kvshared::client::entry_shards(&self.entries, &member_shards);
        problems.extend(kvshared::client::check_layout(&self.entries, &shards));
        problems
    }

    pub fn totals(&self) -> Totals {
        let mut t = Totals {
            nodes: self.nodes.len(),
            ..Totals::default()
        };
        let (mut hits, mut lookups) = (0.0, 0.0);
        for n in self.nodes.iter().filter(|n| n.is_up()) {
            t.up += 1;
            if let Some(s) = &n.stats {
                t.rss_bytes += s.system.process_rss_bytes;
            }
            // A replica group's followers hold and apply the same data as their leader: the
            // cluster's keys and ops are the leaders'.
            // (Their CPU and traffic are real, and counted.)
            if n.is_follower() {
                if let Some(r) = &n.rates {
                    t.cpu_percent += r.process_cpu_percent;
                    t.net_in_per_sec += r.bytes_in_per_sec;
                    t.net_out_per_sec += r.bytes_out_per_sec;
                    t.nic_rx_per_sec += r.host_rx_per_sec;
                    t.nic_tx_per_sec += r.host_tx_per_sec;
                }
                continue;
            }
            if let Some(s) = &n.stats {
                t.keys += s.keys;
            }
            if let Some(r) = &n.rates {
                t.ops_per_sec += r.ops_per_sec;
                t.gets_per_sec += r.gets_per_sec;
                t.puts_per_sec += r.puts_per_sec;
                t.errors_per_sec += r.errors_per_sec;
                t.redirects_per_sec += r.redirects_per_sec;
                t.cpu_percent += r.process_cpu_percent;
                t.net_in_per_sec += r.bytes_in_per_sec;
                t.net_out_per_sec += r.bytes_out_per_sec;
                t.nic_rx_per_sec += r.host_rx_per_sec;
                t.nic_tx_per_sec += r.host_tx_per_sec;
                if let Some(h) = r.hit_ratio {
                    hits += h * r.gets_per_sec;
                    lookups += r.gets_per_sec;
                }
            }
        }
        t.hit_ratio = (lookups > 0.0).then(|| hits / lookups);
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(uptime_ms: u64, gets: u64) -> NodeStats {
        NodeStats {
            pid: 1,
            uptime_ms,
            counts: kvshared::stats::Counts {
                gets,
                hits: gets,
                ..Default::default()
            },
            keys: 10,
            ..NodeStats::default()
        }
    }

    /// Polls every 500 ms against kvd sampling its NIC counters every second, under a steady
    /// load: the detail view's per-interface rate must be steady, not 0, 2x, 0, 2x.
    #[test]
    fn interface_rates_are_steady_when_polling_faster_than_kvd_samples() {
        let mut v = ClusterView::new(&["a:1".into()]);
        let t0 = v.started;
        let mut shown = Vec::new();
        for poll in 0..10u64 {
            let now_ms = 1000 + poll * 500;
            let sampled_ms = now_ms / 1000 * 1000;
            let mut s = stats(now_ms, poll * 1000);
            s.system.system_sampled_ms = sampled_ms;
            s.system.interfaces = vec![kvshared::stats::InterfaceStats {
                name: "eth0".into(),
                rx_bytes: sampled_ms * 2000,
                tx_bytes: sampled_ms * 1000,
            }];
            v.apply(Sample {
                node: 0,
                at: t0 + Duration::from_millis(now_ms),
                result: Ok(s),
            });
            if let Some(i) = v.nodes[0].rates.as_ref().and_then(|r| r.interfaces.first()) {
                shown.push((i.rx_per_sec, i.tx_per_sec));
            }
        }
        assert!(shown.len() >= 7, "{shown:?}");
        assert!(
            shown.iter().all(|&r| r == (2_000_000.0, 1_000_000.0)),
            "flickering rates: {shown:?}"
        );
    }

    #[test]
    fn rates_come_from_two_samples_and_a_failure_marks_the_node_down() {
        let mut v = ClusterView::new(&["a:1".into(), "b:2".into()]);
        let t0 = v.started;
        v.apply(Sample {
            node: 0,
            at: t0,
            result: Ok(stats(1000, 0)),
        });
        assert!(v.nodes[0].rates.is_none());
        v.apply(Sample {
            node: 0,
            at: t0 + Duration::from_secs(2),
            result: Ok(stats(3000, 4000)),
        });
        assert_eq!(v.nodes[0].rates.as_ref().unwrap().ops_per_sec, 2000.0);
        v.apply(Sample {
            node: 1,
            at: t0,
            result: Err("connection refused".into()),
        });
        assert!(matches!(v.nodes[1].health, Health::Down { .. }));
        let t = v.totals();
        assert_eq!((t.up, t.nodes, t.keys, t.ops_per_sec), (1, 2, 10, 2000.0));
        assert_eq!(t.hit_ratio, Some(1.0));
    }

    #[test]
    fn a_node_that_misses_a_sample_is_silent_until_it_answers_again() {
        let mut v = ClusterView::new(&["a:1".into()]);
        let t0 = v.started;
        let every = Duration::from_millis(500);
        for (i, at) in [0u64, 500].into_iter().enumerate() {
            v.apply(Sample {
                node: 0,
                at: t0 + Duration::from_millis(at),
                result: Ok(stats(1000 + at, i as u64 * 100)),
            });
        }
        v.mark_silent(t0 + Duration::from_millis(1400), every);
        assert_eq!(v.nodes[0].health, Health::Up, "within two intervals (and a second)");
        v.mark_silent(t0 + Duration::from_millis(1600), every);
        assert_eq!(v.nodes[0].health, Health::Silent);
        assert!(v.nodes[0].rates.is_none() && !v.nodes[0].is_up());
        v.apply(Sample {
            node: 0,
            at: t0 + Duration::from_millis(3000),
            result: Ok(stats(3500, 300)),
        });
        assert_eq!(v.nodes[0].health, Health::Up);
    }

    fn member(role: GroupRole, members: &[&str]) -> NodeStats {
        let mut s = stats(1000, 0);
        s.group.role = role;
        s.group.group_id = 7;
        s.group.members = members.iter().map(|m| m.to_string()).collect();
        s
    }

    #[test]
    fn members_a_group_reports_get_rows_and_one_its_leader_dropped_is_removed() {
        let mut v = ClusterView::new(&["a:1|b:2".into()]);
        let t0 = v.started;
        for (node, s) in [
            (0, member(GroupRole::Follower, &["a:1", "b:2", "c:3"])),
            (1, member(GroupRole::Follower, &["a:1", "b:2", "c:3"])),
        ] {
            v.apply(Sample {
                node,
                at: t0,
                result: Ok(s),
            });
        }
        assert_eq!(v.discover(), vec![(2, "c:3".to_string())]);
        assert_eq!(v.discover(), vec![], "found once");
        assert_eq!((v.listed, v.nodes[2].origin), (2, Origin::Learned));
        // The learned member leads, and has removed a:1.
        v.apply(Sample {
            node: 2,
            at: t0,
            result: Ok(member(GroupRole::Leader, &["b:2", "c:3"])),
        });
        assert_eq!(v.nodes[0].standing, Standing::Removed);
        assert_eq!(v.nodes[1].standing, Standing::Member);
        assert_eq!(v.totals().keys, 10, "the leader's keys, once");
        assert!(
            v.layout_problems().is_empty(),
            "the listed entry is judged alone: {:?}",
            v.layout_problems()
        );
    }

    #[test]
    fn history_is_a_sliding_window() {
        let mut s = Series::new();
        for i in 0..1000 {
            push(&mut s, i as f64, 1.0);
        }
        assert!(s.front().unwrap().0 >= 999.0 - MAX_WINDOW.as_secs_f64());
    }
}
