//! The keyspace commands' arguments (`SCAN`, `KEYS`, `DBSIZE`, `RANDOMKEY`, `FLUSHALL`,
//! `FLUSHDB`): parsed into a `keyspace::Keyspace` that runs in a round of its own.

use kvshared::keyspace::{ClusterCursor, MAX_SCAN_COUNT};

use super::ctx::{Ctx, is, wrong_args};
use super::errors::CommandError;
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
        Err(e) => p.immediate(|o| reply::error(o, &e.to_string())),
    }
}

fn scan_args(ctx: &Ctx<'_>, args: &Args<'_>) -> Result<Keyspace, CommandError> {
    let nodes = nodes(ctx.node, ctx.forward);
    let cursor = std::str::from_utf8(args.get(1))
        .ok()
        .and_then(|c| c.parse::<u64>().ok())
        .and_then(|c| ClusterCursor::from_u64(c, nodes.len() as u32))
        .ok_or(CommandError::InvalidCursor)?;
    let (mut pattern, mut count, mut strings) = (Vec::new(), 10u32, true);
    let mut i = 2;
    if args.len() < 2 {
        return Err(CommandError::WrongArgs("scan".into()));
    }
    while i < args.len() {
        let value = args.get(i + 1);
        match args.get(i) {
            _ if i + 1 >= args.len() => return Err(CommandError::Syntax),
            o if is(o, "MATCH") => pattern = value.to_vec(),
            o if is(o, "COUNT") => {
                count = kvshared::wire::decimal_i64(value)
                    .filter(|&c| c >= 1)
                    .ok_or(CommandError::Syntax)?
                    .min(i64::from(MAX_SCAN_COUNT)) as u32;
            }
            // Every kvd key is a string: another type matches none.
            o if is(o, "TYPE") => strings = is(value, "string"),
            _ => return Err(CommandError::Syntax),
        }
        i += 2;
    }
    kvshared::pattern::Pattern::new(&pattern)?;
    Ok(Keyspace::Scan {
        cursor,
        pattern,
        count,
        strings,
    })
}

/// FLUSHALL/FLUSHDB [ASYNC|SYNC]: a durable node wants the mode said, so a habit typed at
/// a prompt does not delete acknowledged data for good (both run at once here).
fn flush_args(ctx: &Ctx<'_>, args: &Args<'_>) -> Result<Keyspace, CommandError> {
    let explicit = match args.len() {
        1 => false,
        2 if is(args.get(1), "ASYNC") || is(args.get(1), "SYNC") => true,
        _ => return Err(CommandError::Syntax),
    };
    if ctx.node.config().durability.is_some() && !explicit {
        let name = String::from_utf8_lossy(args.get(0)).to_ascii_uppercase();
        return Err(CommandError::FlushNeedsMode(name));
    }
    Ok(Keyspace::Flush)
}
