//! The output folder of a run: claimed before any work, so that a run never mixes its files
//! with another run's (an exclusive lock for the life of the run), never loses an epoch to a
//! folder it cannot write, and is only replaced when the user says so.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{Error, Result};

/// The files and folders a training run writes in its output folder.
pub(crate) const RUN_FILES: [&str; 4] =
    ["metrics.jsonl", "checkpoints", "samples", "reward_curve.png"];

/// How a run starts in its output folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// A new run: the folder must hold no run files.
    Fresh,
    /// Continue the run in the folder (`--resume`): it must hold checkpoints.
    Resume,
    /// A new run replacing the one in the folder (`--overwrite`): its run files are removed.
    Overwrite,
}

/// The lock file of an output folder: locked (`flock`, released by the OS when the process
/// ends, however it ends) for the life of a run, holding the PID of the process that has it.
pub(crate) const LOCK_FILE: &str = ".tpgrpo.lock";

/// The folders this process has locked: the lock file (open, locked) and how many claims
/// share it. A claim nested in another of the same process (the binary claims the folder
/// before loading anything, the trainer again when it starts) shares the lock.
static HELD: Mutex<Vec<(PathBuf, File, usize)>> = Mutex::new(Vec::new());

/// A claimed output folder: its exclusive lock, held until every claim of the folder in this
/// process is dropped.
#[derive(Debug)]
pub struct Claim {
    lock_path: PathBuf,
    /// The process recorded in the lock file by a run that ended without releasing the folder
    /// (killed), whose claim this one took over.
    pub took_over_from: Option<u32>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = held.iter().position(|(p, _, _)| *p == self.lock_path) {
            held[i].2 -= 1;
            if held[i].2 == 0 {
                // A run that ends normally leaves no PID behind (best effort); closing the
                // file releases the lock.
                let (_, file, _) = held.swap_remove(i);
                let _ = file.set_len(0);
            }
        }
    }
}

/// Takes the exclusive lock of `out` (which exists), or refuses naming the folder and the
/// process holding it.
fn lock(out: &Path) -> Result<Claim> {
    let path = out.join(LOCK_FILE);
    // One key per folder however it is spelled (`out` exists, so it canonicalizes).
    let key = std::fs::canonicalize(out).map_err(|e| Error::io(out, e))?.join(LOCK_FILE);
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(entry) = held.iter_mut().find(|(p, _, _)| *p == key) {
        entry.2 += 1;
        return Ok(Claim { lock_path: key, took_over_from: None });
    }
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| Error::io(&path, e))?;
    // A PID is at most 10 digits: read no more than that of whatever the file holds.
    let mut text = String::new();
    let _ = (&mut file).take(16).read_to_string(&mut text);
    let holder: Option<u32> = text.trim().parse().ok();
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let who = holder.map_or("another process".to_string(), |p| format!("process {p}"));
            return Err(Error::format(
                out,
                format!(
                    "is the output folder of a run still going ({who} holds {LOCK_FILE}); \
                     wait for it to end or choose another --out"
                ),
            ));
        }
        Err(TryLockError::Error(e)) => return Err(Error::io(&path, e)),
    }
    let record = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| write!(file, "{}", std::process::id()))
        .and_then(|()| file.sync_all());
    record.map_err(|e| Error::io(&path, e))?;
    held.push((key.clone(), file, 1));
    Ok(Claim { lock_path: key, took_over_from: holder.filter(|&p| p != std::process::id()) })
}

/// Removes what killed runs left half-written in `out`: `.NAME.tmp-PID` files of atomic
/// writes and `.epoch-NNNNN.partial` checkpoint folders (only called under the lock, so no
/// live process is writing them).
fn remove_stale_temporaries(out: &Path) -> Result<()> {
    for dir in [out.to_path_buf(), out.join("checkpoints"), out.join("samples")] {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let stale = name.starts_with('.')
                && (name.contains(".tmp-") || (dir != out && name.ends_with(".partial")));
            if !stale {
                continue;
            }
            remove(&entry.path())?;
        }
    }
    Ok(())
}

/// Removes the file or folder `path`.
fn remove(path: &Path) -> Result<()> {
    let removed =
        if path.is_dir() { std::fs::remove_dir_all(path) } else { std::fs::remove_file(path) };
    removed.map_err(|e| Error::io(path, e))
}

/// The run files present in `out`.
pub(crate) fn run_files(out: &Path) -> Vec<&'static str> {
    RUN_FILES.into_iter().filter(|f| out.join(f).exists()).collect()
}

/// Claims `out` for a run started as `start`: creates it, takes its exclusive lock (refusing,
/// naming the holder's PID, while another run has it; taking over the lock of a run that was
/// killed), removes what killed runs left half-written, checks that a file can be written
/// and removed there, and refuses a fresh run in a folder that holds another run's files
/// (naming them) or a resume without checkpoints; `Overwrite` removes the run files (and
/// nothing else). Called before any model is loaded or any epoch computed; the folder stays
/// claimed until the returned [`Claim`] is dropped.
pub fn claim(out: &Path, start: Start) -> Result<Claim> {
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let claim = lock(out)?;
    remove_stale_temporaries(out)?;
    prepare(out, start)?;
    Ok(claim)
}

/// The checks and removals of [`claim`] once the folder is locked.
fn prepare(out: &Path, start: Start) -> Result<()> {
    let probe = out.join(format!(".tpgrpo-write-test-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| Error::io(out, e))?;
    std::fs::remove_file(&probe).map_err(|e| Error::io(&probe, e))?;
    let present = run_files(out);
    match start {
        Start::Fresh if !present.is_empty() => Err(Error::format(
            out,
            format!(
                "holds another run ({}); pass --resume to continue it, --overwrite to replace \
                 it, or choose another --out",
                present.join(", ")
            ),
        )),
        Start::Resume if !out.join("checkpoints").is_dir() => {
            Err(Error::format(out, "has no checkpoints/ to resume from"))
        }
        Start::Overwrite => {
            for name in present {
                remove(&out.join(name))?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("tpgrpo-run-dir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_fresh_run_is_refused_in_another_runs_folder_and_overwrite_removes_only_run_files() {
        let out = scratch("claim");
        claim(&out, Start::Fresh).expect("a new folder is claimed");
        claim(&out, Start::Fresh).expect("an empty folder is claimed");
        let e = claim(&out, Start::Resume).unwrap_err().to_string();
        assert!(e.contains("no checkpoints"), "{e}");
        std::fs::write(out.join("metrics.jsonl"), "{}\n").unwrap();
        std::fs::create_dir_all(out.join("checkpoints/epoch-00001")).unwrap();
        std::fs::write(out.join("notes.txt"), "mine").unwrap();
        let e = claim(&out, Start::Fresh).unwrap_err().to_string();
        assert!(e.contains("metrics.jsonl, checkpoints") && e.contains("--overwrite"), "{e}");
        claim(&out, Start::Resume).expect("a run with checkpoints resumes");
        claim(&out, Start::Overwrite).expect("overwrite");
        assert!(run_files(&out).is_empty());
        assert_eq!(std::fs::read_to_string(out.join("notes.txt")).unwrap(), "mine");
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn an_output_path_that_is_a_file_is_refused_naming_it() {
        let out = scratch("file");
        std::fs::write(&out, b"not a folder").unwrap();
        let e = claim(&out, Start::Fresh).unwrap_err().to_string();
        assert!(e.contains(&out.display().to_string()), "{e}");
        let _ = std::fs::remove_file(&out);
    }

    /// The lock is exclusive against other processes (here: the lock file opened and locked
    /// apart, as another process would), shared by nested claims of this process, released
    /// when the last is dropped, and the PID of a holder that never released it (a killed
    /// run; written here by hand) is reported when the next claim takes over.
    #[test]
    fn a_claimed_folder_is_locked_until_released_and_a_dead_holder_is_named() {
        let out = scratch("lock");
        let held = claim(&out, Start::Fresh).expect("claimed");
        assert_eq!(held.took_over_from, None);
        let me = std::process::id().to_string();
        let path = out.join(LOCK_FILE);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), me);
        let other = || File::options().read(true).write(true).open(&path).unwrap();
        assert!(matches!(other().try_lock(), Err(TryLockError::WouldBlock)));
        let nested = claim(&out, Start::Fresh).expect("a nested claim shares the lock");
        drop(held);
        assert!(matches!(other().try_lock(), Err(TryLockError::WouldBlock)), "still held");
        drop(nested);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "", "no PID left");
        let outsider = other();
        outsider.try_lock().expect("released");
        let e = claim(&out, Start::Fresh).unwrap_err().to_string();
        assert!(e.contains(&out.display().to_string()) && e.contains("still going"), "{e}");
        drop(outsider);
        std::fs::write(&path, "4000000000").unwrap();
        let taken = claim(&out, Start::Fresh).expect("a dead holder's folder is claimed");
        assert_eq!(taken.took_over_from, Some(4_000_000_000));
        drop(taken);
        let _ = std::fs::remove_dir_all(&out);
    }

    /// What a killed run leaves half-written is removed when the folder is claimed, and
    /// nothing else (files of the user's, complete checkpoints).
    #[test]
    fn stale_temporaries_of_killed_runs_are_removed_at_claim() {
        let out = scratch("stale");
        let partial = out.join("checkpoints/.epoch-00002.partial");
        std::fs::create_dir_all(partial.join("adapter")).unwrap();
        std::fs::create_dir_all(out.join("checkpoints/epoch-00001")).unwrap();
        std::fs::create_dir_all(out.join("samples")).unwrap();
        let stale = [
            out.join(".metrics.jsonl.tmp-4242"),
            out.join("checkpoints/.latest.tmp-17"),
            out.join("samples/.epoch-00002.png.tmp-99"),
        ];
        for f in &stale {
            std::fs::write(f, b"half").unwrap();
        }
        std::fs::write(out.join("notes.tmp-1"), b"mine").unwrap();
        let _claim = claim(&out, Start::Resume).expect("claimed");
        assert!(!partial.exists());
        assert!(stale.iter().all(|f| !f.exists()));
        assert!(out.join("checkpoints/epoch-00001").is_dir() && out.join("notes.tmp-1").is_file());
        let _ = std::fs::remove_dir_all(&out);
    }
}
