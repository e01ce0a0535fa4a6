//! Writing safetensors files atomically (temporary file in the same folder, then rename).

use std::borrow::Cow;
use std::fs;
use std::path::{Path, PathBuf};

use safetensors::tensor::View;
use safetensors::Dtype;

use crate::error::{Error, Result};

/// Writes `path` atomically: `write` fills a temporary sibling path, which is synced and renamed
/// over `path` only when it succeeded, so a crash never leaves a half-written file behind.
pub fn write_atomically(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
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

/// An f32 tensor borrowed for serialisation; its bytes are produced one tensor at a time.
struct F32View<'a> {
    shape: &'a [usize],
    values: &'a [f32],
}

impl View for F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(self.values.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
    fn data_len(&self) -> usize {
        self.values.len() * 4
    }
}

/// Saves named f32 tensors (`(key, shape, values)`) as a safetensors file, atomically.
pub fn save_safetensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) -> Result<()> {
    save_safetensors_with_metadata(path, tensors, None)
}

/// [`save_safetensors`] with string metadata in the header (`__metadata__`).
pub fn save_safetensors_with_metadata(
    path: &Path,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
    metadata: Option<std::collections::HashMap<String, String>>,
) -> Result<()> {
    for (key, shape, values) in tensors {
        if shape.iter().product::<usize>() != values.len() {
            return Err(Error::shape(key, format!("{} values", values.len()), shape));
        }
    }
    let views = tensors.iter().map(|(k, s, v)| (k.as_str(), F32View { shape: s, values: v }));
    write_atomically(path, |tmp| {
        safetensors::serialize_to_file(views, metadata, tmp)
            .map_err(|e| Error::format(tmp, format!("cannot write safetensors: {e}")))
    })
}
