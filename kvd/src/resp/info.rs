//! `INFO [section]`: the node's figures under Redis's section and field names where the
//! meaning is the same (so dashboards and tools that read INFO find them), plus a few
//! `kvd_` fields of our own.

use std::fmt::Write;

use kvshared::stats::{GroupFigures, GroupRole};

use crate::node::Node;

/// Redis's name for a node's role: a replica group's leader, or a node in no group, is a
/// `master`; every other member (follower, learner, or one not yet or no longer in the
/// group) a `slave`, which answers no writes.
pub fn role(node: &Node) -> &'static str {
    redis_role(&node.group_figures())
}

fn redis_role(g: &GroupFigures) -> &'static str {
    match g.role {
        GroupRole::None | GroupRole::Leader => "master",
        GroupRole::Follower | GroupRole::Learner | GroupRole::Joining | GroupRole::Removed => "slave",
    }
}

/// INFO's replication section, from the group's figures: offsets are raft log indexes
/// (the leader's last entry; a member's applied index), `master_host`/`master_port` the
/// leader's kvd address (its binary port: kvd does not know the leader's `--resp` port).
fn replication(g: &GroupFigures) -> Vec<(&'static str, String)> {
    let mut fields = vec![("role", redis_role(g).to_string())];
    match redis_role(g) {
        "master" => {
            let replicas = g.members.len().saturating_sub(1) + g.learners.len();
            fields.push(("connected_slaves", replicas.to_string()));
            fields.push(("master_repl_offset", g.log_index.to_string()));
        }
        _ => {
            let (host, port) = g.leader.rsplit_once(':').unwrap_or(("", ""));
            fields.push(("master_host", host.trim_matches(['[', ']']).to_string()));
            fields.push(("master_port", port.to_string()));
            let up = if g.leader.is_empty() { "down" } else { "up" };
            fields.push(("master_link_status", up.to_string()));
            fields.push(("slave_repl_offset", g.applied_index.to_string()));
            fields.push(("slave_read_only", "1".to_string()));
            fields.push(("master_repl_offset", g.commit_index.to_string()));
        }
    }
    fields.push(("kvd_group_role", g.role.as_str().to_string()));
    fields.push(("kvd_term", g.term.to_string()));
    fields
}

/// The Redis version kvd reports where tools ask (the commands it answers behave as 7.0's).
pub const REDIS_VERSION: &str = "7.0.0";

/// What INFO says of the connection asking: its id, the RESP port, and whether the node
/// speaks Redis Cluster (`--resp-cluster`: redirects rather than forwards).
pub struct Here {
    /// The connection's id.
    pub client_id: u64,
    /// The RESP port it reached.
    pub port: u16,
    /// `--resp-cluster`: Redis Cluster's `cluster_enabled:1`, `redis_mode:cluster`.
    pub cluster: bool,
}

/// The INFO text for `section` (empty, `all`, `default` or `everything`: every section).
pub fn info(node: &Node, section: &[u8], here: &Here) -> String {
    let (client_id, port) = (here.client_id, here.port);
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
            ("redis_mode", if here.cluster { "cluster" } else { "standalone" }.into()),
            ("process_id", s.pid.to_string()),
            ("tcp_port", port.to_string()),
            ("uptime_in_seconds", (s.uptime_ms / 1000).to_string()),
            ("uptime_in_days", (s.uptime_ms / 86_400_000).to_string()),
        ],
    );
    put(
        "Clients",
        &[
            ("connected_clients", c.connections_open().to_string()),
            ("blocked_clients", "0".into()),
            ("kvd_client_id", client_id.to_string()),
        ],
    );
    put(
        "Memory",
        &[
            ("used_memory", s.memory_used_bytes.to_string()),
            ("used_memory_rss", s.system.process_rss_bytes.to_string()),
            ("maxmemory", s.max_memory_bytes.to_string()),
            ("maxmemory_policy", crate::node::redis_policy(&s.eviction).into()),
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
            (
                "instantaneous_ops_per_sec",
                format!("{:.0}", s.recent.reads_per_sec + s.recent.writes_per_sec),
            ),
            ("total_net_input_bytes", c.bytes_in.to_string()),
            ("total_net_output_bytes", c.bytes_out.to_string()),
            ("rejected_connections", c.conns_refused.to_string()),
            ("expired_keys", c.expired.to_string()),
            (
                "expire_cycle_cpu_milliseconds",
                (c.expire_cycle_microseconds / 1000).to_string(),
            ),
            ("evicted_keys", c.evicted.to_string()),
            ("keyspace_hits", c.hits.to_string()),
            ("keyspace_misses", c.misses.to_string()),
            ("total_error_replies", c.errors().to_string()),
        ],
    );
    put("Replication", &replication(&s.group));
    // Redis Cluster's tools (`redis-cli --cluster`) check this before anything else.
    put("Cluster", &[("cluster_enabled", u8::from(here.cluster).to_string())]);
    put(
        "Keyspace",
        &[("db0", format!("keys={},expires={},avg_ttl=0", s.keys, s.volatile_keys))],
    );
    out
}

/// `ROLE`, as Redis answers it: a master with its replicas (host, port, offset), or a
/// replica with its master (host, port, link state, offset). Addresses are kvd's binary
/// ports (see [`replication`]).
pub fn role_reply(node: &Node, out: &mut Vec<u8>) {
    use super::reply;
    let g = node.group_figures();
    let split = |addr: &str| -> (String, String) {
        let (host, port) = addr.rsplit_once(':').unwrap_or((addr, ""));
        (host.trim_matches(['[', ']']).to_string(), port.to_string())
    };
    if redis_role(&g) == "master" {
        let replicas: Vec<&String> = g
            .members
            .iter()
            .chain(&g.learners)
            .filter(|m| **m != g.leader)
            .collect();
        reply::array(out, 3);
        reply::bulk(out, b"master");
        reply::integer(out, g.log_index as i64);
        reply::array(out, replicas.len());
        for m in replicas {
            let behind = g.lag.iter().find(|l| l.addr == *m).map_or(0, |l| l.behind);
            let (host, port) = split(m);
            reply::array(out, 3);
            reply::bulk(out, host.as_bytes());
            reply::bulk(out, port.as_bytes());
            reply::bulk(out, g.log_index.saturating_sub(behind).to_string().as_bytes());
        }
    } else {
        let (host, port) = split(&g.leader);
        reply::array(out, 5);
        reply::bulk(out, b"slave");
        reply::bulk(out, host.as_bytes());
        reply::integer(out, port.parse().unwrap_or(0));
        reply::bulk(
            out,
            if g.leader.is_empty() {
                &b"connect"[..]
            } else {
                b"connected"
            },
        );
        reply::integer(out, g.applied_index as i64);
    }
}
