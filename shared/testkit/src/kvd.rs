//! Starting the `kvd` binary (and finding the workspace's other binaries).

use std::path::PathBuf;
use std::process::Command;

use crate::port::listener_for;
use crate::process::{AfterReady, Exited, Ready, Server};

/// The flags whose value is an address kvd listens on.
const LISTEN_FLAGS: [&str; 3] = ["--listen", "--resp", "--http"];

/// The workspace binary `name` (`kvd`, `kvbench`, `kvtui`): `KV_BIN_DIR/name` if set, else
/// beside the running test (`target/<profile>/deps/test-…` → `target/<profile>/name`).
/// Panics, saying how to build it, if it is not there: a test never skips for want of it.
pub fn binary(name: &str) -> PathBuf {
    let dir = match std::env::var_os("KV_BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let exe = std::env::current_exe().expect("the test's own path");
            let deps = exe.parent().expect("the test's directory").to_path_buf();
            match deps.file_name().is_some_and(|n| n == "deps") {
                true => deps.parent().expect("the profile directory").to_path_buf(),
                false => deps,
            }
        }
    };
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build it first (`cargo test --workspace` builds every binary, or `cargo build --release -p {name}`)",
        path.display()
    );
    path
}

/// A running kvd: its process and the addresses it reported.
pub struct Kvd {
    /// The process (killed when dropped).
    pub server: Server,
    /// Where its binary protocol listens (from the ready line).
    pub addr: String,
    /// Where it speaks RESP, if it does.
    pub resp: Option<String>,
    /// Where it serves HTTP, if it does.
    pub http: Option<String>,
    /// What it printed up to its ready line.
    pub ready: Ready,
}

impl std::ops::Deref for Kvd {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.server
    }
}

impl std::ops::DerefMut for Kvd {
    fn deref_mut(&mut self) -> &mut Server {
        &mut self.server
    }
}

/// How to start kvd beyond its arguments.
#[derive(Clone, Debug)]
pub struct Options {
    /// `RUST_LOG` for it (`None`: unset, kvd's own default: what an operator sees).
    pub log: Option<String>,
    /// Whether its standard error is read after the ready line.
    pub after: AfterReady,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            log: Some("kvd=info".into()),
            after: AfterReady::Read,
        }
    }
}

/// Starts kvd with `args` (with `--listen 127.0.0.1:0` unless `args` give `--listen`).
/// Addresses of [`crate::addr`] in `--listen`, `--resp` and `--http` are handed to it as
/// listening sockets; any others (port 0) it binds itself and reports.
pub fn start(args: &[&str]) -> Kvd {
    start_with(args, &Options::default())
}

/// [`start`] with `options`.
pub fn start_with(args: &[&str], options: &Options) -> Kvd {
    start_command(command(args, options.log.as_deref()), args, options.after)
}

/// The command that runs kvd with `args` (and `--listen 127.0.0.1:0` unless they give one)
/// and `RUST_LOG=log` (unset if `None`).
fn command(args: &[&str], log: Option<&str>) -> Command {
    let mut command = Command::new(binary("kvd"));
    if !args.iter().any(|a| a == &"--listen" || a.starts_with("--listen=")) {
        command.args(["--listen", "127.0.0.1:0"]);
    }
    command.args(args);
    match log {
        Some(log) => command.env("RUST_LOG", log),
        None => command.env_remove("RUST_LOG"),
    };
    command
}

/// Starts kvd by `command` as given (e.g. through `ip netns exec`); `args` are its
/// arguments, read for the addresses to hand it.
pub fn start_command(command: Command, args: &[&str], after: AfterReady) -> Kvd {
    try_start_command(command, args, after).unwrap_or_else(|exited| {
        panic!(
            "kvd {} exited ({}) before its ready line; it printed:\n{}",
            args.join(" "),
            exited.status,
            exited.output
        )
    })
}

/// Starts kvd with `args` (as [`start`]); a kvd that refuses to start (exits before its ready
/// line) is returned as `Err` with what it printed.
pub fn try_start(args: &[&str]) -> Result<Kvd, Exited> {
    try_start_command(command(args, Some("kvd=info")), args, AfterReady::Read)
}

/// [`start_command`], returning a refusal to start as `Err`.
pub fn try_start_command(mut command: Command, args: &[&str], after: AfterReady) -> Result<Kvd, Exited> {
    command.env_remove("KV_NODES");
    let sockets = listen_addrs(args)
        .into_iter()
        .filter_map(|a| listener_for(&a).map(|l| l.unwrap_or_else(|e| panic!("cannot listen on {a}: {e}"))))
        .collect();
    let name = format!("kvd {}", args.join(" "));
    let (server, ready) = Server::try_start(&name, command, sockets, is_ready, after)?;
    let reported = |what: &str| {
        ready
            .before
            .iter()
            .find_map(|l| l.split_once(what).map(|(_, a)| a.trim().to_string()))
    };
    let (resp, http) = (reported(" speaks RESP on "), reported(" serves HTTP on "));
    let addr = ready
        .line
        .rsplit("listening on ")
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    Ok(Kvd {
        server,
        addr,
        resp,
        http,
        ready,
    })
}

/// kvd's ready line: printed once every front listens.
fn is_ready(line: &str) -> bool {
    line.contains("kvd shard ") && line.contains(" listening on ")
}

/// The values of the listening flags in `args`.
fn listen_addrs(args: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, a) in args.iter().enumerate() {
        for flag in LISTEN_FLAGS {
            if *a == flag {
                if let Some(v) = args.get(i + 1) {
                    out.push(v.to_string());
                }
            } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
                out.push(v.to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listening_flags_are_read_in_both_spellings() {
        let got = listen_addrs(&[
            "--shard",
            "0/1",
            "--listen",
            "a:1",
            "--resp=b:2",
            "--nodes",
            "c:3",
            "--http",
        ]);
        assert_eq!(got, ["a:1", "b:2"]);
    }
}
