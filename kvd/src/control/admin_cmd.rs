//! `kvd admin`: asks a replica group's leader to change the group's members or its leader,
//! following "not the leader" answers, and reports progress while a new member catches up.

use std::collections::HashMap;
use std::time::Duration;

use crate::control::error::{ControlError, refuse, unexpected};
use kvshared::client::{ClientConfig, Cluster, members};
use kvshared::stats::GroupRole;

use crate::cli::{AdminCommand, GroupArgs};
use kvshared::admin::{AdminReply, AdminRequest, MemberIdentity, Target};

/// The reason `kvd admin` gives for its changes (kept in the leader's list of changes).
const BY_ADMIN: &str = "kvd admin";

/// How long one request may run (a new member's catch-up runs inside its request).
const REQUEST_LIMIT: Duration = Duration::from_secs(900);

/// Runs one admin command; returns the exit code.
pub async fn run(command: AdminCommand) -> crate::control::error::Result<u8> {
    match command {
        AdminCommand::AddReplica { group, learner, addr } => {
            let mut g = Group::new(&group, None)?;
            eprintln!(
                "kvd: adding {addr} to shard {}'s group; it catches up as a learner first",
                g.shard
            );
            let progress = g.watch_catch_up(addr.clone());
            let added = g
                .send(AdminRequest::AddLearner {
                    addr: addr.clone(),
                    why: BY_ADMIN.into(),
                })
                .await;
            progress.abort();
            eprintln!("kvd: {}", added?);
            if !learner {
                let why = BY_ADMIN.into();
                eprintln!("kvd: {}", g.send(AdminRequest::Promote { addr, why }).await?);
            }
            g.print_membership().await?;
        }
        AdminCommand::RemoveReplica { group, addr } => {
            let mut g = Group::new(&group, Some(&addr))?;
            let why = BY_ADMIN.into();
            eprintln!("kvd: {}", g.send(AdminRequest::Remove { addr, why }).await?);
            g.print_membership().await?;
        }
        AdminCommand::TransferLeader { group, addr } => {
            let mut g = Group::new(&group, Some(&addr))?;
            eprintln!("kvd: {}", g.send(AdminRequest::TransferLeader { addr }).await?);
            g.print_membership().await?;
        }
        AdminCommand::RestartCheck { group, wait, addr } => {
            let g = Group::new(&group, Some(&addr))?;
            let limit = if wait { group.nodes.timeout } else { Duration::ZERO };
            return crate::restart_check::run(g.shard, g.members, g.config, &addr, limit)
                .await
                .map_err(Into::into);
        }
        AdminCommand::MoveSlots {
            nodes,
            from,
            to,
            chunk,
            slots,
        } => {
            let wanted =
                kvshared::slots::parse_ranges(&slots).map_err(|e| ControlError::Refused(format!("SLOTS: {e}")))?;
            let groups = crate::control::move_slots::Groups::new(&nodes.node_list()?, nodes.client_config()?)?;
            let moved =
                crate::control::move_slots::move_slots(&groups, (from, to), &wanted, usize::from(chunk)).await?;
            if moved == 0 {
                eprintln!("kvd: nothing to move from group {from} to group {to} in {slots}");
                return Ok(1);
            }
        }
        AdminCommand::Rebalance {
            nodes,
            by,
            window,
            chunk,
        } => {
            let groups = crate::control::move_slots::Groups::new(&nodes.node_list()?, nodes.client_config()?)?;
            match by {
                crate::cli::RebalanceBy::Slots => {
                    let keep: Vec<usize> = (0..groups.count()).collect();
                    crate::control::reshard::rebalance(&groups, &keep, usize::from(chunk)).await?;
                }
                crate::cli::RebalanceBy::Load => {
                    crate::control::reshard::rebalance_by_load(&groups, window, usize::from(chunk)).await?;
                }
            }
        }
        AdminCommand::AddShard { nodes, group, chunk } => {
            let groups = crate::control::move_slots::Groups::new(&nodes.node_list()?, nodes.client_config()?)?;
            let new = group.unwrap_or(groups.count().saturating_sub(1));
            crate::control::reshard::add_shard(&groups, new, usize::from(chunk)).await?;
        }
        AdminCommand::RemoveShard { nodes, group, chunk } => {
            let groups = crate::control::move_slots::Groups::new(&nodes.node_list()?, nodes.client_config()?)?;
            crate::control::reshard::remove_shard(&groups, group, usize::from(chunk)).await?;
        }
        AdminCommand::Slots { nodes } => {
            let groups = crate::control::move_slots::Groups::new(&nodes.node_list()?, nodes.client_config()?)?;
            crate::control::move_slots::print_slots(&groups).await?;
        }
        AdminCommand::InitGroup { nodes } => {
            let config = nodes.client_config()?;
            for (shard, entry) in nodes.node_list()?.iter().enumerate() {
                let addrs: Vec<String> = members(entry).map(str::to_string).collect();
                init_group(shard, &addrs, &config).await?;
                Group::of(shard, addrs, config.clone()).print_membership().await?;
            }
        }
    }
    Ok(0)
}

/// Starts shard `shard`'s new group of `addrs`, once: every member must be running, blank
/// (in no group yet) and agree on the shard and the members; each adopts a new group id
/// (written to its data directory), then the first initialises the group with all of them.
async fn init_group(shard: usize, addrs: &[String], config: &ClientConfig) -> crate::control::error::Result<()> {
    let mut found: Vec<(String, MemberIdentity, Cluster)> = Vec::new();
    for addr in addrs {
        let c = Cluster::new(std::slice::from_ref(addr), config.clone())?;
        match kvshared::admin::call(&c, Target::ANY, AdminRequest::Identify).await {
            Ok(AdminReply::Identity(who)) => found.push((addr.clone(), who, c)),
            Ok(AdminReply::Failed(why)) => {
                unexpected!("{addr}: {why} (start every member with --group and --data-dir)")
            }
            Ok(other) => unexpected!("{addr} did not say who it is: {other:?}"),
            Err(e) => refuse!("{addr} is not reachable: {e} (start every member of the group first)"),
        }
    }
    check_new_group(shard, addrs, &found)?;
    let group = kvshared::admin::new_id();
    for (addr, who, c) in &found {
        let to = Target {
            group: 0,
            member: who.member,
        };
        match kvshared::admin::call(c, to, AdminRequest::Adopt { group }).await? {
            AdminReply::Done(_) => {}
            other => unexpected!("{addr} did not take the group: {other:?}"),
        }
    }
    let members: Vec<(u64, String)> = found.iter().map(|(a, w, _)| (w.member, a.clone())).collect();
    let (first, who, c) = &found[0];
    let to = Target {
        group,
        member: who.member,
    };
    match kvshared::admin::call(c, to, AdminRequest::Initialize { members }).await? {
        AdminReply::Done(_) => eprintln!("kvd: shard {shard}'s group {group} is initialised (asked {first})"),
        other => unexpected!("{first} did not initialise the group: {other:?}"),
    }
    Ok(())
}

/// Refuses to start a group twice, across shards, or with members that disagree.
fn check_new_group(
    shard: usize,
    addrs: &[String],
    found: &[(String, MemberIdentity, Cluster)],
) -> crate::control::error::Result<()> {
    if found.is_empty() {
        refuse!("shard {shard}: no members listed");
    }
    for (addr, who, _) in found {
        if let Some(g) = who.group {
            refuse!(
                "{addr} already belongs to group {g}: shard {shard}'s group was initialised before (a group \
                 is initialised once); add or replace members with `kvd admin add-replica`"
            );
        }
        if who.shard != found[0].1.shard {
            refuse!(
                "{addr} serves shard {}, {} serves {}",
                who.shard,
                found[0].0,
                found[0].1.shard
            );
        }
        let mut peers = who.peers.clone();
        let mut listed = addrs.to_vec();
        peers.sort();
        listed.sort();
        if !peers.is_empty() && peers != listed {
            refuse!(
                "{addr} was started with --group {}, but --nodes lists {}: the members must agree",
                who.peers.join(","),
                addrs.join("|")
            );
        }
    }
    Ok(())
}

/// One replica group as an admin command (or the shard manager) reaches it: requests go to
/// its leader, found by following "not the leader" answers.
pub(crate) struct Group {
    shard: usize,
    /// The members to ask, the leader (as last learned) first.
    members: Vec<String>,
    config: ClientConfig,
    clients: HashMap<String, Cluster>,
    /// How long the group may go without a leader that carries a request out before the
    /// command gives up (`--timeout`).
    find_leader: Duration,
}

impl Group {
    /// The group of `--shard`, or of the entry of `--nodes` that lists `addr`, or the only one.
    fn new(args: &GroupArgs, addr: Option<&str>) -> crate::control::error::Result<Group> {
        let entries = args.nodes.node_list()?;
        let shard = match (args.shard, addr) {
            (Some(i), _) if i < entries.len() => i,
            (Some(i), _) => refuse!("--shard {i}: --nodes lists {} shards", entries.len()),
            (None, _) if entries.len() == 1 => 0,
            (None, Some(a)) => entries.iter().position(|e| members(e).any(|m| m == a)).ok_or_else(|| {
                ControlError::Refused(format!(
                    "no entry of --nodes lists {a}: say which shard's group with --shard I"
                ))
            })?,
            (None, None) => refuse!(
                "--nodes lists {} shards: say which shard's group with --shard I",
                entries.len()
            ),
        };
        let members = members(&entries[shard]).map(str::to_string).collect();
        Ok(Group::of(shard, members, args.nodes.client_config()?))
    }

    /// Shard `shard`'s group, reached through `members` (any of them will do to start).
    pub(crate) fn of(shard: usize, members: Vec<String>, config: ClientConfig) -> Group {
        let find_leader = config.request_timeout;
        let config = ClientConfig {
            request_timeout: REQUEST_LIMIT,
            conns_per_node: 1,
            ..config
        };
        Group {
            shard,
            members,
            config,
            clients: HashMap::new(),
            find_leader,
        }
    }

    fn client(&mut self, addr: &str) -> crate::control::error::Result<&Cluster> {
        if !self.clients.contains_key(addr) {
            let c = Cluster::new(&[addr.to_string()], self.config.clone())?;
            self.clients.insert(addr.to_string(), c);
        }
        Ok(&self.clients[addr])
    }

    /// Sends `request` to the group's leader, following "not the leader" answers (to members
    /// --nodes may not list, such as one added since) until one carries it out.
    pub(crate) async fn send(&mut self, request: AdminRequest) -> crate::control::error::Result<String> {
        let began = tokio::time::Instant::now();
        let mut next = 0;
        let mut last_error = String::from("no member answered");
        while began.elapsed() < self.find_leader {
            let addr = self.members[next % self.members.len()].clone();
            // A learner's catch-up runs inside its request (progress is printed meanwhile);
            // any other request a member does not answer within --timeout is given up on.
            let limit = match request {
                AdminRequest::AddLearner { .. } => REQUEST_LIMIT,
                _ => self.find_leader,
            };
            let call = kvshared::admin::call(self.client(&addr)?, Target::ANY, request.clone());
            let Ok(answer) = tokio::time::timeout(limit, call).await else {
                unexpected!("{addr} did not answer within --timeout {limit:?} (the request may still be carried out)");
            };
            match answer {
                Ok(AdminReply::Done(what)) => {
                    self.lead_with(&addr);
                    return Ok(what);
                }
                Ok(AdminReply::Failed(why)) => refuse!("{addr}: {why}"),
                Ok(AdminReply::ReadIndex(index)) => return Ok(format!("read index {index}")),
                Ok(AdminReply::Identity(who)) => return Ok(format!("{who:?}")),
                Ok(AdminReply::PreVote(yes)) => {
                    return Ok(format!("pre-vote {}", if yes { "granted" } else { "refused" }));
                }
                Ok(AdminReply::NotLeader(Some(leader))) => {
                    tracing::debug!(%addr, %leader, "following the leader");
                    self.lead_with(&leader);
                    next = 0;
                    continue;
                }
                Ok(AdminReply::NotLeader(None)) => last_error = format!("{addr}: no leader known (an election?)"),
                Err(e) => last_error = format!("{addr}: {e}"),
            }
            next += 1;
            if next % self.members.len() == 0 {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        refuse!(
            "shard {}'s group: no leader carried out the request within --timeout {:?} (last: {last_error})",
            self.shard,
            self.find_leader
        )
    }

    /// Puts `addr` first among the members to ask.
    fn lead_with(&mut self, addr: &str) {
        self.members.retain(|m| m != addr);
        self.members.insert(0, addr.to_string());
    }

    /// Prints, once a second, how far `addr` is behind the leader while it catches up.
    fn watch_catch_up(&self, addr: String) -> tokio::task::JoinHandle<()> {
        let members = self.members.clone();
        let config = ClientConfig {
            request_timeout: Duration::from_secs(2),
            ..self.config.clone()
        };
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                for m in &members {
                    let Ok(c) = Cluster::new(std::slice::from_ref(m), config.clone()) else {
                        continue;
                    };
                    let Ok(s) = c.stats(0).await else { continue };
                    if s.group.role != GroupRole::Leader {
                        continue;
                    }
                    match s.group.lag.iter().find(|l| l.addr == addr) {
                        Some(l) => eprintln!("kvd: {addr} is {} log entries behind the leader {m}", l.behind),
                        None => eprintln!("kvd: waiting for the leader {m} to reach {addr}"),
                    }
                    break;
                }
            }
        })
    }

    /// Prints the group's voters, learners and leader as its leader reports them.
    async fn print_membership(&mut self) -> crate::control::error::Result<()> {
        let shard = self.shard;
        for _ in 0..50 {
            for addr in self.members.clone() {
                let Ok(s) = self.client(&addr)?.stats(0).await else {
                    continue;
                };
                if s.group.role == GroupRole::Leader {
                    let g = &s.group;
                    let learners = match g.learners.is_empty() {
                        true => "none".to_string(),
                        false => g.learners.join(", "),
                    };
                    kvshared::outln!(
                        "shard {shard}: leader {addr}, voters {}, learners {learners}, term {}",
                        g.members.join(", "),
                        g.term
                    )?;
                    let list = g
                        .members
                        .iter()
                        .chain(&g.learners)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join("|");
                    kvshared::outln!("clients can list this group as \"{list}\"")?;
                    return Ok(());
                }
                let leader = std::iter::once(&s.group.leader).filter(|l| !l.is_empty());
                for m in s.group.members.iter().chain(leader) {
                    if !self.members.contains(m) {
                        self.members.push(m.clone());
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        refuse!("shard {shard}'s group: done, but no member reports itself leader now")
    }
}
