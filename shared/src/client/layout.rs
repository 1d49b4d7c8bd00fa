//! Is `--nodes` the cluster it claims to be? Every tool asks at start, so that a wrong
//! order, a missing node or two nodes serving one shard are said plainly once, instead of
//! surfacing as millions of "wrong shard" refusals.

use crate::routing::ShardId;

/// One thing wrong with a node list, as the nodes themselves report it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutProblem {
    /// A node serves a cluster of another size than the list has nodes.
    #[error("{addr} serves shard {shard}, a cluster of {count} nodes, but --nodes lists {listed}")]
    CountMismatch {
        /// The node.
        addr: String,
        /// What it serves.
        shard: ShardId,
        /// The cluster size it was started with.
        count: u32,
        /// Nodes in the list.
        listed: usize,
    },
    /// Two or more nodes report the same shard.
    #[error("{} serve the same shard {shard}: only one node may serve a shard", addrs.join(" and "))]
    Duplicate {
        /// The shard.
        shard: ShardId,
        /// The nodes that serve it.
        addrs: Vec<String>,
    },
    /// A member of a replica group serves another shard than the rest of its group.
    #[error("{addr} serves shard {shard} but the rest of its group serves {group}: list a group's members together")]
    GroupDisagrees {
        /// The member.
        addr: String,
        /// What it serves.
        shard: ShardId,
        /// What its group's first member serves.
        group: ShardId,
    },
    /// Two groups serve the same slot: a group started with the even split of a larger
    /// cluster (a new group needs `--no-slots`), or two clusters listed as one.
    #[error("{} both serve slot {slot}: one slot, one group (start a group being added with --no-slots)", addrs.join(" and "))]
    SlotServedTwice {
        /// The slot.
        slot: u16,
        /// The groups' entries.
        addrs: Vec<String>,
    },
    /// A node is listed at another position than its shard index.
    #[error("{addr} serves shard {shard} but is listed at position {position}: list the nodes in shard order")]
    OutOfOrder {
        /// The node.
        addr: String,
        /// What it serves.
        shard: ShardId,
        /// Where the list has it (0-based).
        position: usize,
    },
}

/// Every member of every `--nodes` entry, in order, with the index of its entry (a single
/// node is an entry of one member).
pub fn expand_members(entries: &[String]) -> Vec<(usize, String)> {
    entries
        .iter()
        .enumerate()
        .flat_map(|(i, e)| super::members(e).map(move |m| (i, m.to_string())))
        .collect()
}

/// The shard of each entry from the shards its members report (`member_shards` in the order
/// of [`expand_members`]), and the problems of members of one group that disagree.
pub fn entry_shards(
    entries: &[String],
    member_shards: &[Option<ShardId>],
) -> (Vec<Option<ShardId>>, Vec<LayoutProblem>) {
    let members = expand_members(entries);
    let mut shards: Vec<Option<ShardId>> = vec![None; entries.len()];
    let mut problems = Vec::new();
    for ((entry, addr), shard) in members.iter().zip(member_shards) {
        let Some(shard) = *shard else { continue };
        match shards[*entry] {
            None => shards[*entry] = Some(shard),
            Some(first) if first != shard => problems.push(LayoutProblem::GroupDisagrees {
                addr: addr.clone(),
                shard,
                group: first,
            }),
            Some(_) => {}
        }
    }
    (shards, problems)
}

/// The problems with `addrs` (the list, in the order given) given the shard each node
/// reports (`None`: it did not answer, nothing is known of it). A node started in a smaller
/// cluster than the list (`--shard 1/3` of 4 listed) is fine when the cluster grew: some node
/// was started as the list's last (`3/4`, a group added with `--no-slots`); one started in a
/// larger cluster than the list is always named. Positions are judged unless the node's
/// cluster is larger than the list.
pub fn check_layout(addrs: &[String], shards: &[Option<ShardId>]) -> Vec<LayoutProblem> {
    let mut problems = Vec::new();
    let listed = addrs.len();
    let grown = shards.iter().flatten().any(|s| s.count as usize == listed);
    for (addr, shard) in addrs.iter().zip(shards) {
        if let Some(shard) = *shard
            && (shard.count as usize > listed || ((shard.count as usize) < listed && !grown))
        {
            problems.push(LayoutProblem::CountMismatch {
                addr: addr.clone(),
                shard,
                count: shard.count,
                listed,
            });
        }
    }
    let mut seen: Vec<u32> = Vec::new();
    for shard in shards.iter().flatten() {
        if seen.contains(&shard.index) {
            continue;
        }
        seen.push(shard.index);
        let holders: Vec<String> = addrs
            .iter()
            .zip(shards)
            .filter(|(_, s)| s.is_some_and(|s| s.index == shard.index))
            .map(|(a, _)| a.clone())
            .collect();
        if holders.len() > 1 {
            problems.push(LayoutProblem::Duplicate {
                shard: *shard,
                addrs: holders,
            });
        }
    }
    for (position, (addr, shard)) in addrs.iter().zip(shards).enumerate() {
        if let Some(shard) = *shard
            && shard.count as usize <= listed
            && shard.index as usize != position
        {
            problems.push(LayoutProblem::OutOfOrder {
                addr: addr.clone(),
                shard,
                position,
            });
        }
    }
    problems
}

/// The first slot two entries both serve (each entry's served ranges as its leader, or
/// single node, reports them; `None`: unknown).
pub fn slots_served_twice(addrs: &[String], served: &[Option<Vec<[u16; 2]>>]) -> Option<LayoutProblem> {
    let mut by: Vec<Option<usize>> = vec![None; usize::from(crate::routing::SLOTS)];
    for (entry, ranges) in served.iter().enumerate() {
        for [a, b] in ranges.iter().flatten() {
            for s in *a..=(*b).min(crate::routing::SLOTS - 1) {
                match by[usize::from(s)] {
                    Some(other) if other != entry => {
                        return Some(LayoutProblem::SlotServedTwice {
                            slot: s,
                            addrs: vec![addrs[other].clone(), addrs[entry].clone()],
                        });
                    }
                    _ => by[usize::from(s)] = Some(entry),
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(i: u32, n: u32) -> Option<ShardId> {
        Some(ShardId { index: i, count: n })
    }

    fn addrs(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("h:{i}")).collect()
    }

    #[test]
    fn a_good_list_has_no_problems_and_down_nodes_are_not_judged() {
        assert!(check_layout(&addrs(3), &[s(0, 3), s(1, 3), s(2, 3)]).is_empty());
        assert!(check_layout(&addrs(3), &[s(0, 3), None, s(2, 3)]).is_empty());
    }

    #[test]
    fn a_group_entry_takes_its_members_shard_and_names_a_stray_member() {
        let entries = vec!["a:1|a:2".to_string(), "b:1".to_string()];
        assert_eq!(expand_members(&entries).len(), 3);
        let (shards, p) = entry_shards(&entries, &[s(0, 2), None, s(1, 2)]);
        assert_eq!(shards, vec![s(0, 2), s(1, 2)]);
        assert!(p.is_empty());
        let (_, p) = entry_shards(&entries, &[s(0, 2), s(1, 2), s(1, 2)]);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].to_string()
                .starts_with("a:2 serves shard 1/2 but the rest of its group serves 0/2")
        );
    }

    #[test]
    fn wrong_order_duplicates_and_sizes_are_named() {
        let p = check_layout(&addrs(3), &[s(1, 3), s(0, 3), s(2, 3)]);
        assert_eq!(p.len(), 2);
        assert_eq!(
            p[0].to_string(),
            "h:0 serves shard 1/3 but is listed at position 0: list the nodes in shard order"
        );

        let p = check_layout(&addrs(3), &[s(0, 3), s(0, 3), s(2, 3)]);
        assert!(
            p.iter()
                .any(|p| p.to_string() == "h:0 and h:1 serve the same shard 0/3: only one node may serve a shard"),
            "{p:?}"
        );

        let p = check_layout(&addrs(2), &[s(0, 3), s(1, 3)]);
        assert_eq!(p.len(), 2);
        assert!(p[0].to_string().contains("a cluster of 3 nodes, but --nodes lists 2"));

        // A grown cluster: three started as i/3, a fourth added as 3/4; without the fourth
        // answering, the list is longer than the cluster the others know.
        assert!(check_layout(&addrs(4), &[s(0, 3), s(1, 3), s(2, 3), s(3, 4)]).is_empty());
        let p = check_layout(&addrs(4), &[s(0, 3), s(1, 3), s(2, 3), None]);
        assert_eq!(p.len(), 3, "{p:?}");
        let p = check_layout(&addrs(4), &[s(0, 3), s(1, 3), s(2, 3), s(2, 4)]);
        assert!(p.iter().any(|p| matches!(p, LayoutProblem::Duplicate { .. })), "{p:?}");
        // ...whose fourth was started without --no-slots: it serves the third's slots too.
        let served = vec![
            Some(vec![[0, 5461]]),
            Some(vec![[12288, 16383]]),
            Some(vec![[10923, 16383]]),
        ];
        let p = slots_served_twice(&addrs(3), &served).unwrap();
        assert_eq!(
            p.to_string(),
            "h:1 and h:2 both serve slot 12288: one slot, one group (start a group being added with --no-slots)"
        );
    }
}
