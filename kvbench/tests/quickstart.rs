//! `scripts/quickstart.sh` benchmarks only the cluster it started: with another kvd already
//! on its port it refuses (exit 2) and writes nothing into it; on free ports it loads and
//! runs. (It used to load 1M records into whatever listened there and exit 0.)

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn quickstart(bin_dir: &Path, port: u16, logs: &Path) -> std::process::Output {
    Command::new(repo_root().join("scripts/quickstart.sh"))
        .env("KV_NO_BUILD", "1")
        .env("KV_BIN_DIR", bin_dir)
        .env("KV_LOG_DIR", logs)
        .env("NODES", "1")
        .env("BASE_PORT", port.to_string())
        .env("RECORDS", "2000")
        .env("DURATION", "1s")
        .env_remove("KV_NODES")
        .args(["--threads", "1", "--tasks", "2"])
        .output()
        .unwrap()
}

#[test]
fn quickstart_refuses_a_cluster_it_did_not_start_and_runs_on_free_ports() {
    let kvd = kvtestkit::kvd::binary("kvd");
    let bin_dir = kvd.parent().unwrap().to_path_buf();
    let logs = kvtestkit::temp_dir("quickstart");
    let foreign = kvtestkit::kvd::start(&["--shard", "0/1", "--listen", &kvtestkit::addr()]);
    let addr = foreign.addr.clone();
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let keys = || -> String {
        let out = Command::new(&kvd)
            .args(["stats", "--nodes", &addr, "--json"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find(|l| l.trim_start().starts_with("\"keys\""))
            .unwrap_or("no keys line")
            .trim()
            .to_string()
    };
    assert_eq!(keys(), "\"keys\": 0,");
    let refused = quickstart(&bin_dir, port, logs.path());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("set BASE_PORT") || stderr.contains("not the ones this script started"),
        "{stderr}"
    );
    assert_eq!(
        keys(),
        "\"keys\": 0,",
        "quickstart wrote into a cluster it did not start"
    );
    drop(foreign);

    let ran = quickstart(&bin_dir, 0, logs.path());
    let stdout = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    assert!(stdout.contains("op/s"), "{stdout}");
}
