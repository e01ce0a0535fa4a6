//! A reward server in flow_grpo's protocol (pickle) and the JSON variant, serving one of the
//! toy rewards: the reference peer for `reward::RewardServer` and its tests, and a template
//! for serving another scorer.
//!
//! `cargo run --example reward_server -- --port 18085 [--reward toy-geneval]` prints
//! `listening on http://127.0.0.1:PORT` once it accepts requests (`--port 0`: any free port).
//! A request with `Content-Type: application/json` is answered in JSON, any other in pickle.
//! `--fault` makes it misbehave for tests: `slow` (sleeps 5 s), `wrong-count`, `malformed`,
//! `nan`, `error-500` (every reply); `--fail-first N` answers the first N requests with 500.

use std::io::{Cursor, Write};
use std::sync::atomic::{AtomicUsize, Ordering};

use base64::Engine;
use clap::Parser;
use serde_json::Value as Json;
use serde_pickle::{HashableValue, Value as Pickle};
use tpgrpo::image::Image;
use tpgrpo::prompts::Prompt;
use tpgrpo::reward::{score_checked, Reward};

/// Command-line options.
#[derive(Parser, Debug)]
struct Args {
    /// Port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 18085)]
    port: u16,
    /// `toy-geneval` (the rule-based scorer) or `toy-alignment`.
    #[arg(long, default_value = "toy-geneval")]
    reward: String,
    /// `none`, `slow`, `wrong-count`, `malformed`, `nan` or `error-500`.
    #[arg(long, default_value = "none")]
    fault: String,
    /// Answer the first N requests with HTTP 500.
    #[arg(long, default_value_t = 0)]
    fail_first: usize,
}

/// Decodes one image of a request (its declared size checked first), counting its pixels
/// against `budget`: all of a request's images together may hold as many pixels as one image
/// may (`tpgrpo::image::max_image_pixels`), so a request never decodes without bound.
fn decode(bytes: &[u8], budget: &mut u64) -> Result<Image, String> {
    let image = Image::decode(bytes).map_err(|e| e.to_string())?;
    let pixels = (image.width * image.height) as u64;
    *budget = budget.checked_sub(pixels).ok_or("the request's images hold too many pixels")?;
    Ok(image)
}

fn pickle_to_json(v: &Pickle) -> Json {
    match v {
        Pickle::None => Json::Null,
        Pickle::Bool(b) => Json::Bool(*b),
        Pickle::I64(i) => Json::from(*i),
        Pickle::F64(f) => Json::from(*f),
        Pickle::String(s) => Json::String(s.clone()),
        Pickle::List(a) | Pickle::Tuple(a) => Json::Array(a.iter().map(pickle_to_json).collect()),
        Pickle::Dict(d) => Json::Object(
            d.iter()
                .filter_map(|(k, v)| match k {
                    HashableValue::String(k) => Some((k.clone(), pickle_to_json(v))),
                    _ => None,
                })
                .collect(),
        ),
        other => Json::String(format!("{other:?}")),
    }
}

/// Prompts from metadata objects (their `"prompt"` is the text).
fn prompts(metadata: Vec<Json>) -> Vec<Prompt> {
    metadata
        .into_iter()
        .map(|m| Prompt { text: m["prompt"].as_str().unwrap_or_default().to_string(), metadata: m })
        .collect()
}

/// The images and prompts of a request body.
fn parse(body: &[u8], json: bool) -> Result<(Vec<Image>, Vec<Prompt>), String> {
    let mut budget = tpgrpo::image::max_image_pixels();
    if json {
        let req: Json = serde_json::from_slice(body).map_err(|e| e.to_string())?;
        let b64 = base64::engine::general_purpose::STANDARD;
        let images = req["images"]
            .as_array()
            .ok_or("no images")?
            .iter()
            .map(|s| {
                let bytes =
                    b64.decode(s.as_str().unwrap_or_default()).map_err(|e| e.to_string())?;
                decode(&bytes, &mut budget)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let meta = req["metadata"].as_array().ok_or("no metadata")?.clone();
        return Ok((images, prompts(meta)));
    }
    // The same bounds as the trainer's client: no recursion or copying without limit.
    tpgrpo::reward::check_pickle(body)?;
    let req =
        serde_pickle::value_from_slice(body, Default::default()).map_err(|e| e.to_string())?;
    let Pickle::Dict(d) = req else { return Err("not a dict".into()) };
    let get = |k: &str| d.get(&HashableValue::String(k.into()));
    let Some(Pickle::List(jpegs)) = get("images") else { return Err("no images".into()) };
    let Some(Pickle::List(metas)) = get("meta_datas") else { return Err("no meta_datas".into()) };
    let images = jpegs
        .iter()
        .map(|j| match j {
            Pickle::Bytes(b) => decode(b, &mut budget),
            _ => Err("an image is not bytes".into()),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((images, prompts(metas.iter().map(pickle_to_json).collect())))
}

/// The reply body with `scores`, in the request's protocol.
fn reply(scores: &[f64], json: bool) -> Vec<u8> {
    if json {
        return serde_json::json!({ "scores": scores }).to_string().into_bytes();
    }
    let list = Pickle::List(scores.iter().map(|&s| Pickle::F64(s)).collect());
    let key = |k: &str| HashableValue::String(k.into());
    let dict = Pickle::Dict([(key("scores"), list.clone()), (key("rewards"), list)].into());
    serde_pickle::value_to_vec(&dict, Default::default()).expect("plain values pickle")
}

fn main() {
    let args = Args::parse();
    let reward: Box<dyn Reward> = match tpgrpo::toy::reward(&args.reward) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let server = match tiny_http::Server::http(("127.0.0.1", args.port)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot listen on 127.0.0.1:{}: {e}", args.port);
            std::process::exit(1);
        }
    };
    let port = server.server_addr().to_ip().map_or(args.port, |a| a.port());
    println!("listening on http://127.0.0.1:{port}");
    std::io::stdout().flush().ok();
    let served = AtomicUsize::new(0);
    for mut request in server.incoming_requests() {
        let n = served.fetch_add(1, Ordering::SeqCst);
        let json = request.headers().iter().any(|h| {
            h.field.equiv("Content-Type") && h.value.as_str().starts_with("application/json")
        });
        let mut body = Vec::new();
        let _ = request.as_reader().read_to_end(&mut body);
        let respond = |status: u16, bytes: Vec<u8>| {
            tiny_http::Response::new(
                status.into(),
                vec![],
                Cursor::new(bytes.clone()),
                Some(bytes.len()),
                None,
            )
        };
        if n < args.fail_first || args.fault == "error-500" {
            let _ = request.respond(respond(500, b"busy".to_vec()));
            continue;
        }
        let (images, prompts) = match parse(&body, json) {
            Ok(x) => x,
            Err(e) => {
                let _ = request.respond(respond(400, e.into_bytes()));
                continue;
            }
        };
        let mut scores = match score_checked(reward.as_ref(), &images, &prompts) {
            Ok(s) => s,
            Err(e) => {
                let _ = request.respond(respond(500, e.to_string().into_bytes()));
                continue;
            }
        };
        let body = match args.fault.as_str() {
            "slow" => {
                std::thread::sleep(std::time::Duration::from_secs(5));
                reply(&scores, json)
            }
            "wrong-count" => {
                scores.pop();
                reply(&scores, json)
            }
            "malformed" => b"\x80\x04not a pickle {".to_vec(),
            // JSON has no NaN; Python's `json.dumps` writes this non-standard token.
            "nan" if json => br#"{"scores": [NaN]}"#.to_vec(),
            "nan" => {
                scores[0] = f64::NAN;
                reply(&scores, json)
            }
            _ => reply(&scores, json),
        };
        let _ = request.respond(respond(200, body));
    }
}
