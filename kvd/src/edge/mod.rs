//! The edge: everything between a socket and a front's parser, the same for every front.
//!
//! kvd speaks three protocols: its binary protocol (`--listen`), RESP (`--resp`) and HTTP
//! (`--http`). A *front* (`crate::binary`, `crate::resp`, `crate::http`) parses its
//! protocol and dispatches to `Node::execute`; it decides no policy. Every rule about who may
//! connect, for how long and with how much memory lives here, once, and holds on every front:
//!
//! * binding with a backlog, one listener per front (`listener`), or serving on a socket
//!   handed over by socket activation (`inherited`);
//! * protected mode, decided from each listener's own address;
//! * TLS on every front when `--tls-cert` is given, and what a plaintext client is told;
//! * the connection limit (`--max-conns`, node-wide, within the process's file limit);
//! * another front's protocol on a port is answered in that protocol, naming the right
//!   port (`sniff`, `refusal`);
//! * the token (`gate`): checked in constant time, failures counted per front, and before
//!   it a connection may hold no more than `PRE_AUTH_BYTES`;
//! * deadlines: idle (`--idle-timeout`), a begun request (`--read-timeout`), a peer that
//!   reads none of its replies (`--write-timeout`, `deadline`);
//! * the node-wide buffer budget (`--max-buffer-memory`, `budget`);
//! * rate-limited warnings (`warn_limit`);
//! * the drain on shutdown: answer what was read, refuse what comes later, and close every
//!   connection within `SHUTDOWN_GRACE`.
//!
//! A front gets a `conn::Conn`: the connection's two directions with these rules applied,
//! and asks it when to wait, until when to read, whether the peer may send more, and how to
//! end. The edge knows no front: `crate::server` gives each listener its front's
//! `Handler`.

pub(crate) mod budget;
mod config;
pub(crate) mod conn;
mod deadline;
mod ended;
mod front;
pub(crate) mod gate;
pub mod inherited;
mod limits;
mod listener;
mod open;
mod refusal;
mod shared;
mod sniff;
pub(crate) mod warn_limit;

pub use config::EdgeConfig;
pub use front::Front;
pub use gate::PRE_AUTH_BYTES;
pub use limits::connection_slots;
pub use listener::SHUTDOWN_GRACE;
pub(crate) use listener::{Handler, Listener, serve};
pub(crate) use shared::{Edge, Peer};
