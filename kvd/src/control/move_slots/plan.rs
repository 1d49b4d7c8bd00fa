//! What a `move-slots` will move: of the slots asked for, those in a move from the source
//! to the target (not begun, or half done, to resume), those the target holds already, and
//! those that are not the source's to hand over (each group of them with why), read from
//! both groups' tables before anything changes.

use kvshared::slots::{Slot, ranges_of_slots};

use super::steps::{Stage, describe, stage};

/// The slots asked for, sorted out.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// In a move from the source to the target (to begin, or to finish).
    pub moving: Vec<u16>,
    /// Owned by the target already.
    pub done: Vec<u16>,
    /// Neither: left out, with where they are (`describe` of the source's, then the
    /// target's entry).
    pub elsewhere: Vec<(u16, String)>,
}

/// Sorts `wanted` by where each slot stands at the source (`src`) and target (`dst`).
pub fn plan(src: &[Slot], dst: &[Slot], (from, to): (usize, usize), wanted: &[u16]) -> Plan {
    let mut p = Plan::default();
    for &slot in wanted {
        let (Some(&s), Some(&t)) = (src.get(usize::from(slot)), dst.get(usize::from(slot))) else {
            continue;
        };
        match stage(slot, s, t, (from, to)) {
            Ok(Stage::Done) => p.done.push(slot),
            Ok(_) => p.moving.push(slot),
            Err(_) => p.elsewhere.push((
                slot,
                format!("{} at group {from}, {} at group {to}", describe(s), describe(t)),
            )),
        }
    }
    p
}

impl Plan {
    /// What is left out, and why, one line per reason (slot ranges first).
    pub fn left_out(&self) -> Vec<String> {
        let mut reasons: Vec<&str> = self.elsewhere.iter().map(|(_, why)| why.as_str()).collect();
        reasons.sort_unstable();
        reasons.dedup();
        reasons
            .into_iter()
            .map(|why| {
                let slots: Vec<u16> = self
                    .elsewhere
                    .iter()
                    .filter(|(_, w)| w == why)
                    .map(|(s, _)| *s)
                    .collect();
                format!("{} ({why})", kvshared::slots::format_ranges(&ranges_of_slots(&slots)))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvshared::routing::ShardId;
    use kvshared::slots::{SlotState, SlotTable};

    fn table(me: u32, count: u32) -> Vec<Slot> {
        SlotTable::for_shard(ShardId { index: me, count }).entries()
    }

    #[test]
    fn a_plan_keeps_the_sources_slots_and_names_the_rest() {
        // 3 groups; group 2 gave 8214-8218 to group 0 before; asked: 8200-8230 from 2 to 1.
        let (mut src, mut dst) = (table(2, 3), table(1, 3));
        for s in &mut src[8214..=8218] {
            *s = Slot {
                state: SlotState::Gone,
                owner: 0,
                epoch: 3,
            };
        }
        // Group 1's own slots in the range are done already; 8200-8213 are group 1's in the
        // even split of 3 (5462-10922).
        let wanted: Vec<u16> = (8200..=8230).collect();
        let p = plan(&src, &dst, (2, 1), &wanted);
        assert!(p.moving.is_empty(), "{p:?}");
        // As the report had it: group 2 owned 8200-8230 except 8214-8218.
        for s in 8200..=8230 {
            if !(8214..=8218).contains(&s) {
                src[s] = Slot {
                    state: SlotState::Owned,
                    owner: 2,
                    epoch: 2,
                };
                dst[s] = Slot {
                    state: SlotState::Gone,
                    owner: 2,
                    epoch: 2,
                };
            }
        }
        let p = plan(&src, &dst, (2, 1), &wanted);
        assert_eq!(p.moving.len(), 26);
        assert_eq!(p.elsewhere.len(), 5);
        let out = p.left_out();
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(out[0].starts_with("8214-8218 (gone to group 0"), "{out:?}");
    }
}
