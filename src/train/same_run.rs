//! The start-up check of a data-parallel run whose replicas are separate processes (MPI): every
//! replica must train the same thing — settings, model, task, resumed state — or their
//! collectives would combine different runs (or wait forever, when the epochs differ).
//!
//! Each replica describes what it trains ([`RunView`]); the replicas compare a SHA-256 of
//! their descriptions, and only when one differs gather the descriptions themselves, so that
//! the error names every setting, tensor or task detail that differs and the rank it differs
//! on. At the end of a run, every replica checks that all hold the same adapters.
// Only the MPI path builds run views (the threads of one process share their settings).
#![cfg_attr(not(feature = "mpi"), allow(dead_code))]

use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;
use burn_store::ModuleSnapshot;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

use super::checkpoint::RunRecord;
use super::replica::Replica;
use super::trainer::Trainer;
use crate::error::{Error, Result};
use crate::model::Adaptable;
use crate::overrides::leaves;
use crate::sampler::TextToImage;

/// What one replica trains, as its ranks compare it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RunView {
    /// Every setting.
    pub settings: serde_json::Value,
    /// The transformer's configuration, the latent shape, the reward and the prompts.
    pub run: RunRecord,
    /// Epochs completed (non-zero after a resume).
    pub epoch: usize,
    /// Optimizer steps taken.
    pub optimizer_step: u64,
    /// Every parameter (base weights and adapters) by path, with a digest of its dtype, shape
    /// and values.
    pub tensors: Vec<(String, String)>,
}

/// The first 16 hex digits of the SHA-256 of `bytes`.
fn digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// A SHA-256 digest as eight f64 values, each one of its 32-bit words (integers, exact in f64,
/// so an all-gather carries them unchanged).
fn words(digest: &[u8]) -> Vec<f64> {
    digest.chunks(4).map(|c| c.iter().fold(0u32, |w, &b| (w << 8) | u32::from(b)) as f64).collect()
}

/// The digest of every parameter of `module`: its dtype, shape and value bytes.
pub(crate) fn tensor_digests<B, M>(module: &M) -> Result<Vec<(String, String)>>
where
    B: burn::tensor::backend::Backend,
    M: ModuleSnapshot<B>,
{
    module
        .collect(None, None, true)
        .into_iter()
        .map(|snapshot| {
            let data = snapshot.to_data().map_err(|e| Error::Device {
                what: format!("reading `{}`", snapshot.full_path()),
                message: format!("{e:?}"),
            })?;
            let head = format!("{:?} {:?}", data.dtype, data.shape);
            let mut bytes = head.into_bytes();
            bytes.extend_from_slice(data.as_bytes());
            Ok((snapshot.full_path(), digest(&bytes)))
        })
        .collect()
}

impl RunView {
    /// What `trainer` trains.
    pub(crate) fn of<B, P>(trainer: &Trainer<B, P>) -> Result<RunView>
    where
        B: AutodiffBackend,
        P: TextToImage<B::InnerBackend>,
    {
        Ok(RunView {
            settings: serde_json::to_value(trainer.config()).expect("settings serialise"),
            run: trainer.run_record(),
            epoch: trainer.epoch(),
            optimizer_step: trainer.optimizer_step(),
            tensors: tensor_digests::<B, _>(trainer.model())?,
        })
    }

    /// Every difference of `other` (on rank `rank`) from `self` (on rank 0), each naming the
    /// setting, tensor or detail and both values.
    pub(crate) fn differences(&self, other: &RunView, rank: usize) -> Vec<String> {
        let mut out = Vec::new();
        let mut differ = |what: String, lead: String, here: String| {
            if lead != here {
                out.push(format!("{what}: {lead} on rank 0, {here} on rank {rank}"));
            }
        };
        let (a, b) = (leaves(&self.settings), leaves(&other.settings));
        let (a, b): (BTreeMap<_, _>, BTreeMap<_, _>) =
            (a.into_iter().collect(), b.into_iter().collect());
        let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
        keys.sort();
        keys.dedup();
        let shown = |v: Option<&serde_json::Value>| v.map_or("absent".into(), |v| v.to_string());
        for key in keys {
            differ(format!("setting `{key}`"), shown(a.get(key)), shown(b.get(key)));
        }
        let (r, s) = (&self.run, &other.run);
        differ("transformer config".into(), r.transformer.to_string(), s.transformer.to_string());
        differ(
            "latent shape".into(),
            format!("{:?}", r.latent_shape),
            format!("{:?}", s.latent_shape),
        );
        let task = |v: &Option<String>| v.clone().unwrap_or_else(|| "none".into());
        differ("reward".into(), task(&r.reward), task(&s.reward));
        differ("prompt set (SHA-256)".into(), task(&r.prompts), task(&s.prompts));
        differ("epochs completed".into(), self.epoch.to_string(), other.epoch.to_string());
        differ(
            "optimizer steps".into(),
            self.optimizer_step.to_string(),
            other.optimizer_step.to_string(),
        );
        let (a, b): (BTreeMap<_, _>, BTreeMap<_, _>) =
            (self.tensors.iter().cloned().collect(), other.tensors.iter().cloned().collect());
        let mut tensors: Vec<&String> = a.keys().chain(b.keys()).collect();
        tensors.sort();
        tensors.dedup();
        let changed: Vec<&String> =
            tensors.into_iter().filter(|k| a.get(*k) != b.get(*k)).collect();
        if let Some(first) = changed.first() {
            let state = |m: &BTreeMap<String, String>| {
                m.get(*first).map_or("absent".to_string(), |d| format!("digest {d}"))
            };
            out.push(format!(
                "{} parameter(s) differ, first `{first}`: {} on rank 0, {} on rank {rank}",
                changed.len(),
                state(&a),
                state(&b)
            ));
        }
        out
    }
}

/// Checks that every replica trains what replica 0 trains (a collective: every replica calls
/// it); the error, the same on every replica, names the first rank that differs and each
/// difference ([`Error::RanksDiffer`]).
pub(crate) fn check_same_run<B, P>(trainer: &Trainer<B, P>, replica: &Replica) -> Result<()>
where
    B: AutodiffBackend,
    P: TextToImage<B::InnerBackend>,
{
    let view = RunView::of(trainer)?;
    let json = serde_json::to_vec(&view).expect("a run view serialises");
    let device = trainer.model().devices()[0].clone();
    let gather = |values: &[f64]| replica.all_gather::<B::InnerBackend>(values, &device);
    let digests = gather(&words(&Sha256::digest(&json)))?;
    if digests.iter().all(|d| d == &digests[0]) {
        return Ok(());
    }
    // Some replica differs: gather the descriptions (bytes as integers) to name what.
    let bytes: Vec<f64> = json.iter().map(|&b| b as f64).collect();
    let views = gather(&bytes)?
        .into_iter()
        .map(|b| serde_json::from_slice::<RunView>(&b.iter().map(|&v| v as u8).collect::<Vec<_>>()))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Replica { rank: replica.rank, message: format!("a run view: {e}") })?;
    for (rank, other) in views.iter().enumerate().skip(1) {
        let differences = views[0].differences(other, rank);
        if !differences.is_empty() {
            return Err(Error::RanksDiffer { rank, differences });
        }
    }
    Err(Error::RanksDiffer {
        rank: 0,
        differences: vec!["digests differ, descriptions agree".into()],
    })
}

/// Checks that every replica holds the same adapters as replica 0 (a collective), as they do
/// when every replica took the same optimizer steps; the error names the first rank whose
/// adapters differ.
pub(crate) fn check_same_adapters<B, P>(trainer: &Trainer<B, P>, replica: &Replica) -> Result<()>
where
    B: AutodiffBackend,
    P: TextToImage<B::InnerBackend>,
{
    let mut hash = Sha256::new();
    for (name, t) in trainer.model().lora_tensors() {
        hash.update(name.as_bytes());
        hash.update(t.into_data().as_bytes());
    }
    let device = trainer.model().devices()[0].clone();
    let all = replica.all_gather::<B::InnerBackend>(&words(&hash.finalize()), &device)?;
    match all.iter().position(|d| d != &all[0]) {
        None => Ok(()),
        Some(rank) => Err(Error::RanksDiffer {
            rank,
            differences: vec![format!(
                "its adapters after epoch {} differ from rank 0's: the replicas took different \
                 optimizer steps",
                trainer.epoch()
            )],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> RunView {
        RunView {
            settings: serde_json::json!({"seed": 1, "rollout": {"noise_level": 0.7}}),
            run: RunRecord {
                transformer: serde_json::json!({"num_layers": 2}),
                latent_shape: vec![4, 8, 8],
                reward: Some("toy-alignment".into()),
                prompts: Some("abc".into()),
            },
            epoch: 0,
            optimizer_step: 0,
            tensors: vec![("a.weight".into(), "00".into()), ("b.weight".into(), "11".into())],
        }
    }

    /// Each kind of difference is named with both values and the rank; equal views have none.
    #[test]
    fn differences_name_the_setting_the_tensor_and_the_rank() {
        assert!(view().differences(&view(), 3).is_empty());
        let mut other = view();
        other.settings["rollout"]["noise_level"] = serde_json::json!(0.9);
        other.run.reward = Some("pickscore".into());
        other.epoch = 4;
        other.tensors[1].1 = "12".into();
        let d = view().differences(&other, 3);
        assert_eq!(
            d,
            [
                "setting `rollout.noise_level`: 0.7 on rank 0, 0.9 on rank 3",
                "reward: toy-alignment on rank 0, pickscore on rank 3",
                "epochs completed: 0 on rank 0, 4 on rank 3",
                "1 parameter(s) differ, first `b.weight`: digest 11 on rank 0, digest 12 on rank 3",
            ]
        );
        let mut missing = view();
        missing.tensors.pop();
        let d = view().differences(&missing, 1);
        assert_eq!(
            d,
            ["1 parameter(s) differ, first `b.weight`: digest 11 on rank 0, absent on rank 1"]
        );
    }
}
