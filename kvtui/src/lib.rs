//! kvtui: the live cluster dashboard, as a library that both `kvtui` and `kvbench run --tui` use.
//!
//! # Layout
//!
//! * [`collector`]: polls each node's stats on tokio tasks, sends samples over a channel.
//! * [`state`]: what is known about the cluster: latest stats, rates, sliding-window series.
//! * [`ui`]: drawing, one file per widget (table, charts, detail, help, benchmark panel).
//! * [`app`]: key handling and the main loop; [`terminal`]: the RAII terminal guard.
//! * [`headless`]: `--once` output (JSON or the table as text).
//! * [`recording`]: `--record` (samples appended as JSON lines) and `--replay`.
//! * [`bench`](mod@bench): the trait a benchmark implements to appear in the dashboard.
//!
//! Collection, state and drawing are separate, so tests render state built by hand into
//! ratatui's `TestBackend`.

pub mod app;
pub mod bench;
pub mod cli;
pub mod collector;
pub mod headless;
pub mod hosts;
pub mod recording;
pub mod state;
pub mod terminal;
pub mod ui;

pub use app::{DashboardConfig, Exit, run_dashboard};
pub use bench::{BenchProgress, BenchSource};
