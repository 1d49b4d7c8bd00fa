use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use kvd::cli::{Cli, ServeArgs};
use kvd::node::NodeConfig;
use kvd::server::Server;
use kvd::store::MemoryLimit;
use kvshared::cli::{exit_code, init_logging};
use kvshared::tls::TlsServer;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let logging = init_logging(Some("kvd=info,warn"));
    if let Some(dropped) = logging.dropped_counter() {
        kvd::node::report_log_drops(move || dropped.dropped_lines() as u64);
    }
    let result = match cli.command {
        Some(command) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the runtime")
            .and_then(|rt| rt.block_on(kvd::client_cmd::run(command))),
        None => serve(cli.serve).map(|()| ExitCode::SUCCESS),
    };
    result.unwrap_or_else(|e| exit_code("kvd", e.as_ref()))
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    args.validate().map_err(anyhow::Error::msg)?;
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
        idle_timeout: (!args.idle_timeout.is_zero()).then_some(args.idle_timeout),
        read_timeout: args.read_timeout,
        max_buffer_memory: args.max_buffer_memory as usize,
        auth: args.auth.token()?,
        insecure_no_auth: args.insecure_no_auth,
        data_dir: args.data_dir.clone(),
        fsync: args.fsync,
        memory: args.max_memory.map(|max| MemoryLimit {
            max_bytes: max as usize,
            eviction: args.eviction,
        }),
        tls: match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => Some(TlsServer::from_files(cert, key)?),
            _ => None,
        },
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
            .with_context(|| format!("cannot start on {}", args.listen))?;
        let addr = server.local_addr()?;
        tracing::info!("kvd shard {} listening on {addr}", args.shard);
        if let Some(cert) = &args.tls_cert {
            tracing::info!("serving TLS only, with the certificate in {}", cert.display());
        }
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
