//! The command table: every command kvd answers, with its arity, where its keys are (as
//! Redis's `COMMAND INFO` gives them: first key, last key, step), its flags and its
//! handler. Everything that depends on which command it is reads this table: the
//! dispatcher (`dispatch`: the auth gate, the arity, MULTI's rules, the handler),
//! `COMMAND`/`COMMAND COUNT`/`COMMAND INFO`, a connection's rounds (`own_round`) and a
//! Redis Cluster node's key checks (`cluster::redirect`). A new command is one entry here
//! and one handler.

use super::commands as c;
use super::ctx::{Ctx, Flow, Handler, is};
use super::parse::Args;
use super::pipeline::Pipeline;
use super::reply;
use super::transaction as tx;

/// It changes data (a replica redirects it to the master even after READONLY).
pub const WRITE: u8 = 1;
/// It may run before the connection has presented the token (AUTH, HELLO, QUIT).
pub const NO_AUTH: u8 = 2;
/// It acts on MULTI itself, or must run at once: never queued inside MULTI.
pub const NOT_QUEUED: u8 = 4;
/// Refused inside MULTI (it changes the connection, or spans the cluster).
pub const NOT_IN_MULTI: u8 = 8;
/// Outside MULTI, it runs in a round of its own (it spans nodes, or keeps state after it).
pub const OWN_ROUND: u8 = 16;

/// One command.
#[derive(Clone, Copy)]
pub struct Spec {
    pub name: &'static str,
    /// Arguments with the name: exactly this many, or at least -arity when negative.
    pub arity: i8,
    /// The first key's argument (0: no keys).
    pub first: u8,
    /// The last key's argument; -1: the last argument.
    pub last: i8,
    /// Arguments from one key to the next.
    pub step: u8,
    /// Its flags ([`WRITE`], [`NO_AUTH`], ...).
    pub flags: u8,
    /// What adds it to a pipeline.
    pub run: Handler,
}

impl std::fmt::Debug for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spec").field("name", &self.name).finish_non_exhaustive()
    }
}

const fn no_keys(name: &'static str, arity: i8, run: Handler) -> Spec {
    Spec {
        name,
        arity,
        first: 0,
        last: 0,
        step: 0,
        flags: 0,
        run,
    }
}
const fn read(name: &'static str, arity: i8, first: u8, last: i8, step: u8, run: Handler) -> Spec {
    Spec {
        name,
        arity,
        first,
        last,
        step,
        flags: 0,
        run,
    }
}
const fn write(name: &'static str, arity: i8, first: u8, last: i8, step: u8, run: Handler) -> Spec {
    Spec {
        name,
        arity,
        first,
        last,
        step,
        flags: WRITE,
        run,
    }
}

impl Spec {
    /// The same command with `flags` too.
    const fn with(mut self, flags: u8) -> Spec {
        self.flags |= flags;
        self
    }

    /// Whether it has every flag of `flags`.
    pub fn has(&self, flags: u8) -> bool {
        self.flags & flags == flags
    }

    /// Whether `args` arguments (the name included) is an arity it takes.
    pub fn takes(&self, args: usize) -> bool {
        let arity = i64::from(self.arity);
        match arity < 0 {
            true => args as i64 >= -arity,
            false => args as i64 == arity,
        }
    }
}

/// The keyspace commands: they span the cluster, in a round of their own.
const SPANS: u8 = NOT_IN_MULTI | OWN_ROUND;

/// Every command answered, sorted by name (looked up by binary search).
pub const COMMANDS: &[Spec] = &[
    write("APPEND", 3, 1, 1, 1, c::append),
    no_keys("ASKING", 1, c::cluster),
    no_keys("AUTH", -2, c::auth_cmd).with(NO_AUTH | NOT_IN_MULTI),
    no_keys("CLIENT", -2, c::client_cmd).with(NOT_IN_MULTI),
    no_keys("CLUSTER", -2, c::cluster),
    no_keys("COMMAND", -1, command),
    no_keys("CONFIG", -2, c::config_cmd),
    no_keys("DBSIZE", 1, c::keyspace).with(SPANS),
    write("DECR", 2, 1, 1, 1, c::incr),
    write("DECRBY", 3, 1, 1, 1, c::incrby),
    write("DEL", -2, 1, -1, 1, c::count),
    no_keys("DISCARD", 1, tx::discard).with(NOT_QUEUED),
    no_keys("ECHO", 2, c::echo),
    no_keys("EXEC", 1, tx::exec_cmd).with(NOT_QUEUED),
    read("EXISTS", -2, 1, -1, 1, c::count),
    write("EXPIRE", -3, 1, 1, 1, c::expire),
    write("EXPIREAT", -3, 1, 1, 1, c::expire),
    read("EXPIRETIME", 2, 1, 1, 1, c::ttl),
    no_keys("FLUSHALL", -1, c::keyspace).with(SPANS),
    no_keys("FLUSHDB", -1, c::keyspace).with(SPANS),
    read("GET", 2, 1, 1, 1, c::get),
    write("GETDEL", 2, 1, 1, 1, c::getdel),
    write("GETEX", -2, 1, 1, 1, c::getex),
    read("GETRANGE", 4, 1, 1, 1, c::getrange),
    write("GETSET", 3, 1, 1, 1, c::getset),
    no_keys("HELLO", -1, c::hello_cmd).with(NO_AUTH | NOT_IN_MULTI),
    write("INCR", 2, 1, 1, 1, c::incr),
    write("INCRBY", 3, 1, 1, 1, c::incrby),
    write("INCRBYFLOAT", 3, 1, 1, 1, c::incrbyfloat),
    no_keys("INFO", -1, c::info),
    no_keys("KEYS", 2, c::keyspace).with(SPANS),
    read("MEMORY", -2, 2, 2, 1, c::memory),
    read("MGET", -2, 1, -1, 1, c::mget),
    write("MSET", -3, 1, -1, 2, c::mset),
    write("MSETNX", -3, 1, -1, 2, tx::msetnx_cmd).with(NOT_QUEUED | OWN_ROUND),
    no_keys("MULTI", 1, tx::multi).with(NOT_QUEUED),
    read("OBJECT", -2, 2, 2, 1, c::object),
    write("PERSIST", 2, 1, 1, 1, c::persist),
    write("PEXPIRE", -3, 1, 1, 1, c::expire),
    write("PEXPIREAT", -3, 1, 1, 1, c::expire),
    read("PEXPIRETIME", 2, 1, 1, 1, c::ttl),
    no_keys("PING", -1, c::ping),
    write("PSETEX", 4, 1, 1, 1, c::setex),
    read("PTTL", 2, 1, 1, 1, c::ttl),
    no_keys("QUIT", -1, c::quit).with(NO_AUTH | NOT_QUEUED),
    no_keys("RANDOMKEY", 1, c::keyspace).with(SPANS),
    no_keys("READONLY", 1, c::cluster),
    no_keys("READWRITE", 1, c::cluster),
    write("RENAME", 3, 1, 2, 1, c::rename_cmd).with(OWN_ROUND),
    write("RENAMENX", 3, 1, 2, 1, c::rename_cmd).with(OWN_ROUND),
    no_keys("ROLE", 1, c::role),
    no_keys("SCAN", -2, c::keyspace).with(SPANS),
    no_keys("SELECT", 2, c::select).with(NOT_IN_MULTI),
    write("SET", -3, 1, 1, 1, c::set),
    write("SETEX", 4, 1, 1, 1, c::setex),
    write("SETNX", 3, 1, 1, 1, c::setnx),
    write("SETRANGE", 4, 1, 1, 1, c::setrange),
    read("STRLEN", 2, 1, 1, 1, c::strlen),
    read("SUBSTR", 4, 1, 1, 1, c::getrange),
    no_keys("TIME", 1, c::time),
    read("TOUCH", -2, 1, -1, 1, c::count),
    read("TTL", 2, 1, 1, 1, c::ttl),
    read("TYPE", 2, 1, 1, 1, c::type_of),
    write("UNLINK", -2, 1, -1, 1, c::count),
    no_keys("UNWATCH", 1, tx::unwatch).with(NOT_QUEUED),
    read("WATCH", -2, 1, -1, 1, tx::watch_cmd).with(NOT_QUEUED | OWN_ROUND),
];

/// COMMAND, COMMAND COUNT, COMMAND DOCS (what redis-cli asks): from this table.
fn command(_: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    match args.get(1) {
        b"" => p.immediate(command_reply),
        sub if is(sub, "COUNT") => p.immediate(|o| reply::integer(o, COMMANDS.len() as i64)),
        // An error makes redis-cli fall back to its built-in help.
        sub if is(sub, "DOCS") => p.immediate(|o| reply::error(o, "ERR COMMAND DOCS is not supported by kvd")),
        _ => p.immediate(|o| reply::error(o, "ERR kvd answers COMMAND, COMMAND COUNT and COMMAND DOCS only")),
    }
    Flow::Go
}

/// The command named `name` (any case), if kvd answers it.
pub fn spec(name: &[u8]) -> Option<&'static Spec> {
    let mut upper = [0u8; 16];
    let upper = upper.get_mut(..name.len())?;
    for (u, b) in upper.iter_mut().zip(name) {
        *u = b.to_ascii_uppercase();
    }
    let i = COMMANDS.binary_search_by(|s| s.name.as_bytes().cmp(upper)).ok()?;
    COMMANDS.get(i)
}

impl Spec {
    /// The argument indexes of a command of `args` arguments that are keys.
    pub fn key_indexes(&self, args: usize) -> impl Iterator<Item = usize> {
        let first = usize::from(self.first);
        let last = match self.last {
            -1 => args.saturating_sub(1),
            n => usize::try_from(n).unwrap_or(0).min(args.saturating_sub(1)),
        };
        let step = usize::from(self.step.max(1));
        (first..=last).step_by(step).filter(move |_| first > 0)
    }
}

/// Redis 7's tips for the commands that span shards: how a cluster client sends them
/// (to every shard, or split by slot) and merges the answers.
fn tips(name: &str) -> &'static [&'static str] {
    match name {
        "DBSIZE" => &["request_policy:all_shards", "response_policy:agg_sum"],
        "KEYS" => &["request_policy:all_shards", "nondeterministic_output_order"],
        "FLUSHALL" | "FLUSHDB" => &["request_policy:all_shards", "response_policy:all_succeeded"],
        "RANDOMKEY" => &[
            "request_policy:all_shards",
            "response_policy:special",
            "nondeterministic_output",
        ],
        "SCAN" => &["nondeterministic_output", "request_policy:special"],
        "MGET" => &["request_policy:multi_shard"],
        "MSET" => &["request_policy:multi_shard", "response_policy:all_succeeded"],
        "DEL" | "UNLINK" | "EXISTS" | "TOUCH" => &["request_policy:multi_shard", "response_policy:agg_sum"],
        _ => &[],
    }
}

/// `COMMAND`'s reply: per command its name, arity, flags, first key, last key and step
/// (what every Redis version gives), ACL categories (none), Redis 7's tips (see `tips`),
/// key specifications and subcommands (none).
pub fn command_reply(out: &mut Vec<u8>) {
    super::reply::array(out, COMMANDS.len());
    for c in COMMANDS {
        super::reply::array(out, 10);
        super::reply::bulk(out, c.name.to_ascii_lowercase().as_bytes());
        super::reply::integer(out, i64::from(c.arity));
        let flag = match (c.has(WRITE), c.first) {
            (true, _) => Some("write"),
            (false, 0) => None,
            (false, _) => Some("readonly"),
        };
        super::reply::array(out, usize::from(flag.is_some()));
        if let Some(f) = flag {
            super::reply::simple(out, f);
        }
        super::reply::integer(out, i64::from(c.first));
        super::reply::integer(out, i64::from(c.last));
        super::reply::integer(out, i64::from(c.step));
        super::reply::array(out, 0);
        let tips = tips(c.name);
        super::reply::array(out, tips.len());
        for t in tips {
            super::reply::simple(out, t);
        }
        super::reply::array(out, 0);
        super::reply::array(out, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_sorted_and_found_in_any_case() {
        assert!(
            COMMANDS.windows(2).all(|w| w[0].name < w[1].name),
            "sorted, no duplicates"
        );
        assert_eq!(spec(b"get").map(|s| s.name), Some("GET"));
        assert_eq!(spec(b"MsEt").map(|s| s.name), Some("MSET"));
        assert!(spec(b"NOSUCHCOMMAND").is_none() && spec(b"").is_none());
        assert!(spec(&[b'A'; 40]).is_none());
    }

    #[test]
    fn keys_are_where_redis_puts_them() {
        let at = |name: &[u8], args| spec(name).unwrap().key_indexes(args).collect::<Vec<_>>();
        assert_eq!(at(b"GET", 2), [1]);
        assert_eq!(at(b"MSET", 5), [1, 3]);
        assert_eq!(at(b"DEL", 4), [1, 2, 3]);
        assert_eq!(at(b"RENAME", 3), [1, 2]);
        assert_eq!(at(b"OBJECT", 3), [2]);
        assert_eq!(at(b"PING", 2), Vec::<usize>::new());
        assert_eq!(at(b"GET", 1), Vec::<usize>::new(), "a key missing: none");
    }
}
