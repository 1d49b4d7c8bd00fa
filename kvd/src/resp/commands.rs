//! The Redis commands kvd answers, and what each becomes: ops in the pipeline's batch, or
//! a reply written at once. Anything else is `-ERR unknown command`, and the connection goes on.

use kvshared::wire::decimal_i64;

use super::ctx::{Ctx, Flow, Session, is, refuse, wrong_args};
use super::errors::CommandError;
use super::expiry;
use super::info::REDIS_VERSION;
use super::parse::Args;
use super::pipeline::{Pipeline, ReadShape, TtlShape};
use super::reply::{self, Proto};
use crate::node::Node;

/// Adds `reply` as the command's answer at once.
fn answer(p: &mut Pipeline, write: impl FnOnce(&mut Vec<u8>)) -> Flow {
    p.immediate(write);
    Flow::Go
}

fn error(p: &mut Pipeline, text: &str) -> Flow {
    answer(p, |o| reply::error(o, text))
}

pub(super) fn get(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    p.get(ctx.node, ctx.forward, args.get(1));
    Flow::Go
}

pub(super) fn set(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    expiry::set(ctx, args, p);
    Flow::Go
}

pub(super) fn setex(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    expiry::setex(ctx, args, p, is(args.get(0), "PSETEX"));
    Flow::Go
}

pub(super) fn expire(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    expiry::expire(ctx, args, p);
    Flow::Go
}

/// TTL, PTTL, EXPIRETIME, PEXPIRETIME (the shape by name).
pub(super) fn ttl(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    let name = args.get(0);
    let shape = match name {
        _ if is(name, "PTTL") => TtlShape::Millis,
        _ if is(name, "EXPIRETIME") => TtlShape::AtSeconds,
        _ if is(name, "PEXPIRETIME") => TtlShape::AtMillis,
        _ => TtlShape::Seconds,
    };
    expiry::ttl(ctx, args, p, shape);
    Flow::Go
}

pub(super) fn persist(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    expiry::persist(ctx, args, p);
    Flow::Go
}

pub(super) fn getex(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    expiry::getex(ctx, args, p);
    Flow::Go
}

pub(super) fn setnx(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    p.setnx(ctx.node, ctx.forward, args.get(1), args.get(2));
    Flow::Go
}

pub(super) fn append(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    p.append(ctx.node, ctx.forward, args.get(1), args.get(2));
    Flow::Go
}

pub(super) fn setrange(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    set_range(ctx.node, ctx.forward, args, p);
    Flow::Go
}

/// INCR and DECR.
pub(super) fn incr(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    let by = if is(args.get(0), "INCR") { 1 } else { -1 };
    p.incr_by(ctx.node, ctx.forward, args.get(1), by);
    Flow::Go
}

/// INCRBY and DECRBY.
pub(super) fn incrby(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    let Some(by) = decimal_i64(args.get(2)) else {
        return error(p, &CommandError::NotAnInteger.to_string());
    };
    if is(args.get(0), "INCRBY") {
        p.incr_by(ctx.node, ctx.forward, args.get(1), by);
        return Flow::Go;
    }
    // DECRBY of i64::MIN has no negation: Redis refuses it the same way.
    match by.checked_neg() {
        Some(neg) => p.incr_by(ctx.node, ctx.forward, args.get(1), neg),
        None => return error(p, "ERR decrement would overflow"),
    }
    Flow::Go
}

pub(super) fn incrbyfloat(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    match kvshared::wire::decimal_f64(args.get(2)) {
        Some(by) => p.incr_by_float(ctx.node, ctx.forward, args.get(1), by),
        // Redis: `inf` and `nan` are floats, and an increment by one would make the value
        // NaN or infinite.
        None if std::str::from_utf8(args.get(2)).is_ok_and(|t| t.trim().parse::<f64>().is_ok()) => {
            return error(p, "ERR increment would produce NaN or Infinity");
        }
        None => return error(p, "ERR value is not a valid float"),
    }
    Flow::Go
}

pub(super) fn getdel(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    p.getdel(ctx.node, ctx.forward, args.get(1));
    Flow::Go
}

pub(super) fn strlen(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    p.read_of(ctx.node, ctx.forward, args.get(1), ReadShape::Strlen);
    Flow::Go
}

pub(super) fn type_of(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    p.read_of(ctx.node, ctx.forward, args.get(1), ReadShape::Type);
    Flow::Go
}

/// GETRANGE and SUBSTR.
pub(super) fn getrange(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    match (decimal_i64(args.get(2)), decimal_i64(args.get(3))) {
        (Some(start), Some(end)) => p.read_of(ctx.node, ctx.forward, args.get(1), ReadShape::Range(start, end)),
        _ => return error(p, &CommandError::NotAnInteger.to_string()),
    }
    Flow::Go
}

pub(super) fn getset(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    p.set(ctx.node, ctx.forward, args.get(1), args.get(2), true);
    Flow::Go
}

/// DEL and UNLINK (deletes), EXISTS and TOUCH (counts of keys present).
pub(super) fn count(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    let name = args.get(0);
    let keys: Vec<&[u8]> = args.rest(1).collect();
    p.count(ctx.node, ctx.forward, &keys, is(name, "DEL") || is(name, "UNLINK"));
    Flow::Go
}

pub(super) fn mget(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    let keys: Vec<&[u8]> = args.rest(1).collect();
    p.mget(ctx.node, ctx.forward, &keys);
    Flow::Go
}

pub(super) fn mset(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    let n = args.len();
    if n.is_multiple_of(2) {
        wrong_args(p, args.get(0));
        return Flow::Go;
    }
    let pairs: Vec<(&[u8], &[u8])> = (1..n).step_by(2).map(|i| (args.get(i), args.get(i + 1))).collect();
    p.mset(ctx.node, ctx.forward, &pairs);
    Flow::Go
}

pub(super) fn ping(_: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    match args.len() {
        1 => answer(p, |o| reply::simple(o, "PONG")),
        2 => answer(p, |o| reply::bulk(o, args.get(1))),
        _ => {
            wrong_args(p, args.get(0));
            Flow::Go
        }
    }
}

pub(super) fn echo(_: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    answer(p, |o| reply::bulk(o, args.get(1)))
}

pub(super) fn quit(_: &mut Ctx<'_>, _: &Args<'_>, p: &mut Pipeline) -> Flow {
    p.immediate(|o| reply::simple(o, "OK"));
    Flow::Close
}

pub(super) fn select(_: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    match args.get(1) {
        b"0" => answer(p, |o| reply::simple(o, "OK")),
        _ => error(p, "ERR DB index is out of range (kvd has one database, 0)"),
    }
}

/// SCAN, KEYS, DBSIZE, RANDOMKEY, FLUSHALL, FLUSHDB.
pub(super) fn keyspace(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    super::keyspace_args::parse(ctx, args, p);
    Flow::Go
}

/// RENAME and RENAMENX.
pub(super) fn rename_cmd(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    let nx = is(args.get(0), "RENAMENX");
    rename(ctx, args, p, nx);
    Flow::Go
}

pub(super) fn object(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    match args.len() {
        3 if is(args.get(1), "ENCODING") => p.encoding(ctx.node, ctx.forward, args.get(2)),
        _ => return error(p, "ERR kvd answers OBJECT ENCODING <key> only"),
    }
    Flow::Go
}

pub(super) fn memory(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    let usage = is(args.get(1), "USAGE");
    match args.len() {
        5 if usage && is(args.get(3), "SAMPLES") => match decimal_i64(args.get(4)) {
            Some(count) if count >= 0 => p.memory_usage(ctx.node, ctx.forward, args.get(2)),
            Some(_) => return error(p, &CommandError::Syntax.to_string()),
            None => return error(p, &CommandError::NotAnInteger.to_string()),
        },
        3 if usage => p.memory_usage(ctx.node, ctx.forward, args.get(2)),
        _ => return error(p, "ERR kvd answers MEMORY USAGE <key> [SAMPLES <count>] only"),
    }
    Flow::Go
}

/// TIME: the server's clock, as Redis answers it (seconds and microseconds, as text).
pub(super) fn time(_: &mut Ctx<'_>, _: &Args<'_>, p: &mut Pipeline) -> Flow {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let (secs, micros) = (now.as_secs().to_string(), now.subsec_micros().to_string());
    answer(p, |o| {
        reply::array(o, 2);
        reply::bulk(o, secs.as_bytes());
        reply::bulk(o, micros.as_bytes());
    })
}

pub(super) fn role(ctx: &mut Ctx<'_>, _: &Args<'_>, p: &mut Pipeline) -> Flow {
    answer(p, |o| super::info::role_reply(ctx.node, o))
}

pub(super) fn info(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    let here = super::info::Here {
        client_id: ctx.session.id,
        port: ctx.port,
        cluster: ctx.redirect,
    };
    let text = super::info::info(ctx.node, args.get(1), &here);
    answer(p, |o| reply::bulk(o, text.as_bytes()))
}

pub(super) fn config_cmd(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    config(ctx.node, args, p);
    Flow::Go
}

pub(super) fn client_cmd(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    client(ctx.session, args, p);
    Flow::Go
}

/// CLUSTER, READONLY, READWRITE, ASKING.
pub(super) fn cluster(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    super::cluster::run(ctx, args, p);
    Flow::Go
}

pub(super) fn auth_cmd(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    let n = args.len();
    auth(ctx, args.get(n.saturating_sub(1)), n, p);
    Flow::Go
}

pub(super) fn hello_cmd(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    hello(ctx, args, p);
    Flow::Go
}

/// RENAME / RENAMENX key newkey: both keys must be of one node (else `CROSSSLOT`, as
/// Redis Cluster); outside MULTI it runs as an atomic batch of its own.
fn rename(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline, nx: bool) {
    let (from, to) = (args.get(1), args.get(2));
    let owner = ctx.node.owner_of(from);
    if owner != ctx.node.owner_of(to) {
        return p.immediate(|o| reply::error(o, super::ctx::CROSSSLOT));
    }
    if !p.in_transaction() && !ctx.session.tx.is_queuing() {
        p.begin_alone(
            Some(owner)
                .filter(|_| ctx.forward)
                .unwrap_or(ctx.node.config().cluster.shard.index),
        );
    }
    p.rename(ctx.node, ctx.forward, from, to, nx);
}

/// SETRANGE key offset value, with Redis's refusals: an offset that is not a non-negative
/// integer, and a result longer than the largest value (512 MiB, or kvd's `--max-frame`
/// when smaller: a longer value could not be read back), checked before anything is sent.
fn set_range(node: &Node, forward: bool, args: &Args<'_>, p: &mut Pipeline) {
    let Some(offset) = decimal_i64(args.get(2)) else {
        return refuse(p, &CommandError::NotAnInteger);
    };
    let Ok(offset) = u64::try_from(offset) else {
        return p.immediate(|o| reply::error(o, "ERR offset is out of range"));
    };
    let value = args.get(3);
    let max = kvshared::wire::MAX_STRING.min(u64::from(node.config().edge.max_frame));
    if !value.is_empty() && offset.saturating_add(value.len() as u64) > max {
        return p.immediate(|o| reply::error(o, "ERR string exceeds maximum allowed size (proto-max-bulk-len)"));
    }
    p.set_range(node, forward, args.get(1), offset, value);
}

/// CONFIG GET pattern: the few settings benchmark tools ask for at start.
fn config(node: &Node, args: &Args<'_>, p: &mut Pipeline) {
    if !is(args.get(1), "GET") || args.len() != 3 {
        return p.immediate(|o| {
            reply::error(
                o,
                "ERR kvd answers only CONFIG GET <name> (settings are flags; see kvd --help)",
            )
        });
    }
    let durable = node.config().durability.is_some();
    let stats = node.stats();
    let max_memory = stats.max_memory_bytes.to_string();
    let policy = crate::node::redis_policy(&stats.eviction).to_string();
    let settings: [(&str, String); 5] = [
        ("save", String::new()),
        ("appendonly", if durable { "yes" } else { "no" }.into()),
        ("maxmemory", max_memory),
        ("maxmemory-policy", policy),
        ("databases", "1".into()),
    ];
    let pattern = args.get(2);
    let hits: Vec<&(&str, String)> = settings
        .iter()
        .filter(|(name, _)| pattern == b"*" || is(pattern, name))
        .collect();
    let proto = p.proto();
    p.immediate(|o| {
        reply::map(o, hits.len(), proto);
        for (name, value) in hits {
            reply::bulk(o, name.as_bytes());
            reply::bulk(o, value.as_bytes());
        }
    });
}

/// Redis's refusal of a client name (CLIENT SETNAME and HELLO ... SETNAME alike).
const BAD_CLIENT_NAME: &str = "ERR Client names cannot contain spaces, newlines or special characters.";

/// Whether `name` holds a space, a control byte or a byte past `~` (Redis refuses those).
fn bad_client_name(name: &[u8]) -> bool {
    name.iter().any(|&b| b <= b' ' || b > b'~')
}

/// CLIENT SETNAME / GETNAME / ID / INFO / SETINFO.
fn client(s: &mut Session, args: &Args<'_>, p: &mut Pipeline) {
    let sub = args.get(1);
    if is(sub, "SETNAME") && args.len() == 3 {
        let name = args.get(2);
        if bad_client_name(name) {
            return p.immediate(|o| reply::error(o, BAD_CLIENT_NAME));
        }
        s.name = name.to_vec();
        p.immediate(|o| reply::simple(o, "OK"));
    } else if is(sub, "SETINFO") && args.len() == 4 && (is(args.get(2), "LIB-NAME") || is(args.get(2), "LIB-VER")) {
        // Client libraries say who they are (redis-py, go-redis); kvd only acknowledges it.
        p.immediate(|o| reply::simple(o, "OK"));
    } else if is(sub, "GETNAME") {
        let name = s.name.clone();
        let proto = p.proto();
        p.immediate(|o| {
            if name.is_empty() {
                reply::null(o, proto)
            } else {
                reply::bulk(o, &name)
            }
        });
    } else if is(sub, "ID") {
        let id = s.id as i64;
        p.immediate(|o| reply::integer(o, id));
    } else if is(sub, "INFO") {
        let text = format!(
            "id={} addr={} name={} db=0 resp={}\n",
            s.id,
            s.peer,
            String::from_utf8_lossy(&s.name),
            p.proto().number()
        );
        p.immediate(|o| reply::bulk(o, text.as_bytes()));
    } else {
        p.immediate(|o| reply::error(o, "ERR kvd answers CLIENT SETNAME, GETNAME, ID, INFO and SETINFO only"));
    }
}

/// AUTH [user] token: the node's `--auth-token-file` token.
fn auth(ctx: &mut Ctx<'_>, token: &[u8], n: usize, p: &mut Pipeline) {
    if !(2..=3).contains(&n) {
        return wrong_args(p, b"auth");
    }
    if !ctx.auth.needs_token() {
        return p.immediate(|o| {
            reply::error(
                o,
                "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
            )
        });
    }
    if ctx.auth.present(token) {
        p.immediate(|o| reply::simple(o, "OK"));
    } else {
        p.immediate(|o| reply::error(o, "WRONGPASS invalid username-password pair or user is disabled."));
    }
}

/// HELLO [protover [AUTH user token] [SETNAME name]]: RESP2 or RESP3, as Redis 7.
fn hello(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) {
    let proto = match args.get(1) {
        b"" => p.proto(),
        b"2" => Proto::Resp2,
        b"3" => Proto::Resp3,
        v if std::str::from_utf8(v).is_ok_and(|v| v.parse::<i64>().is_ok()) => {
            return p.immediate(|o| reply::error(o, "NOPROTO unsupported protocol version"));
        }
        _ => {
            return p.immediate(|o| reply::error(o, "ERR Protocol version is not an integer or out of range"));
        }
    };
    let mut i = 2;
    let mut name = None;
    while i < args.len() {
        if is(args.get(i), "AUTH") && i + 2 < args.len() {
            if ctx.auth.needs_token() && !ctx.auth.present(args.get(i + 2)) {
                return p
                    .immediate(|o| reply::error(o, "WRONGPASS invalid username-password pair or user is disabled."));
            }
            i += 3;
        } else if is(args.get(i), "SETNAME") && i + 1 < args.len() {
            if bad_client_name(args.get(i + 1)) {
                return p.immediate(|o| reply::error(o, BAD_CLIENT_NAME));
            }
            name = Some(args.get(i + 1).to_vec());
            i += 2;
        } else {
            let option = String::from_utf8_lossy(args.get(i)).into_owned();
            return p.immediate(|o| reply::error(o, &format!("ERR Syntax error in HELLO option '{option}'")));
        }
    }
    if !ctx.auth.admitted() {
        ctx.auth.refused();
        return p.immediate(|o| reply::error(o, "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time"));
    }
    if let Some(name) = name {
        ctx.session.name = name;
    }
    p.switch(proto);
    let id = ctx.session.id as i64;
    let role = super::info::role(ctx.node);
    p.immediate(|o| {
        reply::map(o, 7, proto);
        for (k, v) in [("server", "redis"), ("version", REDIS_VERSION)] {
            reply::bulk(o, k.as_bytes());
            reply::bulk(o, v.as_bytes());
        }
        reply::bulk(o, b"proto");
        reply::integer(o, proto.number());
        reply::bulk(o, b"id");
        reply::integer(o, id);
        for (k, v) in [("mode", "standalone"), ("role", role)] {
            reply::bulk(o, k.as_bytes());
            reply::bulk(o, v.as_bytes());
        }
        reply::bulk(o, b"modules");
        reply::array(o, 0);
    });
}
