//! `INFO [section]`: the node's figures under Redis's section and field names where the
//! meaning is the same (so dashboards and tools that read INFO find them), plus a few
//! `kvd_` fields of our own.

use std::fmt::Write;

use crate::node::Node;

/// The Redis version kvd reports where tools ask (the commands it answers behave as 7.0's).
pub const REDIS_VERSION: &str = "7.0.0";

/// The INFO text for `section` (empty, `all`, `default` or `everything`: every section).
pub fn info(node: &Node, section: &[u8], client_id: u64) -> String {
    let s = node.stats();
    let c = &s.counts;
    let want = |name: &str| {
        section.is_empty()
            || section.eq_ignore_ascii_case(name.as_bytes())
            || [&b"all"[..], b"default", b"everything"]
                .iter()
                .any(|w| section.eq_ignore_ascii_case(w))
    };
    let mut out = String::new();
    let mut put = |title: &str, fields: &[(&str, String)]| {
        if !want(&title.to_ascii_lowercase()) {
            return;
        }
        if !out.is_empty() {
            out.push_str("\r\n");
        }
        let _ = write!(out, "# {title}\r\n");
        for (k, v) in fields {
            let _ = write!(out, "{k}:{v}\r\n");
        }
    };
    put(
        "Server",
        &[
            ("redis_version", REDIS_VERSION.into()),
            ("kvd_version", s.version.clone()),
            ("kvd_shard", s.shard.to_string()),
            ("redis_mode", "standalone".into()),
            ("process_id", s.pid.to_string()),
            ("tcp_port", String::new()),
            ("uptime_in_seconds", (s.uptime_ms / 1000).to_string()),
            ("uptime_in_days", (s.uptime_ms / 86_400_000).to_string()),
        ],
    );
    put(
        "Clients",
        &[
            ("connected_clients", c.connections_open().to_string()),
            ("kvd_client_id", client_id.to_string()),
        ],
    );
    put(
        "Memory",
        &[
            ("used_memory", s.memory_used_bytes.to_string()),
            ("used_memory_rss", s.system.process_rss_bytes.to_string()),
            ("maxmemory", s.max_memory_bytes.to_string()),
            (
                "maxmemory_policy",
                match s.eviction.as_str() {
                    "lru" => "allkeys-lru",
                    "random" => "allkeys-random",
                    _ => "noeviction",
                }
                .into(),
            ),
            ("total_system_memory", s.system.host_mem_total_bytes.to_string()),
        ],
    );
    put(
        "Persistence",
        &[
            ("aof_enabled", u8::from(s.durability.is_durable()).to_string()),
            ("kvd_fsync", s.durability.mode.clone()),
            ("kvd_log_bytes", s.durability.log_bytes.to_string()),
            ("kvd_snapshot_index", s.durability.snapshot_index.to_string()),
        ],
    );
    put(
        "Stats",
        &[
            ("total_connections_received", c.conns_opened.to_string()),
            ("total_commands_processed", c.ops().to_string()),
            ("total_net_input_bytes", c.bytes_in.to_string()),
            ("total_net_output_bytes", c.bytes_out.to_string()),
            ("rejected_connections", c.conns_refused.to_string()),
            ("evicted_keys", c.evicted.to_string()),
            ("keyspace_hits", c.hits.to_string()),
            ("keyspace_misses", c.misses.to_string()),
            ("total_error_replies", c.errors().to_string()),
        ],
    );
    put(
        "Replication",
        &[("role", "master".into()), ("connected_slaves", "0".into())],
    );
    put("Keyspace", &[("db0", format!("keys={},expires=0,avg_ttl=0", s.keys))]);
    out
}
