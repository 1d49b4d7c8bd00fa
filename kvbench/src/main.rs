use std::process::ExitCode;

use clap::Parser;
use kvbench::cli::{Cli, Command};
use kvbench::interrupt::Interrupt;
use kvbench::run::EXIT_INTERRUPTED;
use kvshared::cli::{EXIT_ERROR, exit_code, init_logging};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let _logging = init_logging(Some("warn"));
    let threads = match &cli.command {
        Command::Run(a) => a.bench.cluster.threads,
        Command::Sweep(a) => a.bench.cluster.threads,
        Command::Load(a) => a.cluster.threads,
        Command::Check(a) => a.cluster.threads,
        Command::Merge(_) => Some(1),
    }
    .unwrap_or_else(kvbench::run::default_threads)
    .max(1);
    // `run` and `sweep` drive their load from threads of their own (kvbench::engine::run):
    // the main runtime only watches it.
    let workers = match &cli.command {
        Command::Run(_) | Command::Sweep(_) => 1,
        _ => threads,
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kvbench: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let result = rt.block_on(async {
        let interrupt = Interrupt::default();
        tokio::spawn(watch_ctrl_c(interrupt.clone()));
        match cli.command {
            Command::Load(a) => kvbench::load::command(a).await.map(|()| ExitCode::SUCCESS),
            Command::Run(a) => kvbench::run::command(a, interrupt).await,
            Command::Sweep(a) => kvbench::sweep::command(a, interrupt).await,
            Command::Merge(a) => kvbench::merge::command(a),
            Command::Check(a) => kvbench::check::command(a).await,
        }
    });
    result.unwrap_or_else(|e| exit_code("kvbench", e.as_ref()))
}

/// First Ctrl-C: stop the load and report what was measured. Second: quit at once.
async fn watch_ctrl_c(interrupt: Interrupt) {
    if tokio::signal::ctrl_c().await.is_err() {
        return;
    }
    interrupt.trigger();
    eprintln!("\nkvbench: interrupted; stopping the load and reporting what was measured (Ctrl-C again quits now)");
    if tokio::signal::ctrl_c().await.is_ok() {
        std::process::exit(i32::from(EXIT_INTERRUPTED));
    }
}
