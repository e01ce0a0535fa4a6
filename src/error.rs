//! The crate's error type: every variant names the file, key, field or tensor it is about.

use std::fmt;
use std::path::{Path, PathBuf};

/// Errors raised by tpgrpo.
#[derive(Debug)]
pub enum Error {
    /// Reading or writing a file failed.
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A file's contents are not what its format promises (corrupt, truncated, malformed JSON).
    Format {
        /// The file involved.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A checkpoint's tensors do not match the model: missing, unexpected or mis-shaped keys.
    Checkpoint {
        /// The checkpoint (file or folder).
        path: PathBuf,
        /// One line per problem, each naming the key.
        problems: Vec<String>,
    },
    /// A configuration value is invalid.
    Config {
        /// The configuration field, as written in the file.
        field: String,
        /// Why the value is rejected.
        message: String,
    },
    /// Values of a run went NaN or infinite (divergence, or bad weights or inputs); the run
    /// stops before anything is written with them.
    NonFinite {
        /// What went non-finite, and where (`adapter to_q.lora_A after optimizer step 3`).
        what: String,
        /// How many values are not finite.
        count: usize,
        /// Of how many.
        total: usize,
    },
    /// A replica of a data-parallel run failed, or its collective did.
    Replica {
        /// The replica's rank.
        rank: usize,
        /// What happened.
        message: String,
    },
    /// The device reported an error while running queued work (`what`: the phase waited on).
    Device {
        /// What was being waited on.
        what: String,
        /// The backend's message.
        message: String,
    },
    /// A tensor argument has the wrong shape.
    Shape {
        /// The argument.
        name: String,
        /// The expected shape, in words (may contain symbolic sizes).
        expected: String,
        /// The shape found.
        found: Vec<usize>,
    },
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

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Format { path, message } => write!(f, "{}: {message}", path.display()),
            Error::Checkpoint { path, problems } => {
                write!(
                    f,
                    "{}: checkpoint does not match the model ({} problem{})",
                    path.display(),
                    problems.len(),
                    if problems.len() == 1 { "" } else { "s" }
                )?;
                for p in problems.iter().take(MAX_LISTED_PROBLEMS) {
                    write!(f, "\n  - {p}")?;
                }
                if problems.len() > MAX_LISTED_PROBLEMS {
                    write!(f, "\n  ... and {} more", problems.len() - MAX_LISTED_PROBLEMS)?;
                }
                Ok(())
            }
            Error::Config { field, message } => write!(f, "config field `{field}`: {message}"),
            Error::NonFinite { what, count, total } => write!(
                f,
                "{what}: {count} of {total} values are NaN or infinite (diverged? try a lower \
                 optimizer.lr; check the weights and inputs); stopped before writing them"
            ),
            Error::Replica { rank, message } => write!(f, "replica {rank}: {message}"),
            Error::Device { what, message } => write!(f, "device error during {what}: {message}"),
            Error::Shape { name, expected, found } => {
                write!(f, "`{name}` has shape {found:?}, expected {expected}")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
