//! Every PromQL query docs/HTTP.md shows and every query of the Grafana dashboard
//! (docs/grafana/kvd-dashboard.json), against a real Prometheus (Debian's, which `.ci/run`
//! takes out of its package into target/tools) scraping a 2-node cluster and a replica
//! group of three on 127.0.0.1 every second: each must be valid and return data.
//! (The "errors by kind" query once failed with "vector cannot contain metrics with the
//! same labelset".)

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use common::{AfterReady, HANG, Kvd, addr, kvd, start_at, temp_dir, until};

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
    let out = Command::new(kvtestkit::tools::program("curl"))
        .args(["-s", "-G", &format!("http://{web}/api/v1/query"), "--data-urlencode"])
        .arg(format!("query={q}"))
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// A real Prometheus scraping `targets` every second, on a port of its own choosing (read
/// from its "Listening on" line): the process and its web address.
fn prometheus(scratch: &std::path::Path, targets: &[String]) -> (kvtestkit::Server, String) {
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
    let mut command = Command::new(kvtestkit::tools::program("prometheus"));
    command
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", scratch.join("tsdb").display()))
        .arg("--web.listen-address=127.0.0.1:0")
        .stdout(Stdio::null());
    let listening = |l: &str| l.contains("msg=\"Listening on\"");
    let (server, ready) = kvtestkit::Server::start("prometheus", command, Vec::new(), listening, AfterReady::Read);
    let web = ready
        .line
        .rsplit("address=")
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    (server, web)
}

#[test]
fn every_documented_query_returns_data_from_a_real_prometheus() {
    let scratch = temp_dir("prometheus");
    let mut nodes: Vec<Kvd> = Vec::new();
    let mut targets = Vec::new();
    // A 2-node cluster in memory.
    let bin: Vec<String> = (0..2).map(|_| addr()).collect();
    for (i, at) in bin.iter().enumerate() {
        let http = addr();
        let shard = format!("{i}/2");
        nodes.push(start_at(at, &["--shard", &shard, "--http", &http]).0);
        targets.push(http);
    }
    // A replica group of three, durable.
    let members: Vec<String> = (0..3).map(|_| addr()).collect();
    for (i, at) in members.iter().enumerate() {
        let http = addr();
        let dir = scratch.path().join(format!("member-{i}")).display().to_string();
        nodes.push(
            start_at(
                at,
                &["--data-dir", &dir, "--group", &members.join(","), "--http", &http],
            )
            .0,
        );
        targets.push(http);
    }
    let init = kvd(&["admin", "init-group", "--nodes", &members.join("|")]);
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    let (_prometheus, web) = prometheus(scratch.path(), &targets);

    // Load, until every query has data: puts and gets (hits) on both the cluster and the
    // group (bounded by HANG).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (cluster, group, stop) = (bin.join(","), members.join("|"), stop.clone());
        std::thread::spawn(move || {
            let until = Instant::now() + HANG;
            let mut round = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until {
                for nodes in [&cluster, &group] {
                    let key = format!("k{}", round % 10);
                    assert!(kvd(&["put", "--nodes", nodes, &key, "v"]).status.success());
                    let _ = kvd(&["get", "--nodes", nodes, &key]);
                }
                round += 1;
            }
        })
    };
    // Every query: valid, and with data once the scrapes are in.
    let documented = documented_queries();
    assert!(
        documented.len() >= 10,
        "the promql block of docs/HTTP.md: {documented:?}"
    );
    let dashboard = dashboard_queries();
    assert!(dashboard.len() >= 15, "the dashboard's queries: {dashboard:?}");
    for q in documented.into_iter().chain(dashboard) {
        until(&format!("{q} to return data"), HANG, || {
            let answer = query(&web, &q);
            let rows = answer["data"]["result"].as_array().map_or(0, Vec::len);
            assert!(answer["status"] != "error", "{q}: {answer}");
            if answer["status"] == "success" && rows > 0 {
                Ok(())
            } else {
                Err(answer)
            }
        });
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    load.join().unwrap();
    drop(nodes);
}
