//! Each host's CPU split, from its kvd nodes: kvd's own processes, every other process
//! (a benchmark client on the same host shows here), the kernel's interrupt work (network
//! softirqs, not charged to any process) and idle, as htop's header and bottom's process
//! view tell them apart. Shown under the table, in the detail view and by `--once`.

use serde::Serialize;

use crate::state::ClusterView;

/// One host's CPU over the last measured span, percent of one core each.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostView {
    pub name: String,
    pub cpus: u32,
    /// kvd processes seen on it (nodes up, by pid).
    pub kvd_processes: usize,
    pub kvd_percent: f64,
    /// Every other process: user and system time not kvd's.
    pub other_percent: f64,
    /// Hard and soft interrupts.
    pub irq_percent: f64,
    pub steal_percent: f64,
    pub idle_percent: f64,
}

impl HostView {
    /// One line: `host a (2 CPUs): kvd 60% (2 processes), other processes 98%, ...`.
    pub fn summary(&self) -> String {
        let steal = match self.steal_percent >= 0.5 {
            true => format!(", stolen {:.0}%", self.steal_percent),
            false => String::new(),
        };
        format!(
            "host {} ({} CPUs, {:.0}% in all): kvd {:.0}% ({} process{}), other processes {:.0}%, interrupts {:.0}%{steal}, idle {:.0}%",
            self.name,
            self.cpus,
            100.0 * f64::from(self.cpus),
            self.kvd_percent,
            self.kvd_processes,
            if self.kvd_processes == 1 { "" } else { "es" },
            self.other_percent,
            self.irq_percent,
            self.idle_percent
        )
    }
}

/// The hosts of the nodes that are up and have measured CPU rates, in order of first
/// appearance. kvd's share sums every kvd process on the host; the other processes are the
/// host's process time less that. (Nodes that share a process, as in tests, count once.)
pub fn hosts(view: &ClusterView) -> Vec<HostView> {
    let mut out: Vec<HostView> = Vec::new();
    let mut counted: Vec<(String, u32)> = Vec::new();
    for n in view.nodes.iter().filter(|n| n.is_up()) {
        let (Some(s), Some(r)) = (&n.stats, &n.rates) else {
            continue;
        };
        let Some(split) = r.host_cpu else { continue };
        let name = &s.system.host_name;
        let at = match out.iter().position(|h| &h.name == name) {
            Some(i) => i,
            None => {
                out.push(HostView {
                    name: name.clone(),
                    cpus: s.system.host_cpus,
                    kvd_processes: 0,
                    kvd_percent: 0.0,
                    other_percent: split.processes_percent,
                    irq_percent: split.irq_percent,
                    steal_percent: split.steal_percent,
                    idle_percent: split.idle_percent,
                });
                out.len() - 1
            }
        };
        if counted.contains(&(name.clone(), s.pid)) {
            continue;
        }
        counted.push((name.clone(), s.pid));
        let h = &mut out[at];
        h.kvd_processes += 1;
        h.kvd_percent += r.process_cpu_percent;
    }
    for h in &mut out {
        h.other_percent = (h.other_percent - h.kvd_percent).max(0.0);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kvshared::stats::{HostCpuTime, NodeStats};

    use super::*;
    use crate::state::Sample;

    /// Node `node` (its own process) on `host`, whose process used `kvd_ms` of CPU, on a host whose processes used
    /// `proc_ms` and interrupts `irq_ms`, `at_ms` into both clocks.
    fn stats(host: &str, node: usize, at_ms: u64, kvd_ms: u64, proc_ms: u64, irq_ms: u64) -> NodeStats {
        let mut s = NodeStats {
            pid: 100 + node as u32,
            uptime_ms: at_ms,
            ..NodeStats::default()
        };
        s.system.host_name = host.into();
        s.system.host_cpus = 2;
        s.system.system_sampled_ms = at_ms;
        s.system.process_cpu_ms = kvd_ms;
        s.system.host_cpu = HostCpuTime {
            user_ms: proc_ms,
            system_ms: 0,
            irq_ms,
            idle_ms: 2 * at_ms - proc_ms - irq_ms,
            steal_ms: 0,
        };
        s
    }

    #[test]
    fn two_kvds_and_a_busy_client_on_one_host_split_its_cpu() {
        let mut v = ClusterView::new(&["a:1".into(), "a:2".into()]);
        let t0 = v.started;
        for (node, kvd_ms) in [(0, 300u64), (1, 300)] {
            for (at, k, p, i) in [(1_000u64, 0, 0, 0), (2_000, kvd_ms, 1_600, 200)] {
                v.apply(Sample {
                    node,
                    at: t0 + Duration::from_millis(at),
                    result: Ok(stats("h", node, at, k, p, i)),
                });
            }
        }
        let hosts = hosts(&v);
        assert_eq!(hosts.len(), 1, "{hosts:?}");
        let h = &hosts[0];
        assert_eq!(
            (h.kvd_processes, h.kvd_percent, h.other_percent, h.irq_percent),
            (2, 60.0, 100.0, 20.0)
        );
        assert_eq!(h.idle_percent, 20.0);
        assert!(
            h.summary()
                .contains("kvd 60% (2 processes), other processes 100%, interrupts 20%"),
            "{}",
            h.summary()
        );
    }
}
