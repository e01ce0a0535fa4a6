//! Writing safetensors files atomically (temporary file in the same folder, then rename).

use std::borrow::Cow;
use std::path::Path;

use safetensors::tensor::View;
use safetensors::Dtype;

use crate::error::{Error, Result};
use crate::files::write_atomically;

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
