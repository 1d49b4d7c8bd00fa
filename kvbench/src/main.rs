use std::process::ExitCode;

use clap::Parser;
use kvbench::cli::{Cli, Command};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let threads = match &cli.command {
        Command::Run(a) => a.cluster.threads,
        Command::Sweep(a) => a.cluster.threads,
        Command::Load(a) => a.cluster.threads,
        Command::Check(a) => a.cluster.threads,
        Command::Merge(_) => Some(1),
    }
    .unwrap_or_else(kvbench::run::default_threads)
    .max(1);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kvbench: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let result = rt.block_on(async {
        let done = match cli.command {
            Command::Load(a) => kvbench::load::command(a).await,
            Command::Run(a) => kvbench::run::command(a).await,
            Command::Sweep(a) => kvbench::sweep::command(a).await,
            Command::Merge(a) => kvbench::merge::command(a),
            Command::Check(a) => return kvbench::check::command(a).await,
        };
        done.map(|()| ExitCode::SUCCESS)
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kvbench: {e:#}");
            ExitCode::from(2)
        }
    }
}
