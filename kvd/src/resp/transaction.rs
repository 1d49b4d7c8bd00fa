//! Redis transactions: `MULTI` queues commands (answered `+QUEUED`), `EXEC` runs them as one
//! atomic batch on the node that owns their keys (the store's `Atomic` op: nothing of
//! another client comes between them; with a data dir, one log entry), `DISCARD` drops
//! them, `WATCH` makes `EXEC` answer null when a watched key's value changed meanwhile.
//!
//! As Redis: a command refused when queued (unknown, wrong arguments, bad options, a key
//! of another shard than the transaction's: `CROSSSLOT`) makes `EXEC` answer `EXECABORT`
//! and run nothing; a command that fails when it runs (`INCR` of text) answers its error in
//! `EXEC`'s array and the others still run. Limits: [`MAX_QUEUED`] commands,
//! [`MAX_QUEUED_BYTES`] of them, [`MAX_WATCHED`] watched keys.

use super::ctx::{CROSSSLOT, Ctx, Flow, wrong_args};
use super::errors::CommandError;
use super::parse::Args;
use super::pipeline::Pipeline;
use super::reply;
use super::tx_state::{Multi, Queue};

/// Most commands one transaction queues.
pub const MAX_QUEUED: usize = 4096;
/// Most bytes of queued commands (a transaction is one batch: it must fit in a frame).
pub const MAX_QUEUED_BYTES: usize = 4 << 20;
/// Most keys one connection watches.
pub const MAX_WATCHED: usize = 1024;

fn ok(p: &mut Pipeline) -> Flow {
    p.immediate(|o| reply::simple(o, "OK"));
    Flow::Go
}

fn refuse(p: &mut Pipeline, e: &str) -> Flow {
    p.immediate(|o| reply::error(o, e));
    Flow::Go
}

/// MULTI: queue the commands that follow.
pub(super) fn multi(ctx: &mut Ctx<'_>, _: &Args<'_>, p: &mut Pipeline) -> Flow {
    let tx = &mut ctx.session.tx;
    if tx.is_queuing() {
        return refuse(p, "ERR MULTI calls can not be nested");
    }
    tx.multi = Multi::Queuing(Queue::default());
    ok(p)
}

/// DISCARD: drop the queued commands and the watched keys.
pub(super) fn discard(ctx: &mut Ctx<'_>, _: &Args<'_>, p: &mut Pipeline) -> Flow {
    let tx = &mut ctx.session.tx;
    if !tx.is_queuing() {
        return refuse(p, "ERR DISCARD without MULTI");
    }
    tx.multi = Multi::Off;
    tx.watched.clear();
    ok(p)
}

/// UNWATCH: forget the watched keys.
pub(super) fn unwatch(ctx: &mut Ctx<'_>, _: &Args<'_>, p: &mut Pipeline) -> Flow {
    ctx.session.tx.watched.clear();
    ok(p)
}

/// EXEC (see [`exec`]).
pub(super) fn exec_cmd(ctx: &mut Ctx<'_>, _: &Args<'_>, p: &mut Pipeline) -> Flow {
    exec(ctx, p);
    Flow::Go
}

/// WATCH (see [`watch`]); refused inside MULTI.
pub(super) fn watch_cmd(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    if ctx.session.tx.is_queuing() {
        return refuse(p, "ERR WATCH inside MULTI is not allowed");
    }
    watch(ctx, args, p);
    Flow::Go
}

/// MSETNX (see [`msetnx`]); refused inside MULTI, which it then aborts.
pub(super) fn msetnx_cmd(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    if let Multi::Queuing(q) = &mut ctx.session.tx.multi {
        q.failed = true;
        return refuse(
            p,
            "ERR kvd does not run MSETNX inside MULTI (it is a transaction of its own)",
        );
    }
    msetnx(ctx, args, p);
    Flow::Go
}

/// Queues a command inside MULTI, or refuses it (and the transaction with it): `refused`
/// is what adding it alone to a scratch pipeline found (the dispatcher's), its keys' nodes
/// or the error it was answered with.
pub(super) fn queue(ctx: &mut Ctx<'_>, args: &Args<'_>, refused: Result<Vec<u32>, CommandError>, p: &mut Pipeline) {
    let Multi::Queuing(q) = &mut ctx.session.tx.multi else {
        return;
    };
    match refused {
        Err(e) => {
            q.failed = true;
            p.immediate(|o| reply::error(o, &e.to_string()));
        }
        Ok(owners) => {
            for o in owners {
                if *q.owner.get_or_insert(o) != o {
                    q.failed = true;
                    return p.immediate(|out| reply::error(out, CROSSSLOT));
                }
            }
            let command = args.to_owned();
            q.bytes += command.0.len() + 16 * command.1.len();
            q.commands.push(command);
            if q.commands.len() > MAX_QUEUED || q.bytes > MAX_QUEUED_BYTES {
                q.failed = true;
                q.commands.clear();
                let e = format!(
                    "ERR a kvd transaction holds at most {MAX_QUEUED} commands and {} MiB of them",
                    MAX_QUEUED_BYTES >> 20
                );
                return p.immediate(|o| reply::error(o, &e));
            }
            p.immediate(|o| reply::simple(o, "QUEUED"));
        }
    }
}

/// EXEC: the queued commands as one atomic batch to the node of their keys.
fn exec(ctx: &mut Ctx<'_>, p: &mut Pipeline) {
    let tx = &mut ctx.session.tx;
    let Multi::Queuing(q) = std::mem::take(&mut tx.multi) else {
        return p.immediate(|o| reply::error(o, "ERR EXEC without MULTI"));
    };
    let watched = std::mem::take(&mut tx.watched);
    if q.failed {
        return p.immediate(|o| reply::error(o, "EXECABORT Transaction discarded because of previous errors."));
    }
    let mut owner = q.owner;
    for (key, _) in &watched {
        let o = ctx.node.owner_of(key);
        if *owner.get_or_insert(o) != o {
            return p.immediate(|out| reply::error(out, CROSSSLOT));
        }
    }
    // Without --nodes nothing is forwarded: another node's keys abort it here.
    let owner = owner
        .filter(|_| ctx.forward)
        .unwrap_or(ctx.node.config().cluster.shard.index);
    p.begin_transaction(owner, &watched);
    // The dispatcher adds them to the batch now begun.
    ctx.session.tx.to_run = q.commands;
}

/// WATCH key...: reads each key in this round; `after_round` keeps what it found.
fn watch(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) {
    let tx = &mut ctx.session.tx;
    let keys: Vec<&[u8]> = args.rest(1).collect();
    if keys.is_empty() {
        return wrong_args(p, args.get(0));
    }
    if tx.watched.len() + keys.len() > MAX_WATCHED {
        let e = format!("ERR a kvd connection watches at most {MAX_WATCHED} keys");
        return p.immediate(|o| reply::error(o, &e));
    }
    tx.watching = keys.iter().map(|k| k.to_vec()).collect();
    p.watch(ctx.node, ctx.forward, &keys);
}

/// `MSETNX key value ...`: every key set, or none when any exists (answered 1 or 0): an
/// atomic batch of "absent" checks and puts, on one shard (else `CROSSSLOT`, as Redis
/// Cluster).
fn msetnx(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) {
    let n = args.len();
    if n < 3 || n.is_multiple_of(2) {
        return wrong_args(p, args.get(0));
    }
    let pairs: Vec<(&[u8], &[u8])> = (1..n).step_by(2).map(|i| (args.get(i), args.get(i + 1))).collect();
    let owners: Vec<u32> = pairs.iter().map(|(k, _)| ctx.node.owner_of(k)).collect();
    if owners.iter().any(|o| *o != owners[0]) {
        return p.immediate(|o| reply::error(o, CROSSSLOT));
    }
    let owner = Some(owners[0])
        .filter(|_| ctx.forward)
        .unwrap_or(ctx.node.config().cluster.shard.index);
    let absent: Vec<(Vec<u8>, [u8; 9])> = pairs
        .iter()
        .map(|(k, _)| (k.to_vec(), kvshared::wire::watch_value(None)))
        .collect();
    p.begin_set_if_none(owner, &absent);
    p.mset(ctx.node, ctx.forward, &pairs);
}
