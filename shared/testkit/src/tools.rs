//! The outside programs tests drive kvd with. `.ci/run` installs every one of them; a test
//! that needs one that is missing fails, saying how to get it: nothing is skipped in
//! silence.

use std::path::{Path, PathBuf};

/// The workspace's root directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root")
}

/// The Python with the pinned redis-py: `KV_PYTHON`, or the venv `.ci/run` makes in
/// `target/pyvenv`.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("KV_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = workspace_root().join("target/pyvenv/bin/python");
    assert!(
        venv.exists(),
        "this test needs redis-py: run `bash .ci/run` once (it makes target/pyvenv), or set KV_PYTHON to a Python with redis-py"
    );
    venv
}

/// The go-redis check program `.ci/run` builds from `kvd/tests/clients/goredis`.
pub fn goredis() -> PathBuf {
    let path = workspace_root().join("target/goredis-check");
    assert!(
        path.exists(),
        "this test needs the go-redis check: run `bash .ci/run` once (it builds target/goredis-check from kvd/tests/clients/goredis)"
    );
    path
}

/// `name` from `PATH` or from `target/tools/usr/bin` (where `.ci/run` unpacks Prometheus).
pub fn program(name: &str) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.push(workspace_root().join("target/tools/usr/bin"));
    dirs.into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("this test needs `{name}`: run `bash .ci/run` once, which installs it"))
}

/// Whether this process runs as root (network namespaces, cgroups, loop devices).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// For a test marked `#[ignore = "needs root ..."]`: fails at once, saying so, when it is
/// run (`--include-ignored`) without root.
pub fn require_root(what: &str) {
    assert!(
        is_root(),
        "{what} needs root (network namespaces, cgroups or loop devices): run it as root, as `.ci/run` does"
    );
}
