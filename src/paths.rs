//! Paths named inside files (a sharded index's shard names): confined to the folder of the
//! file that names them.

use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};

/// `dir/name` when `name`, read from the file `listed_in`, is a relative path that stays
/// inside `dir` (plain names and `.` only: no `..`, no root, no drive); else an error naming
/// the file and the entry.
///
/// The check is on the name, not on the file system: a name may be a symbolic link to
/// elsewhere (the Hugging Face cache links every file of a snapshot to its blob store), but a
/// file cannot make the reader open a path of its own choosing outside the folder.
pub fn inside(dir: &Path, name: &str, listed_in: &Path) -> Result<PathBuf> {
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
