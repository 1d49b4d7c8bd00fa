//! Connecting to the cluster named on the command line, with errors that say what to do.

use std::sync::Arc;

use anyhow::Context;
use kvshared::client::{ClientConfig, ClientError, Cluster, DEFAULT_NODE, parse_nodes};

use crate::cli::ClusterArgs;

/// The node list from `--nodes` / `KV_NODES`, or the default single node.
pub fn nodes(args: &ClusterArgs) -> anyhow::Result<Vec<String>> {
    Ok(parse_nodes(args.nodes.as_deref().unwrap_or(DEFAULT_NODE))?)
}

pub fn client_config(args: &ClusterArgs) -> ClientConfig {
    ClientConfig {
        conns_per_node: args.conns.max(1),
        pipeline: args.pipeline.max(1),
        request_timeout: args.timeout,
        ..ClientConfig::default()
    }
}

/// Connects to every node, or explains how to get a node running.
pub async fn cluster(args: &ClusterArgs) -> anyhow::Result<Arc<Cluster>> {
    let nodes = nodes(args)?;
    match Cluster::connect(&nodes, client_config(args)).await {
        Ok(c) => Ok(Arc::new(c)),
        Err(e @ ClientError::Connect { .. }) if args.nodes.is_none() => Err(anyhow::anyhow!(
            "{e}\nNothing listens on the default node {DEFAULT_NODE}. Start one with\n  \
             kvd --listen {DEFAULT_NODE} &\nor name your cluster with --nodes A,B,... (or KV_NODES)."
        )),
        Err(e) => Err(e).context("cannot reach the cluster (check --nodes / KV_NODES and that every kvd is up)"),
    }
}
