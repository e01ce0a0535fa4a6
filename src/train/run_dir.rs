//! The output folder of a run: claimed before any work, so that a run never mixes its files
//! with another run's, never loses an epoch to a folder it cannot write, and is only replaced
//! when the user says so.

use std::path::Path;

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

/// The run files present in `out`.
pub(crate) fn run_files(out: &Path) -> Vec<&'static str> {
    RUN_FILES.into_iter().filter(|f| out.join(f).exists()).collect()
}

/// Claims `out` for a run started as `start`: creates it, checks that a file can be written
/// and removed there, and refuses a fresh run in a folder that holds another run's files
/// (naming them) or a resume without checkpoints; `Overwrite` removes the run files (and
/// nothing else). Called before any model is loaded or any epoch computed.
pub fn claim(out: &Path, start: Start) -> Result<()> {
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
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
                let path = out.join(name);
                let removed = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                removed.map_err(|e| Error::io(&path, e))?;
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
}
