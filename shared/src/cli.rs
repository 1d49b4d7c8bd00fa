//! What every tool's command line shares: naming the cluster, the request timeout, logging,
//! and turning an error into an exit status. (Feature `cli`; the library proper has no clap.)

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tracing_subscriber::EnvFilter;

use crate::auth::{AuthError, AuthToken, TOKEN_FILE_ENV};
use crate::client::{ClientConfig, ClientError, DEFAULT_NODE, ReadFrom, parse_nodes};

/// The largest `--max-staleness` (what the `StaleReads` frame can say, in whole ms, is far
/// more; a bound of hours would not be a bound anyone means).
const MAX_STALENESS: Duration = Duration::from_secs(3600);
use crate::tls::{TlsClient, TlsError};

/// `--nodes`/`KV_NODES` and `--timeout`, the same in kvd's client verbs, kvbench and kvtui.
#[derive(Args, Debug, Clone)]
pub struct NodesArgs {
    /// The cluster's nodes in shard order (node I is the kvd started with --shard I/N).
    #[arg(long, env = "KV_NODES", default_value = DEFAULT_NODE, value_name = "ADDR,ADDR,...")]
    pub nodes: String,
    /// Give up on a request, or on connecting to a node, after this long (e.g. 500ms, 5s).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub timeout: Duration,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub auth: AuthArgs,
    /// Connect over TLS, trusting the CA certificate(s) in this PEM file (the nodes' own
    /// certificate, if it is self-signed). Needed when kvd runs with --tls-cert.
    #[arg(long, env = "KV_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Which members of a replica group (`A|B|C` in --nodes) serve batches of reads only:
    /// `replicas` spreads them over every member, voters and learners the group reports,
    /// linearizably (a follower reads once it has applied the leader's read index);
    /// `leader` sends them to the leader only; `stale` lets a member answer from its own
    /// store while it is at most --max-staleness behind its leader (faster, may miss recent
    /// writes). Writes always go to the leader.
    #[arg(long, value_enum, default_value = "replicas", value_name = "FROM")]
    pub reads: ReadsArg,
    /// With `--reads stale`: how far behind its leader a member may be and still answer
    /// (at most 1h).
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub max_staleness: Duration,
}

/// `--reads`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum ReadsArg {
    Leader,
    Replicas,
    Stale,
}

/// Why a client could not be set up from its flags.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)]
pub enum SetupError {
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// `--auth-token-file`, the same for kvd (which requires the token) and every client.
#[derive(Args, Debug, Clone, Default)]
pub struct AuthArgs {
    /// File holding the cluster's shared token (one line; 16 to 1024 bytes, e.g. from
    /// `openssl rand -hex 32`). Without it, the token is taken from KV_AUTH_TOKEN if set.
    /// Never pass the token itself as an argument: `ps` shows arguments to every user.
    #[arg(long, env = TOKEN_FILE_ENV, value_name = "FILE")]
    pub auth_token_file: Option<PathBuf>,
}

impl AuthArgs {
    /// The token, if one is configured.
    pub fn token(&self) -> Result<Option<AuthToken>, AuthError> {
        AuthToken::load(self.auth_token_file.as_deref())
    }
}

impl NodesArgs {
    /// The node list, checked.
    pub fn node_list(&self) -> Result<Vec<String>, ClientError> {
        parse_nodes(&self.nodes)
    }

    /// A client configuration with these timeouts, token and TLS, and defaults for the rest.
    pub fn client_config(&self) -> Result<ClientConfig, SetupError> {
        Ok(ClientConfig {
            request_timeout: self.timeout,
            connect_timeout: self.timeout,
            auth: self.auth.token()?,
            tls: self.tls_ca.as_deref().map(TlsClient::from_ca_file).transpose()?,
            reads: match self.reads {
                ReadsArg::Leader => ReadFrom::Leader,
                ReadsArg::Replicas => ReadFrom::Replicas,
                ReadsArg::Stale => ReadFrom::Stale(self.max_staleness.clamp(Duration::from_millis(1), MAX_STALENESS)),
            },
            ..ClientConfig::default()
        })
    }

    /// Whether the node list is the default single local node (for hints when it is down).
    pub fn is_default(&self) -> bool {
        self.nodes.trim() == DEFAULT_NODE
    }
}

/// Lines the log may queue for stderr before it drops them (and counts them).
const LOG_QUEUE_LINES: usize = 16_384;

/// The running log: keep it alive until exit, so queued lines are written.
pub struct Logging {
    _guard: Option<tracing_appender::non_blocking::WorkerGuard>,
    dropped: Option<tracing_appender::non_blocking::ErrorCounter>,
}

impl Logging {
    /// Lines dropped because stderr could not keep up.
    pub fn dropped_lines(&self) -> u64 {
        self.dropped.as_ref().map_or(0, |c| c.dropped_lines() as u64)
    }

    /// A handle that reads the dropped-lines count (for a server's stats).
    pub fn dropped_counter(&self) -> Option<tracing_appender::non_blocking::ErrorCounter> {
        self.dropped.clone()
    }
}

/// Sets up `tracing` to stderr. `default` is the filter without `RUST_LOG` (e.g.
/// `"kvd=info,warn"`); `None` logs nothing unless `RUST_LOG` is set (a full-screen UI).
///
/// Lines are written by a background thread: a request path that logs never waits on a
/// slow or stalled stderr reader. When the queue is full, lines are dropped and counted
/// ([`Logging::dropped_lines`]) rather than blocking the caller.
pub fn init_logging(default: Option<&str>) -> Logging {
    let filter = match (EnvFilter::try_from_default_env(), default) {
        (Ok(f), _) => f,
        (Err(_), Some(d)) => EnvFilter::new(d),
        (Err(_), None) => {
            return Logging {
                _guard: None,
                dropped: None,
            };
        }
    };
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(LOG_QUEUE_LINES)
        .thread_name("log-writer")
        .finish(std::io::stderr());
    let dropped = writer.error_counter();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    Logging {
        _guard: Some(guard),
        dropped: Some(dropped),
    }
}

/// A size flag that is not a size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0} (try 512mb, 2gb, 1gib or a number of bytes)")]
pub struct SizeError(parse_size::Error);

/// Parses a size such as `512mb`, `2gb`, `1gib` or a plain number of bytes (for flags).
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    parse_size::parse_size(s).map_err(SizeError)
}

/// Exit status for usage errors and failures to run at all.
pub const EXIT_ERROR: u8 = 2;

/// Prints `tool: error: cause: cause` to stderr and returns exit status 2, except for a
/// closed stdout (`| head`), which ends quietly with status 0 as Unix tools do.
pub fn exit_code(tool: &str, err: &(dyn Error + 'static)) -> ExitCode {
    let mut chain = Some(err);
    let mut text = String::new();
    while let Some(e) = chain {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::BrokenPipe
        {
            return ExitCode::SUCCESS;
        }
        append_cause(&mut text, &e.to_string());
        chain = e.source();
    }
    eprintln!("{tool}: {text}");
    ExitCode::from(EXIT_ERROR)
}

/// Adds one cause to an error's text, unless the text already ends with it (an error that
/// names its source in its own message, as many `thiserror` types do, would say it twice).
fn append_cause(text: &mut String, cause: &str) {
    if cause.is_empty() || text.ends_with(cause) {
        return;
    }
    if !text.is_empty() {
        text.push_str(": ");
    }
    text.push_str(cause);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_already_in_the_message_is_said_once() {
        let err = crate::auth::AuthToken::from_file(std::path::Path::new("/nonexistent/kv-token")).unwrap_err();
        let mut text = String::new();
        let mut chain: Option<&(dyn Error + 'static)> = Some(&err);
        while let Some(e) = chain {
            append_cause(&mut text, &e.to_string());
            chain = e.source();
        }
        assert_eq!(text.matches("No such file").count(), 1, "{text}");
        assert!(
            text.starts_with("cannot read the token file /nonexistent/kv-token"),
            "{text}"
        );
    }

    #[test]
    fn a_new_cause_is_appended() {
        let mut text = "cannot connect".to_string();
        append_cause(&mut text, "refused");
        assert_eq!(text, "cannot connect: refused");
    }
}
