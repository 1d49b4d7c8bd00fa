//! Connecting to the cluster named on the command line, with errors that say what to do.

use std::sync::Arc;

use anyhow::Context;
use kvshared::client::{ClientConfig, ClientError, Cluster, DEFAULT_NODE};

use crate::cli::ClusterArgs;

/// The client configuration `args` ask for (connections per node as given, or 1).
pub fn client_config(args: &ClusterArgs) -> anyhow::Result<ClientConfig> {
    Ok(ClientConfig {
        conns_per_node: args.conns.unwrap_or(1).max(1),
        pipeline: args.pipeline.max(1),
        ..args.nodes.client_config()?
    })
}

/// Most connections per node chosen automatically.
const MAX_AUTO_CONNS: usize = 16;

/// Connects to every node, or explains how to get a node running. Without `--conns`, uses
/// as many connections per node as the busiest node has worker threads (from its stats),
/// at most 16.
pub async fn cluster(args: &ClusterArgs) -> anyhow::Result<Arc<Cluster>> {
    let nodes = args.nodes.node_list()?;
    let cluster = Arc::new(connect_with(args, &nodes, client_config(args)?).await?);
    let problems = cluster.check_layout().await;
    if !problems.is_empty() {
        let lines: Vec<String> = problems.iter().map(|p| format!("  {p}")).collect();
        anyhow::bail!(
            "--nodes does not match the cluster, so most ops would be refused:\n{}",
            lines.join("\n")
        );
    }
    if args.conns.is_some() {
        // Slots may have moved since the cluster started: route by the groups' own tables.
        cluster.learn_slot_map().await;
        return Ok(cluster);
    }
    let mut threads = 1;
    for n in 0..cluster.node_count() {
        if let Ok(s) = cluster.stats(n).await {
            threads = threads.max(s.worker_threads as usize);
        }
    }
    if threads <= 1 {
        cluster.learn_slot_map().await;
        return Ok(cluster);
    }
    let config = ClientConfig {
        conns_per_node: threads.min(MAX_AUTO_CONNS),
        ..client_config(args)?
    };
    let cluster = connect_with(args, &nodes, config).await?;
    cluster.learn_slot_map().await;
    Ok(Arc::new(cluster))
}

/// Connects each node's first connection (the others open on first use: `run` and `sweep`
/// send through their load threads' own, so the main client keeps one per node).
async fn connect_with(args: &ClusterArgs, nodes: &[String], config: ClientConfig) -> anyhow::Result<Cluster> {
    match Cluster::connect_first(nodes, config).await {
        Ok(c) => Ok(c),
        Err(e @ ClientError::Connect { .. }) if args.nodes.is_default() => Err(anyhow::anyhow!(
            "{e}\nNothing listens on the default node {DEFAULT_NODE}. Start one with\n  \
             kvd --listen {DEFAULT_NODE} &\nor name your cluster with --nodes A,B,... (or KV_NODES)."
        )),
        Err(e) => Err(e).context("cannot reach the cluster (check --nodes / KV_NODES and that every kvd is up)"),
    }
}
