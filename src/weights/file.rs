//! Safetensors files opened by header only; tensors are read one at a time and converted to f32.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use serde::Deserialize;

use crate::error::{Error, Result};

/// Largest header the safetensors format allows (100 MB).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Where one tensor lives: its file, element type, shape and byte range.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// Index into [`WeightFiles::files`].
    pub file: usize,
    /// Element type as written in the header (`F32`, `F16`, `BF16`, ...).
    pub dtype: String,
    /// Shape in the file's (PyTorch) layout.
    pub shape: Vec<usize>,
    /// Absolute byte offset of the first element in the file.
    pub start: u64,
    /// Absolute byte offset one past the last element.
    pub end: u64,
}

/// One safetensors checkpoint, a single file or the shards of a sharded one, indexed by key.
#[derive(Debug, Clone, Default)]
pub struct WeightFiles {
    /// The files, in the order they were opened.
    pub files: Vec<PathBuf>,
    tensors: BTreeMap<String, TensorInfo>,
    /// String metadata of the headers (`__metadata__`), merged over the files.
    pub metadata: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct HeaderEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: (u64, u64),
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "F64" | "I64" | "U64" => 8,
        "F32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "I8" | "U8" | "BOOL" | "F8_E4M3" | "F8_E5M2" => 1,
        _ => return None,
    })
}

impl WeightFiles {
    /// Opens one `.safetensors` file, reading and validating its header only.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let mut files = WeightFiles::default();
        files.add_file(path.as_ref())?;
        Ok(files)
    }

    /// Opens the weights of a transformers / diffusers model folder: `{stem}.safetensors`, or
    /// the shards listed in `{stem}.safetensors.index.json` (`stem` is `model` for
    /// transformers, `diffusion_pytorch_model` for diffusers).
    pub fn open_dir(dir: impl AsRef<Path>, stem: &str) -> Result<Self> {
        let dir = dir.as_ref();
        let (single, index) = (
            dir.join(format!("{stem}.safetensors")),
            dir.join(format!("{stem}.safetensors.index.json")),
        );
        if index.is_file() {
            Self::open_sharded(&index)
        } else if single.is_file() {
            Self::open(&single)
        } else {
            Err(Error::format(
                dir,
                format!("holds neither {stem}.safetensors nor {stem}.safetensors.index.json"),
            ))
        }
    }

    /// Opens a sharded checkpoint from its `*.safetensors.index.json`: every shard named in the
    /// `weight_map`, checking that each key lives in the shard the index says.
    pub fn open_sharded(index_path: impl AsRef<Path>) -> Result<Self> {
        let index_path = index_path.as_ref();
        let text = std::fs::read_to_string(index_path).map_err(|e| Error::io(index_path, e))?;
        let index: ShardIndex = serde_json::from_str(&text)
            .map_err(|e| Error::format(index_path, format!("not a safetensors index: {e}")))?;
        let dir = index_path.parent().unwrap_or(Path::new("."));
        let mut shards: Vec<&String> = index.weight_map.values().collect();
        shards.sort();
        shards.dedup();
        let mut files = WeightFiles::default();
        for shard in shards {
            files.add_file(&crate::files::inside(dir, shard, index_path)?)?;
        }
        let mut problems = Vec::new();
        for (key, shard) in &index.weight_map {
            match files.tensors.get(key) {
                None => problems.push(format!("`{key}` is listed for {shard} but not in it")),
                Some(info) if !files.files[info.file].ends_with(shard) => problems.push(format!(
                    "`{key}` is listed for {shard} but found in {}",
                    files.files[info.file].display()
                )),
                Some(_) => {}
            }
        }
        for key in files.tensors.keys().filter(|k| !index.weight_map.contains_key(*k)) {
            problems.push(format!("`{key}` is in a shard but not in the index"));
        }
        if !problems.is_empty() {
            return Err(Error::Checkpoint { path: index_path.to_path_buf(), problems });
        }
        Ok(files)
    }

    fn add_file(&mut self, path: &Path) -> Result<()> {
        let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
        let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let mut n = [0u8; 8];
        file.read_exact(&mut n)
            .map_err(|_| Error::format(path, "not a safetensors file: shorter than 8 bytes"))?;
        let n = u64::from_le_bytes(n);
        if n > MAX_HEADER_BYTES || 8 + n > file_len {
            return Err(Error::format(
                path,
                format!("corrupt safetensors header: length {n} for a file of {file_len} bytes"),
            ));
        }
        let mut header = vec![0u8; n as usize];
        file.read_exact(&mut header).map_err(|e| Error::io(path, e))?;
        let header: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&header)
            .map_err(|e| Error::format(path, format!("corrupt safetensors header: {e}")))?;

        let data_start = 8 + n;
        let file_index = self.files.len();
        let mut ranges = Vec::new();
        for (key, value) in header {
            if key == "__metadata__" {
                let entries: BTreeMap<String, String> = serde_json::from_value(value)
                    .map_err(|e| Error::format(path, format!("corrupt __metadata__: {e}")))?;
                self.metadata.extend(entries);
                continue;
            }
            let entry: HeaderEntry = serde_json::from_value(value).map_err(|e| {
                Error::format(path, format!("corrupt header entry for `{key}`: {e}"))
            })?;
            let elem = dtype_size(&entry.dtype).ok_or_else(|| {
                Error::format(path, format!("`{key}` has unknown dtype {}", entry.dtype))
            })?;
            let (begin, end) = entry.data_offsets;
            let numel: u64 = entry.shape.iter().map(|&d| d as u64).product();
            if end < begin || end - begin != numel * elem {
                return Err(Error::format(
                    path,
                    format!(
                        "`{key}`: byte range {begin}..{end} does not hold {:?} {} elements",
                        entry.shape, entry.dtype
                    ),
                ));
            }
            ranges.push((begin, end, key.clone()));
            let info = TensorInfo {
                file: file_index,
                dtype: entry.dtype,
                shape: entry.shape,
                start: data_start + begin,
                end: data_start + end,
            };
            if let Some(old) = self.tensors.insert(key.clone(), info) {
                return Err(Error::format(
                    path,
                    format!("`{key}` is also in {}", self.files[old.file].display()),
                ));
            }
        }
        ranges.sort();
        let mut cursor = 0;
        for (begin, end, key) in &ranges {
            if *begin != cursor {
                return Err(Error::format(
                    path,
                    format!("corrupt safetensors data: `{key}` starts at byte {begin}, expected {cursor}"),
                ));
            }
            cursor = *end;
        }
        if data_start + cursor != file_len {
            return Err(Error::format(
                path,
                format!(
                    "truncated or padded safetensors file: header describes {} bytes, file has {file_len}",
                    data_start + cursor
                ),
            ));
        }
        self.files.push(path.to_path_buf());
        Ok(())
    }

    /// Every tensor key, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Where `key` lives, if present.
    pub fn info(&self, key: &str) -> Option<&TensorInfo> {
        self.tensors.get(key)
    }

    /// The file holding `key` (for error messages), or the first file.
    pub fn path_of(&self, key: &str) -> &Path {
        let i = self.tensors.get(key).map_or(0, |t| t.file);
        self.files.get(i).map_or(Path::new("<no file>"), PathBuf::as_path)
    }

    /// Reads `key` and converts F32, F16 and BF16 elements to f32 (row-major, file layout).
    pub fn read_f32(&self, key: &str) -> Result<Vec<f32>> {
        let info = self.tensors.get(key).ok_or_else(|| Error::Checkpoint {
            path: self.path_of(key).to_path_buf(),
            problems: vec![format!("missing key `{key}`")],
        })?;
        let path = &self.files[info.file];
        let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
        file.seek(SeekFrom::Start(info.start)).map_err(|e| Error::io(path, e))?;
        let mut bytes = vec![0u8; (info.end - info.start) as usize];
        file.read_exact(&mut bytes).map_err(|e| Error::io(path, e))?;
        let values = match info.dtype.as_str() {
            "F32" => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            "F16" => {
                bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
            }
            "BF16" => {
                bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
            }
            other => {
                return Err(Error::format(
                    path,
                    format!("`{key}` has dtype {other}; model weights must be F32, F16 or BF16"),
                ))
            }
        };
        Ok(values)
    }
}
