//! The commands kvd answers and where their keys are, as Redis's command table gives them
//! (`COMMAND INFO`'s first key, last key, step): `COMMAND COUNT` counts it, and a Redis
//! Cluster node (`--resp-cluster`) finds a command's keys with it to redirect the command
//! to their slot's owner.

/// One command: its name, where its keys are, whether it writes.
#[derive(Clone, Copy, Debug)]
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
    /// It changes data (a replica redirects it to the master even after READONLY).
    pub write: bool,
}

const fn no_keys(name: &'static str, arity: i8) -> Spec {
    Spec {
        name,
        arity,
        first: 0,
        last: 0,
        step: 0,
        write: false,
    }
}
const fn read(name: &'static str, arity: i8, first: u8, last: i8, step: u8) -> Spec {
    Spec {
        name,
        arity,
        first,
        last,
        step,
        write: false,
    }
}
const fn write(name: &'static str, arity: i8, first: u8, last: i8, step: u8) -> Spec {
    Spec {
        name,
        arity,
        first,
        last,
        step,
        write: true,
    }
}

/// Every command answered, sorted by name (looked up by binary search).
pub const COMMANDS: &[Spec] = &[
    write("APPEND", 3, 1, 1, 1),
    no_keys("ASKING", 1),
    no_keys("AUTH", -2),
    no_keys("CLIENT", -2),
    no_keys("CLUSTER", -2),
    no_keys("COMMAND", -1),
    no_keys("CONFIG", -2),
    no_keys("DBSIZE", 1),
    write("DECR", 2, 1, 1, 1),
    write("DECRBY", 3, 1, 1, 1),
    write("DEL", -2, 1, -1, 1),
    no_keys("DISCARD", 1),
    no_keys("ECHO", 2),
    no_keys("EXEC", 1),
    read("EXISTS", -2, 1, -1, 1),
    write("EXPIRE", -3, 1, 1, 1),
    write("EXPIREAT", -3, 1, 1, 1),
    read("EXPIRETIME", 2, 1, 1, 1),
    no_keys("FLUSHALL", -1),
    no_keys("FLUSHDB", -1),
    read("GET", 2, 1, 1, 1),
    write("GETDEL", 2, 1, 1, 1),
    write("GETEX", -2, 1, 1, 1),
    read("GETRANGE", 4, 1, 1, 1),
    write("GETSET", 3, 1, 1, 1),
    no_keys("HELLO", -1),
    write("INCR", 2, 1, 1, 1),
    write("INCRBY", 3, 1, 1, 1),
    write("INCRBYFLOAT", 3, 1, 1, 1),
    no_keys("INFO", -1),
    no_keys("KEYS", 2),
    read("MEMORY", -2, 2, 2, 1),
    read("MGET", -2, 1, -1, 1),
    write("MSET", -3, 1, -1, 2),
    write("MSETNX", -3, 1, -1, 2),
    no_keys("MULTI", 1),
    read("OBJECT", -2, 2, 2, 1),
    write("PERSIST", 2, 1, 1, 1),
    write("PEXPIRE", -3, 1, 1, 1),
    write("PEXPIREAT", -3, 1, 1, 1),
    read("PEXPIRETIME", 2, 1, 1, 1),
    no_keys("PING", -1),
    write("PSETEX", 4, 1, 1, 1),
    read("PTTL", 2, 1, 1, 1),
    no_keys("QUIT", -1),
    no_keys("RANDOMKEY", 1),
    no_keys("READONLY", 1),
    no_keys("READWRITE", 1),
    write("RENAME", 3, 1, 2, 1),
    write("RENAMENX", 3, 1, 2, 1),
    no_keys("ROLE", 1),
    no_keys("SCAN", -2),
    no_keys("SELECT", 2),
    write("SET", -3, 1, 1, 1),
    write("SETEX", 4, 1, 1, 1),
    write("SETNX", 3, 1, 1, 1),
    write("SETRANGE", 4, 1, 1, 1),
    read("STRLEN", 2, 1, 1, 1),
    read("SUBSTR", 4, 1, 1, 1),
    read("TOUCH", -2, 1, -1, 1),
    read("TTL", 2, 1, 1, 1),
    read("TYPE", 2, 1, 1, 1),
    write("UNLINK", -2, 1, -1, 1),
    no_keys("UNWATCH", 1),
    read("WATCH", -2, 1, -1, 1),
];

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
        let flag = match (c.write, c.first) {
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
