//! The expiry commands' arguments, read with Redis's rules and error texts: `SET`'s
//! options, `SETEX`/`PSETEX`, the `EXPIRE` family and its conditions, `GETEX`. Each becomes
//! an op (`PutWith`, `Expire`, `Ttl`) in the pipeline; the store keeps the deadlines.

use kvshared::expiry::{Deadline, Expire, ExpireIf, MAX_TTL_MS, PutIf, PutTtl, PutWith};
use kvshared::wire::{OpKind, decimal_i64};

use super::ctx::{Ctx, is, wrong_args};
use super::errors::CommandError;
use super::parse::Args;
use super::pipeline::{Pipeline, TtlShape};
use super::reply;

/// How a time argument counts.
#[derive(Clone, Copy)]
enum Unit {
    Seconds,
    Millis,
}

impl Unit {
    fn ms(self, n: i64) -> Option<i64> {
        match self {
            Unit::Seconds => n.checked_mul(1000),
            Unit::Millis => Some(n),
        }
    }
}

fn invalid_expire(command: &str) -> CommandError {
    CommandError::InvalidExpire(command.to_string())
}

/// A positive time to live or deadline as `SET`, `SETEX` and `GETEX` take it (`at`: a Unix
/// time); `Err` with Redis's text.
fn positive(arg: &[u8], unit: Unit, at: bool, command: &str) -> Result<Deadline, CommandError> {
    let n = decimal_i64(arg).ok_or(CommandError::NotAnInteger)?;
    match unit.ms(n) {
        Some(ms) if ms > 0 && ms as u64 <= MAX_TTL_MS => Ok(if at {
            Deadline::At(ms as u64)
        } else {
            Deadline::In(ms as u64)
        }),
        _ => Err(invalid_expire(command)),
    }
}

/// `EX|PX|EXAT|PXAT`'s unit and whether it is a Unix time.
fn time_option(opt: &[u8]) -> Option<(Unit, bool)> {
    [
        ("EX", Unit::Seconds, false),
        ("PX", Unit::Millis, false),
        ("EXAT", Unit::Seconds, true),
        ("PXAT", Unit::Millis, true),
    ]
    .into_iter()
    .find(|(name, _, _)| is(opt, name))
    .map(|(_, unit, at)| (unit, at))
}

/// `SET key value [NX|XX] [GET] [EX s|PX ms|EXAT t|PXAT t|KEEPTTL]`.
pub fn set(ctx: &Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) {
    if args.len() < 3 {
        return wrong_args(p, args.get(0));
    }
    match set_options(args) {
        // Without a time to live, the plain puts (no argument to encode, as before expiry).
        Ok((cond, PutTtl::Clear, get_old)) => {
            let kind = match cond {
                PutIf::Always => OpKind::Put,
                PutIf::Absent => OpKind::PutIfAbsent,
                PutIf::Present => OpKind::PutIfPresent,
            };
            p.set_if(ctx.node, ctx.forward, args.get(1), args.get(2), get_old, kind);
        }
        Ok((cond, ttl, get_old)) => {
            let put = PutWith {
                cond,
                ttl,
                value: args.get(2),
            };
            p.set_with(ctx.node, ctx.forward, args.get(1), put, get_old);
        }
        Err(e) => p.immediate(|o| reply::error(o, &e.to_string())),
    }
}

fn set_options(args: &Args<'_>) -> Result<(PutIf, PutTtl, bool), CommandError> {
    let (mut cond, mut ttl, mut get_old) = (PutIf::Always, None, false);
    let mut i = 3;
    while i < args.len() {
        let opt = args.get(i);
        if is(opt, "GET") && !get_old {
            get_old = true;
        } else if (is(opt, "NX") || is(opt, "XX")) && cond == PutIf::Always {
            cond = if is(opt, "NX") { PutIf::Absent } else { PutIf::Present };
        } else if is(opt, "KEEPTTL") && ttl.is_none() {
            ttl = Some(PutTtl::Keep);
        } else if let (Some((unit, at)), None, true) = (time_option(opt), ttl, i + 1 < args.len()) {
            ttl = Some(PutTtl::Until(positive(args.get(i + 1), unit, at, "set")?));
            i += 1;
        } else {
            return Err(CommandError::Syntax);
        }
        i += 1;
    }
    Ok((cond, ttl.unwrap_or(PutTtl::Clear), get_old))
}

/// `SETEX key seconds value` and `PSETEX key ms value`.
pub fn setex(ctx: &Ctx<'_>, args: &Args<'_>, p: &mut Pipeline, unit_ms: bool) {
    if args.len() != 4 {
        return wrong_args(p, args.get(0));
    }
    let (unit, name) = if unit_ms {
        (Unit::Millis, "psetex")
    } else {
        (Unit::Seconds, "setex")
    };
    match positive(args.get(2), unit, false, name) {
        Ok(d) => {
            let put = PutWith {
                cond: PutIf::Always,
                ttl: PutTtl::Until(d),
                value: args.get(3),
            };
            p.set_with(ctx.node, ctx.forward, args.get(1), put, false);
        }
        Err(e) => p.immediate(|o| reply::error(o, &e.to_string())),
    }
}

/// `EXPIRE`, `PEXPIRE`, `EXPIREAT`, `PEXPIREAT` `key time [NX|XX|GT|LT]`: answered 1 when
/// the deadline was set, 0 when not. A time already past removes the key.
pub fn expire(ctx: &Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) {
    if args.len() < 3 {
        return wrong_args(p, args.get(0));
    }
    let name = String::from_utf8_lossy(args.get(0)).to_ascii_lowercase();
    let (unit, at) = match name.as_str() {
        "pexpire" => (Unit::Millis, false),
        "expireat" => (Unit::Seconds, true),
        "pexpireat" => (Unit::Millis, true),
        _ => (Unit::Seconds, false),
    };
    let parsed = expire_args(args, unit, at, &name);
    match parsed {
        Ok(e) => p.expire(ctx.node, ctx.forward, args.get(1), e),
        Err(e) => p.immediate(|o| reply::error(o, &e.to_string())),
    }
}

fn expire_args(args: &Args<'_>, unit: Unit, at: bool, name: &str) -> Result<Expire, CommandError> {
    let n = decimal_i64(args.get(2)).ok_or(CommandError::NotAnInteger)?;
    let ms = unit
        .ms(n)
        .filter(|ms| ms.unsigned_abs() <= MAX_TTL_MS)
        .ok_or_else(|| invalid_expire(name))?;
    // A negative time is already past: the key goes (Redis's rule).
    let deadline = match (at, u64::try_from(ms)) {
        (true, Ok(ms)) => Deadline::At(ms),
        (false, Ok(ms)) => Deadline::In(ms),
        (_, Err(_)) => Deadline::At(0),
    };
    let mut cond = ExpireIf::Always;
    for opt in args.rest(3) {
        let next = [
            ("NX", ExpireIf::NoTtl),
            ("XX", ExpireIf::HasTtl),
            ("GT", ExpireIf::Later),
            ("LT", ExpireIf::Sooner),
        ]
        .into_iter()
        .find(|(o, _)| is(opt, o))
        .map(|(_, c)| c)
        .ok_or_else(|| CommandError::UnsupportedOption(String::from_utf8_lossy(opt).into_owned()))?;
        cond = match (cond, next) {
            (ExpireIf::Always, c) => c,
            (a, b) if a == b => a,
            (ExpireIf::Later, ExpireIf::Sooner) | (ExpireIf::Sooner, ExpireIf::Later) => {
                return Err(CommandError::GtAndLt);
            }
            _ => return Err(CommandError::NxWithOthers),
        };
    }
    Ok(Expire { cond, deadline })
}

/// `TTL`, `PTTL`, `EXPIRETIME`, `PEXPIRETIME` `key`: -2 for a missing key, -1 for a key
/// without a deadline.
pub fn ttl(ctx: &Ctx<'_>, args: &Args<'_>, p: &mut Pipeline, shape: TtlShape) {
    match args.len() {
        2 => p.ttl(ctx.node, ctx.forward, args.get(1), shape),
        _ => wrong_args(p, args.get(0)),
    }
}

/// `PERSIST key`: 1 when it removed a deadline.
pub fn persist(ctx: &Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) {
    match args.len() {
        2 => p.expire(ctx.node, ctx.forward, args.get(1), Expire::persist()),
        _ => wrong_args(p, args.get(0)),
    }
}

/// `GETEX key [EX s|PX ms|EXAT t|PXAT t|PERSIST]`: the value, and the deadline changed in
/// the same batch (under the key's lock: nothing comes between).
pub fn getex(ctx: &Ctx<'_>, args: &Args<'_>, p: &mut Pipeline) {
    if args.len() < 2 {
        return wrong_args(p, args.get(0));
    }
    let change = match args.len() {
        2 => Ok(None),
        3 if is(args.get(2), "PERSIST") => Ok(Some(Expire::persist())),
        4 => match time_option(args.get(2)) {
            Some((unit, at)) => positive(args.get(3), unit, at, "getex").map(|deadline| {
                Some(Expire {
                    cond: ExpireIf::Always,
                    deadline,
                })
            }),
            None => Err(CommandError::Syntax),
        },
        _ => Err(CommandError::Syntax),
    };
    match change {
        Ok(change) => p.getex(ctx.node, ctx.forward, args.get(1), change),
        Err(e) => p.immediate(|o| reply::error(o, &e.to_string())),
    }
}
