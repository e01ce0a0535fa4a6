//! The crate's error type: every variant names the file, key, field, URL or tensor it is about.

use std::path::{Path, PathBuf};

/// Errors raised by tpgrpo.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing a file failed.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file's contents are not what its format promises (corrupt, truncated, malformed JSON).
    #[error("{}: {message}", .path.display())]
    Format {
        /// The file involved.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A checkpoint's tensors do not match the model: missing, unexpected or mis-shaped keys.
    #[error("{}", checkpoint_message(.path, .problems))]
    Checkpoint {
        /// The checkpoint (file or folder).
        path: PathBuf,
        /// One line per problem, each naming the key.
        problems: Vec<String>,
    },
    /// A setting (configuration field, command-line value, model config entry) is invalid.
    #[error("config field `{field}`: {message}")]
    Config {
        /// The configuration field, as written in the file.
        field: String,
        /// Why the value is rejected.
        message: String,
    },
    /// A reward server failed or replied with something unusable (status, body, scores).
    #[error("reward server {url}: {message}")]
    RewardServer {
        /// The server's URL.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// A reward returned something unusable: a wrong number of scores, or one not finite.
    #[error("reward `{name}`: {message}")]
    Reward {
        /// The reward (or reward term).
        name: String,
        /// What it returned.
        message: String,
    },
    /// An image could not be decoded, encoded or processed (`what`: which image).
    #[error("{what}: {message}")]
    Image {
        /// Which image.
        what: String,
        /// The codec's message.
        message: String,
    },
    /// Values of a run went NaN or infinite (divergence, or bad weights or inputs); the run
    /// stops before anything is written with them.
    #[error(
        "{what}: {count} of {total} values are NaN or infinite (diverged? try a lower \
         optimizer.lr; check the weights and inputs); stopped before writing them"
    )]
    NonFinite {
        /// What went non-finite, and where (`adapter to_q.lora_A after optimizer step 3`).
        what: String,
        /// How many values are not finite.
        count: usize,
        /// Of how many.
        total: usize,
    },
    /// Training stopped on request ([`crate::train::Trainer::stopping_on`]) after writing a
    /// checkpoint of the last completed epoch; resuming from it continues the run exactly.
    #[error(
        "stopped on request after epoch {epoch}; checkpoint {} (resume from it to continue)",
        .checkpoint.display()
    )]
    Stopped {
        /// Epochs completed.
        epoch: usize,
        /// The checkpoint of that epoch.
        checkpoint: PathBuf,
    },
    /// A replica of a data-parallel run failed, or its collective did.
    #[error("replica {rank}: {message}")]
    Replica {
        /// The replica's rank.
        rank: usize,
        /// What happened.
        message: String,
    },
    /// A replica of a multi-process run does not train what replica 0 trains: settings, model,
    /// task or resumed state differ (or its adapters after an epoch).
    #[error("rank {rank} does not train what rank 0 trains: {}", .differences.join("; "))]
    RanksDiffer {
        /// The first rank that differs.
        rank: usize,
        /// Each difference, naming the setting, tensor or detail and both values.
        differences: Vec<String>,
    },
    /// The device reported an error while running queued work or reading a tensor back, or
    /// computed values that fail a check against a host reference (`what`: the phase, tensor
    /// or computation).
    #[error("device error during {what}: {message}")]
    Device {
        /// What was being waited on.
        what: String,
        /// The backend's message.
        message: String,
    },
    /// A tensor argument has the wrong shape.
    #[error("`{name}` has shape {found:?}, expected {expected}")]
    Shape {
        /// The argument.
        name: String,
        /// The expected shape, in words (may contain symbolic sizes).
        expected: String,
        /// The shape found.
        found: Vec<usize>,
    },
    /// A stage of `tpgrpo doctor` failed its check.
    #[error("doctor stage '{stage}' failed: {message}")]
    Doctor {
        /// The stage.
        stage: String,
        /// What the check found.
        message: String,
    },
    /// An invariant of the crate itself broke (a bug to report, not a user error).
    #[error("internal error (please report): {0}")]
    Internal(String),
}

/// Result alias with the crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        Error::Io { path: path.as_ref().to_path_buf(), source }
    }

    /// A format error in `path`.
    pub fn format(path: impl AsRef<Path>, message: impl Into<String>) -> Self {
        Error::Format { path: path.as_ref().to_path_buf(), message: message.into() }
    }

    /// An invalid configuration `field`.
    pub fn config(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config { field: field.into(), message: message.into() }
    }

    /// A tensor argument `name` whose shape is not `expected`.
    pub fn shape(name: impl Into<String>, expected: impl Into<String>, found: &[usize]) -> Self {
        Error::Shape { name: name.into(), expected: expected.into(), found: found.to_vec() }
    }
}

/// How many problems of a checkpoint report are printed before the rest are counted.
const MAX_LISTED_PROBLEMS: usize = 20;

/// A checkpoint's problems, one per line after a count, at most [`MAX_LISTED_PROBLEMS`].
fn checkpoint_message(path: &Path, problems: &[String]) -> String {
    let n = problems.len();
    let mut text = format!(
        "{}: checkpoint does not match the model ({n} problem{})",
        path.display(),
        if n == 1 { "" } else { "s" }
    );
    for p in problems.iter().take(MAX_LISTED_PROBLEMS) {
        text.push_str(&format!("\n  - {p}"));
    }
    if n > MAX_LISTED_PROBLEMS {
        text.push_str(&format!("\n  ... and {} more", n - MAX_LISTED_PROBLEMS));
    }
    text
}
