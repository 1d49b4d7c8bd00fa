//! The dashboard's interactive state and its main loop: drain samples, draw, handle keys.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use tokio::sync::watch;

use crate::bench::{BenchProgress, BenchSource};
use crate::collector::Collector;
use crate::recording::{self, Recorder, Recording, ReplayClock};
use crate::state::{ClusterView, Sample, Series};
use crate::terminal;

/// Which screen is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Table,
    Detail,
    Help,
}

/// How the dashboard starts.
#[derive(Debug, Clone)]
pub struct DashboardConfig {
    /// The nodes, in shard order.
    pub nodes: Vec<String>,
    /// Timeouts for polling them.
    pub client: kvshared::client::ClientConfig,
    /// Poll interval.
    pub interval: Duration,
    /// Chart window.
    pub window: Duration,
    /// Append every sample to this file (`--record`).
    pub record: Option<std::path::PathBuf>,
    /// Show this recording instead of polling (`--replay`), at this speed.
    pub replay: Option<(Recording, f64)>,
}

/// A benchmark's live figures, as the embedded panel shows them.
#[derive(Debug, Clone, Default)]
pub struct BenchView {
    pub progress: BenchProgress,
    pub throughput: Series,
    pub p50: Series,
    pub p99: Series,
    last: Option<(Instant, u64)>,
}

impl BenchView {
    /// Takes in a new progress report; rates come from the change since the last one.
    pub fn update(&mut self, p: BenchProgress, now: Instant, t: f64) {
        if let Some((at, ops)) = self.last {
            let secs = now.saturating_duration_since(at).as_secs_f64();
            if secs >= 0.2 {
                self.throughput
                    .push_back((t, p.completed_ops.saturating_sub(ops) as f64 / secs));
                if let Some((p50, p99)) = p.recent_latency_us {
                    self.p50.push_back((t, p50));
                    self.p99.push_back((t, p99));
                }
                self.last = Some((now, p.completed_ops));
            }
        } else {
            self.last = Some((now, p.completed_ops));
        }
        self.progress = p;
    }
}

/// Everything the UI draws from.
pub struct App {
    pub view: ClusterView,
    pub selected: usize,
    pub mode: Mode,
    /// The screen help was opened from, which Esc or `?` go back to.
    pub under_help: Mode,
    pub paused: bool,
    pub interval: Duration,
    pub window: Duration,
    pub bench: Option<BenchView>,
    pub quit: bool,
    /// The instant the screen represents (frozen while paused).
    pub now: Instant,
    /// Replaying a recording at this speed.
    pub replay: Option<f64>,
}

impl App {
    pub fn new(config: &DashboardConfig, with_bench: bool) -> App {
        App {
            view: ClusterView::new(&config.nodes),
            selected: 0,
            mode: Mode::Table,
            under_help: Mode::Table,
            paused: false,
            interval: config.interval,
            window: config.window,
            bench: with_bench.then(BenchView::default),
            quit: false,
            now: Instant::now(),
            replay: None,
        }
    }

    /// Handles one key press; returns a new poll interval if it changed.
    pub fn on_key(&mut self, key: KeyEvent) -> Option<Duration> {
        if key.kind != KeyEventKind::Press {
            return None;
        }
        let ctrl_c = key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c');
        match key.code {
            _ if ctrl_c => self.quit = true,
            KeyCode::Char('q') => self.quit = true,
            KeyCode::Esc => match self.mode {
                Mode::Table => self.quit = true,
                Mode::Help => self.mode = self.under_help,
                Mode::Detail => self.mode = Mode::Table,
            },
            KeyCode::Up | KeyCode::Char('k') => self.selected = self.selected.saturating_sub(1),
            KeyCode::Down | KeyCode::Char('j') => {
                self.selected = (self.selected + 1).min(self.view.nodes.len().saturating_sub(1));
            }
            KeyCode::Enter => {
                self.mode = if self.mode == Mode::Detail {
                    Mode::Table
                } else {
                    Mode::Detail
                }
            }
            KeyCode::Char('?') | KeyCode::Char('h') => {
                if self.mode == Mode::Help {
                    self.mode = self.under_help;
                } else {
                    self.under_help = self.mode;
                    self.mode = Mode::Help;
                }
            }
            KeyCode::Char('p') | KeyCode::Char(' ') => self.paused = !self.paused,
            KeyCode::Char('w') => {
                self.window = if self.window <= Duration::from_secs(60) {
                    Duration::from_secs(300)
                } else {
                    Duration::from_secs(60)
                }
            }
            KeyCode::Char('+') | KeyCode::Char('=') => {
                self.interval = INTERVALS
                    .iter()
                    .copied()
                    .find(|&i| i > self.interval)
                    .unwrap_or(self.interval);
                return Some(self.interval);
            }
            KeyCode::Char('-') | KeyCode::Char('_') => {
                self.interval = INTERVALS
                    .iter()
                    .rev()
                    .copied()
                    .find(|&i| i < self.interval)
                    .unwrap_or(self.interval);
                return Some(self.interval);
            }
            _ => {}
        }
        None
    }

    /// The screen drawn beneath the help popup (or the current one).
    pub fn screen_under_help(&self) -> Mode {
        match self.mode {
            Mode::Help => self.under_help,
            other => other,
        }
    }

    /// Takes in every sample waiting on `rx` (dropping them from the view while paused;
    /// a recording gets them all).
    pub fn drain(&mut self, rx: &Receiver<Sample>, mut recorder: Option<&mut Recorder>) -> anyhow::Result<usize> {
        let mut n = 0;
        while let Ok(s) = rx.try_recv() {
            if let Some(r) = recorder.as_deref_mut() {
                r.write(&s)?;
            }
            if !self.paused {
                self.view.apply(s);
                n += 1;
            }
        }
        if let Some(r) = recorder {
            r.flush()?;
        }
        Ok(n)
    }
}

/// The poll intervals `+` and `-` step through: round values, so that any of them can be
/// reached again from any other (doubling and halving drifted to "312ms 500us").
pub const INTERVALS: [Duration; 7] = [
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(5),
    Duration::from_secs(10),
];

/// Why the dashboard returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The user pressed q / Esc / Ctrl-C.
    Quit,
    /// The embedded benchmark finished.
    BenchDone,
}

/// Runs the full-screen dashboard on this thread until the user quits (or the benchmark in
/// `bench` finishes). The collector runs on `runtime`. The terminal is restored on return,
/// on error and on panic.
pub fn run_dashboard(
    runtime: &tokio::runtime::Handle,
    config: DashboardConfig,
    bench: Option<Arc<dyn BenchSource>>,
) -> anyhow::Result<Exit> {
    let (tx, rx) = channel();
    let (interval_tx, interval_rx) = watch::channel(config.interval);
    let mut app = App::new(&config, bench.is_some());
    let (clock, mut collector) = match config.replay.clone() {
        None => {
            let members = crate::state::members(&config.nodes);
            let collector = Collector::spawn(runtime, &members, &config.client, interval_rx, tx)?;
            (None, Some(collector))
        }
        Some((recording, speed)) => {
            let clock = ReplayClock::new(app.view.started, speed);
            // The recording knows members, not how they were grouped on --nodes.
            app.view.judge_layout = false;
            app.replay = Some(speed);
            // The header says how often the recording sampled, not the --interval default.
            app.interval = recording.interval().unwrap_or(app.interval);
            recording::play(recording, clock, tx);
            (Some(clock), None)
        }
    };
    let mut recorder = match &config.record {
        Some(path) => Some(Recorder::open(path, &crate::state::members(&config.nodes))?),
        None => None,
    };
    // Set when this function returns, however it returns (see `stop_on_signals`).
    struct Returned(Arc<AtomicBool>);
    impl Drop for Returned {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let returned = Returned(Arc::new(AtomicBool::new(false)));
    let stop = stop_on_signals(runtime, returned.0.clone());
    let mut guard = terminal::TerminalGuard::enter()?;
    let mut last_tick = Instant::now();
    loop {
        app.drain(&rx, recorder.as_mut())?;
        if let Some(c) = collector.as_mut() {
            learn_members(&mut app.view, c, recorder.as_mut())?;
        }
        let now = clock.map_or_else(Instant::now, |c| c.now());
        if !app.paused {
            app.now = now;
            if now.duration_since(last_tick) >= app.interval {
                app.view.mark_silent(now, app.interval);
                app.view.tick(now);
                last_tick = now;
            }
        }
        if let (Some(source), Some(view)) = (&bench, app.bench.as_mut()) {
            let p = source.progress();
            let done = p.done;
            let t = app.view.secs(now);
            view.update(p, now, t);
            if done {
                return Ok(Exit::BenchDone);
            }
        }
        guard.terminal().draw(|f| crate::ui::draw(f, &app))?;
        if event::poll(Duration::from_millis(100))?
            && let Event::Key(key) = event::read()?
            && let Some(interval) = app.on_key(key)
        {
            let _ = interval_tx.send(interval);
        }
        if app.quit || stop.load(Ordering::Relaxed) {
            return Ok(Exit::Quit);
        }
    }
}

/// Polls (and records) the members the groups report that no row shows yet.
fn learn_members(
    view: &mut ClusterView,
    collector: &mut Collector,
    recorder: Option<&mut Recorder>,
) -> anyhow::Result<()> {
    let added = view.discover();
    if let Some(r) = recorder {
        added.iter().for_each(|(_, addr)| r.add_node(addr));
    }
    for (row, addr) in added {
        collector.poll(row, &addr)?;
    }
    Ok(())
}

/// How long after SIGTERM/SIGHUP the dashboard may take to return before the process ends.
const SIGNAL_GRACE: Duration = Duration::from_secs(2);

/// A flag set on SIGTERM or SIGHUP (a closed terminal, `kill`), so the dashboard returns
/// through the guard that restores the terminal, as on q or Ctrl-C, instead of dying in the
/// alternate screen with the cursor hidden.
fn stop_on_signals(runtime: &tokio::runtime::Handle, returned: Arc<AtomicBool>) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let flag = stop.clone();
        let _enter = runtime.enter();
        if let (Ok(mut term), Ok(mut hup)) = (signal(SignalKind::terminate()), signal(SignalKind::hangup())) {
            runtime.spawn(async move {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = hup.recv() => {},
                }
                flag.store(true, Ordering::Relaxed);
                // The dashboard returns within a frame and restores the terminal. When the
                // terminal itself is gone (SIGHUP from a closed tmux pane), crossterm's event
                // poll can spin on end-of-input and never return to check the flag: end the
                // process rather than spin.
                tokio::time::sleep(SIGNAL_GRACE).await;
                if !returned.load(Ordering::Relaxed) {
                    std::process::exit(1);
                }
            });
        }
    }
    stop
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::crossterm::event::KeyEvent;

    fn app() -> App {
        App::new(
            &DashboardConfig {
                nodes: vec!["a:1".into(), "b:2".into(), "c:3".into()],
                client: Default::default(),
                interval: Duration::from_millis(500),
                window: Duration::from_secs(60),
                record: None,
                replay: None,
            },
            false,
        )
    }

    fn press(app: &mut App, code: KeyCode) -> Option<Duration> {
        app.on_key(KeyEvent::from(code))
    }

    /// `+` and `-` walk a ladder of round values, capped at both ends, and every value can
    /// be reached again after hitting a cap; an interval off the ladder joins it.
    #[test]
    fn plus_and_minus_walk_a_ladder_of_round_intervals() {
        let mut a = app();
        let mut up = Vec::new();
        for _ in 0..8 {
            up.push(press(&mut a, KeyCode::Char('+')).unwrap());
        }
        let secs = |v: &[Duration]| v.iter().map(|d| d.as_millis()).collect::<Vec<_>>();
        assert_eq!(secs(&up), [1000, 2000, 5000, 10_000, 10_000, 10_000, 10_000, 10_000]);
        let mut down = Vec::new();
        for _ in 0..8 {
            down.push(press(&mut a, KeyCode::Char('-')).unwrap());
        }
        assert_eq!(secs(&down), [5000, 2000, 1000, 500, 250, 100, 100, 100]);
        a.interval = Duration::from_millis(300);
        assert_eq!(press(&mut a, KeyCode::Char('+')), Some(Duration::from_millis(500)));
        a.interval = Duration::from_millis(300);
        assert_eq!(press(&mut a, KeyCode::Char('-')), Some(Duration::from_millis(250)));
    }

    #[test]
    fn keys_move_the_selection_and_change_views() {
        let mut a = app();
        press(&mut a, KeyCode::Down);
        press(&mut a, KeyCode::Down);
        press(&mut a, KeyCode::Down);
        assert_eq!(a.selected, 2);
        press(&mut a, KeyCode::Up);
        assert_eq!(a.selected, 1);
        press(&mut a, KeyCode::Enter);
        assert_eq!(a.mode, Mode::Detail);
        press(&mut a, KeyCode::Esc);
        assert_eq!((a.mode, a.quit), (Mode::Table, false));
        press(&mut a, KeyCode::Char('?'));
        assert_eq!(a.mode, Mode::Help);
        press(&mut a, KeyCode::Char('p'));
        assert!(a.paused);
        assert_eq!(press(&mut a, KeyCode::Char('+')), Some(Duration::from_secs(1)));
        assert_eq!(press(&mut a, KeyCode::Char('-')), Some(Duration::from_millis(500)));
        press(&mut a, KeyCode::Char('w'));
        assert_eq!(a.window, Duration::from_secs(300));
        press(&mut a, KeyCode::Char('q'));
        assert!(a.quit);
    }

    #[test]
    fn ctrl_c_and_esc_on_the_table_quit() {
        let mut a = app();
        a.on_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL));
        assert!(a.quit);
        let mut b = app();
        press(&mut b, KeyCode::Esc);
        assert!(b.quit);
    }
}
