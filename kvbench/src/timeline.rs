//! Each node's batch round trips second by second, as the client saw them, so that a run
//! whose load moves (`-w hotkey --phases`) shows which shard was slow when, and for how long
//! after its hot spot left.
//!
//! Each task keeps one dense histogram per node for the second in progress and folds it
//! into a sparse [`Latency`] when the second ends; the tasks' lines are merged at the end.
//! Seconds count from the start of the run, warm-up included (as `per_second` does).

use kvshared::latency::{BUCKETS, Latency, bucket_of};
use serde::Serialize;

use crate::chart::LineChart;

/// One task's timeline.
pub struct Timeline {
    nodes: Vec<NodeLine>,
}

struct NodeLine {
    /// The second `current` holds.
    second: usize,
    current: Vec<u64>,
    sum_ns: u64,
    /// Finished seconds, by second.
    done: Vec<Latency>,
}

impl Timeline {
    pub fn new(nodes: usize) -> Timeline {
        Timeline {
            nodes: (0..nodes).map(|_| NodeLine::new()).collect(),
        }
    }

    /// A batch to `node` answered in `second` after `ns` nanoseconds.
    #[inline]
    pub fn record(&mut self, node: usize, second: usize, ns: u64) {
        let Some(line) = self.nodes.get_mut(node) else { return };
        if second != line.second {
            line.flush();
            line.second = second;
        }
        if line.current.is_empty() {
            line.current.resize(BUCKETS, 0);
        }
        line.current[bucket_of(ns)] += 1;
        line.sum_ns = line.sum_ns.saturating_add(ns);
    }

    /// Takes in another task's timeline.
    pub fn absorb(&mut self, other: Timeline) {
        let theirs = other.finish();
        if self.nodes.len() < theirs.len() {
            self.nodes.resize_with(theirs.len(), NodeLine::new);
        }
        for (line, done) in self.nodes.iter_mut().zip(&theirs) {
            merge_line(&mut line.done, done);
        }
    }

    /// Per node, per second: the latencies recorded.
    pub fn finish(mut self) -> Vec<Vec<Latency>> {
        self.nodes
            .iter_mut()
            .map(|line| {
                line.flush();
                std::mem::take(&mut line.done)
            })
            .collect()
    }
}

impl NodeLine {
    fn new() -> NodeLine {
        NodeLine {
            second: 0,
            current: Vec::new(),
            sum_ns: 0,
            done: Vec::new(),
        }
    }

    fn flush(&mut self) {
        if self.current.iter().all(|&c| c == 0) {
            return;
        }
        let l = Latency::from_dense(&self.current, self.sum_ns);
        if self.done.len() <= self.second {
            self.done.resize(self.second + 1, Latency::default());
        }
        self.done[self.second] = self.done[self.second].merged(&l);
        self.current.iter_mut().for_each(|c| *c = 0);
        self.sum_ns = 0;
    }
}

/// Adds `other` (per node, per second) into `into`.
pub fn merge(into: &mut Vec<Vec<Latency>>, other: &[Vec<Latency>]) {
    if into.len() < other.len() {
        into.resize(other.len(), Vec::new());
    }
    for (mine, theirs) in into.iter_mut().zip(other) {
        merge_line(mine, theirs);
    }
}

/// Adds one node's seconds `theirs` into `mine`.
fn merge_line(mine: &mut Vec<Latency>, theirs: &[Latency]) {
    if mine.len() < theirs.len() {
        mine.resize(theirs.len(), Latency::default());
    }
    for (a, b) in mine.iter_mut().zip(theirs) {
        *a = a.merged(b);
    }
}

/// One node's second, summarised.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SecondFigures {
    pub second: usize,
    pub batches: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// The seconds of one node's line that saw batches.
pub fn summarise(line: &[Latency]) -> Vec<SecondFigures> {
    let us = |ns: Option<u64>| ns.map_or(0.0, |n| n as f64 / 1000.0);
    line.iter()
        .enumerate()
        .filter(|(_, l)| l.count() > 0)
        .map(|(second, l)| SecondFigures {
            second,
            batches: l.count(),
            mean_us: us(l.mean_ns()),
            p50_us: us(l.quantile_ns(0.5)),
            p99_us: us(l.quantile_ns(0.99)),
        })
        .collect()
}

/// A chart of each node's p99 batch round trip per second (`stem`.png and .svg).
pub fn chart(timeline: &[Vec<Latency>], nodes: &[String], title: &str, stem: &std::path::Path) -> anyhow::Result<()> {
    let series = timeline
        .iter()
        .enumerate()
        .map(|(i, line)| {
            let name = nodes
                .get(i)
                .map_or(format!("shard {i}"), |a| format!("shard {i} ({a})"));
            let points = summarise(line)
                .iter()
                .map(|s| (s.second as f64, s.p99_us / 1000.0))
                .collect();
            (name, points)
        })
        .collect();
    LineChart {
        title: title.to_string(),
        x_label: "seconds since the start (warm-up included)".into(),
        y_label: "p99 batch round trip, ms".into(),
        log_x: false,
        log_y: true,
        series,
    }
    .write(stem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_kept_apart_per_node_and_tasks_merge() {
        let mut a = Timeline::new(2);
        a.record(0, 0, 1_000);
        a.record(0, 0, 3_000);
        a.record(1, 1, 50_000);
        a.record(0, 2, 2_000_000);
        let mut b = Timeline::new(2);
        b.record(0, 2, 2_000_000);
        a.absorb(b);
        let mut all = a.finish();
        let mut c = Timeline::new(1);
        c.record(0, 0, 1_000);
        merge(&mut all, &c.finish());
        let zero = summarise(&all[0]);
        assert_eq!(
            zero.iter().map(|s| (s.second, s.batches)).collect::<Vec<_>>(),
            vec![(0, 3), (2, 2)]
        );
        assert!(zero[1].p99_us >= 1_500.0 && zero[1].p99_us <= 2_600.0, "{zero:?}");
        assert_eq!(summarise(&all[1]).len(), 1);
        assert_eq!(summarise(&all[1])[0].second, 1);
    }
}
