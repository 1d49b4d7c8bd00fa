//! Redis Cluster on the RESP front: the `CLUSTER` subcommands (`SLOTS`, `SHARDS`, `NODES`,
//! `INFO`, `MYID`, `MYSHARDID`, `KEYSLOT`, `COUNTKEYSINSLOT`, `GETKEYSINSLOT`), `READONLY`,
//! `READWRITE`, `ASKING`, and, on a node started with `--resp-cluster`, the redirect a
//! command gets instead of running here: `-MOVED slot host:port` to its keys' master,
//! `-CROSSSLOT` when its keys are of several shards. docs/CLUSTER.md.

use std::fmt::Write;

use kvshared::routing::{SLOTS, key_slot};
use kvshared::slots::SlotState;

use super::ctx::{CROSSSLOT, Ctx, Reads, is, wrong_args};
use super::parse::Args;
use super::pipeline::Pipeline;
use super::reply::{self, Proto};
use crate::cluster_view::{MemberView, View};

/// Most keys `CLUSTER GETKEYSINSLOT` answers at once.
const MAX_KEYS_IN_SLOT: usize = 100_000;

/// In a Redis Cluster node: the error `args` gets instead of running here, or `None`; its
/// keys are the arguments at `keys`, and `write` says whether it changes data (both from
/// the command table).
pub fn redirect(ctx: &Ctx<'_>, args: &Args<'_>, keys: impl Iterator<Item = usize>, write: bool) -> Option<String> {
    let me = ctx.node.config().cluster.shard;
    let table = ctx.node.slot_table();
    let mut slot = None;
    for i in keys {
        let s = key_slot(args.get(i));
        match slot {
            None => slot = Some(s),
            Some(t) if table.owner(t) != table.owner(s) => return Some(CROSSSLOT.into()),
            Some(_) => {}
        }
    }
    let slot = slot?;
    let entry = table.get(slot);
    let owner = u32::from(entry.owner);
    if owner == me.index && entry.state != SlotState::Owned && (write || entry.state == SlotState::Importing) {
        // Being handed over: Redis's answer while a slot migrates, which clients retry.
        // (A slot still copied here while its source serves it names the source: MOVED
        // there below, as Redis's importing node answers a client that sent no ASKING.)
        return Some(super::errors::TRY_AGAIN.into());
    }
    let replica_read = ctx.session.reads == Reads::Replica && !write;
    if owner == me.index && (replica_read || ctx.node.serves_writes()) {
        return None;
    }
    let view = ctx.view.map(|v| v.get()).unwrap_or_default();
    match view.master(owner) {
        Some(m) if m.myself => None,
        Some(m) => m
            .resp
            .as_ref()
            .map(|(host, port)| format!("MOVED {slot} {host}:{port}")),
        None => Some("CLUSTERDOWN The cluster is down (the slot's master is not known yet)".into()),
    }
}

/// `CLUSTER <subcommand>`, `READONLY`, `READWRITE`, `ASKING`.
pub fn run(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) {
    let name = args.get(0);
    if !is(name, "CLUSTER") {
        let reads = match name {
            _ if is(name, "READONLY") => Reads::Replica,
            _ if is(name, "READWRITE") => Reads::Master,
            // No slot migrates yet: ASKING changes nothing.
            _ => ctx.session.reads,
        };
        ctx.session.reads = reads;
        return match args.len() {
            1 => p.immediate(|o| reply::simple(o, "OK")),
            _ => wrong_args(p, name),
        };
    }
    let view = ctx.view.map(|v| v.get()).unwrap_or_default();
    let (sub, n) = (args.get(1), args.len());
    let proto = p.proto();
    match sub {
        _ if is(sub, "KEYSLOT") && n == 3 => {
            let slot = i64::from(key_slot(args.get(2)));
            p.immediate(|o| reply::integer(o, slot))
        }
        _ if is(sub, "SLOTS") && n == 2 => p.immediate(|o| slots(&view, o)),
        _ if is(sub, "SHARDS") && n == 2 => p.immediate(|o| shards(&view, proto, o)),
        _ if is(sub, "NODES") && n == 2 => p.immediate(|o| reply::bulk(o, nodes(&view).as_bytes())),
        _ if is(sub, "INFO") && n == 2 => p.immediate(|o| reply::bulk(o, info(&view).as_bytes())),
        _ if (is(sub, "MYID") || is(sub, "MYSHARDID")) && n == 2 => {
            let id = match is(sub, "MYID") {
                true => myself(&view).map_or(String::new(), |m| m.id.clone()),
                false => shard_id(ctx.node.config().cluster.shard.index),
            };
            p.immediate(|o| reply::bulk(o, id.as_bytes()))
        }
        _ if is(sub, "COUNTKEYSINSLOT") && n == 3 => match slot_arg(args.get(2)) {
            Ok(slot) => {
                let (count, _) = ctx.node.keys_in_slot(slot, 0);
                p.immediate(|o| reply::integer(o, count as i64))
            }
            Err(e) => p.immediate(|o| reply::error(o, e)),
        },
        _ if is(sub, "GETKEYSINSLOT") && n == 4 => get_keys_in_slot(ctx, args, p),
        _ => {
            let shown = String::from_utf8_lossy(&sub[..sub.len().min(64)]).into_owned();
            p.immediate(|o| {
                reply::error(
                    o,
                    &format!("ERR unknown subcommand or wrong number of arguments for '{shown}'. Try CLUSTER HELP."),
                )
            })
        }
    }
}

fn slot_arg(arg: &[u8]) -> Result<u16, &'static str> {
    match kvshared::wire::decimal_i64(arg) {
        Some(s) if (0..i64::from(SLOTS)).contains(&s) => Ok(s as u16),
        _ => Err("ERR Invalid slot"),
    }
}

fn get_keys_in_slot(ctx: &Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) {
    let slot = match slot_arg(args.get(2)) {
        Ok(slot) => slot,
        Err(e) => return p.immediate(|o| reply::error(o, e)),
    };
    let count = match kvshared::wire::decimal_i64(args.get(3)) {
        Some(c) if c >= 0 => (c as usize).min(MAX_KEYS_IN_SLOT),
        _ => return p.immediate(|o| reply::error(o, "ERR Invalid number of keys")),
    };
    let (_, keys) = ctx.node.keys_in_slot(slot, count);
    p.immediate(|o| {
        reply::array(o, keys.len());
        for k in &keys {
            reply::bulk(o, k);
        }
    })
}

fn myself(view: &View) -> Option<&MemberView> {
    view.shards.iter().flat_map(|s| &s.members).find(|m| m.myself)
}

/// A shard's id for `CLUSTER SHARDS`/`MYSHARDID`: 40 hex digits from its index.
fn shard_id(shard: u32) -> String {
    format!("{shard:040x}")
}

/// `CLUSTER SLOTS`: per slot range, its master then its replicas, each `[host, port, id]`;
/// replicas without a RESP address or not answering are left out; a shard in an election is
/// listed under its last master (see `cluster_view`: every slot is listed at every moment).
fn slots(view: &View, o: &mut Vec<u8>) {
    let listed = |s: &&crate::cluster_view::ShardView| -> Vec<(String, u16, String)> {
        s.members
            .iter()
            .filter(|m| m.up || m.master)
            .filter_map(|m| m.resp.clone().map(|(h, p)| (h, p, m.id.clone())))
            .collect()
    };
    let ranges: Vec<_> = view
        .shards
        .iter()
        .filter(|s| view.listed_master(s).is_some())
        .flat_map(|s| s.slots.iter().map(move |r| (s, r)))
        .collect();
    reply::array(o, ranges.len());
    for (s, [first, last]) in ranges {
        let members = listed(&s);
        reply::array(o, 2 + members.len());
        reply::integer(o, i64::from(*first));
        reply::integer(o, i64::from(*last));
        for (host, port, id) in members {
            reply::array(o, 3);
            reply::bulk(o, host.as_bytes());
            reply::integer(o, i64::from(port));
            reply::bulk(o, id.as_bytes());
        }
    }
}

/// `CLUSTER SHARDS` (Redis 7): per shard its slots and its nodes, as maps.
fn shards(view: &View, proto: Proto, o: &mut Vec<u8>) {
    reply::array(o, view.shards.len());
    for s in &view.shards {
        reply::map(o, 2, proto);
        reply::bulk(o, b"slots");
        reply::array(o, 2 * s.slots.len());
        for [first, last] in &s.slots {
            reply::integer(o, i64::from(*first));
            reply::integer(o, i64::from(*last));
        }
        reply::bulk(o, b"nodes");
        let members: Vec<_> = s.members.iter().filter(|m| m.resp.is_some()).collect();
        reply::array(o, members.len());
        for m in members {
            let (host, port) = m.resp.clone().unwrap_or_default();
            reply::map(o, 7, proto);
            for (k, v) in [("id", m.id.as_str()), ("endpoint", &host), ("ip", &host)] {
                reply::bulk(o, k.as_bytes());
                reply::bulk(o, v.as_bytes());
            }
            reply::bulk(o, b"port");
            reply::integer(o, i64::from(port));
            reply::bulk(o, b"role");
            reply::bulk(o, if m.master { b"master" as &[u8] } else { b"replica" });
            reply::bulk(o, b"replication-offset");
            reply::integer(o, m.offset as i64);
            reply::bulk(o, b"health");
            reply::bulk(o, if m.up { b"online" as &[u8] } else { b"failed" });
        }
    }
}

/// `CLUSTER NODES`: one line per member, as Redis writes it.
fn nodes(view: &View) -> String {
    let mut text = String::new();
    for s in &view.shards {
        let master = view.listed_master(s).map(|m| m.id.clone());
        for m in &s.members {
            let Some((host, port)) = &m.resp else { continue };
            let mut flags = Vec::new();
            if m.myself {
                flags.push("myself");
            }
            flags.push(if m.master { "master" } else { "slave" });
            if !m.up {
                flags.push("fail");
            }
            let of = match (m.master, &master) {
                (false, Some(id)) => id.as_str(),
                _ => "-",
            };
            let link = if m.up { "connected" } else { "disconnected" };
            let epoch = m.config_epoch();
            let _ = write!(
                text,
                "{} {host}:{port}@0 {} {of} 0 0 {epoch} {link}",
                m.id,
                flags.join(",")
            );
            if m.master {
                for [first, last] in &s.slots {
                    match first == last {
                        true => {
                            let _ = write!(text, " {first}");
                        }
                        false => {
                            let _ = write!(text, " {first}-{last}");
                        }
                    }
                }
            }
            text.push('\n');
        }
    }
    text
}

/// `CLUSTER INFO`.
fn info(view: &View) -> String {
    let (listed, up) = (view.slots_listed(), view.slots_up());
    let current = view.current_epoch();
    let mine = myself(view).map_or(1, |m| m.config_epoch());
    let known = view.shards.iter().map(|s| s.members.len()).sum::<usize>();
    let state = if view.complete() { "ok" } else { "fail" };
    format!(
        "cluster_enabled:1\r\ncluster_state:{state}\r\ncluster_slots_assigned:{listed}\r\n\
         cluster_slots_ok:{up}\r\ncluster_slots_pfail:{}\r\ncluster_slots_fail:{}\r\n\
         cluster_known_nodes:{known}\r\ncluster_size:{}\r\ncluster_current_epoch:{current}\r\n\
         cluster_my_epoch:{mine}\r\ncluster_stats_messages_sent:0\r\ncluster_stats_messages_received:0\r\n",
        listed - up,
        u32::from(SLOTS) - listed,
        view.shards.len(),
    )
}
