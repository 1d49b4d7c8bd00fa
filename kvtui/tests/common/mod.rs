//! Helpers for the tests that run the real kvtui on a pseudo-terminal (util-linux `script`).

/// The children of `pid`, from `/proc/PID/task/*/children`.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| t.ok())
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// The pid of the kvtui process below `script` (pid `root`). `script -c` runs the command
/// through `$SHELL -c`, which may or may not exec it, so the kvtui process is looked for by
/// name among all descendants: signalling the shell instead would end `script` before kvtui
/// had written its restoring bytes.
pub fn kvtui_below(root: u32) -> Option<u32> {
    let mut todo = children_of(root);
    while let Some(pid) = todo.pop() {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "kvtui" {
            return Some(pid);
        }
        todo.extend(children_of(pid));
    }
    None
}
