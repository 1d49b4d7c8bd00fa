//! THROWAWAY: times of each stage of the log cycle, per entry index.
use std::collections::HashMap;
use std::time::Instant;
pub static T: parking_lot::Mutex<Option<HashMap<u64, [Option<Instant>; 4]>>> = parking_lot::Mutex::new(None);
pub static SUM: parking_lot::Mutex<([f64; 6], u64, Option<Instant>)> = parking_lot::Mutex::new(([0.0; 6], 0, None));
pub fn mark(index: u64, stage: usize) {
    let mut t = T.lock();
    t.get_or_insert_with(HashMap::new).entry(index).or_insert([None; 4])[stage] = Some(Instant::now());
}
pub fn done(index: u64, proposed: Instant, flushed_seen: Option<Instant>, batches: usize) {
    let now = Instant::now();
    let Some(st) = T.lock().get_or_insert_with(HashMap::new).remove(&index) else { return };
    let [Some(h), Some(f), Some(a0), Some(a1)] = st else { return };
    let us = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e6;
    let mut s = SUM.lock();
    let v = [us(proposed, h), us(h, f), us(f, a0), us(a0, a1), us(a1, now), batches as f64];
    for i in 0..6 { s.0[i] += v[i]; }
    s.1 += 1;
    let _ = flushed_seen;
    let began = *s.2.get_or_insert(now);
    if now.duration_since(began).as_secs() >= 2 {
        let n = s.1 as f64;
        eprintln!("PROBE entries/s {:.0}  propose->handed {:.0}  handed->flushed {:.0}  flushed->apply {:.0}  apply {:.0}  applied->returned {:.0} us  batches/entry {:.1}",
            n / now.duration_since(began).as_secs_f64(), s.0[0]/n, s.0[1]/n, s.0[2]/n, s.0[3]/n, s.0[4]/n, s.0[5]/n);
        *s = ([0.0; 6], 0, Some(now));
    }
}

pub static EPOCH: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);
pub static SENT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub static CONN: parking_lot::Mutex<(f64, u64, Option<Instant>)> = parking_lot::Mutex::new((0.0, 0, None));
pub fn sent() { SENT.store(EPOCH.elapsed().as_nanos() as u64, std::sync::atomic::Ordering::Relaxed); }
pub fn answered() {
    let now = EPOCH.elapsed().as_nanos() as u64;
    let d = now.saturating_sub(SENT.load(std::sync::atomic::Ordering::Relaxed)) as f64 / 1e3;
    let mut c = CONN.lock();
    c.0 += d; c.1 += 1;
    let t = *c.2.get_or_insert(Instant::now());
    if t.elapsed().as_secs() >= 2 { eprintln!("PROBE2 answers->written {:.0} us over {}", c.0 / c.1 as f64, c.1); *c = (0.0, 0, Some(Instant::now())); }
}
