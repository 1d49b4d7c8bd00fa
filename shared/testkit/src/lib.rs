//! The test harness every crate of the workspace uses for its end-to-end tests.
//!
//! # Layout
//!
//! * [`port`]: 127.0.0.1 ports held for the whole test process ([`addr`]): bound but not
//!   listening, so no other process can take one and a connection to it is refused until a
//!   server this harness started listens there; the server is handed a listening socket on
//!   it (systemd's socket activation, `LISTEN_FDS`), so there is no moment at which the port
//!   is free.
//! * [`process`]: [`Server`], a child process started with those sockets, whose standard
//!   error is read until its ready line and kept (the last lines) for failure messages, and
//!   which is killed by PID when dropped, however the test ends; [`Guard`] for any other
//!   child.
//! * [`kvd`]: starting the `kvd` binary: which flags name its listening addresses, its ready
//!   line, the addresses it reports.
//! * [`wait`]: waiting for a condition with a deadline that only bounds a hang; on timeout
//!   the panic says what was awaited and what was last seen.
//! * [`tools`]: the outside programs a test needs (redis-py, go-redis, redis-cli, ...): found,
//!   or the test fails saying how to install them; never skipped in silence.
//! * [`dirs`]: temporary directories that remove themselves, also when a test panics.
//!
//! Nothing here knows kvd's protocol: tests talk to their servers with the real clients.

pub mod dirs;
pub mod kvd;
pub mod port;
pub mod process;
pub mod tools;
pub mod wait;

pub use dirs::{Scratch, TempDir, scratch, scratch_file, temp_dir};
pub use port::addr;
pub use process::{Guard, Server};
pub use wait::{HANG, until, until_async};
