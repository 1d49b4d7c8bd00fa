//! What a benchmark asks of the store: the op mix, the key distribution, keys and values.
//!
//! A [`WorkloadSpec`] is built once from the command line (a YCSB letter or a named preset
//! from the seed reports, plus overrides) and shared; each task draws ops from its own
//! [`OpGen`] with its own seeded RNG.

mod zipf;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use clap::ValueEnum;
use kvshared::routing::{key_hash, owner_node};
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
    /// YCSB B: 95% read, 5% update, zipfian (the course workload).
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
    /// 95% read, 5% update, uniform over only the keys that node 0 owns: one shard takes all.
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
        }
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
        format!(
            "{} ({}), {} records, {}, {} B values",
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
    out.extend_from_slice(prefix.as_bytes());
    out.extend_from_slice(itoa::Buffer::new().format(index).as_bytes());
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
    /// For `hotkey`: the records owned by node 0.
    subset: Option<Vec<u64>>,
}

impl Shared {
    /// Prepares the shared state; `nodes` is the cluster size (for `hotkey`).
    pub fn new(spec: WorkloadSpec, nodes: u32) -> Arc<Shared> {
        let space = spec.key_space.unwrap_or(spec.records);
        let zipf = matches!(spec.distribution, Distribution::Zipfian | Distribution::Latest)
            .then(|| ZipfTable::new(space, spec.theta));
        let subset = spec.single_shard.then(|| {
            let mut key = Vec::new();
            (0..space)
                .filter(|&i| {
                    key.clear();
                    write_key(&mut key, &spec.key_prefix, i);
                    owner_node(key_hash(&key), nodes) == 0
                })
                .collect()
        });
        Arc::new(Shared {
            spec,
            zipf,
            inserted: AtomicU64::new(0),
            subset,
        })
    }
}

/// One task's op generator.
pub struct OpGen {
    shared: Arc<Shared>,
    rng: SmallRng,
    /// Cumulative thresholds of the mix, for one uniform draw per op.
    thresholds: [f64; 3],
}

impl OpGen {
    pub fn new(shared: Arc<Shared>, seed: u64) -> OpGen {
        let m = shared.spec.mix;
        let thresholds = [m.read, m.read + m.update, m.read + m.update + m.insert];
        OpGen {
            shared,
            rng: SmallRng::seed_from_u64(seed),
            thresholds,
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
        if let Some(subset) = &s.subset {
            return match subset.len() {
                0 => 0,
                n => subset[self.rng.random_range(0..n)],
            };
        }
        let space = spec.key_space.unwrap_or(spec.records);
        match (spec.distribution, &s.zipf) {
            (Distribution::Zipfian, Some(z)) => {
                let rank = z.sample(&mut self.rng);
                if spec.scrambled { scramble(rank, space) } else { rank }
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
            assert_eq!(owner_node(key_hash(&key), 4), 0);
        }
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
    fn keys_are_decimal_record_numbers() {
        let mut k = Vec::new();
        write_key(&mut k, "", 123456);
        assert_eq!(k, b"123456");
        k.clear();
        write_key(&mut k, "user", 0);
        assert_eq!(k, b"user0");
    }
}
