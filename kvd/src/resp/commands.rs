//! The Redis commands kvd answers, and what each becomes: ops in the pipeline's batch, or
//! a reply written at once. Anything else is `-ERR unknown command`, and the connection goes on.

use kvshared::wire::decimal_i64;

use super::expiry;
use super::info::REDIS_VERSION;
use super::parse::Args;
use super::pipeline::{Pipeline, ReadShape, TtlShape};
use super::reply::{self, Proto};
use super::transaction::TxState;
use crate::edge::conn::Auth;
use crate::node::Node;

/// What a connection remembers between commands.
pub struct Session {
    id: u64,
    peer: String,
    name: Vec<u8>,
    /// MULTI's queue and WATCH's keys.
    pub(super) tx: TxState,
    /// READONLY or READWRITE (Redis Cluster).
    pub(super) reads: super::cluster::Reads,
}

impl Session {
    /// A new connection's session.
    pub fn new(id: u64, peer: String) -> Session {
        Session {
            id,
            peer,
            name: Vec::new(),
            tx: TxState::default(),
            reads: Default::default(),
        }
    }

    /// Whether the command named `name` runs in a round of its own (EXEC, WATCH, the
    /// keyspace commands, RENAME).
    pub fn own_round(&self, name: &[u8]) -> bool {
        self.tx.own_round(name)
            || (!self.tx.is_queuing()
                && (super::keyspace::is_keyspace(name) || is(name, "RENAME") || is(name, "RENAMENX")))
    }

    /// After a round: keeps what a WATCH in it found.
    pub fn after_round(&mut self, p: &Pipeline) {
        self.tx.after_round(p);
    }

    /// Bytes the session holds (queued commands, watched keys).
    pub fn held_bytes(&self) -> usize {
        self.tx.held_bytes()
    }
}

/// What a command may use: the node, whether other shards' keys are forwarded (or, in a
/// Redis Cluster node, redirected), the connection's session and its standing with the token.
pub struct Ctx<'a> {
    pub node: &'a Node,
    pub forward: bool,
    /// `--resp-cluster`: a command for another shard's keys is answered `-MOVED`.
    pub redirect: bool,
    /// The cluster as this node sees it (CLUSTER SLOTS, MOVED's addresses).
    pub view: Option<&'a crate::cluster_view::ClusterView>,
    pub session: &'a mut Session,
    pub auth: Auth<'a>,
    /// The port this node serves RESP on (INFO's `tcp_port`).
    pub port: u16,
}

pub(super) fn is(arg: &[u8], name: &str) -> bool {
    arg.eq_ignore_ascii_case(name.as_bytes())
}

pub(super) fn wrong_args(p: &mut Pipeline, name: &[u8]) {
    let name = String::from_utf8_lossy(name).to_ascii_lowercase();
    p.immediate(|o| reply::error(o, &format!("ERR wrong number of arguments for '{name}' command")));
}

/// Adds one command to the pipeline; true when the connection closes after the replies.
pub fn dispatch(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> bool {
    let name = args.get(0);
    if !ctx.auth.admitted() && !is(name, "AUTH") && !is(name, "HELLO") && !is(name, "QUIT") {
        ctx.auth.refused();
        p.immediate(|o| reply::error(o, "NOAUTH Authentication required."));
        return false;
    }
    if ctx.redirect
        && !ctx.session.tx.is_queuing()
        && let Some(e) = super::cluster::redirect(ctx, args)
    {
        if e.starts_with("MOVED") {
            ctx.node
                .counters
                .add(ctx.session.id, kvshared::stats::Counter::Moved, 1);
        }
        p.immediate(|o| reply::error(o, &e));
        return false;
    }
    if super::transaction::handle(ctx, args, p) {
        return false;
    }
    run(ctx, args, p)
}

/// Adds one command (not a transaction's: see `transaction`) to the pipeline; true when
/// the connection closes after the replies.
pub(super) fn run(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> bool {
    let name = args.get(0);
    let n = args.len();
    let (node, forward) = (ctx.node, ctx.forward);
    match name {
        _ if is(name, "GET") => match n {
            2 => p.get(node, forward, args.get(1)),
            _ => wrong_args(p, name),
        },
        _ if is(name, "SET") => expiry::set(ctx, args, p),
        _ if is(name, "SETEX") || is(name, "PSETEX") => expiry::setex(ctx, args, p, is(name, "PSETEX")),
        _ if ["EXPIRE", "PEXPIRE", "EXPIREAT", "PEXPIREAT"]
            .iter()
            .any(|c| is(name, c)) =>
        {
            expiry::expire(ctx, args, p)
        }
        _ if is(name, "TTL") => expiry::ttl(ctx, args, p, TtlShape::Seconds),
        _ if is(name, "PTTL") => expiry::ttl(ctx, args, p, TtlShape::Millis),
        _ if is(name, "EXPIRETIME") => expiry::ttl(ctx, args, p, TtlShape::AtSeconds),
        _ if is(name, "PEXPIRETIME") => expiry::ttl(ctx, args, p, TtlShape::AtMillis),
        _ if is(name, "PERSIST") => expiry::persist(ctx, args, p),
        _ if is(name, "GETEX") => expiry::getex(ctx, args, p),
        _ if is(name, "SETNX") => match n {
            3 => p.setnx(node, forward, args.get(1), args.get(2)),
            _ => wrong_args(p, name),
        },
        _ if is(name, "APPEND") => match n {
            3 => p.append(node, forward, args.get(1), args.get(2)),
            _ => wrong_args(p, name),
        },
        _ if is(name, "SETRANGE") => match n {
            4 => set_range(node, forward, args, p),
            _ => wrong_args(p, name),
        },
        _ if is(name, "INCR") || is(name, "DECR") => match n {
            2 => p.incr_by(node, forward, args.get(1), if is(name, "INCR") { 1 } else { -1 }),
            _ => wrong_args(p, name),
        },
        _ if is(name, "INCRBY") || is(name, "DECRBY") => match (n, decimal_i64(args.get(2))) {
            (3, Some(by)) if is(name, "INCRBY") => p.incr_by(node, forward, args.get(1), by),
            // DECRBY of i64::MIN has no negation: Redis refuses it the same way.
            (3, Some(by)) => match by.checked_neg() {
                Some(neg) => p.incr_by(node, forward, args.get(1), neg),
                None => p.immediate(|o| reply::error(o, "ERR decrement would overflow")),
            },
            (3, None) => p.immediate(|o| reply::error(o, "ERR value is not an integer or out of range")),
            _ => wrong_args(p, name),
        },
        _ if is(name, "INCRBYFLOAT") => match (n, kvshared::wire::decimal_f64(args.get(2))) {
            (3, Some(by)) => p.incr_by_float(node, forward, args.get(1), by),
            // Redis: `inf` and `nan` are floats, and an increment by one would make the
            // value NaN or infinite.
            (3, None) if std::str::from_utf8(args.get(2)).is_ok_and(|t| t.trim().parse::<f64>().is_ok()) => {
                p.immediate(|o| reply::error(o, "ERR increment would produce NaN or Infinity"))
            }
            (3, None) => p.immediate(|o| reply::error(o, "ERR value is not a valid float")),
            _ => wrong_args(p, name),
        },
        _ if is(name, "GETDEL") => match n {
            2 => p.getdel(node, forward, args.get(1)),
            _ => wrong_args(p, name),
        },
        _ if is(name, "STRLEN") => match n {
            2 => p.read_of(node, forward, args.get(1), ReadShape::Strlen),
            _ => wrong_args(p, name),
        },
        _ if is(name, "TYPE") => match n {
            2 => p.read_of(node, forward, args.get(1), ReadShape::Type),
            _ => wrong_args(p, name),
        },
        _ if is(name, "GETRANGE") || is(name, "SUBSTR") => {
            let bounds = (decimal_i64(args.get(2)), decimal_i64(args.get(3)));
            match (n, bounds) {
                (4, (Some(start), Some(end))) => p.read_of(node, forward, args.get(1), ReadShape::Range(start, end)),
                (4, _) => p.immediate(|o| reply::error(o, "ERR value is not an integer or out of range")),
                _ => wrong_args(p, name),
            }
        }
        _ if is(name, "GETSET") => match n {
            3 => p.set(node, forward, args.get(1), args.get(2), true),
            _ => wrong_args(p, name),
        },
        _ if is(name, "DEL") || is(name, "UNLINK") || is(name, "EXISTS") || is(name, "TOUCH") => match n {
            1 => wrong_args(p, name),
            _ => {
                let keys: Vec<&[u8]> = args.rest(1).collect();
                p.count(node, forward, &keys, is(name, "DEL") || is(name, "UNLINK"));
            }
        },
        _ if is(name, "MGET") => match n {
            1 => wrong_args(p, name),
            _ => {
                let keys: Vec<&[u8]> = args.rest(1).collect();
                p.mget(node, forward, &keys);
            }
        },
        _ if is(name, "MSET") => match n {
            _ if n < 3 || n.is_multiple_of(2) => wrong_args(p, name),
            _ => {
                let pairs: Vec<(&[u8], &[u8])> = (1..n).step_by(2).map(|i| (args.get(i), args.get(i + 1))).collect();
                p.mset(node, forward, &pairs);
            }
        },
        _ if is(name, "PING") => match n {
            1 => p.immediate(|o| reply::simple(o, "PONG")),
            2 => p.immediate(|o| reply::bulk(o, args.get(1))),
            _ => wrong_args(p, name),
        },
        _ if is(name, "ECHO") => match n {
            2 => p.immediate(|o| reply::bulk(o, args.get(1))),
            _ => wrong_args(p, name),
        },
        _ if is(name, "QUIT") => {
            p.immediate(|o| reply::simple(o, "OK"));
            return true;
        }
        _ if is(name, "SELECT") => match n {
            2 if args.get(1) == b"0" => p.immediate(|o| reply::simple(o, "OK")),
            2 => p.immediate(|o| reply::error(o, "ERR DB index is out of range (kvd has one database, 0)")),
            _ => wrong_args(p, name),
        },
        _ if super::keyspace::is_keyspace(name) => super::keyspace::parse(ctx, args, p),
        _ if is(name, "RENAME") || is(name, "RENAMENX") => match n {
            3 => rename(ctx, args, p, is(name, "RENAMENX")),
            _ => wrong_args(p, name),
        },
        _ if is(name, "OBJECT") => match n {
            3 if is(args.get(1), "ENCODING") => p.encoding(node, forward, args.get(2)),
            _ => p.immediate(|o| reply::error(o, "ERR kvd answers OBJECT ENCODING <key> only")),
        },
        _ if is(name, "MEMORY") => match n {
            5 if is(args.get(1), "USAGE") && is(args.get(3), "SAMPLES") => match decimal_i64(args.get(4)) {
                Some(count) if count >= 0 => p.memory_usage(node, forward, args.get(2)),
                Some(_) => p.immediate(|o| reply::error(o, "ERR syntax error")),
                None => p.immediate(|o| reply::error(o, "ERR value is not an integer or out of range")),
            },
            3 if is(args.get(1), "USAGE") => p.memory_usage(node, forward, args.get(2)),
            _ => p.immediate(|o| reply::error(o, "ERR kvd answers MEMORY USAGE <key> [SAMPLES <count>] only")),
        },
        _ if is(name, "ROLE") => p.immediate(|o| super::info::role_reply(node, o)),
        _ if is(name, "INFO") => {
            let text = super::info::info(node, args.get(1), ctx.session.id, ctx.port);
            p.immediate(|o| reply::bulk(o, text.as_bytes()));
        }
        _ if is(name, "CONFIG") => config(node, args, p),
        _ if is(name, "COMMAND") => command(args, p),
        _ if is(name, "CLIENT") => client(ctx.session, args, p),
        _ if ["CLUSTER", "READONLY", "READWRITE", "ASKING"]
            .iter()
            .any(|c| is(name, c)) =>
        {
            super::cluster::run(ctx, args, p)
        }
        _ if is(name, "AUTH") => auth(ctx, args.get(n.saturating_sub(1)), n, p),
        _ if is(name, "HELLO") => hello(ctx, args, p),
        _ => {
            let shown = String::from_utf8_lossy(&name[..name.len().min(128)]).into_owned();
            let rest: Vec<String> = args
                .rest(1)
                .take(8)
                .map(|a| format!("'{}'", String::from_utf8_lossy(&a[..a.len().min(64)])))
                .collect();
            p.immediate(|o| {
                reply::error(
                    o,
                    &format!(
                        "ERR unknown command '{shown}', with args beginning with: {}",
                        rest.join(" ")
                    ),
                )
            });
        }
    }
    false
}

/// RENAME / RENAMENX key newkey: both keys must be of one node (else `CROSSSLOT`, as
/// Redis Cluster); outside MULTI it runs as an atomic batch of its own.
fn rename(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline, nx: bool) {
    let (from, to) = (args.get(1), args.get(2));
    let owner = ctx.node.owner_of(from);
    if owner != ctx.node.owner_of(to) {
        return p.immediate(|o| reply::error(o, super::transaction::CROSSSLOT));
    }
    if !p.in_transaction() && !ctx.session.tx.is_queuing() {
        p.begin_alone(
            Some(owner)
                .filter(|_| ctx.forward)
                .unwrap_or(ctx.node.config.shard.index),
        );
    }
    p.rename(ctx.node, ctx.forward, from, to, nx);
}

/// SETRANGE key offset value, with Redis's refusals: an offset that is not a non-negative
/// integer, and a result longer than the largest value (512 MiB, or kvd's `--max-frame`
/// when smaller: a longer value could not be read back), checked before anything is sent.
fn set_range(node: &Node, forward: bool, args: &Args<'_>, p: &mut Pipeline) {
    let Some(offset) = decimal_i64(args.get(2)) else {
        return p.immediate(|o| reply::error(o, "ERR value is not an integer or out of range"));
    };
    let Ok(offset) = u64::try_from(offset) else {
        return p.immediate(|o| reply::error(o, "ERR offset is out of range"));
    };
    let value = args.get(3);
    let max = kvshared::wire::MAX_STRING.min(u64::from(node.config.max_frame));
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
    let durable = node.config.data_dir.is_some();
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

/// COMMAND, COMMAND COUNT, COMMAND DOCS (what redis-cli asks).
fn command(args: &Args<'_>, p: &mut Pipeline) {
    match args.get(1) {
        b"" => p.immediate(super::table::command_reply),
        sub if is(sub, "COUNT") => p.immediate(|o| reply::integer(o, super::table::COMMANDS.len() as i64)),
        // An error makes redis-cli fall back to its built-in help.
        sub if is(sub, "DOCS") => p.immediate(|o| reply::error(o, "ERR COMMAND DOCS is not supported by kvd")),
        _ => p.immediate(|o| reply::error(o, "ERR kvd answers COMMAND, COMMAND COUNT and COMMAND DOCS only")),
    }
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
