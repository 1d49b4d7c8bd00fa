//! kvbench: how every figure about kvd is produced.
//!
//! # Layout
//!
//! * [`workload`]: YCSB mixes, presets and key distributions; per-task op generators.
//! * [`engine`]: the tokio tasks that batch ops per node, send them and record latency.
//! * [`hist`]: HDR histograms, their summaries and their portable (mergeable) encoding.
//! * [`result`]: the self-describing result of a run, and merging results of several clients.
//! * [`report`]: the summary table and CSV rows; [`chart`]: PNG/SVG charts.
//! * [`run`], [`load`], [`sweep`] (and [`cache_sweep`]), [`merge`], [`check`]: the
//!   subcommands; [`cli`]: their flags.
//! * [`progress`], [`tui`], [`cpu`], [`connect`], [`interrupt`]: progress lines, the embedded
//!   dashboard, own CPU time, connecting with hints, Ctrl-C that keeps the partial result.
//!
//! The wire protocol, routing and client come from `kvshared`; nothing here re-implements them.

pub mod cache_sweep;
pub mod chart;
pub mod check;
pub mod cli;
pub mod connect;
pub mod cpu;
pub mod engine;
pub mod faults;
pub mod hist;
pub mod interrupt;
pub mod load;
pub mod merge;
pub mod progress;
pub mod report;
pub mod result;
pub mod run;
pub mod sweep;
pub mod timeline;
pub mod tui;
pub mod workload;
