//! Ports without races.
//!
//! A test that must know a server's address before the server starts (a replica group's
//! members name each other; a node is given the others' addresses) cannot bind port 0 and
//! hand the number on: between the close and the server's bind, any process may take it.
//! Instead [`addr`] binds a socket to `127.0.0.1:0` with `SO_REUSEPORT` and keeps it,
//! never listening, for the rest of the test process:
//!
//! * the kernel never gives that port to another `bind` (or as a connection's source port);
//! * a connection to it is refused while no server listens there (a dead node looks dead);
//! * [`listener_for`] makes a second socket on the same port, also with `SO_REUSEPORT`,
//!   and listening; the server inherits it ([`crate::process`]), and when the server dies
//!   the port goes back to refusing, still held, ready for a restart at the same address.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Mutex, OnceLock};

use socket2::{Domain, Socket, Type};

/// Connections a harness listener queues before the server accepts them (as kvd's own).
const BACKLOG: i32 = 4096;

/// Every port this process holds, by address.
fn reserved() -> &'static Mutex<HashMap<SocketAddr, Socket>> {
    static RESERVED: OnceLock<Mutex<HashMap<SocketAddr, Socket>>> = OnceLock::new();
    RESERVED.get_or_init(Default::default)
}

/// A `127.0.0.1:PORT` held for this test process: nothing else can bind it, connecting is
/// refused until a server started by this harness listens there. Panics if the machine has
/// no port left (the only way it fails).
pub fn addr() -> String {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("a TCP socket");
    socket.set_reuse_port(true).expect("SO_REUSEPORT");
    socket
        .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .expect("a free port on 127.0.0.1");
    let local = socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .expect("the bound address");
    reserved()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(local, socket);
    local.to_string()
}

/// Holds the particular address `addr` (as [`addr`] does a free port), for servers whose
/// addresses were fixed before the test (a golden data directory's group members). Panics,
/// naming it, when another process has it.
pub fn hold_at(addr: &str) -> String {
    let parsed: SocketAddr = addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}"));
    let mut held = reserved().lock().unwrap_or_else(|e| e.into_inner());
    held.entry(parsed).or_insert_with(|| {
        let socket = Socket::new(Domain::for_address(parsed), Type::STREAM, None).expect("a TCP socket");
        socket.set_reuse_port(true).expect("SO_REUSEPORT");
        // (A fixed address may still have connections of an earlier run in TIME_WAIT.)
        socket.set_reuse_address(true).expect("SO_REUSEADDR");
        socket
            .bind(&parsed.into())
            .unwrap_or_else(|e| panic!("cannot hold {addr} for this test (is another process using it?): {e}"));
        socket
    });
    parsed.to_string()
}

/// Whether `addr` is a port this process holds.
pub fn is_reserved(addr: &str) -> bool {
    addr.parse::<SocketAddr>()
        .is_ok_and(|a| reserved().lock().unwrap_or_else(|e| e.into_inner()).contains_key(&a))
}

/// A socket listening on the held port `addr`, for a server to inherit; `None` if `addr` is
/// not held by this process (the server then binds it itself, e.g. port 0).
pub fn listener_for(addr: &str) -> Option<std::io::Result<TcpListener>> {
    let parsed: SocketAddr = addr.parse().ok()?;
    if !reserved()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains_key(&parsed)
    {
        return None;
    }
    Some(listening(parsed))
}

/// A socket bound to the fixed address `addr` and never listening (dropped: the port is
/// free again): connections to it are refused and no other process can take the port, for
/// a test that needs a particular port (a tool's default) quiet.
pub fn hold(addr: &str) -> std::io::Result<Socket> {
    let parsed: SocketAddr = addr
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{addr}: {e}")))?;
    let socket = Socket::new(Domain::for_address(parsed), Type::STREAM, None)?;
    socket.bind(&parsed.into())?;
    Ok(socket)
}

fn listening(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.set_reuse_port(true)?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpStream;

    #[test]
    fn a_held_port_refuses_until_listened_on_and_again_after() {
        let a = addr();
        assert!(is_reserved(&a));
        assert!(TcpStream::connect(&a).is_err(), "nothing listens yet");
        // Nobody else can bind it.
        assert!(std::net::TcpListener::bind(&a).is_err());
        let l = listener_for(&a).unwrap().unwrap();
        assert!(TcpStream::connect(&a).is_ok());
        drop(l);
        assert!(
            TcpStream::connect(&a).is_err(),
            "refused again once the listener is gone"
        );
        let again = listener_for(&a).unwrap().unwrap();
        assert!(TcpStream::connect(&a).is_ok(), "a restart listens at the same address");
        drop(again);
        assert!(listener_for("127.0.0.1:0").is_none());
    }

    #[test]
    fn held_ports_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            assert!(seen.insert(addr()));
        }
    }
}
