//! File helpers shared by the loaders and writers: atomic writes, and paths named inside files
//! confined to the folder of the file that names them.

use std::fs;
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};

/// Writes `path` atomically: `write` fills a temporary sibling path, which is synced and renamed
/// over `path` only when it succeeded, so a crash never leaves a half-written file behind.
pub(crate) fn write_atomically(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let name = path.file_name().ok_or_else(|| Error::format(path, "not a file path"))?;
    let tmp: PathBuf = dir.join(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    let result = write(&tmp).and_then(|()| {
        let sync = fs::File::open(&tmp).and_then(|f| f.sync_all());
        sync.and_then(|()| fs::rename(&tmp, path)).map_err(|e| Error::io(path, e))
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// `dir/name` when `name`, read from the file `listed_in`, is a relative path that stays
/// inside `dir` (plain names and `.` only: no `..`, no root, no drive); else an error naming
/// the file and the entry.
///
/// The check is on the name, not on the file system: a name may be a symbolic link to
/// elsewhere (the Hugging Face cache links every file of a snapshot to its blob store), but a
/// file cannot make the reader open a path of its own choosing outside the folder.
pub(crate) fn inside(dir: &Path, name: &str, listed_in: &Path) -> Result<PathBuf> {
    let path = Path::new(name);
    let plain = path.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if !plain || !path.components().any(|c| matches!(c, Component::Normal(_))) {
        return Err(Error::format(
            listed_in,
            format!(
                "names {name:?}, which is not a file inside {} (only relative names without \
                 `..` are read)",
                dir.display()
            ),
        ));
    }
    Ok(dir.join(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_leave_the_folder_are_refused() {
        let (dir, index) = (Path::new("/models/x"), Path::new("/models/x/model.index.json"));
        assert_eq!(inside(dir, "a.safetensors", index).unwrap(), dir.join("a.safetensors"));
        assert_eq!(inside(dir, "sub/./b", index).unwrap(), dir.join("sub/./b"));
        for bad in ["", ".", "..", "../x.safetensors", "sub/../../x", "/etc/passwd", "a/../b"] {
            let e = inside(dir, bad, index).unwrap_err().to_string();
            assert!(e.starts_with("/models/x/model.index.json: names"), "{bad}: {e}");
        }
    }
}
