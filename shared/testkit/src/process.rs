//! Child processes a test starts: handed their listening sockets, read until ready, and
//! killed by PID when the test ends, however it ends.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::wait::HANG;

/// Lines of a server's standard error kept for failure messages and [`Server::wait_for_log`].
pub const KEPT_LINES: usize = 2000;

/// At most this many sockets are handed to one child (fds 3 and up).
const MAX_SOCKETS: usize = 8;

/// Hands `sockets` to the child `command` starts as fds 3, 4, ... with `LISTEN_FDS` set
/// (systemd's socket activation; `LISTEN_PID` left unset, which the `listenfd` convention
/// reads as "for whoever runs"). The parent's copies close when `command` is dropped.
pub fn inherit(command: &mut Command, sockets: Vec<TcpListener>) {
    assert!(sockets.len() <= MAX_SOCKETS, "at most {MAX_SOCKETS} sockets");
    command.env_remove("LISTEN_PID").env_remove("LISTEN_FDNAMES");
    if sockets.is_empty() {
        command.env_remove("LISTEN_FDS");
        return;
    }
    command.env("LISTEN_FDS", sockets.len().to_string());
    let raw: Vec<RawFd> = sockets.iter().map(|s| s.as_raw_fd()).collect();
    // SAFETY: between fork and exec this calls only fcntl, dup2 and close (async-signal-safe)
    // and allocates nothing; `sockets` lives in the closure until `command` is dropped.
    unsafe {
        command.pre_exec(move || {
            let _keep = &sockets;
            let mut high = [0 as RawFd; MAX_SOCKETS];
            // First lift every socket above the target numbers, so that a socket that already
            // is fd 4, say, is not overwritten by the first dup2.
            for (i, fd) in raw.iter().enumerate() {
                high[i] = libc::fcntl(*fd, libc::F_DUPFD, 64);
                if high[i] < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (i, fd) in high.iter().take(raw.len()).enumerate() {
                // dup2's copy does not close on exec.
                if libc::dup2(*fd, 3 + i as RawFd) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(*fd);
            }
            Ok(())
        });
    }
}

/// What a server printed: the last [`KEPT_LINES`] lines of its standard error, and how many
/// it printed in all.
#[derive(Default)]
struct Log {
    lines: Mutex<(VecDeque<String>, usize)>,
    grew: Condvar,
}

impl Log {
    fn push(&self, line: String) {
        let mut kept = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        if kept.0.len() == KEPT_LINES {
            kept.0.pop_front();
        }
        kept.0.push_back(line);
        kept.1 += 1;
        self.grew.notify_all();
    }

    fn text(&self) -> String {
        let kept = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        kept.0.iter().map(|l| format!("  | {l}\n")).collect()
    }
}

/// How a server's standard error is read once it is ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterReady {
    /// Every line is read and kept (the last [`KEPT_LINES`]).
    Read,
    /// Nothing more is read (the pipe fills, as with a stuck log collector).
    Stall,
}

/// A started server, killed (SIGKILL, by PID) and reaped when dropped.
pub struct Server {
    child: Child,
    name: String,
    log: Arc<Log>,
    /// Dropped with the server: a stalled reader lets go of the pipe.
    _release: mpsc::Sender<()>,
}

/// A process that exited before its ready line.
#[derive(Debug)]
pub struct Exited {
    /// How it exited.
    pub status: ExitStatus,
    /// Everything it printed on standard error.
    pub output: String,
}

/// What a server printed up to and including its ready line.
#[derive(Debug, Clone)]
pub struct Ready {
    /// The ready line itself.
    pub line: String,
    /// The lines before it (e.g. what a data directory recovered).
    pub before: Vec<String>,
}

impl Server {
    /// Starts `command` with `sockets` inherited ([`inherit`]) and its standard error read
    /// until a line for which `ready` holds (within [`HANG`]). Panics, with what the process
    /// printed, if it exits or goes quiet first.
    pub fn start(
        name: &str,
        command: Command,
        sockets: Vec<TcpListener>,
        ready: impl Fn(&str) -> bool + Send + 'static,
        after: AfterReady,
    ) -> (Server, Ready) {
        match Server::try_start(name, command, sockets, ready, after) {
            Ok(started) => started,
            Err(exited) => panic!(
                "{name} exited ({}) before its ready line; it printed:\n{}",
                exited.status, exited.output
            ),
        }
    }

    /// [`Server::start`], but a process that exits before its ready line (a refusal to
    /// start) is returned as such rather than a panic.
    pub fn try_start(
        name: &str,
        mut command: Command,
        sockets: Vec<TcpListener>,
        ready: impl Fn(&str) -> bool + Send + 'static,
        after: AfterReady,
    ) -> Result<(Server, Ready), Exited> {
        inherit(&mut command, sockets);
        let mut child = command
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({:?}): {e}", command.get_program()));
        drop(command);
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Log::default());
        let (ready_tx, ready_rx) = mpsc::channel::<Ready>();
        let (release, held) = mpsc::channel::<()>();
        let reader_log = log.clone();
        let reader = std::thread::spawn(move || read_stderr(stderr, reader_log, ready, ready_tx, after, held));
        let mut server = Server {
            child,
            name: name.to_string(),
            log,
            _release: release,
        };
        match server.await_ready(ready_rx) {
            Some(ready) => Ok((server, ready)),
            None => {
                // Everything it printed is read once the pipe closes.
                let _ = reader.join();
                let status = server.child.wait().expect("the exit status");
                Err(Exited {
                    status,
                    output: server
                        .log
                        .lines
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                        .iter()
                        .fold(String::new(), |mut all, l| {
                            all.push_str(l);
                            all.push('\n');
                            all
                        }),
                })
            }
        }
    }

    /// The ready line, or `None` if the process closed its standard error (exited) first.
    fn await_ready(&mut self, ready: mpsc::Receiver<Ready>) -> Option<Ready> {
        match ready.recv_timeout(HANG) {
            Ok(r) => Some(r),
            Err(mpsc::RecvTimeoutError::Disconnected) => None,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                "{} printed no ready line within {HANG:?}; it printed:\n{}",
                self.name,
                self.log.text()
            ),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The child itself (e.g. to take its standard output).
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Kills it with SIGKILL and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`, `SIGSTOP`) to it.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid, which is not reaped while `self` lives.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(rc, 0, "kill -{signal} {}", self.child.id());
    }

    /// Waits for it to exit (within `within`; panics with its log otherwise).
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {within:?}; it printed:\n{}",
                self.name,
                self.log.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last lines it printed, indented, for a failure message.
    pub fn log(&self) -> String {
        self.log.text()
    }

    /// How many lines it has printed so far (a mark for [`Server::wait_for_log`]).
    pub fn lines_printed(&self) -> usize {
        self.log.lines.lock().unwrap_or_else(|e| e.into_inner()).1
    }

    /// Waits (within `within`) for a line printed after the first `from` lines for which
    /// `wanted` holds, and returns it; panics naming `what`, with the log, otherwise.
    pub fn wait_for_log(&self, what: &str, from: usize, within: Duration, wanted: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + within;
        let mut kept = self.log.lines.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let (lines, total) = (&kept.0, kept.1);
            let first_kept = total - lines.len();
            let skip = from.saturating_sub(first_kept);
            if let Some(line) = lines.iter().skip(skip).find(|l| wanted(l)) {
                return line.clone();
            }
            let now = Instant::now();
            if now >= deadline {
                drop(kept);
                panic!(
                    "{}: no log line {what} within {within:?}; it printed:\n{}",
                    self.name,
                    self.log.text()
                );
            }
            kept = self
                .log
                .grew
                .wait_timeout(kept, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

fn read_stderr(
    stderr: std::process::ChildStderr,
    log: Arc<Log>,
    ready: impl Fn(&str) -> bool,
    ready_tx: mpsc::Sender<Ready>,
    after: AfterReady,
    held: mpsc::Receiver<()>,
) {
    let mut lines = BufReader::new(stderr).lines();
    let mut before = Vec::new();
    for line in lines.by_ref().map_while(Result::ok) {
        log.push(line.clone());
        if ready(&line) {
            let _ = ready_tx.send(Ready { line, before });
            if after == AfterReady::Stall {
                // Hold the pipe unread until the server is dropped.
                let _ = held.recv();
                return;
            }
            for line in lines.map_while(Result::ok) {
                log.push(line);
            }
            return;
        }
        before.push(line);
    }
}

/// Any other child a test starts (a client run, a manager), killed by PID and reaped when
/// dropped.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for Guard {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Guard {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}
