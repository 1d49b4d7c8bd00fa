//! Listening sockets handed to kvd by whoever started it (systemd's socket activation:
//! `LISTEN_FDS`, read by the `listenfd` crate; `LISTEN_PID`, when set, must be kvd's own).
//!
//! A front whose address (`--listen`, `--resp`, `--http`) is the local address of an
//! inherited socket serves on that socket instead of binding: the port was held by the
//! parent from before kvd started, so no other process can have taken it in between (the
//! test harness starts every kvd this way). Sockets nobody asks for are reported once
//! every front is bound.

use std::net::{SocketAddr, TcpListener};
use std::sync::Mutex;

/// The inherited sockets not yet taken by a front.
static INHERITED: Mutex<Vec<(SocketAddr, TcpListener)>> = Mutex::new(Vec::new());

/// Takes every TCP listener passed by socket activation. Called once, at start, by the
/// binary; the library's own nodes (`crate::local`) never inherit.
pub fn adopt_from_env() -> std::io::Result<usize> {
    let mut fds = listenfd::ListenFd::from_env();
    let mut taken = INHERITED.lock().unwrap_or_else(|e| e.into_inner());
    for i in 0..fds.len() {
        if let Some(listener) = fds.take_tcp_listener(i)? {
            taken.push((listener.local_addr()?, listener));
        }
    }
    Ok(taken.len())
}

/// The inherited socket listening on `addr`, if there is one (each is taken once).
pub(crate) fn take(addr: SocketAddr) -> Option<TcpListener> {
    let mut left = INHERITED.lock().unwrap_or_else(|e| e.into_inner());
    let at = left.iter().position(|(a, _)| *a == addr)?;
    Some(left.swap_remove(at).1)
}

/// The addresses of inherited sockets no front took (to warn about once serving).
pub fn unused() -> Vec<SocketAddr> {
    let left = INHERITED.lock().unwrap_or_else(|e| e.into_inner());
    left.iter().map(|(a, _)| *a).collect()
}
