//! `kvtui --record FILE` and `kvtui --replay FILE`: every sample the dashboard takes, as one
//! JSON line each, appended; and a recording played back through the same view.
//!
//! A line is self-contained (wall-clock time, node address, its stats or error), so
//! recordings of several sessions can be appended to one file and still replay, and other
//! tools (jq, pandas) can read them without knowing kvtui.

use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kvshared::stats::NodeStats;
use serde::{Deserialize, Serialize};

use crate::state::Sample;

/// One recorded sample.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// When it was taken, milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// The node's address as given to `--nodes`.
    pub addr: String,
    /// What the node answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats: Option<NodeStats>,
    /// Why it did not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Appends samples to a recording file.
pub struct Recorder {
    out: BufWriter<std::fs::File>,
    path: PathBuf,
    nodes: Vec<String>,
}

impl Recorder {
    /// Opens `path` for appending (creating it).
    pub fn open(path: &Path, nodes: &[String]) -> anyhow::Result<Recorder> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| anyhow::anyhow!("cannot open {} to record into: {e}", path.display()))?;
        Ok(Recorder {
            out: BufWriter::new(file),
            path: path.to_path_buf(),
            nodes: nodes.to_vec(),
        })
    }

    /// Records the samples of one more row (a member learned from its group).
    pub fn add_node(&mut self, addr: &str) {
        self.nodes.push(addr.to_string());
    }

    /// Writes one sample (taken now).
    pub fn write(&mut self, sample: &Sample) -> anyhow::Result<()> {
        let record = Record {
            unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            addr: self.nodes.get(sample.node).cloned().unwrap_or_default(),
            stats: sample.result.as_ref().ok().cloned(),
            error: sample.result.as_ref().err().cloned(),
        };
        serde_json::to_writer(&mut self.out, &record)?;
        self.out.write_all(b"\n")?;
        Ok(())
    }

    /// Pushes what was written to the file (once per screen refresh).
    pub fn flush(&mut self) -> anyhow::Result<()> {
        self.out
            .flush()
            .map_err(|e| anyhow::anyhow!("cannot write to {}: {e}", self.path.display()))
    }
}

/// A recording read back: its records in file order and the nodes in order of first
/// appearance.
#[derive(Debug, Clone)]
pub struct Recording {
    pub records: Vec<Record>,
    pub nodes: Vec<String>,
}

/// Reads a recording. A line that does not parse is refused with its number, except a last
/// line cut short (kvtui killed mid-write), which is left out with a warning.
pub fn read(path: &Path) -> anyhow::Result<Recording> {
    let file = std::fs::File::open(path).map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
    let lines: Vec<String> = std::io::BufReader::new(file)
        .lines()
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    let mut records = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Record>(line) {
            Ok(r) if r.stats.is_some() != r.error.is_some() => records.push(r),
            Ok(_) => anyhow::bail!(
                "{} line {}: a record has either \"stats\" or \"error\"",
                path.display(),
                i + 1
            ),
            Err(e) if i + 1 == lines.len() && e.is_eof() => {
                // Said before the dashboard takes the screen.
                eprintln!(
                    "kvtui: warning: {} line {}: the last line is cut short (kvtui stopped mid-write); left out",
                    path.display(),
                    i + 1
                );
            }
            Err(e) => anyhow::bail!("{} line {}: not a kvtui recording line ({e})", path.display(), i + 1),
        }
    }
    if records.is_empty() {
        anyhow::bail!("{} holds no samples", path.display());
    }
    let mut nodes: Vec<String> = Vec::new();
    for r in &records {
        if !nodes.contains(&r.addr) {
            nodes.push(r.addr.clone());
        }
    }
    Ok(Recording { records, nodes })
}

impl Recording {
    /// The interval it was recorded at: the median gap between one node's samples (the
    /// first node's), `None` for fewer than two of them.
    pub fn interval(&self) -> Option<Duration> {
        let first = self.nodes.first()?;
        let times: Vec<u64> = self
            .records
            .iter()
            .filter(|r| &r.addr == first)
            .map(|r| r.unix_ms)
            .collect();
        let mut gaps: Vec<u64> = times.windows(2).map(|w| w[1].saturating_sub(w[0])).collect();
        gaps.sort_unstable();
        gaps.get(gaps.len() / 2).map(|&ms| Duration::from_millis(ms))
    }
}

/// The dashboard's time while replaying: the recording's time, running `speed` times as
/// fast as the wall clock from `origin` (the first record).
#[derive(Debug, Clone, Copy)]
pub struct ReplayClock {
    pub origin: Instant,
    pub speed: f64,
    started: Instant,
}

impl ReplayClock {
    pub fn new(origin: Instant, speed: f64) -> ReplayClock {
        ReplayClock {
            origin,
            speed,
            started: Instant::now(),
        }
    }

    /// Where the replay stands now.
    pub fn now(&self) -> Instant {
        self.origin + self.started.elapsed().mul_f64(self.speed)
    }
}

/// Sends the records as samples, each when the replay clock reaches it (the sample's time is
/// the recorded one, so rates are the recorded rates at any speed). Runs on its own thread;
/// stops when the dashboard is gone or the recording ends.
pub fn play(recording: Recording, clock: ReplayClock, samples: Sender<Sample>) {
    std::thread::spawn(move || {
        let Some(first) = recording.records.first().map(|r| r.unix_ms) else {
            return;
        };
        for r in recording.records {
            let offset = Duration::from_millis(r.unix_ms.saturating_sub(first));
            let due = clock.origin + offset;
            let now = clock.now();
            if due > now {
                std::thread::sleep((due - now).div_f64(clock.speed));
            }
            let node = recording.nodes.iter().position(|a| *a == r.addr).unwrap_or(0);
            let result = match (r.stats, r.error) {
                (Some(s), _) => Ok(s),
                (None, e) => Err(e.unwrap_or_default()),
            };
            if samples.send(Sample { node, at: due, result }).is_err() {
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> kvtestkit::Scratch {
        kvtestkit::scratch_file("kvtui-rec", name)
    }

    #[test]
    fn a_recording_reads_back_with_its_nodes_in_order() {
        let path = scratch("round");
        let nodes = vec!["a:1".to_string(), "b:2".to_string()];
        let mut rec = Recorder::open(&path, &nodes).unwrap();
        for (node, result) in [(1, Ok(NodeStats::default())), (0, Err("refused".to_string()))] {
            rec.write(&Sample {
                node,
                at: Instant::now(),
                result,
            })
            .unwrap();
        }
        rec.flush().unwrap();
        drop(rec);
        // A second session appends; a torn last line is left out.
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"unix_ms\":12,\"addr\":\"a:").unwrap();
        let r = read(&path).unwrap();
        assert_eq!(r.records.len(), 2);
        assert_eq!(r.nodes, vec!["b:2", "a:1"]);
        assert_eq!(r.records[1].error.as_deref(), Some("refused"));
    }

    #[test]
    fn a_damaged_line_is_refused_with_its_number() {
        let path = scratch("bad");
        std::fs::write(
            &path,
            "{\"unix_ms\":1,\"addr\":\"a:1\",\"error\":\"x\"}\nnot json\n{}\n",
        )
        .unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
    }

    /// Played back fast, samples keep their recorded times, so the view's rates are the
    /// recorded rates at any speed.
    #[test]
    fn a_fast_replay_shows_the_recorded_rates() {
        let stats = |uptime_ms: u64, gets: u64| NodeStats {
            uptime_ms,
            counts: kvshared::stats::Counts {
                gets,
                ..Default::default()
            },
            ..NodeStats::default()
        };
        let recording = Recording {
            records: vec![
                Record {
                    unix_ms: 1_000_000,
                    addr: "a:1".into(),
                    stats: Some(stats(5_000, 0)),
                    error: None,
                },
                Record {
                    unix_ms: 1_002_000,
                    addr: "a:1".into(),
                    stats: Some(stats(7_000, 10_000)),
                    error: None,
                },
            ],
            nodes: vec!["a:1".into()],
        };
        assert_eq!(recording.interval(), Some(Duration::from_secs(2)));
        let mut view = crate::state::ClusterView::new(&recording.nodes);
        let (tx, rx) = std::sync::mpsc::channel();
        play(recording, ReplayClock::new(view.started, 100.0), tx);
        for _ in 0..2 {
            view.apply(rx.recv_timeout(Duration::from_secs(5)).unwrap());
        }
        assert_eq!(view.nodes[0].rates.as_ref().unwrap().ops_per_sec, 5_000.0);
    }
}
