//! `kvd manager`: watches every shard's load and gives a hot shard read replicas on spare
//! members, then takes them back when it cools; with `--move-slots`, moves a hot group's
//! busiest slots to the idlest groups instead (or as well: see `mover`).
//!
//! A spare is a kvd started with `--join` for one shard (`--shard I/N --join --data-dir D`):
//! it holds nothing and serves nothing until a group adds it. Each interval the manager
//! reads every member's stats (`recent`: reads/s, writes/s and server-side read p99 over
//! the member's last window), sums a shard's reads over the members that serve them, and
//! asks [`policy::Policy`] what to do. An added replica is a learner: it catches up from the
//! leader (log or snapshot), then serves reads (follower reads with the leader's read index,
//! so they stay linearizable) but never votes, so writes cost no more than before. Clients
//! learn it from the group within a few seconds and spread their reads over it.
//!
//! The manager holds no state that matters: a restarted manager finds the learners it added
//! (the learners that are spares) and goes on. Every decision is printed with the figures
//! that caused it, and kept with them in the leader's list of changes (`kvd stats`, kvtui).

mod decision;
mod learners;
mod mover;
pub mod policy;
pub mod spread;

use std::time::{Duration, Instant};

use crate::control::error::refuse;
use kvshared::client::ClientConfig;

use crate::cli::ManagerArgs;
use crate::control::move_slots::Groups;
use learners::Learners;
use mover::SlotMover;
use policy::Policy;

/// Runs the manager until `--duration` ends or Ctrl-C; returns the exit code.
pub async fn run(args: ManagerArgs) -> crate::control::error::Result<u8> {
    let entries = args.nodes.node_list()?;
    let config = ClientConfig {
        request_timeout: args.interval.max(Duration::from_millis(500)),
        connect_timeout: args.interval.max(Duration::from_millis(500)),
        ..args.nodes.client_config()?
    };
    check(&args)?;
    let policy = learner_policy(&args);
    if !args.spare.is_empty() {
        eprintln!(
            "kvd manager: {} shard(s), {} spare(s), every {:?}: a replica is added after {} hot intervals (>= {:.0} reads/s per member or read p99 >= {:?}), removed after {} cold ones; at most {} members per shard",
            entries.len(),
            args.spare.len(),
            args.interval,
            policy.up_after,
            policy.hot_reads_per_member,
            policy.hot_read_p99,
            policy.down_after,
            policy.max_replicas,
        );
    }
    if args.move_slots {
        eprintln!(
            "kvd manager: {} group(s), every {:?}: slots move when the busiest group serves {:.1}x the mean load for {} intervals, {}, {} slots per hand-over",
            entries.len(),
            args.interval,
            args.spread_above,
            args.up_after.max(1),
            match args.balance_after {
                0 => "no lasting imbalance evened".to_string(),
                n => format!("or {:.2}x over {n} intervals", args.balance_above),
            },
            args.chunk
        );
    }
    let mut learners =
        (!args.spare.is_empty()).then(|| Learners::new(&entries, args.spare.clone(), policy, config.clone()));
    let mut mover = match args.move_slots {
        true => {
            let groups = Groups::new(&entries, config.clone())?;
            // A reading may take longer than an interval (a saturated group answers late):
            // the load is judged by shares, whatever the window's length.
            let limit = (args.interval * 4).max(Duration::from_secs(2));
            Some(SlotMover::start(groups, spread_policy(&args), usize::from(args.chunk), limit).await?)
        }
        false => None,
    };
    let began = Instant::now();
    let mut tick = tokio::time::interval(args.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut ctrl_c => break,
        }
        if args.duration.is_some_and(|d| began.elapsed() >= d) {
            break;
        }
        if let Some(m) = mover.as_mut() {
            m.tick(args.json).await?;
        }
        if let Some(l) = learners.as_mut() {
            l.tick(args.json).await?;
        }
    }
    // Changes under way are let finish: a half-made change is the leader's to finish, but
    // the operator should read how it ended.
    if let Some(m) = mover.as_mut() {
        m.finish(args.json).await?;
    }
    if let Some(l) = learners.as_mut() {
        l.finish(args.json).await?;
    }
    Ok(0)
}

/// Refuses flags that cannot work together.
fn check(args: &ManagerArgs) -> crate::control::error::Result<()> {
    if args.spare.is_empty() && !args.move_slots {
        refuse!(
            "give the manager a lever: spare members with --spare ADDR,... (each a kvd started with --shard I/N --join \
             --data-dir DIR), or --move-slots to move a hot group's slots to idle groups"
        );
    }
    if args.move_slots && !(args.spread_above.is_finite() && args.spread_above > 1.0) {
        refuse!(
            "--spread-above {}: the busiest group must serve more than the mean (a ratio above 1)",
            args.spread_above
        );
    }
    let least = 1.0 + spread::TOLERANCE;
    if args.move_slots && args.balance_after > 0 && !(args.balance_above.is_finite() && args.balance_above > least) {
        refuse!(
            "--balance-above {}: give more than {least:.2} (a group within {:.0}% of the mean gives nothing; \
             --balance-after 0 turns the evening out off)",
            args.balance_above,
            100.0 * spread::TOLERANCE
        );
    }
    if args.max_replicas < 2 {
        refuse!(
            "--max-replicas {}: a shard needs room for at least 2 members to gain one",
            args.max_replicas
        );
    }
    Ok(())
}

/// When a shard gains or gives back a learner (the flags).
fn learner_policy(args: &ManagerArgs) -> Policy {
    Policy {
        hot_reads_per_member: args.hot_reads,
        hot_read_p99: args.hot_p99,
        cold_reads_per_member: args.cold_reads.unwrap_or(args.hot_reads / 4.0),
        up_after: args.up_after.max(1),
        down_after: args.down_after.max(1),
        max_replicas: args.max_replicas,
        settle: args.settle,
    }
}

/// When `--move-slots` moves slots (its flags).
fn spread_policy(args: &ManagerArgs) -> spread::SpreadPolicy {
    spread::SpreadPolicy {
        above: args.spread_above,
        up_after: args.up_after.max(1),
        settle: args.settle,
        min_sampled: spread::MIN_SAMPLED,
        balance_above: args.balance_above,
        balance_after: args.balance_after,
    }
}
