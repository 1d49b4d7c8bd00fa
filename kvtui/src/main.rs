use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use kvshared::cli::{exit_code, init_logging};
use kvtui::cli::Cli;
use kvtui::{DashboardConfig, headless};

/// `--once` when some node did not answer.
const EXIT_NODE_DOWN: u8 = 1;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Logs would corrupt the full-screen view, so they go nowhere unless RUST_LOG asks.
    let _logging = init_logging(None);
    run(cli).unwrap_or_else(|e| exit_code("kvtui", e.as_ref()))
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let nodes = cli.nodes.node_list()?;
    let client = cli.nodes.client_config()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    if cli.once {
        let view = rt.block_on(headless::sample_once(&nodes, client, cli.interval))?;
        if cli.json {
            kvshared::outln!(
                "{}",
                serde_json::to_string_pretty(&headless::report(&view, cli.interval))?
            )?;
        } else {
            kvshared::out!("{}", headless::text(&view))?;
        }
        let all_up = view.nodes.iter().all(|n| n.is_up());
        return Ok(if all_up {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(EXIT_NODE_DOWN)
        });
    }
    if !std::io::stdout().is_terminal() {
        anyhow::bail!("stdout is not a terminal; use --once (or --once --json) for a one-shot sample");
    }
    let replay = match &cli.replay {
        Some(path) => Some((kvtui::recording::read(path)?, cli.speed)),
        None => None,
    };
    let config = DashboardConfig {
        nodes: replay.as_ref().map_or(nodes, |(r, _)| r.nodes.clone()),
        client,
        interval: cli.interval,
        window: cli.window,
        record: cli.record,
        replay,
    };
    kvtui::run_dashboard(rt.handle(), config, None)?;
    Ok(ExitCode::SUCCESS)
}
