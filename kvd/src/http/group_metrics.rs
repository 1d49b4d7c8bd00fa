//! A replica group member's figures as metrics: its role (one `kvd_raft_role` series per
//! role, 1 for the one it has), term, log positions, elections, and on the leader each
//! follower's lag. A node in no group exports none of them.

use std::fmt::Write;

use kvshared::stats::{GroupRole, NodeStats};

use super::metrics::family;

/// The roles `kvd_raft_role` has a series for.
const ROLES: [GroupRole; 5] = [
    GroupRole::Leader,
    GroupRole::Follower,
    GroupRole::Learner,
    GroupRole::Joining,
    GroupRole::Removed,
];

/// Writes the group's metrics for a member (nothing for a node in no group).
pub fn render(out: &mut String, labels: &str, s: &NodeStats) {
    let g = &s.group;
    if g.role == GroupRole::None {
        return;
    }
    family(
        out,
        "kvd_raft_role",
        "gauge",
        "1 for this member's role in its replica group, 0 for the others.",
    );
    for role in ROLES {
        let _ = writeln!(
            out,
            "kvd_raft_role{{{labels},role=\"{}\"}} {}",
            role.as_str(),
            u8::from(g.role == role)
        );
    }
    let gauges: [(&str, &str, u64); 4] = [
        ("kvd_raft_term", "The raft term this member is in.", g.term),
        (
            "kvd_raft_last_log_index",
            "The last log entry this member holds.",
            g.log_index,
        ),
        (
            "kvd_raft_commit_index",
            "The last entry known committed (computed on the leader; the leader's last word on a follower).",
            g.commit_index,
        ),
        (
            "kvd_raft_applied_index",
            "The last log entry applied to this member's store.",
            g.applied_index,
        ),
    ];
    for (name, help, value) in gauges {
        family(out, name, "gauge", help);
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
    family(
        out,
        "kvd_raft_elections_total",
        "counter",
        "Elections (new terms) this member's process has seen.",
    );
    let _ = writeln!(out, "kvd_raft_elections_total{{{labels}}} {}", g.elections);
    family(
        out,
        "kvd_raft_leader_changes_total",
        "counter",
        "Times this member saw its group's leader change to another member.",
    );
    let _ = writeln!(out, "kvd_raft_leader_changes_total{{{labels}}} {}", g.leader_changes);
    family(
        out,
        "kvd_raft_read_index_rounds_total",
        "counter",
        "Read-index rounds this member ran as leader (none while its group has no other member).",
    );
    let _ = writeln!(
        out,
        "kvd_raft_read_index_rounds_total{{{labels}}} {}",
        g.read_index_rounds
    );
    if !g.lag.is_empty() {
        family(
            out,
            "kvd_raft_follower_lag_entries",
            "gauge",
            "On the leader: log entries each follower is behind.",
        );
        for l in &g.lag {
            let follower = l.addr.replace(['\\', '"', '\n'], "_");
            let _ = writeln!(
                out,
                "kvd_raft_follower_lag_entries{{{labels},follower=\"{follower}\"}} {}",
                l.behind
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_exports_its_role_and_positions_and_a_plain_node_none() {
        let mut s = NodeStats::default();
        let mut out = String::new();
        render(&mut out, "shard=\"0\",shards=\"1\"", &s);
        assert!(out.is_empty());
        s.group.role = GroupRole::Leader;
        s.group.term = 7;
        s.group.leader_changes = 2;
        s.group.lag = vec![kvshared::stats::FollowerLag {
            addr: "10.0.0.2:7070".into(),
            behind: 3,
        }];
        render(&mut out, "shard=\"0\",shards=\"1\"", &s);
        assert!(
            out.contains("kvd_raft_role{shard=\"0\",shards=\"1\",role=\"leader\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("kvd_raft_role{shard=\"0\",shards=\"1\",role=\"follower\"} 0\n"),
            "{out}"
        );
        assert!(out.contains("kvd_raft_term{shard=\"0\",shards=\"1\"} 7\n"), "{out}");
        assert!(
            out.contains("kvd_raft_leader_changes_total{shard=\"0\",shards=\"1\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("kvd_raft_follower_lag_entries{shard=\"0\",shards=\"1\",follower=\"10.0.0.2:7070\"} 3\n"),
            "{out}"
        );
    }
}
