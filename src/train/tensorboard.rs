//! TensorBoard event files: the metrics of every epoch as scalars and the held-out grid as an
//! image, in the format TensorBoard, wandb (`wandb.tensorboard.patch` / `sync_tensorboard`) and
//! most trackers read.
//!
//! A file `events.out.tfevents.<unix seconds>.<host>.<pid>` is a sequence of records, each
//! `len: u64 LE`, `masked_crc32c(len bytes): u32 LE`, `data: len bytes`,
//! `masked_crc32c(data): u32 LE`, with `masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8`
//! (mod 2^32) over the Castagnoli CRC-32. Each `data` is a protobuf `tensorflow.Event`; the
//! first one carries `file_version = "brain.Event:2"`. A resumed run writes a `SessionLog`
//! `START` at its epoch, which tells TensorBoard to drop the earlier file's later steps.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use prost::Message;

use super::metrics::{wall_time, EpochMetrics};
use crate::error::{Error, Result};

/// `tensorflow.Event` (the fields this crate writes).
#[derive(Clone, PartialEq, Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(string, optional, tag = "3")]
    file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    summary: Option<Summary>,
    #[prost(message, optional, tag = "6")]
    session_log: Option<SessionLog>,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value`: a scalar (`simple_value`) or an image.
#[derive(Clone, PartialEq, Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, optional, tag = "2")]
    simple_value: Option<f32>,
    #[prost(message, optional, tag = "4")]
    image: Option<SummaryImage>,
}

/// `tensorflow.Summary.Image`: an encoded PNG.
#[derive(Clone, PartialEq, Message)]
struct SummaryImage {
    #[prost(int32, tag = "1")]
    height: i32,
    #[prost(int32, tag = "2")]
    width: i32,
    #[prost(int32, tag = "3")]
    colorspace: i32,
    #[prost(bytes = "vec", tag = "4")]
    encoded_image_string: Vec<u8>,
}

/// `tensorflow.SessionLog` (`status` 1 is `START`).
#[derive(Clone, PartialEq, Message)]
struct SessionLog {
    #[prost(int32, tag = "1")]
    status: i32,
}

/// TensorBoard's masked CRC-32C of `bytes`.
fn masked_crc(bytes: &[u8]) -> u32 {
    let c = crc32c::crc32c(bytes);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// An event file being appended to.
pub(crate) struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl EventWriter {
    /// A new event file in `dir` (created), its first record the file version; `resumed_at`
    /// adds a `SessionLog START` at that step.
    pub(crate) fn create(dir: &Path, resumed_at: Option<usize>) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let host = std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
            .unwrap_or_else(|| "localhost".into());
        let name =
            format!("events.out.tfevents.{}.{host}.{}", wall_time() as u64, std::process::id());
        let path = dir.join(name);
        let file = File::create_new(&path).map_err(|e| Error::io(&path, e))?;
        let mut writer = EventWriter { path, out: BufWriter::new(file) };
        let version = Some("brain.Event:2".to_string());
        writer.write(&Event {
            wall_time: wall_time(),
            file_version: version,
            ..Event::default()
        })?;
        if let Some(step) = resumed_at {
            let log = Some(SessionLog { status: 1 });
            writer.write(&Event {
                wall_time: wall_time(),
                step: step as i64,
                session_log: log,
                ..Event::default()
            })?;
        }
        writer.flush()?;
        Ok(writer)
    }

    /// Appends one record.
    fn write(&mut self, event: &Event) -> Result<()> {
        let data = event.encode_to_vec();
        let len = (data.len() as u64).to_le_bytes();
        let mut record = Vec::with_capacity(data.len() + 16);
        record.extend_from_slice(&len);
        record.extend_from_slice(&masked_crc(&len).to_le_bytes());
        record.extend_from_slice(&data);
        record.extend_from_slice(&masked_crc(&data).to_le_bytes());
        self.out.write_all(&record).map_err(|e| Error::io(&self.path, e))
    }

    /// Writes what is buffered to the file.
    fn flush(&mut self) -> Result<()> {
        self.out.flush().map_err(|e| Error::io(&self.path, e))
    }

    /// The epoch's metrics as scalars at step `epoch` (see [`scalars`]) and, when given, the
    /// held-out grid (PNG bytes) as the image `samples/held-out`; flushed.
    pub(crate) fn epoch(&mut self, m: &EpochMetrics, grid: Option<&[u8]>) -> Result<()> {
        let grid = match grid {
            Some(png) => {
                let (width, height) = crate::image::png_dimensions(png, &self.path)?;
                Some((png.to_vec(), width, height))
            }
            None => None,
        };
        let mut value: Vec<SummaryValue> = scalars(m)
            .into_iter()
            .map(|(tag, v)| SummaryValue { tag, simple_value: Some(v as f32), image: None })
            .collect();
        if let Some((png, width, height)) = grid {
            value.push(SummaryValue {
                tag: "samples/held-out".into(),
                simple_value: None,
                image: Some(SummaryImage {
                    height: height as i32,
                    width: width as i32,
                    colorspace: 3,
                    encoded_image_string: png,
                }),
            });
        }
        let summary = Some(Summary { value });
        self.write(&Event {
            wall_time: m.wall_time,
            step: m.epoch as i64,
            summary,
            ..Event::default()
        })?;
        self.flush()
    }
}

/// The scalars of an epoch's metrics line, by tag: `reward/train` (mean, and `_std`),
/// `reward/held-out`, `reward_terms/<name>`, `held-out/<report rate>`, `loss/*`, `credit/*`,
/// `grad/*`, `nfe_per_sample`, `time/epoch_seconds`. The line before training has only its
/// held-out values.
pub fn scalars(m: &EpochMetrics) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    if let Some(r) = m.eval_reward {
        out.push(("reward/held-out".to_string(), r));
    }
    for (name, v) in &m.eval_report {
        out.push((format!("held-out/{name}"), *v));
    }
    if m.epoch == 0 {
        return out;
    }
    out.push(("reward/train".into(), m.reward_mean));
    out.push(("reward/train_std".into(), m.reward_std));
    for (name, v) in &m.reward_terms {
        out.push((format!("reward_terms/{name}"), *v));
    }
    let l = &m.loss;
    for (name, v) in [
        ("ratio_mean", l.ratio_mean),
        ("clip_frac_above", l.clip_frac_above),
        ("clip_frac_below", l.clip_frac_below),
        ("approx_kl", l.approx_kl),
        ("kl", l.kl),
        ("policy_loss", l.policy_loss),
    ] {
        out.push((format!("loss/{name}"), v));
    }
    let c = &m.credit;
    for (name, v) in [
        ("turning_points", c.turning_points),
        ("turning_points_positive", c.turning_points_positive),
        ("turning_points_negative", c.turning_points_negative),
        ("samples_used", c.samples_used),
    ] {
        out.push((format!("credit/{name}"), v as f64));
    }
    out.push(("grad/norm".into(), m.grad_norm));
    out.extend(m.grad_signal_sq.map(|v| ("grad/signal_sq".to_string(), v)));
    out.extend(m.grad_noise_trace.map(|v| ("grad/noise_trace".to_string(), v)));
    out.push(("optimizer_steps".into(), m.optimizer_steps as f64));
    out.push(("nfe_per_sample".into(), m.nfe_per_sample));
    out.push(("time/epoch_seconds".into(), m.seconds));
    out
}

/// One scalar read back from an event file.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalar {
    /// The step (the epoch).
    pub step: i64,
    /// The tag (`reward/held-out`, ...).
    pub tag: String,
    /// The value, as stored (f32).
    pub value: f32,
}

/// Every scalar of the event file `path`, in order; each record's length and data checksums
/// are verified and a torn or corrupt record is an error naming the file and its offset.
pub fn read_scalars(path: &Path) -> Result<Vec<Scalar>> {
    let mut bytes = Vec::new();
    File::open(path).and_then(|mut f| f.read_to_end(&mut bytes)).map_err(|e| Error::io(path, e))?;
    let mut out = Vec::new();
    let mut at = 0usize;
    let bad = |at: usize, what: &str| Error::format(path, format!("record at byte {at}: {what}"));
    while at < bytes.len() {
        let head = bytes.get(at..at + 12).ok_or_else(|| bad(at, "truncated header"))?;
        let (len, crc) = head.split_at(8);
        if masked_crc(len) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err(bad(at, "length checksum mismatch"));
        }
        let n = u64::from_le_bytes(len.try_into().expect("8 bytes"));
        let n = usize::try_from(n).map_err(|_| bad(at, "length too large"))?;
        let end = (at + 12).checked_add(n).ok_or_else(|| bad(at, "length too large"))?;
        let data = bytes.get(at + 12..end).ok_or_else(|| bad(at, "truncated data"))?;
        let crc = bytes.get(end..end + 4).ok_or_else(|| bad(at, "truncated checksum"))?;
        if masked_crc(data) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err(bad(at, "data checksum mismatch"));
        }
        let event = Event::decode(data).map_err(|e| bad(at, &e.to_string()))?;
        for v in event.summary.map(|s| s.value).unwrap_or_default() {
            if let Some(value) = v.simple_value {
                out.push(Scalar { step: event.step, tag: v.tag, value });
            }
        }
        at = end + 4;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRC-32C of "123456789" is 0xE3069283 (RFC 3720, B.4's check value); TensorBoard's mask
    /// of it worked by hand: rotate right 15 gives 0x2507C60D, plus 0xA282EAD8 is 0xC78AB0E5.
    #[test]
    fn the_checksum_is_masked_crc32c() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(masked_crc(b"123456789"), 0xC78A_B0E5);
    }

    #[test]
    fn records_read_back_and_corruption_is_named() {
        let dir = std::env::temp_dir().join(format!("tpgrpo-tb-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut w = EventWriter::create(&dir, Some(3)).unwrap();
        let m = EpochMetrics {
            epoch: 4,
            reward_mean: 0.25,
            eval_reward: Some(0.5),
            ..EpochMetrics::default()
        };
        w.epoch(&m, None).unwrap();
        let path = w.path.clone();
        drop(w);
        let read = read_scalars(&path).unwrap();
        let find = |tag: &str| read.iter().find(|s| s.tag == tag).map(|s| (s.step, s.value));
        assert_eq!(find("reward/held-out"), Some((4, 0.5)));
        assert_eq!(find("reward/train"), Some((4, 0.25)));
        assert_eq!(read.len(), scalars(&m).len());
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 10;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let err = read_scalars(&path).unwrap_err().to_string();
        assert!(err.contains("data checksum mismatch") && err.contains("record at byte"), "{err}");
        std::fs::write(&path, &bytes[..bytes.len() - 2]).unwrap();
        assert!(read_scalars(&path).unwrap_err().to_string().contains("truncated"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
