//! Process and host figures (CPU, memory, network), sampled off the request path.
//!
//! A plain thread refreshes sysinfo about once a second and keeps the latest sample behind
//! a lock that only stats requests read. Nothing on the request path touches it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kvshared::stats::{InterfaceStats, SystemFigures};
use parking_lot::Mutex;
use sysinfo::{Networks, Pid, ProcessRefreshKind, ProcessesToUpdate, System};

/// The latest figures, and when they were taken.
#[derive(Clone, Debug)]
pub(crate) struct Sample {
    pub at: Instant,
    pub figures: SystemFigures,
}

/// The sampling thread's handle; dropping it stops the thread.
pub(crate) struct Sampler {
    latest: Arc<Mutex<Sample>>,
    stop: Arc<AtomicBool>,
}

impl Sampler {
    /// Starts sampling every `period`. The first sample is taken before this returns.
    pub fn start(period: Duration) -> Sampler {
        let mut probe = Probe::new();
        let latest = Arc::new(Mutex::new(probe.sample()));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s) = (latest.clone(), stop.clone());
        let spawned = std::thread::Builder::new().name("kvd-sampler".into()).spawn(move || {
            while !s.load(Ordering::Relaxed) {
                std::thread::sleep(period);
                let sample = probe.sample();
                *l.lock() = sample;
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the stats sampler; CPU and memory figures stay at zero");
        }
        Sampler { latest, stop }
    }

    pub fn latest(&self) -> Sample {
        self.latest.lock().clone()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The host's CPU time by state, from `/proc/stat` (`None` where there is none).
fn host_cpu_time() -> Option<kvshared::stats::HostCpuTime> {
    use procfs::CurrentSI;
    let t = procfs::KernelStats::current().ok()?.total;
    Some(kvshared::stats::HostCpuTime {
        user_ms: t.user_ms() + t.nice_ms(),
        system_ms: t.system_ms(),
        irq_ms: t.irq_ms().unwrap_or(0) + t.softirq_ms().unwrap_or(0),
        idle_ms: t.idle_ms() + t.iowait_ms().unwrap_or(0),
        steal_ms: t.steal_ms().unwrap_or(0),
    })
}

/// sysinfo state kept between samples (CPU figures are deltas between refreshes).
struct Probe {
    system: Option<System>,
    networks: Option<Networks>,
    pid: Option<Pid>,
    host_name: String,
}

impl Probe {
    fn new() -> Probe {
        Probe {
            system: System::new().ok(),
            networks: Networks::new_with_refreshed_list().ok(),
            pid: sysinfo::get_current_pid().ok(),
            host_name: System::host_name().unwrap_or_default(),
        }
    }

    fn sample(&mut self) -> Sample {
        let mut out = SystemFigures {
            host_name: self.host_name.clone(),
            ..SystemFigures::default()
        };
        if let Some(sys) = self.system.as_mut() {
            sys.refresh_memory();
            sys.refresh_cpu_usage();
            out.host_cpu_percent = sys.global_cpu_usage();
            out.host_cpus = sys.cpus().len() as u32;
            out.host_mem_used_bytes = sys.used_memory();
            out.host_mem_total_bytes = sys.total_memory();
            if let Some(pid) = self.pid {
                sys.refresh_processes_specifics(
                    ProcessesToUpdate::Some(&[pid]),
                    false,
                    ProcessRefreshKind::nothing().with_cpu().with_memory(),
                );
                if let Some(p) = sys.process(pid) {
                    out.process_cpu_ms = p.accumulated_cpu_time();
                    out.process_cpu_percent = p.cpu_usage();
                    out.process_rss_bytes = p.memory();
                }
            }
        }
        out.host_cpu = host_cpu_time().unwrap_or_default();
        if let Some(nets) = self.networks.as_mut() {
            nets.refresh(true);
            out.interfaces = nets
                .iter()
                .map(|(name, data)| InterfaceStats {
                    name: name.to_string_lossy().into_owned(),
                    rx_bytes: data.total_received(),
                    tx_bytes: data.total_transmitted(),
                })
                .collect();
            out.interfaces.sort_by(|a, b| a.name.cmp(&b.name));
        }
        Sample {
            at: Instant::now(),
            figures: out,
        }
    }
}
