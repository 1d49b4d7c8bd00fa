use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use kvd::cli::{Cli, ServeArgs};
use std::sync::Arc;

use kvd::durable::LogSettings;
use kvd::edge::EdgeConfig;
use kvd::node::{ClusterConfig, Durability, EngineConfig, GroupMember, NodeConfig};
use kvd::server::Server;
use kvd::store::MemoryLimit;
use kvshared::cli::{exit_code, init_logging};
use kvshared::client::{ClientConfig, Cluster};
use kvshared::tls::TlsServer;

/// mimalloc rather than glibc's malloc: its size classes carry no per-allocation header, so
/// a 128-byte value costs 128 bytes, not 144 (the store's memory per record, see
/// `store::table`), and it is at least as fast for the request path's buffers.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // openraft logs every failed RPC to an unreachable member (an ERROR and a WARN each
    // heartbeat); kvd logs each member's change of state once instead (`network::Reach`).
    let logging = init_logging(Some(
        "kvd=info,openraft::replication=off,openraft::engine::handler::replication_handler=off,warn",
    ));
    if let Some(dropped) = logging.dropped_counter() {
        kvd::node::report_log_drops(move || dropped.dropped_lines() as u64);
    }
    let result = match cli.command {
        Some(command) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the runtime")
            .and_then(|rt| Ok(rt.block_on(kvd::control::client_cmd::run(command))?)),
        None => serve(cli.serve).map(|()| ExitCode::SUCCESS),
    };
    result.unwrap_or_else(|e| exit_code("kvd", e.as_ref()))
}

/// The node's settings from the serving flags, by concern.
fn node_config(args: &ServeArgs, threads: usize, map_shards: usize) -> anyhow::Result<NodeConfig> {
    Ok(NodeConfig {
        cluster: ClusterConfig {
            shard: args.shard,
            no_slots: args.no_slots,
            group: (args.join || !args.group.is_empty()).then(|| GroupMember {
                me: args.listen.clone(),
                initial: args.group.clone(),
            }),
        },
        engine: EngineConfig {
            map_shards,
            capacity: args.capacity,
            memory: args.max_memory.map(|max| MemoryLimit {
                max_bytes: max as usize,
                eviction: args.eviction,
            }),
            worker_threads: threads,
            ..EngineConfig::default()
        },
        durability: args.data_dir.clone().map(|data_dir| Durability {
            data_dir,
            log: LogSettings {
                fsync: args.fsync,
                snapshot_every: args.snapshot_every,
                ..LogSettings::default()
            },
        }),
        edge: EdgeConfig {
            max_conns: args.max_conns,
            max_frame: args.max_frame,
            idle_timeout: (!args.idle_timeout.is_zero()).then_some(args.idle_timeout),
            read_timeout: args.read_timeout,
            write_timeout: args.write_timeout,
            max_buffer_memory: args.max_buffer_memory as usize,
            auth: args.auth.token()?,
            insecure_no_auth: args.insecure_no_auth,
            tls: match (&args.tls_cert, &args.tls_key) {
                (Some(cert), Some(key)) => Some(TlsServer::from_files(cert, key)?),
                _ => None,
            },
        },
    })
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    args.validate()?;
    if args.max_memory.is_some() {
        // Under --max-memory, RSS is promised to stay near the cap (docs/MEMORY.md).
        kvd::alloc::purge_freed_memory_at_once();
    }
    // Sockets passed by socket activation (systemd, or the test harness) are taken before
    // anything binds; each front serves on the one bound to its address.
    kvd::edge::inherited::adopt_from_env().context("cannot take the sockets passed in LISTEN_FDS")?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
        .max(1);
    let map_shards = args.map_shards.unwrap_or((8 * threads).max(16));
    args.capacity_fits(map_shards)?;
    let config = node_config(&args, threads, map_shards)?;
    // How this node reaches the others to forward RESP keys: as any client, with the
    // cluster's token.
    let client_config = ClientConfig {
        auth: config.edge.auth.clone(),
        max_frame: config.edge.max_frame,
        ..ClientConfig::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    rt.block_on(async {
        let mut server = Server::bind(&args.listen, config)
            .await
            .with_context(|| format!("cannot start on {}", args.listen))?;
        let cluster = match args.nodes.is_empty() {
            true => None,
            false => Some(Arc::new(Cluster::new(&args.nodes, client_config.clone())?)),
        };
        if let Some(resp_addr) = &args.resp {
            let bound = server
                .serve_resp_with(resp_addr, cluster.clone(), &args.nodes, args.resp_cluster)
                .await
                .with_context(|| format!("cannot serve RESP on {resp_addr}"))?;
            tracing::info!("kvd shard {} speaks RESP on {bound}", args.shard);
        }
        if let Some(http_addr) = &args.http {
            let bound = server
                .serve_http(http_addr, cluster.clone())
                .await
                .with_context(|| format!("cannot serve HTTP on {http_addr}"))?;
            tracing::info!("kvd shard {} serves HTTP on {bound}", args.shard);
        }
        // The ready line comes last, once every front is bound: scripts wait for it.
        let addr = server.local_addr()?;
        if let Some(cert) = &args.tls_cert {
            tracing::info!(
                "serving TLS only, on every front, with the certificate in {}",
                cert.display()
            );
        }
        for unused in kvd::edge::inherited::unused() {
            tracing::warn!("an inherited socket on {unused} is not one of this kvd's addresses; it is not served");
        }
        tracing::info!("kvd shard {} listening on {addr}", args.shard);
        // On a signal every front drains (answers what it read, refuses the rest, within
        // the grace period), then the node closes its log.
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
