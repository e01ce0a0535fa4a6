//! Rewards computed by another process over HTTP: flow_grpo's reward-server protocol (a
//! pickled dict of JPEG bytes and metadata, a pickled dict of scores back) and a JSON variant
//! (base64 PNG) for servers in any language. Every failure names the URL and what went wrong;
//! nothing trains on a missing score.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use burn::config::Config;
use serde_json::Value as Json;
use serde_pickle::{HashableValue, Value as Pickle};

use super::Reward;
use crate::error::Error;
use crate::image::Image;
use crate::prompts::Prompt;

/// Largest response body read (64 MiB): a reply holds a few numbers per image.
const MAX_RESPONSE_BYTES: u64 = 64 << 20;

/// How requests are sent (flow_grpo's defaults: batches of 64, 120 s timeout).
#[derive(Config, Debug, PartialEq)]
pub struct ServerConfig {
    /// Images per request.
    #[config(default = 64)]
    pub batch_size: usize,
    /// Seconds before a request is abandoned (connect, send, wait and read).
    #[config(default = 120.0)]
    pub timeout_secs: f64,
    /// Retries after an HTTP 5xx reply or a refused connection, with doubling waits.
    #[config(default = 4)]
    pub retries: u32,
    /// The first wait before a retry, in seconds.
    #[config(default = 1.0)]
    pub backoff_secs: f64,
}

/// The wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// flow_grpo: POST a pickled `{"images": [JPEG bytes], "meta_datas": [dict],
    /// "only_strict": True}`, reply a pickled dict whose `"scores"` is a list of numbers.
    Pickle,
    /// POST JSON `{"images": [base64 PNG], "prompts": [str], "metadata": [obj]}`, reply JSON
    /// `{"scores": [number]}`.
    Json,
}

/// A reward server at one URL.
pub struct RewardServer {
    url: String,
    protocol: Protocol,
    config: ServerConfig,
    agent: ureq::Agent,
    name: String,
}

impl std::fmt::Debug for RewardServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RewardServer({}, {:?})", self.url, self.protocol)
    }
}

/// The metadata a server receives for a prompt: the prompt's metadata object with `"prompt"`
/// set to its text when absent (a text-file prompt sends `{"prompt": text}`).
fn metadata(prompt: &Prompt) -> Json {
    let mut meta = match &prompt.metadata {
        Json::Object(o) => o.clone(),
        Json::Null => serde_json::Map::new(),
        other => {
            let mut m = serde_json::Map::new();
            m.insert("metadata".into(), other.clone());
            m
        }
    };
    meta.entry("prompt").or_insert_with(|| Json::String(prompt.text.clone()));
    Json::Object(meta)
}

/// A JSON value as the Python value `json.loads` would give.
fn json_to_pickle(v: &Json) -> Pickle {
    match v {
        Json::Null => Pickle::None,
        Json::Bool(b) => Pickle::Bool(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Pickle::I64(i),
            None => Pickle::F64(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Pickle::String(s.clone()),
        Json::Array(a) => Pickle::List(a.iter().map(json_to_pickle).collect()),
        Json::Object(o) => Pickle::Dict(
            o.iter().map(|(k, v)| (HashableValue::String(k.clone()), json_to_pickle(v))).collect(),
        ),
    }
}

impl RewardServer {
    /// A client for `url` (plain `http://`; TLS is not built in).
    pub fn new(url: &str, protocol: Protocol, config: ServerConfig) -> crate::Result<Self> {
        if !url.starts_with("http://") {
            return Err(Error::config(
                "reward",
                format!("server URL {url:?} must start with http:// (https is not supported)"),
            ));
        }
        if config.batch_size == 0 {
            return Err(Error::config("reward.batch_size", "must be at least 1"));
        }
        let positive = |x: f64| x.is_finite() && x > 0.0;
        let non_negative = |x: f64| x.is_finite() && x >= 0.0;
        if !positive(config.timeout_secs) || !non_negative(config.backoff_secs) {
            return Err(Error::config(
                "reward.timeout_secs",
                "timeout must be positive and backoff non-negative, both finite",
            ));
        }
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs_f64(config.timeout_secs)))
            .http_status_as_error(false)
            .max_redirects(0)
            .build()
            .into();
        let name = match protocol {
            Protocol::Pickle => "server",
            Protocol::Json => "json-server",
        };
        Ok(RewardServer { url: url.to_string(), protocol, config, agent, name: name.into() })
    }

    fn fail(&self, problem: impl std::fmt::Display) -> Error {
        Error::RewardServer { url: self.url.clone(), message: problem.to_string() }
    }

    /// The request body and its content type for one batch.
    fn request(
        &self,
        images: &[Image],
        prompts: &[Prompt],
    ) -> crate::Result<(Vec<u8>, &'static str)> {
        match self.protocol {
            Protocol::Pickle => {
                let jpegs = images
                    .iter()
                    .map(|i| i.encode(::image::ImageFormat::Jpeg).map(Pickle::Bytes))
                    .collect::<crate::Result<Vec<_>>>()?;
                let metas = prompts.iter().map(|p| json_to_pickle(&metadata(p))).collect();
                let key = |k: &str| HashableValue::String(k.into());
                let dict = BTreeMap::from([
                    (key("images"), Pickle::List(jpegs)),
                    (key("meta_datas"), Pickle::List(metas)),
                    (key("only_strict"), Pickle::Bool(true)),
                ]);
                let body = serde_pickle::value_to_vec(&Pickle::Dict(dict), Default::default())
                    .map_err(|e| self.fail(format!("cannot pickle the request: {e}")))?;
                Ok((body, "application/octet-stream"))
            }
            Protocol::Json => {
                let b64 = base64::engine::general_purpose::STANDARD;
                let pngs = images
                    .iter()
                    .map(|i| {
                        i.encode(::image::ImageFormat::Png).map(|b| Json::String(b64.encode(b)))
                    })
                    .collect::<crate::Result<Vec<_>>>()?;
                let body = serde_json::json!({
                    "images": pngs,
                    "prompts": prompts.iter().map(|p| p.text.clone()).collect::<Vec<_>>(),
                    "metadata": prompts.iter().map(metadata).collect::<Vec<_>>(),
                });
                Ok((body.to_string().into_bytes(), "application/json"))
            }
        }
    }

    /// The `"scores"` list of a reply body.
    fn scores(&self, body: &[u8]) -> crate::Result<Vec<f64>> {
        let malformed = |what: String| self.fail(format!("malformed reply: {what}"));
        let numbers: Vec<Option<f64>> = match self.protocol {
            Protocol::Pickle => {
                super::pickle::check_pickle(body).map_err(malformed)?;
                let reply = serde_pickle::value_from_slice(body, Default::default())
                    .map_err(|e| malformed(format!("not a pickle of plain Python values ({e})")))?;
                let Pickle::Dict(dict) = reply else {
                    return Err(malformed("not a dict".into()));
                };
                match dict.get(&HashableValue::String("scores".into())) {
                    Some(Pickle::List(v) | Pickle::Tuple(v)) => v
                        .iter()
                        .map(|s| match s {
                            Pickle::F64(f) => Some(*f),
                            Pickle::I64(i) => Some(*i as f64),
                            Pickle::Bool(b) => Some(f64::from(u8::from(*b))),
                            _ => None,
                        })
                        .collect(),
                    _ => return Err(malformed("no \"scores\" list".into())),
                }
            }
            Protocol::Json => {
                let reply: Json = serde_json::from_slice(body)
                    .map_err(|e| malformed(format!("not JSON ({e})")))?;
                match reply.get("scores") {
                    Some(Json::Array(v)) => v.iter().map(Json::as_f64).collect(),
                    _ => return Err(malformed("no \"scores\" list".into())),
                }
            }
        };
        numbers
            .into_iter()
            .enumerate()
            .map(|(i, s)| match s {
                Some(s) if s.is_finite() => Ok(s),
                Some(s) => Err(self.fail(format!("score {i} is {s}"))),
                None => Err(malformed(format!("score {i} is not a number"))),
            })
            .collect()
    }

    /// One POST with bounded retries on refused connections and 5xx replies (waits
    /// `backoff, 2 backoff, ..`); anything else fails at once.
    fn post(&self, body: &[u8], content_type: &str) -> crate::Result<Vec<u8>> {
        let mut wait = self.config.backoff_secs;
        let mut attempt = 0;
        loop {
            let outcome =
                self.agent.post(&self.url).header("Content-Type", content_type).send(body);
            let retryable = match outcome {
                Ok(mut reply) => {
                    let status = reply.status().as_u16();
                    let read =
                        reply.body_mut().with_config().limit(MAX_RESPONSE_BYTES).read_to_vec();
                    match (status, read) {
                        (200..=299, Ok(bytes)) => return Ok(bytes),
                        (200..=299, Err(e)) => {
                            return Err(self.fail(format!("cannot read the reply: {e}")))
                        }
                        (500..=599, _) => format!("HTTP {status}"),
                        (300..=399, _) => {
                            let to = reply.headers().get("location");
                            let to = to.and_then(|l| l.to_str().ok()).unwrap_or("nowhere");
                            let to: String = to.chars().take(200).collect();
                            return Err(self.fail(format!(
                                "HTTP {status}, redirected to {to:?}: redirects are not \
                                 followed (give the final URL)"
                            )));
                        }
                        (_, _) => return Err(self.fail(format!("HTTP {status}"))),
                    }
                }
                Err(ureq::Error::Timeout(_)) => {
                    return Err(self.fail(format!(
                        "no reply within {} s (timeout_secs)",
                        self.config.timeout_secs
                    )))
                }
                Err(ureq::Error::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    "connection refused (is the server running?)".to_string()
                }
                Err(e) => return Err(self.fail(e)),
            };
            if attempt == self.config.retries {
                return Err(
                    self.fail(format!("{retryable}, after {} retries", self.config.retries))
                );
            }
            attempt += 1;
            std::thread::sleep(Duration::from_secs_f64(wait));
            wait *= 2.0;
        }
    }
}

impl Reward for RewardServer {
    fn name(&self) -> &str {
        &self.name
    }

    /// The protocol and the URL.
    fn identity(&self) -> String {
        format!("{}={:?}:{}", self.name, self.protocol, self.url)
    }

    fn score(&self, images: &[Image], prompts: &[Prompt]) -> crate::Result<Vec<f64>> {
        let mut out = Vec::with_capacity(images.len());
        let size = self.config.batch_size;
        for (images, prompts) in images.chunks(size).zip(prompts.chunks(size)) {
            let (body, content_type) = self.request(images, prompts)?;
            let scores = self.scores(&self.post(&body, content_type)?)?;
            if scores.len() != images.len() {
                return Err(self.fail(format!(
                    "{} scores for {} images",
                    scores.len(),
                    images.len()
                )));
            }
            out.extend(scores);
        }
        Ok(out)
    }
}
