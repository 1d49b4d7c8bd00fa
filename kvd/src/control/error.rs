//! Why a control verb (`kvd admin`, `kvd manager`, the client verbs) stopped: the cluster
//! could not be reached, a group answered something else than asked, or the request cannot
//! be carried out as given (the message says why and what to run instead).

use kvshared::client::ClientError;

/// A control verb's failure.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The cluster client failed (connecting, a frame, a node down).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The client failed while doing what `doing` says (which group, which step).
    #[error("{doing}: {source}")]
    Reach {
        /// What was being done, naming the group or member.
        doing: String,
        /// The client's failure.
        source: ClientError,
    },
    /// A group or member answered something else than the step asked for.
    #[error("{0}")]
    Unexpected(String),
    /// The request cannot be carried out as given: the operator is told why and what to do.
    #[error("{0}")]
    Refused(String),
    /// Reading a file or writing the output failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A size flag that is not a size.
    #[error(transparent)]
    Size(#[from] kvshared::cli::SizeError),
    /// The client's settings (the token file, TLS) could not be read.
    #[error(transparent)]
    Setup(#[from] kvshared::cli::SetupError),
    /// Output could not be encoded as JSON.
    #[error("cannot encode the output: {0}")]
    Json(#[from] serde_json::Error),
}

/// Adds what was being done to a failure.
pub trait Doing<T> {
    /// `Err(e)` becomes the failure of `doing`.
    fn doing(self, doing: impl FnOnce() -> String) -> Result<T>;
}

impl<T> Doing<T> for Result<T> {
    fn doing(self, doing: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| match e {
            ControlError::Client(source) => ControlError::Reach { doing: doing(), source },
            other => ControlError::Refused(format!("{}: {other}", doing())),
        })
    }
}

impl<T> Doing<T> for std::result::Result<T, ClientError> {
    fn doing(self, doing: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| ControlError::Reach { doing: doing(), source })
    }
}

/// A control verb's result.
pub type Result<T> = std::result::Result<T, ControlError>;

/// Returns a [`ControlError::Refused`] made with `format!`'s arguments.
macro_rules! refuse {
    ($($arg:tt)*) => {
        return Err($crate::control::error::ControlError::Refused(format!($($arg)*)))
    };
}
pub(crate) use refuse;

/// Returns a [`ControlError::Unexpected`] made with `format!`'s arguments.
macro_rules! unexpected {
    ($($arg:tt)*) => {
        return Err($crate::control::error::ControlError::Unexpected(format!($($arg)*)))
    };
}
pub(crate) use unexpected;
