//! Rewards named on the command line: `KIND=TARGET[:WEIGHT]` or `NAME[:WEIGHT]`, several
//! combined as a weighted sum (flow_grpo's `reward_fn` dict).

use std::path::{Path, PathBuf};

use burn::prelude::*;

use super::{Aesthetic, ClipSimilarity, Protocol, Reward, RewardServer, ServerConfig, WeightedSum};
use crate::error::{Error, Result};

/// The kinds given a path or URL.
pub(crate) const MODEL_KINDS: &str =
    "pickscore=DIR, clipscore=DIR, aesthetic=DIR|FILE.pth, server=URL, json-server=URL";

/// One `--reward` value.
#[derive(Debug, Clone, PartialEq)]
pub struct RewardSpec {
    /// `pickscore`, `clipscore`, `aesthetic`, or a name the caller resolves (toy rewards).
    pub kind: String,
    /// The path after `=`, if any.
    pub target: Option<String>,
    /// The weight after the last `:` (1 when absent).
    pub weight: f64,
}

impl RewardSpec {
    /// Parses `KIND=TARGET[:WEIGHT]` or `NAME[:WEIGHT]`; the weight is the text after the last
    /// `:` when it is a number, except a URL's port (`server=http://host:18085` has weight 1,
    /// `server=http://host:18085:0.5` weight 0.5).
    pub fn parse(text: &str) -> Result<Self> {
        let bad = |msg: String| Error::config("reward", format!("{text:?}: {msg}"));
        // `body` split at its last `:` when that is a weight; in a URL the authority's first
        // `:` (the port) never is, and any other last `:` must be followed by a number.
        let weighted = |body: &str| -> Result<(String, f64)> {
            let Some((rest, w)) = body.rsplit_once(':') else {
                return Ok((body.to_string(), 1.0));
            };
            let url = body.find("://").map(|i| i + 3);
            if let Some(start) = url {
                let authority_end = body[start..].find('/').map_or(body.len(), |i| start + i);
                let port = body[start..authority_end].find(':').map(|i| start + i);
                if port == Some(rest.len()) || rest.len() < start {
                    return Ok((body.to_string(), 1.0));
                }
            }
            match w.trim().parse::<f64>() {
                Ok(w) if w.is_finite() => Ok((rest.to_string(), w)),
                Ok(w) => Err(bad(format!("weight {w} is not finite"))),
                Err(_) if url.is_some() => Err(bad(format!("weight {w:?} is not a number"))),
                Err(_) => Ok((body.to_string(), 1.0)),
            }
        };
        let (kind, target, weight) = match text.split_once('=') {
            Some((k, "")) => return Err(bad(format!("no path after `{k}=`"))),
            Some((k, t)) => {
                let (t, w) = weighted(t)?;
                (k.trim().to_string(), Some(t), w)
            }
            None => {
                let (k, w) = weighted(text)?;
                (k.trim().to_string(), None, w)
            }
        };
        if kind.is_empty() {
            return Err(bad("no reward name".into()));
        }
        Ok(RewardSpec { kind, target, weight })
    }

    /// Loads this reward on `device`: the model kinds here, any other name through `named`.
    pub fn load<B: Backend>(
        &self,
        device: &B::Device,
        named: &dyn Fn(&str) -> Result<Box<dyn Reward>>,
    ) -> Result<Box<dyn Reward>> {
        let path = || {
            self.target.as_deref().map(PathBuf::from).ok_or_else(|| {
                Error::config("reward", format!("`{}` needs a path: {MODEL_KINDS}", self.kind))
            })
        };
        Ok(match self.kind.as_str() {
            "pickscore" => Box::new(ClipSimilarity::<B>::pickscore(path()?, device)?),
            "clipscore" => Box::new(ClipSimilarity::<B>::clip_score(path()?, device)?),
            "aesthetic" => {
                let (mlp, clip) = aesthetic_files(&path()?)?;
                Box::new(Aesthetic::<B>::load(mlp, clip, device)?)
            }
            "server" | "json-server" => {
                let target = path()?.to_string_lossy().into_owned();
                let (url, config) = server_settings(&target)?;
                let protocol =
                    if self.kind == "server" { Protocol::Pickle } else { Protocol::Json };
                Box::new(RewardServer::new(url, protocol, config)?)
            }
            name => match &self.target {
                None => named(name)?,
                Some(_) => {
                    return Err(Error::config(
                        "reward",
                        format!("unknown reward kind `{name}` (known: {MODEL_KINDS})"),
                    ))
                }
            },
        })
    }
}

/// A server target's URL and its [`ServerConfig`]: the defaults, with the `key=value` pairs
/// (`&`-separated) of the URL's fragment applied, which no HTTP client sends
/// (`http://host:18085#timeout_secs=300&batch_size=16`); an unknown key or a bad value is
/// an error naming `reward.KEY`.
fn server_settings(target: &str) -> Result<(&str, ServerConfig)> {
    let Some((url, fragment)) = target.split_once('#') else {
        return Ok((target, ServerConfig::new()));
    };
    let updates = fragment
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(crate::overrides::parse_assignment)
        .collect::<Result<Vec<_>>>()?;
    let config = crate::overrides::apply(&ServerConfig::new(), &updates)
        .map_err(|e| Error::config("reward", format!("{target:?}: {e}")))?;
    Ok((url, config))
}

/// The aesthetic MLP file and its CLIP folder: `FILE.pth` inside the CLIP folder, or the
/// folder holding exactly one `.pth`.
fn aesthetic_files(path: &Path) -> Result<(PathBuf, PathBuf)> {
    if path.is_file() {
        let dir = path.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        return Ok((path.to_path_buf(), dir));
    }
    let entries = std::fs::read_dir(path).map_err(|e| Error::io(path, e))?;
    let pth: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "pth"))
        .collect();
    match &pth[..] {
        [one] => Ok((one.clone(), path.to_path_buf())),
        _ => Err(Error::format(
            path,
            format!(
                "must hold exactly one .pth (the aesthetic MLP) beside the CLIP model, found {}",
                pth.len()
            ),
        )),
    }
}

/// Parses and loads every `--reward` value ([`RewardSpec::parse`]); one reward of weight 1 is
/// returned as itself, several as a [`WeightedSum`]. Names appearing twice are an error
/// (their metrics would collide).
pub fn load_rewards<B: Backend>(
    specs: &[String],
    device: &B::Device,
    named: &dyn Fn(&str) -> Result<Box<dyn Reward>>,
) -> Result<Box<dyn Reward>> {
    let specs = specs.iter().map(|s| RewardSpec::parse(s)).collect::<Result<Vec<_>>>()?;
    let mut terms = Vec::new();
    for spec in &specs {
        let reward = spec.load::<B>(device, named)?;
        if terms.iter().any(|(_, r): &(f64, Box<dyn Reward>)| r.name() == reward.name()) {
            return Err(Error::config("reward", format!("`{}` is given twice", reward.name())));
        }
        terms.push((spec.weight, reward));
    }
    match terms.len() {
        0 => Err(Error::config("reward", "no reward given")),
        1 if terms[0].0 == 1.0 => Ok(terms.pop().expect("one term").1),
        _ => Ok(Box::new(WeightedSum { terms })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_with_and_without_weights() {
        let p = |s: &str| RewardSpec::parse(s).unwrap();
        let spec = |k: &str, t: Option<&str>, w| RewardSpec {
            kind: k.into(),
            target: t.map(Into::into),
            weight: w,
        };
        assert_eq!(p("pickscore=/m/PickScore_v1"), spec("pickscore", Some("/m/PickScore_v1"), 1.0));
        assert_eq!(p("aesthetic=models/clip:0.5"), spec("aesthetic", Some("models/clip"), 0.5));
        assert_eq!(p("toy-alignment"), spec("toy-alignment", None, 1.0));
        assert_eq!(p("toy-geneval:-2"), spec("toy-geneval", None, -2.0));
        assert_eq!(p("clipscore=C:/x:y"), spec("clipscore", Some("C:/x:y"), 1.0));
        let url = "http://127.0.0.1:18085";
        assert_eq!(p(&format!("server={url}")), spec("server", Some(url), 1.0));
        assert_eq!(p(&format!("server={url}:0.5")), spec("server", Some(url), 0.5));
        assert_eq!(
            p("json-server=http://h/score:2"),
            spec("json-server", Some("http://h/score"), 2.0)
        );
        assert_eq!(p("server=http://h:80/a"), spec("server", Some("http://h:80/a"), 1.0));
        for bad in ["pickscore=", "=x", ":0.5", "pickscore=x:inf", "server=http://h:1:x"] {
            assert!(RewardSpec::parse(bad).is_err(), "{bad}");
        }
    }

    /// A server's timeout and batch size come from its URL's fragment (never sent), each
    /// checked as a setting; the fragment leaves the weight and the URL alone.
    #[test]
    fn server_settings_come_from_the_url_fragment() {
        let spec = RewardSpec::parse("server=http://h:18085#timeout_secs=300&batch_size=16:0.5");
        let spec = spec.unwrap();
        assert_eq!(spec.weight, 0.5);
        let (url, config) = server_settings(spec.target.as_deref().unwrap()).unwrap();
        assert_eq!(url, "http://h:18085");
        assert_eq!(config, ServerConfig::new().with_timeout_secs(300.0).with_batch_size(16));
        assert_eq!(server_settings("http://h:1").unwrap().1, ServerConfig::new());
        let e = server_settings("http://h:1#timeout=3").unwrap_err().to_string();
        assert!(e.contains("timeout") && e.contains("batch_size"), "{e}");
        let e = server_settings("http://h:1#batch_size=many").unwrap_err().to_string();
        assert!(e.contains("batch_size") && e.contains("many"), "{e}");
    }
}
