//! The connection limit against the process's file limit.
//!
//! Every connection is a file descriptor. If `--max-conns` is more than the process may
//! open, idle connections of one front use up the descriptors and every front's accept
//! fails (the probe locked out every port with 1,100 idle HTTP connections under
//! `ulimit -n 1024`). As Redis does with `maxclients`, kvd raises its soft limit as far as
//! the hard limit allows and, if that is still too few, serves fewer connections and says so.

/// Descriptors kept for everything that is not a client connection: the listeners, the log
/// and snapshot files, raft peers, forwarding connections to other nodes, /proc reads, and
/// refusals in flight.
pub(crate) const RESERVED_FDS: u64 = 160;

/// How many connections the node may serve: `wanted`, or fewer when the file limit is lower.
pub fn connection_slots(wanted: usize) -> usize {
    let limit = match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => limit,
        Err(e) => {
            tracing::debug!(error = %e, "cannot read the open-file limit");
            return wanted;
        }
    };
    let fits = limit.saturating_sub(RESERVED_FDS).max(1);
    if wanted as u64 <= fits {
        return wanted;
    }
    let fits = fits as usize;
    tracing::warn!(
        "--max-conns {wanted} is more than this process may open (ulimit -n {limit}, of which \
         {RESERVED_FDS} are kept for files and peers): serving at most {fits} connections; raise \
         the limit (ulimit -n, or LimitNOFILE= in a systemd unit) to serve more"
    );
    fits
}
