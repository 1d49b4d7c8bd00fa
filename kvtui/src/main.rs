use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use kvshared::client::{DEFAULT_NODE, parse_nodes};
use kvtui::cli::Cli;
use kvtui::{DashboardConfig, headless};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Logs would corrupt the full-screen view, so they go nowhere unless RUST_LOG asks.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvtui: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let nodes = parse_nodes(cli.nodes.as_deref().unwrap_or(DEFAULT_NODE))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    if cli.once {
        let view = rt.block_on(headless::sample_once(&nodes, cli.interval))?;
        if cli.json {
            kvshared::outln!(
                "{}",
                serde_json::to_string_pretty(&headless::report(&view, cli.interval))?
            );
        } else {
            kvshared::out!("{}", headless::text(&view));
        }
        return Ok(());
    }
    if !std::io::stdout().is_terminal() {
        anyhow::bail!("stdout is not a terminal; use --once (or --once --json) for a one-shot sample");
    }
    let config = DashboardConfig {
        nodes,
        interval: cli.interval,
        window: cli.window,
    };
    kvtui::run_dashboard(rt.handle(), config, None)?;
    Ok(())
}
