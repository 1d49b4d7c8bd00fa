//! Per-node statistics: what kvd reports over the protocol, and how readers turn two
//! samples into rates.
//!
//! kvd serves only monotonic totals and a timestamp; every rate (op/s, bytes/s, CPU) is
//! computed by the reader from two samples, with saturating deltas so that a restarted node
//! shows a reset rather than a negative spike. One type serves the wire (rkyv), the JSON
//! output (serde) and both readers (kvbench, kvtui).

use rkyv::{Archive, Deserialize as RkyvDeserialize, Serialize as RkyvSerialize};
use serde::{Deserialize, Serialize};

/// Errors a node has counted, by kind (totals since start).
#[derive(Archive, RkyvSerialize, RkyvDeserialize, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorCounts {
    /// Ops for keys this node does not own.
    pub wrong_shard: u64,
    /// Ops with bad key or value spans.
    pub malformed_op: u64,
    /// Frame bodies that failed validation.
    pub malformed_body: u64,
    /// Frames with a bad magic, unknown kind or other protocol version.
    pub bad_frame: u64,
    /// Length prefixes over the frame limit.
    pub frame_too_large: u64,
    /// Connections that ended in the middle of a frame or with an I/O error.
    pub io: u64,
}

impl ErrorCounts {
    pub fn total(&self) -> u64 {
        self.wrong_shard + self.malformed_op + self.malformed_body + self.bad_frame + self.frame_too_large + self.io
    }
}

/// Byte counters of one host network interface (totals since boot).
#[derive(Archive, RkyvSerialize, RkyvDeserialize, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct InterfaceStats {
    pub name: String,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

/// One node's statistics at one instant.
#[derive(Archive, RkyvSerialize, RkyvDeserialize, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct NodeStats {
    /// kvd's version string.
    pub version: String,
    pub shard_index: u32,
    pub shard_count: u32,
    pub pid: u32,
    /// Milliseconds since the node started; a smaller value than last time means a restart.
    pub uptime_ms: u64,
    /// Wall clock at sampling, milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// Keys stored now.
    pub keys: u64,
    pub map_shards: u32,
    pub worker_threads: u32,
    pub gets: u64,
    pub puts: u64,
    pub deletes: u64,
    pub hits: u64,
    pub misses: u64,
    pub batches: u64,
    /// Bytes read from and written to kvd's own client sockets (the per-process network figure).
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub connections_open: u64,
    pub connections_total: u64,
    pub errors: ErrorCounts,
    /// When the process and host figures below were sampled (kvd samples them about once a
    /// second), in milliseconds of uptime. Rates of those figures use this, not the read time.
    pub system_sampled_ms: u64,
    /// CPU time kvd has used, in milliseconds (user + system); rate it for a CPU %.
    pub process_cpu_ms: u64,
    /// kvd's CPU use over the last sampling period, percent of one core.
    pub process_cpu_percent: f32,
    pub process_rss_bytes: u64,
    /// Host-wide CPU use over the last sampling period, percent of all cores (0..=100).
    pub host_cpu_percent: f32,
    pub host_cpus: u32,
    pub host_mem_used_bytes: u64,
    pub host_mem_total_bytes: u64,
    pub host_name: String,
    pub interfaces: Vec<InterfaceStats>,
}

impl NodeStats {
    /// Total ops served (get + put + delete).
    pub fn ops(&self) -> u64 {
        self.gets + self.puts + self.deletes
    }

    /// Host NIC totals summed over interfaces other than loopback.
    pub fn host_net_totals(&self) -> (u64, u64) {
        self.interfaces
            .iter()
            .filter(|i| i.name != "lo")
            .fold((0, 0), |(rx, tx), i| (rx + i.rx_bytes, tx + i.tx_bytes))
    }
}

/// Rates between two samples of the same node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct NodeRates {
    pub seconds: f64,
    pub ops_per_sec: f64,
    pub gets_per_sec: f64,
    pub puts_per_sec: f64,
    pub deletes_per_sec: f64,
    /// Hits / (hits + misses) over the interval; `None` if there were no lookups.
    pub hit_ratio: Option<f64>,
    pub bytes_in_per_sec: f64,
    pub bytes_out_per_sec: f64,
    /// kvd CPU over the interval, percent of one core.
    pub process_cpu_percent: f64,
    pub host_rx_per_sec: f64,
    pub host_tx_per_sec: f64,
    /// False when kvd had not re-sampled its process and host figures between the two reads:
    /// `process_cpu_percent` and the host rates are then 0 and the reader should keep its
    /// previous values.
    pub system_fresh: bool,
    /// The node restarted between the samples; rates start again from zero.
    pub restarted: bool,
}

impl NodeRates {
    /// Rates from `before` to `after`, `seconds` apart as measured by the reader.
    ///
    /// A restart (uptime went backwards) yields zero rates and `restarted = true`.
    pub fn between(before: &NodeStats, after: &NodeStats, seconds: f64) -> NodeRates {
        let restarted = after.uptime_ms < before.uptime_ms || after.pid != before.pid;
        if restarted || seconds <= 0.0 {
            return NodeRates {
                seconds,
                restarted,
                ..NodeRates::default()
            };
        }
        let rate = |a: u64, b: u64| b.saturating_sub(a) as f64 / seconds;
        let hits = after.hits.saturating_sub(before.hits);
        let misses = after.misses.saturating_sub(before.misses);
        let (rx0, tx0) = before.host_net_totals();
        let (rx1, tx1) = after.host_net_totals();
        // CPU and NIC totals change only when kvd samples them: rate them over the sampling
        // times, or two reads between samples would show 0 and then double.
        let system_secs = after.system_sampled_ms.saturating_sub(before.system_sampled_ms) as f64 / 1000.0;
        let system_fresh = system_secs > 0.0;
        let system_rate = |a: u64, b: u64| {
            if system_fresh {
                b.saturating_sub(a) as f64 / system_secs
            } else {
                0.0
            }
        };
        NodeRates {
            seconds,
            ops_per_sec: rate(before.ops(), after.ops()),
            gets_per_sec: rate(before.gets, after.gets),
            puts_per_sec: rate(before.puts, after.puts),
            deletes_per_sec: rate(before.deletes, after.deletes),
            hit_ratio: (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64),
            bytes_in_per_sec: rate(before.bytes_in, after.bytes_in),
            bytes_out_per_sec: rate(before.bytes_out, after.bytes_out),
            process_cpu_percent: system_rate(before.process_cpu_ms, after.process_cpu_ms) / 10.0,
            host_rx_per_sec: system_rate(rx0, rx1),
            host_tx_per_sec: system_rate(tx0, tx1),
            system_fresh,
            restarted: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(uptime_ms: u64, gets: u64, cpu_ms: u64) -> NodeStats {
        NodeStats {
            pid: 7,
            uptime_ms,
            system_sampled_ms: uptime_ms,
            gets,
            hits: gets,
            process_cpu_ms: cpu_ms,
            ..NodeStats::default()
        }
    }

    #[test]
    fn rates_from_totals() {
        let r = NodeRates::between(&sample(1000, 100, 0), &sample(3000, 2100, 1000), 2.0);
        assert_eq!(r.ops_per_sec, 1000.0);
        assert_eq!(r.process_cpu_percent, 50.0);
        assert_eq!(r.hit_ratio, Some(1.0));
        assert!(!r.restarted);
    }

    #[test]
    fn cpu_is_rated_over_kvds_sampling_times_not_the_read_times() {
        let mut a = sample(1000, 0, 0);
        let mut b = sample(1500, 100, 0);
        b.system_sampled_ms = a.system_sampled_ms;
        let r = NodeRates::between(&a, &b, 0.5);
        assert!(!r.system_fresh);
        assert_eq!(r.ops_per_sec, 200.0);
        a = b;
        let mut c = sample(2000, 200, 900);
        c.system_sampled_ms = 2000;
        let r = NodeRates::between(&a, &c, 0.5);
        assert!(r.system_fresh);
        assert_eq!(r.process_cpu_percent, 90.0);
    }

    #[test]
    fn a_restart_is_a_reset_not_a_negative_spike() {
        let r = NodeRates::between(&sample(9000, 5000, 100), &sample(500, 10, 5), 1.0);
        assert!(r.restarted);
        assert_eq!(r.ops_per_sec, 0.0);
    }
}
