//! One command into the pipeline, every rule read from the command table (`table`): the
//! token's gate, Redis Cluster's redirect, MULTI's queue, the arity, then the command's
//! handler. EXEC's queued commands are added to its batch here.

use super::ctx::{Ctx, Flow, Session};
use super::errors::CommandError;
use super::parse::Args;
use super::pipeline::Pipeline;
use super::reply;
use super::table::{self, NO_AUTH, NOT_IN_MULTI, NOT_QUEUED};

/// Adds one command to the pipeline; true when the connection closes after the replies.
pub fn dispatch(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> bool {
    let spec = table::spec(args.get(0));
    if !ctx.auth.admitted() && !spec.is_some_and(|s| s.has(NO_AUTH)) {
        ctx.auth.refused();
        p.immediate(|o| reply::error(o, "NOAUTH Authentication required."));
        return false;
    }
    let queuing = ctx.session.tx.is_queuing();
    if ctx.redirect
        && !queuing
        && let Some(e) = redirect(ctx, args)
    {
        if e.starts_with("MOVED") {
            ctx.node
                .counters()
                .add(ctx.session.id, kvshared::stats::Counter::Moved, 1);
        }
        p.immediate(|o| reply::error(o, &e));
        return false;
    }
    if queuing && !spec.is_some_and(|s| s.has(NOT_QUEUED)) {
        let refused = queue_refusal(ctx, args);
        super::transaction::queue(ctx, args, refused, p);
        return false;
    }
    let flow = run(ctx, args, p);
    for (bytes, ranges) in ctx.session.tx.take_to_run() {
        run(ctx, &Args::new(&bytes, &ranges), p);
    }
    flow == Flow::Close
}

/// A Redis Cluster node's redirect for `args`, its keys found by the table (an unknown
/// command has none: it runs, to be answered as unknown).
fn redirect(ctx: &Ctx<'_>, args: &Args<'_>) -> Option<String> {
    let spec = table::spec(args.get(0))?;
    super::cluster::redirect(ctx, args, spec.key_indexes(args.len()), spec.has(table::WRITE))
}

/// Whether the command named `name` runs in a round of its own: outside MULTI, those the
/// table marks so (the keyspace commands, RENAME, WATCH, MSETNX); inside, EXEC (its batch
/// is the transaction alone).
pub fn own_round(session: &Session, name: &[u8]) -> bool {
    let Some(spec) = table::spec(name) else {
        return false;
    };
    match session.tx.is_queuing() {
        true => spec.name == "EXEC",
        false => spec.has(table::OWN_ROUND),
    }
}

/// Runs one command (none of MULTI's rules): unknown, or of the wrong arity, it is answered
/// Redis's error; else its handler adds it.
pub fn run(ctx: &mut Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) -> Flow {
    let name = args.get(0);
    let Some(spec) = table::spec(name) else {
        unknown(name, args, p);
        return Flow::Go;
    };
    if !spec.takes(args.len()) {
        super::ctx::wrong_args(p, name);
        return Flow::Go;
    }
    (spec.run)(ctx, args, p)
}

/// Redis's answer to a command it does not know.
fn unknown(name: &[u8], args: &Args<'_>, p: &mut Pipeline) {
    let shown = String::from_utf8_lossy(&name[..name.len().min(128)]).into_owned();
    let rest: Vec<String> = args
        .rest(1)
        .take(8)
        .map(|a| format!("'{}'", String::from_utf8_lossy(&a[..a.len().min(64)])))
        .collect();
    let text = format!(
        "ERR unknown command '{shown}', with args beginning with: {}",
        rest.join(" ")
    );
    p.immediate(|o| reply::error(o, &text));
}

/// What a command queued in MULTI would do, found by adding it alone to a scratch
/// pipeline (nothing runs): the nodes of its keys, or the error it is refused with.
fn queue_refusal(ctx: &mut Ctx<'_>, args: &Args<'_>) -> Result<Vec<u32>, CommandError> {
    let name = args.get(0);
    if let Some(spec) = table::spec(name)
        && spec.has(NOT_IN_MULTI)
    {
        return Err(CommandError::NotInMulti(spec.name));
    }
    if ctx.redirect
        && let Some(e) = redirect(ctx, args)
    {
        return Err(CommandError::Redirected(e));
    }
    let mut scratch = Pipeline::default();
    run(ctx, args, &mut scratch);
    scratch.queued_owners(ctx.node)
}
