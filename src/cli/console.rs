//! Console output of the training programs: a closed or failing stdout (`| head`, a full log
//! disk) never stops a run. Included by `tpgrpo` and the examples with `#[path]`.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once stdout has failed: later lines are dropped.
static LOST: AtomicBool = AtomicBool::new(false);

/// Writes one line to stdout; after the first failure says so once on stderr (if that still
/// works) and drops every later line.
pub fn line(args: std::fmt::Arguments<'_>) {
    if LOST.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    let written =
        out.write_fmt(args).and_then(|()| out.write_all(b"\n")).and_then(|()| out.flush());
    if let Err(e) = written {
        LOST.store(true, Ordering::Relaxed);
        let _ = writeln!(
            std::io::stderr(),
            "warning: standard output failed ({e}); the run goes on without printing"
        );
    }
}

/// Drops every later line: the other ranks of an MPI job, for which rank 0 speaks.
#[allow(dead_code)] // only the MPI path silences a process
pub fn silence() {
    LOST.store(true, Ordering::Relaxed);
}

/// Reports `error: {error}` on stderr (if it still works) in one write: stderr is unbuffered,
/// and written piece by piece the line could be split by output that other processes write to
/// the same place (Open MPI's launcher put its abort notice between `error: rank 1` and `: ...`).
pub fn error(error: impl std::fmt::Display) {
    let _ = std::io::stderr().write_all(format!("error: {error}\n").as_bytes());
}

/// Reports `error` on stderr ([`error`]) and exits with status 1.
pub fn fail(error: impl std::fmt::Display) -> ! {
    self::error(error);
    std::process::exit(1)
}

/// `println!` for a run: see [`line`].
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::console::line(format_args!($($arg)*))
    };
}
