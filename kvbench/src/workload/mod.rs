//! What a benchmark asks of the store: the op mix, the key distribution, keys and values.
//!
//! A [`WorkloadSpec`] is built once from the command line (a YCSB letter or a named preset
//! from the seed reports, plus overrides) and shared; each task draws ops from its own
//! [`OpGen`] with its own seeded RNG.

pub mod ttl;
mod zipf;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use kvshared::routing::{key_slot, slot_owner};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};

pub use zipf::{ZipfTable, scramble};

/// Named workloads: YCSB's core letters and the presets the seed reports used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// YCSB A: 50% read, 50% update, zipfian.
    A,
    /// YCSB B: 95% read, 5% update, zipfian 0.99 (the headline workload with the default
    /// 1M records of 128 B values).
    B,
    /// YCSB C: 100% read, zipfian.
    C,
    /// YCSB D: 95% read, 5% insert, reads favour the latest inserts.
    D,
    /// YCSB F: 50% read, 50% read-modify-write, zipfian.
    F,
    /// 90% read, 10% update; --contention picks uniform (low) or zipfian (high).
    ReadMostly,
    /// 10% read, 90% update; --contention picks uniform (low) or zipfian (high).
    WriteMostly,
    /// 100% update over all records, uniform.
    Putall,
    /// 100% read over all records, uniform.
    Getall,
    /// 100% read of the 100 most popular keys (records 0..99), uniform among them.
    Getpopular,
    /// 50% read, 50% update, uniform.
    Mixed,
    /// 95% read, 5% update, uniform over only the keys that one node owns (node 0, or as
    /// --phases moves it): one shard takes all (or --hot-ops of the ops).
    Hotkey,
    /// 95% read, 5% update, uniform.
    Uniform,
}

/// Contention level of the read-mostly / write-mostly presets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Contention {
    /// Uniform key choice: few collisions on the same keys and shards.
    Low,
    /// Zipfian key choice (theta 0.99): a few hot keys take most ops.
    High,
}

/// How keys are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Distribution {
    Zipfian,
    Uniform,
    /// Zipfian over recency: the newest inserted records are the most popular.
    Latest,
    /// A fraction of the keys (--hot-fraction) receives a fraction of the ops (--hot-ops).
    Hotspot,
}

/// Fractions of each op type; they sum to 1.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Mix {
    pub read: f64,
    pub update: f64,
    pub insert: f64,
    pub read_modify_write: f64,
}

impl Mix {
    const fn new(read: f64, update: f64, insert: f64, read_modify_write: f64) -> Mix {
        Mix {
            read,
            update,
            insert,
            read_modify_write,
        }
    }
}

/// Everything that defines the ops a run sends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkloadSpec {
    pub workload: Workload,
    pub mix: Mix,
    pub distribution: Distribution,
    pub theta: f64,
    pub scrambled: bool,
    pub hot_fraction: f64,
    pub hot_ops: f64,
    pub records: u64,
    pub value_size: usize,
    pub key_prefix: String,
    /// Only keys owned by node 0 (the `hotkey` preset).
    pub single_shard: bool,
    /// Restrict key choice to records `0..key_space` (the `getpopular` preset); else all records.
    pub key_space: Option<u64>,
    /// `hotkey`: where the hot spot is over time (repeated in turn); empty: node 0 throughout.
    #[serde(default)]
    pub phases: Vec<Phase>,
    /// `hotkey`: the fraction of ops that go to the hot node's keys (the rest spread over
    /// every record); `None`: all of them.
    #[serde(default)]
    pub hot_share: Option<f64>,
    /// `--ttl`: every put sets a time to live from this range; `None`: plain puts.
    #[serde(default)]
    pub ttl: Option<ttl::TtlRange>,
}

/// One step of a moving hot spot: node `shard` is hot for `millis` milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Phase {
    pub shard: u32,
    pub millis: u64,
}

/// Parses `--phases`: `SHARD:DURATION` steps separated by commas, e.g. `0:10s,1:10s,2:5s`.
pub fn parse_phases(text: &str) -> Result<Vec<Phase>, String> {
    text.split(',')
        .map(|step| {
            let (shard, time) = step
                .trim()
                .split_once(':')
                .ok_or_else(|| format!("'{step}' is not SHARD:DURATION (e.g. 1:10s)"))?;
            let shard = shard
                .trim()
                .parse()
                .map_err(|_| format!("'{shard}' in '{step}' is not a shard number"))?;
            let time = humantime::parse_duration(time.trim()).map_err(|e| format!("'{time}' in '{step}': {e}"))?;
            if time < Duration::from_millis(100) {
                return Err(format!("'{step}': a phase lasts at least 100ms"));
            }
            Ok(Phase {
                shard,
                millis: time.as_millis() as u64,
            })
        })
        .collect()
}

/// Overrides of a preset, from the command line.
#[derive(Clone, Debug, Default)]
pub struct SpecOptions {
    pub contention: Option<Contention>,
    pub distribution: Option<Distribution>,
    pub theta: Option<f64>,
    pub scrambled: bool,
    pub hot_fraction: Option<f64>,
    pub hot_ops: Option<f64>,
    pub records: u64,
    pub value_size: usize,
    pub key_prefix: String,
    /// `--phases` (hotkey only).
    pub phases: Vec<Phase>,
    /// `--ttl`.
    pub ttl: Option<ttl::TtlRange>,
}

impl WorkloadSpec {
    pub fn new(workload: Workload, o: &SpecOptions) -> WorkloadSpec {
        use Distribution::*;
        let contended = |c: Option<Contention>| match c.unwrap_or(Contention::High) {
            Contention::Low => Uniform,
            Contention::High => Zipfian,
        };
        let (mix, distribution) = match workload {
            Workload::A => (Mix::new(0.5, 0.5, 0.0, 0.0), Zipfian),
            Workload::B => (Mix::new(0.95, 0.05, 0.0, 0.0), Zipfian),
            Workload::C => (Mix::new(1.0, 0.0, 0.0, 0.0), Zipfian),
            Workload::D => (Mix::new(0.95, 0.0, 0.05, 0.0), Latest),
            Workload::F => (Mix::new(0.5, 0.0, 0.0, 0.5), Zipfian),
            Workload::ReadMostly => (Mix::new(0.9, 0.1, 0.0, 0.0), contended(o.contention)),
            Workload::WriteMostly => (Mix::new(0.1, 0.9, 0.0, 0.0), contended(o.contention)),
            Workload::Putall => (Mix::new(0.0, 1.0, 0.0, 0.0), Uniform),
            Workload::Getall | Workload::Getpopular => (Mix::new(1.0, 0.0, 0.0, 0.0), Uniform),
            Workload::Mixed => (Mix::new(0.5, 0.5, 0.0, 0.0), Uniform),
            Workload::Hotkey | Workload::Uniform => (Mix::new(0.95, 0.05, 0.0, 0.0), Uniform),
        };
        WorkloadSpec {
            workload,
            mix,
            distribution: o.distribution.unwrap_or(distribution),
            theta: o.theta.unwrap_or(0.99),
            scrambled: o.scrambled,
            hot_fraction: o.hot_fraction.unwrap_or(0.2),
            hot_ops: o.hot_ops.unwrap_or(0.8),
            records: o.records.max(1),
            value_size: o.value_size,
            key_prefix: o.key_prefix.clone(),
            single_shard: workload == Workload::Hotkey,
            key_space: (workload == Workload::Getpopular).then_some(100.min(o.records.max(1))),
            phases: o.phases.clone(),
            hot_share: (workload == Workload::Hotkey).then_some(o.hot_ops).flatten(),
            ttl: o.ttl,
        }
    }

    /// Refuses settings this cluster of `nodes` nodes cannot run: phases without `hotkey`, a
    /// phase naming a node past the last.
    pub fn check(&self, nodes: u32) -> Result<(), String> {
        if !self.phases.is_empty() && self.workload != Workload::Hotkey {
            return Err("--phases moves the hot spot of -w hotkey; add -w hotkey".into());
        }
        if let Some(p) = self.phases.iter().find(|p| p.shard >= nodes) {
            return Err(format!(
                "--phases names shard {} but the cluster has {nodes} (shards 0..{})",
                p.shard,
                nodes.saturating_sub(1)
            ));
        }
        Ok(())
    }

    /// A one-line description for summaries.
    pub fn describe(&self) -> String {
        let dist = match self.distribution {
            Distribution::Zipfian => format!(
                "zipfian({}{})",
                self.theta,
                if self.scrambled { ", scrambled" } else { "" }
            ),
            Distribution::Hotspot => format!(
                "hotspot({:.0}% of keys get {:.0}% of ops)",
                self.hot_fraction * 100.0,
                self.hot_ops * 100.0
            ),
            _ if self.workload == Workload::Hotkey => {
                let share = self
                    .hot_share
                    .map_or("all".to_string(), |f| format!("{:.0}%", f * 100.0));
                let place = if self.phases.is_empty() {
                    "node 0".to_string()
                } else {
                    self.phases
                        .iter()
                        .map(|p| {
                            format!(
                                "{} for {}",
                                p.shard,
                                humantime::format_duration(Duration::from_millis(p.millis))
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(", then ")
                };
                format!("{share} of ops on the keys of {place}")
            }
            d => format!("{d:?}").to_lowercase(),
        };
        let m = &self.mix;
        let mut parts = Vec::new();
        for (name, f) in [
            ("read", m.read),
            ("update", m.update),
            ("insert", m.insert),
            ("rmw", m.read_modify_write),
        ] {
            if f > 0.0 {
                parts.push(format!("{:.0}% {name}", f * 100.0));
            }
        }
        let ttl = self.ttl.map_or(String::new(), |t| {
            format!(", each put with a time to live of {}", t.describe())
        });
        format!(
            "{} ({}), {} records, {}, {} B values{ttl}",
            format!("{:?}", self.workload).to_lowercase(),
            parts.join(" / "),
            self.records,
            dist,
            self.value_size
        )
    }
}

/// Appends the key of record `index` to `out`: the prefix, then the index in decimal.
#[inline]
pub fn write_key(out: &mut Vec<u8>, prefix: &str, index: u64) {
    if !prefix.is_empty() {
        out.extend_from_slice(prefix.as_bytes());
    }
    match u32::try_from(index) {
        Ok(small) if small < 100_000_000 => {
            // One 8-byte store and a truncation: `itoa`'s digits and their copy into `out`
            // were a quarter of the cost of drawing an op (`kvbench run --dry-run`).
            let (digits, len) = eight_digits(small);
            let start = out.len();
            out.extend_from_slice(&digits.to_le_bytes());
            out.truncate(start + len);
        }
        _ => out.extend_from_slice(itoa::Buffer::new().format(index).as_bytes()),
    }
}

/// `n` (below 10^8) in decimal without leading zeros, as the low `len` bytes of a
/// little-endian word (the first digit in the lowest byte), and `len` (1-8). Each step halves
/// every lane of the word at once (SWAR): 4-digit halves, then 2-digit quarters, then digits.
#[inline]
fn eight_digits(n: u32) -> (u64, usize) {
    let n = u64::from(n);
    // The high four digits in the low 32-bit lane (they come first in memory).
    let mut v = (n / 10_000) | ((n % 10_000) << 32);
    // x / 100 for x < 10,000 in each 32-bit lane: (x * 10,486) >> 20 stays in its lane.
    let hundreds = ((v * 10_486) >> 20) & 0x0000_007f_0000_007f;
    v = hundreds | ((v - hundreds * 100) << 16);
    // x / 10 for x < 100 in each 16-bit lane: (x * 103) >> 10.
    let tens = ((v * 103) >> 10) & 0x000f_000f_000f_000f;
    v = tens | ((v - tens * 10) << 8);
    // Leading zero digits are the low zero bytes; keep at least one digit.
    let zeros = ((v.trailing_zeros() / 8) as usize).min(7);
    ((v >> (8 * zeros)) + 0x3030_3030_3030_3030, 8 - zeros)
}

/// The kind of op a generator produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpType {
    Read = 0,
    Update = 1,
    Insert = 2,
    ReadModifyWrite = 3,
}

impl OpType {
    pub const ALL: [OpType; 4] = [OpType::Read, OpType::Update, OpType::Insert, OpType::ReadModifyWrite];

    pub fn name(self) -> &'static str {
        match self {
            OpType::Read => "read",
            OpType::Update => "update",
            OpType::Insert => "insert",
            OpType::ReadModifyWrite => "read_modify_write",
        }
    }
}

/// What the whole run shares: the spec, the zipf constants and the insert counter.
pub struct Shared {
    pub spec: WorkloadSpec,
    zipf: Option<Arc<ZipfTable>>,
    /// Records inserted so far during the run (workload D); new keys start at `records`.
    inserted: AtomicU64,
    /// For `hotkey`: per node, the records it owns.
    subsets: Option<Vec<Vec<u64>>>,
    /// When the run's hot spot schedule starts.
    created: Instant,
}

impl Shared {
    /// Prepares the shared state; `nodes` is the cluster size (for `hotkey`: node `k`'s
    /// keys are those of the slots an even split gives it).
    pub fn new(spec: WorkloadSpec, nodes: u32) -> Arc<Shared> {
        let nodes = nodes.max(1);
        Shared::with_owners(spec, nodes, &|slot| slot_owner(slot, nodes))
    }

    /// As [`Shared::new`], with `hotkey`'s sets of keys by `owner` (a slot's node as the run
    /// starts: a hot spot is a set of keys, and stays that set wherever its slots move).
    pub fn with_owners(spec: WorkloadSpec, nodes: u32, owner: &dyn Fn(u16) -> u32) -> Arc<Shared> {
        let space = spec.key_space.unwrap_or(spec.records);
        let zipf = matches!(spec.distribution, Distribution::Zipfian | Distribution::Latest)
            .then(|| ZipfTable::new(space, spec.theta));
        let subsets = spec.single_shard.then(|| {
            let mut key = Vec::new();
            let mut subsets = vec![Vec::new(); nodes.max(1) as usize];
            for i in 0..space {
                key.clear();
                write_key(&mut key, &spec.key_prefix, i);
                if let Some(set) = subsets.get_mut(owner(key_slot(&key)) as usize) {
                    set.push(i);
                }
            }
            subsets
        });
        Arc::new(Shared {
            spec,
            zipf,
            inserted: AtomicU64::new(0),
            subsets,
            created: Instant::now(),
        })
    }

    /// The node that is hot `elapsed` after the run started (`hotkey`).
    pub fn hot_node(&self, elapsed: Duration) -> usize {
        let phases = &self.spec.phases;
        let cycle: u64 = phases.iter().map(|p| p.millis).sum();
        if cycle == 0 {
            return 0;
        }
        let mut at = elapsed.as_millis() as u64 % cycle;
        for p in phases {
            if at < p.millis {
                return p.shard as usize;
            }
            at -= p.millis;
        }
        0
    }
}

/// Ops between two looks at the clock for a moving hot spot.
const HOT_CHECK_EVERY: u32 = 256;

/// Zipfian records drawn at once, ahead of the ops that take them. One draw is a chain of
/// dependent steps (the power, the scrambling hash, the modulo) too long for the CPU to
/// overlap with the next op's when the ops are made one at a time; drawn in a loop of
/// their own, the draws overlap one another (`kvbench run --dry-run`: 8% fewer ns per op).
const DRAW_AHEAD: usize = 32;

/// One task's op generator.
pub struct OpGen {
    shared: Arc<Shared>,
    rng: SmallRng,
    /// Cumulative thresholds of the mix, for one uniform draw per op.
    thresholds: [f64; 3],
    /// `hotkey`: the hot node, and ops until the clock is read again.
    hot: usize,
    until_check: u32,
    /// Zipfian records drawn ahead (see [`DRAW_AHEAD`]), taken from `next` on.
    ahead: [u64; DRAW_AHEAD],
    next: usize,
}

impl OpGen {
    pub fn new(shared: Arc<Shared>, seed: u64) -> OpGen {
        let m = shared.spec.mix;
        let thresholds = [m.read, m.read + m.update, m.read + m.update + m.insert];
        OpGen {
            shared,
            rng: SmallRng::seed_from_u64(seed),
            thresholds,
            hot: 0,
            until_check: 0,
            ahead: [0; DRAW_AHEAD],
            next: DRAW_AHEAD,
        }
    }

    /// The next op and the record index it touches.
    #[inline]
    pub fn next_op(&mut self) -> (OpType, u64) {
        let u: f64 = self.rng.random();
        let op = if u < self.thresholds[0] {
            OpType::Read
        } else if u < self.thresholds[1] {
            OpType::Update
        } else if u < self.thresholds[2] {
            OpType::Insert
        } else {
            OpType::ReadModifyWrite
        };
        let index = if op == OpType::Insert {
            self.shared.spec.records + self.shared.inserted.fetch_add(1, Ordering::Relaxed)
        } else {
            self.choose_key()
        };
        (op, index)
    }

    #[inline]
    fn choose_key(&mut self) -> u64 {
        let s = &self.shared;
        let spec = &s.spec;
        if let Some(subsets) = &s.subsets {
            if self.until_check == 0 {
                self.until_check = HOT_CHECK_EVERY;
                self.hot = s.hot_node(s.created.elapsed());
            }
            self.until_check -= 1;
            let hot = spec.hot_share.is_none_or(|f| self.rng.random_bool(f.clamp(0.0, 1.0)));
            let subset = subsets.get(self.hot).map(Vec::as_slice).unwrap_or_default();
            return match subset.len() {
                0 => 0,
                n if hot => subset[self.rng.random_range(0..n)],
                _ => self.rng.random_range(0..spec.records.max(1)),
            };
        }
        let space = spec.key_space.unwrap_or(spec.records);
        match (spec.distribution, &s.zipf) {
            (Distribution::Zipfian, Some(z)) => {
                if self.next == DRAW_AHEAD {
                    for record in &mut self.ahead {
                        let rank = z.sample(&mut self.rng);
                        *record = if spec.scrambled { scramble(rank, space) } else { rank };
                    }
                    self.next = 0;
                }
                let record = self.ahead[self.next];
                self.next += 1;
                record
            }
            (Distribution::Latest, Some(z)) => {
                let newest = spec.records + s.inserted.load(Ordering::Relaxed) - 1;
                newest.saturating_sub(z.sample(&mut self.rng))
            }
            (Distribution::Hotspot, _) => {
                let hot = ((space as f64 * spec.hot_fraction) as u64).clamp(1, space);
                if self.rng.random_bool(spec.hot_ops.clamp(0.0, 1.0)) || hot == space {
                    self.rng.random_range(0..hot)
                } else {
                    self.rng.random_range(hot..space)
                }
            }
            _ => self.rng.random_range(0..space),
        }
    }

    /// Fills `value` with fresh bytes for an update (cheap: only the first 8 bytes change).
    #[inline]
    pub fn fresh_value(&mut self, value: &mut [u8]) {
        let stamp: u64 = self.rng.random();
        let n = value.len().min(8);
        value[..n].copy_from_slice(&stamp.to_le_bytes()[..n]);
    }

    pub fn rng(&mut self) -> &mut SmallRng {
        &mut self.rng
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvshared::routing::owner_node;

    fn spec(w: Workload) -> WorkloadSpec {
        WorkloadSpec::new(
            w,
            &SpecOptions {
                records: 1_000_000,
                value_size: 128,
                ..SpecOptions::default()
            },
        )
    }

    #[test]
    fn ycsb_b_mix_is_95_5_within_tolerance() {
        let mut g = OpGen::new(Shared::new(spec(Workload::B), 1), 42);
        let draws = 100_000;
        let reads = (0..draws).filter(|_| g.next_op().0 == OpType::Read).count();
        let f = reads as f64 / draws as f64;
        assert!((f - 0.95).abs() < 0.005, "read fraction {f}");
    }

    #[test]
    fn workload_f_mixes_reads_and_read_modify_writes() {
        let mut g = OpGen::new(Shared::new(spec(Workload::F), 1), 3);
        let rmw = (0..100_000)
            .filter(|_| g.next_op().0 == OpType::ReadModifyWrite)
            .count();
        assert!((rmw as f64 / 100_000.0 - 0.5).abs() < 0.01);
    }

    #[test]
    fn unscrambled_zipfian_makes_record_zero_the_hottest() {
        let mut g = OpGen::new(Shared::new(spec(Workload::C), 1), 9);
        let mut counts = std::collections::HashMap::new();
        for _ in 0..50_000 {
            *counts.entry(g.next_op().1).or_insert(0u32) += 1;
        }
        let hottest = counts.iter().max_by_key(|(_, c)| **c).map(|(k, _)| *k);
        assert_eq!(hottest, Some(0));
    }

    #[test]
    fn workload_d_inserts_new_records_and_reads_recent_ones() {
        let mut g = OpGen::new(Shared::new(spec(Workload::D), 1), 5);
        let mut inserted = 0;
        for _ in 0..10_000 {
            let (op, idx) = g.next_op();
            if op == OpType::Insert {
                assert_eq!(idx, 1_000_000 + inserted);
                inserted += 1;
            } else {
                assert!(idx < 1_000_000 + inserted);
            }
        }
        assert!(inserted > 300);
    }

    #[test]
    fn hotkey_sets_follow_the_layout_the_run_starts_with() {
        // Six groups of which only the first three hold slots (spare groups added later):
        // the hot set of node 1 is the keys of the slots node 1 holds, not an even sixth.
        let o = SpecOptions {
            records: 5_000,
            value_size: 8,
            phases: vec![Phase {
                shard: 1,
                millis: 60_000,
            }],
            ..SpecOptions::default()
        };
        let spec = WorkloadSpec::new(Workload::Hotkey, &o);
        let prefix = spec.key_prefix.clone();
        let shared = Shared::with_owners(spec, 6, &|s| slot_owner(s, 3));
        let mut g = OpGen::new(shared, 7);
        let mut key = Vec::new();
        for _ in 0..2000 {
            let (_, idx) = g.next_op();
            key.clear();
            write_key(&mut key, &prefix, idx);
            assert_eq!(slot_owner(key_slot(&key), 3), 1);
        }
    }

    #[test]
    fn hotkey_only_touches_node_zero() {
        let mut o = SpecOptions {
            records: 10_000,
            value_size: 8,
            ..SpecOptions::default()
        };
        o.key_prefix = "user".into();
        let shared = Shared::new(WorkloadSpec::new(Workload::Hotkey, &o), 4);
        let mut g = OpGen::new(shared, 1);
        let mut key = Vec::new();
        for _ in 0..1000 {
            key.clear();
            write_key(&mut key, "user", g.next_op().1);
            assert_eq!(owner_node(&key, 4), 0);
        }
    }

    #[test]
    fn phases_move_the_hot_spot_in_turn() {
        let o = SpecOptions {
            records: 10_000,
            value_size: 8,
            phases: parse_phases("2:1s, 0:500ms").unwrap(),
            ..SpecOptions::default()
        };
        let spec = WorkloadSpec::new(Workload::Hotkey, &o);
        assert_eq!(spec.check(3), Ok(()));
        assert!(spec.check(2).unwrap_err().contains("shard 2"));
        assert!(WorkloadSpec::new(Workload::B, &o).check(3).is_err());
        let shared = Shared::new(spec, 3);
        let at = |ms| shared.hot_node(Duration::from_millis(ms));
        assert_eq!(
            (at(0), at(999), at(1000), at(1499), at(1500), at(2600)),
            (2, 2, 0, 0, 2, 0)
        );
        assert!(parse_phases("1").is_err());
        assert!(parse_phases("x:1s").is_err());
        assert!(parse_phases("1:10ms").is_err());
    }

    #[test]
    fn hot_ops_sends_only_that_share_to_the_hot_node() {
        let o = SpecOptions {
            records: 20_000,
            value_size: 8,
            hot_ops: Some(0.5),
            ..SpecOptions::default()
        };
        let mut g = OpGen::new(Shared::new(WorkloadSpec::new(Workload::Hotkey, &o), 4), 3);
        let mut key = Vec::new();
        let on_zero = (0..4000)
            .filter(|_| {
                key.clear();
                write_key(&mut key, "", g.next_op().1);
                owner_node(&key, 4) == 0
            })
            .count();
        // Half go to node 0's keys, and a quarter of the other half land there anyway.
        assert!((2300..2700).contains(&on_zero), "{on_zero}");
    }

    #[test]
    fn getpopular_stays_in_the_top_hundred() {
        let mut g = OpGen::new(Shared::new(spec(Workload::Getpopular), 1), 5);
        assert!((0..10_000).all(|_| g.next_op().1 < 100));
    }

    #[test]
    fn hotspot_sends_most_ops_to_the_hot_set() {
        let mut o = SpecOptions {
            records: 10_000,
            distribution: Some(Distribution::Hotspot),
            ..SpecOptions::default()
        };
        o.hot_fraction = Some(0.1);
        let mut g = OpGen::new(Shared::new(WorkloadSpec::new(Workload::B, &o), 1), 5);
        let hot = (0..20_000).filter(|_| g.next_op().1 < 1000).count();
        assert!((hot as f64 / 20_000.0 - 0.8).abs() < 0.02);
    }

    #[test]
    fn same_seed_same_ops() {
        let shared = Shared::new(spec(Workload::A), 1);
        let mut a = OpGen::new(shared.clone(), 77);
        let mut b = OpGen::new(shared, 77);
        for _ in 0..100 {
            assert_eq!(a.next_op(), b.next_op());
        }
    }

    #[test]
    fn keys_are_written_as_itoa_writes_them() {
        let mut edges: Vec<u64> = vec![0, 1, 9, 10, 99, 100, 99_999_999, 100_000_000, u64::MAX];
        for p in 1..20u32 {
            let t = 10u64.pow(p);
            edges.extend([t - 1, t, t + 1]);
        }
        let mut rng = SmallRng::seed_from_u64(3);
        let drawn = (0..100_000).map(|_| rng.random_range(0..200_000_000u64));
        for (i, n) in edges.into_iter().chain(drawn).enumerate() {
            let prefix = if i % 2 == 0 { "" } else { "user" };
            let mut key = b"kept".to_vec();
            write_key(&mut key, prefix, n);
            assert_eq!(key, format!("kept{prefix}{n}").into_bytes(), "{n}");
        }
    }

    #[test]
    fn keys_are_decimal_record_numbers() {
        let mut k = Vec::new();
        write_key(&mut k, "", 123456);
        assert_eq!(k, b"123456");
        k.clear();
        write_key(&mut k, "user", 0);
        assert_eq!(k, b"user0");
    }
}
