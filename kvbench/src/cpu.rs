//! kvbench's own CPU time, so a user can see when the client is the bottleneck.

use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

/// CPU time this process has used so far, in milliseconds (user + system).
pub fn own_cpu_ms() -> u64 {
    let Ok(pid) = sysinfo::get_current_pid() else {
        return 0;
    };
    let Ok(mut sys) = System::new() else {
        return 0;
    };
    sys.refresh_processes_specifics(
        ProcessesToUpdate::Some(&[pid]),
        false,
        ProcessRefreshKind::nothing().with_cpu(),
    );
    sys.process(Pid::from(pid.as_u32() as usize))
        .map(|p| p.accumulated_cpu_time())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_time_moves_with_work() {
        let before = super::own_cpu_ms();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed().as_millis() < 200 {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        assert!(super::own_cpu_ms() > before);
    }
}
