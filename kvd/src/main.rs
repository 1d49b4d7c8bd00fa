use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use kvd::cli::{Cli, ServeArgs};
use kvd::node::NodeConfig;
use kvd::server::Server;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("kvd=info,warn")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.command {
        Some(command) => match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt.block_on(kvd::client_cmd::run(command)),
            Err(e) => {
                eprintln!("kvd: cannot start the runtime: {e}");
                ExitCode::from(2)
            }
        },
        None => match serve(cli.serve) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("kvd: {e:#}");
                ExitCode::from(2)
            }
        },
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
        .max(1);
    let config = NodeConfig {
        shard: args.shard,
        map_shards: args.map_shards.unwrap_or((4 * threads).max(64)),
        capacity: args.capacity,
        max_conns: args.max_conns,
        max_frame: args.max_frame,
        worker_threads: threads,
        ..NodeConfig::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    rt.block_on(async {
        let server = Server::bind(&args.listen, config)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let addr = server.local_addr()?;
        tracing::info!("kvd shard {} listening on {addr}", args.shard);
        server.run(shutdown_signal()).await;
        tracing::info!("kvd stopped");
        Ok(())
    })
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
