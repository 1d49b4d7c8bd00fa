//! The keyspace commands' arguments (`SCAN`, `KEYS`, `DBSIZE`, `RANDOMKEY`, `FLUSHALL`,
//! `FLUSHDB`): parsed into a `keyspace::Keyspace` that runs in a round of its own.

use kvshared::keyspace::{ClusterCursor, MAX_SCAN_COUNT};

use super::ctx::{Ctx, is, wrong_args};
use super::keyspace::{Keyspace, nodes};
use super::parse::Args;
use super::pipeline::Pipeline;
use super::reply;

/// Parses one of these commands into the pipeline (or answers its error at once).
pub fn parse(ctx: &Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) {
    let name = args.get(0);
    let cmd = match name {
        _ if is(name, "SCAN") => scan_args(ctx, args),
        _ if is(name, "KEYS") && args.len() == 2 => Ok(Keyspace::Keys {
            pattern: args.get(1).to_vec(),
        }),
        _ if is(name, "DBSIZE") && args.len() == 1 => Ok(Keyspace::DbSize),
        _ if is(name, "RANDOMKEY") && args.len() == 1 => Ok(Keyspace::RandomKey),
        _ if is(name, "FLUSHALL") || is(name, "FLUSHDB") => flush_args(ctx, args),
        _ => return wrong_args(p, name),
    };
    match cmd {
        Ok(cmd) => p.keyspace(cmd),
        Err(e) => p.immediate(|o| reply::error(o, &e)),
    }
}

fn scan_args(ctx: &Ctx<'_>, args: &Args<'_>) -> Result<Keyspace, String> {
    let nodes = nodes(ctx.node, ctx.forward);
    let cursor = std::str::from_utf8(args.get(1))
        .ok()
        .and_then(|c| c.parse::<u64>().ok())
        .and_then(|c| ClusterCursor::from_u64(c, nodes.len() as u32))
        .ok_or("ERR invalid cursor")?;
    let (mut pattern, mut count, mut strings) = (Vec::new(), 10u32, true);
    let mut i = 2;
    if args.len() < 2 {
        return Err("ERR wrong number of arguments for 'scan' command".into());
    }
    while i < args.len() {
        let value = args.get(i + 1);
        match args.get(i) {
            _ if i + 1 >= args.len() => return Err("ERR syntax error".into()),
            o if is(o, "MATCH") => pattern = value.to_vec(),
            o if is(o, "COUNT") => {
                count = kvshared::wire::decimal_i64(value)
                    .filter(|&c| c >= 1)
                    .ok_or("ERR syntax error")?
                    .min(i64::from(MAX_SCAN_COUNT)) as u32;
            }
            // Every kvd key is a string: another type matches none.
            o if is(o, "TYPE") => strings = is(value, "string"),
            _ => return Err("ERR syntax error".into()),
        }
        i += 2;
    }
    kvshared::pattern::Pattern::new(&pattern).map_err(|e| format!("ERR {e}"))?;
    Ok(Keyspace::Scan {
        cursor,
        pattern,
        count,
        strings,
    })
}

/// FLUSHALL/FLUSHDB [ASYNC|SYNC]: a durable node wants the mode said, so a habit typed at
/// a prompt does not delete acknowledged data for good (both run at once here).
fn flush_args(ctx: &Ctx<'_>, args: &Args<'_>) -> Result<Keyspace, String> {
    let explicit = match args.len() {
        1 => false,
        2 if is(args.get(1), "ASYNC") || is(args.get(1), "SYNC") => true,
        _ => return Err("ERR syntax error".into()),
    };
    if ctx.node.config().data_dir.is_some() && !explicit {
        let name = String::from_utf8_lossy(args.get(0)).to_ascii_uppercase();
        return Err(format!(
            "ERR kvd: {name} on a durable node (--data-dir) deletes acknowledged data for good; send {name} SYNC (or ASYNC) to mean it"
        ));
    }
    Ok(Keyspace::Flush)
}
