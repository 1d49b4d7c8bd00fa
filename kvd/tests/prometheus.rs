//! Every PromQL query docs/HTTP.md shows and every query of the Grafana dashboard
//! (docs/grafana/kvd-dashboard.json), against a real Prometheus (Debian's, which `.ci/run`
//! takes out of its package into target/tools) scraping a 2-node cluster and a replica
//! group of three on 127.0.0.1 every second: each must be valid and return data.
//! (The "errors by kind" query once failed with "vector cannot contain metrics with the
//! same labelset".)

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Kvd, free_port, kvd, start_at};

fn prometheus_binary() -> PathBuf {
    let tools = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tools/usr/bin/prometheus");
    if tools.exists() {
        return tools;
    }
    PathBuf::from("prometheus")
}

/// The PromQL lines of docs/HTTP.md's `promql` block (comments left out).
fn documented_queries() -> Vec<String> {
    let doc = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/HTTP.md")).unwrap();
    let block = doc.split("```promql").nth(1).expect("a promql block in docs/HTTP.md");
    let block = block.split("```").next().unwrap();
    block
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// Every panel query of the Grafana dashboard, with Grafana's own range variable
/// (`$__rate_interval`) as Grafana would fill it in for a short dashboard range.
fn dashboard_queries() -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/grafana/kvd-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut out = Vec::new();
    let panels = dashboard["panels"].as_array().expect("a panels list");
    for panel in panels {
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "{}: the dashboard's data source",
            panel["title"]
        );
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("a PromQL expr");
            out.push(expr.replace("$__rate_interval", "1m"));
        }
    }
    out
}

/// Runs `query` through Prometheus's HTTP API; the JSON answer.
fn query(web: &str, q: &str) -> serde_json::Value {
    let out = Command::new("curl")
        .args(["-s", "-G", &format!("http://{web}/api/v1/query"), "--data-urlencode"])
        .arg(format!("query={q}"))
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// Kills Prometheus when the test ends.
struct Guard(std::process::Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn every_documented_query_returns_data_from_a_real_prometheus() {
    let scratch = std::env::temp_dir().join(format!("kvd-prometheus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let mut nodes: Vec<Kvd> = Vec::new();
    let mut targets = Vec::new();
    // A 2-node cluster in memory.
    let bin: Vec<String> = (0..2).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    for (i, addr) in bin.iter().enumerate() {
        let http = format!("127.0.0.1:{}", free_port());
        let shard = format!("{i}/2");
        nodes.push(start_at(addr, &["--shard", &shard, "--http", &http]).0);
        targets.push(http);
    }
    // A replica group of three, durable.
    let members: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    for (i, addr) in members.iter().enumerate() {
        let http = format!("127.0.0.1:{}", free_port());
        let dir = scratch.join(format!("member-{i}")).display().to_string();
        nodes.push(
            start_at(
                addr,
                &["--data-dir", &dir, "--group", &members.join(","), "--http", &http],
            )
            .0,
        );
        targets.push(http);
    }
    let init = kvd(&["admin", "init-group", "--nodes", &members.join("|")]);
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));

    let web = format!("127.0.0.1:{}", free_port());
    let config = scratch.join("prometheus.yml");
    let list: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: kvd\n    static_configs:\n      - targets: [{}]\n",
            list.join(", ")
        ),
    )
    .unwrap();
    let prometheus = Command::new(prometheus_binary())
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", scratch.join("tsdb").display()))
        .arg(format!("--web.listen-address={web}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus is missing: .ci/run takes it out of Debian's prometheus package into target/tools/usr/bin");
    let _prometheus = Guard(prometheus);

    // Load for a few scrapes: puts and gets (hits) on both the cluster and the group.
    let cluster = bin.join(",");
    let group = members.join("|");
    let until = Instant::now() + Duration::from_secs(8);
    let mut round = 0;
    while Instant::now() < until && round < 200 {
        for nodes in [&cluster, &group] {
            let key = format!("k{}", round % 10);
            assert!(kvd(&["put", "--nodes", nodes, &key, "v"]).status.success());
            let _ = kvd(&["get", "--nodes", nodes, &key]);
        }
        round += 1;
    }
    // Every query: valid, and with data once the scrapes are in (waiting up to 20 s more).
    let documented = documented_queries();
    assert!(
        documented.len() >= 10,
        "the promql block of docs/HTTP.md: {documented:?}"
    );
    let dashboard = dashboard_queries();
    assert!(dashboard.len() >= 15, "the dashboard's queries: {dashboard:?}");
    for q in documented.into_iter().chain(dashboard) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let answer = query(&web, &q);
            let rows = answer["data"]["result"].as_array().map_or(0, Vec::len);
            if answer["status"] == "success" && rows > 0 {
                break;
            }
            assert!(answer["status"] != "error", "{q}: {answer}");
            assert!(Instant::now() < deadline, "{q} returned no data: {answer}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    drop(nodes);
    let _ = std::fs::remove_dir_all(&scratch);
}
