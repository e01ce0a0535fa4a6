//! `RewardServer` against a real server process (`examples/reward_server.rs`, built by
//! `cargo test`): both protocols score as the same reward does locally, 5xx replies are
//! retried, and every fault stops scoring with an error naming the URL and the problem.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use tpgrpo::image::Image;
use tpgrpo::prompts::Prompt;
use tpgrpo::reward::{score_checked, Protocol, Reward, RewardServer, ServerConfig};
use tpgrpo::toy::{self, Scene, ToyScorer};
use tpgrpo::Error;

/// A server process, killed when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(args: &[&str]) -> Server {
    let mut child = Command::new(common::example_binary("reward_server"))
        .args(["--port", "0"])
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url =
        line.trim().strip_prefix("listening on ").expect("the server's first line").to_string();
    Server { child, url }
}

/// Five toy scenes drawn as images, with their prompts (scores spread over [0, 1]).
fn batch() -> (Vec<Image>, Vec<Prompt>) {
    let prompts: Vec<Prompt> =
        toy::prompts(toy::Split::Train).into_iter().step_by(37).take(5).collect();
    let images = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| toy::render(&Scene::from_prompt(p).unwrap(), i as u64))
        .collect();
    (images, prompts)
}

fn quick() -> ServerConfig {
    ServerConfig::new().with_timeout_secs(2.0).with_retries(1).with_backoff_secs(0.05)
}

#[test]
fn json_protocol_scores_as_the_local_reward() {
    let server = start(&[]);
    let client = RewardServer::new(&server.url, Protocol::Json, quick()).unwrap();
    let (images, prompts) = batch();
    let local = score_checked(&ToyScorer, &images, &prompts).unwrap();
    assert!(local.iter().any(|&s| s > 0.0), "{local:?}");
    assert_eq!(score_checked(&client, &images, &prompts).unwrap(), local);
}

/// The pickle protocol sends JPEGs (lossy), so the reference is the local reward on the same
/// JPEG round trip.
#[test]
fn pickle_protocol_scores_as_the_local_reward_on_jpegs() {
    let server = start(&[]);
    let client =
        RewardServer::new(&server.url, Protocol::Pickle, quick().with_batch_size(2)).unwrap();
    let (images, prompts) = batch();
    let jpeg: Vec<Image> = images
        .iter()
        .map(|im| Image::decode(&im.encode(image::ImageFormat::Jpeg).unwrap()).unwrap())
        .collect();
    let local = score_checked(&ToyScorer, &jpeg, &prompts).unwrap();
    assert_eq!(client.score(&images, &prompts).unwrap(), local);
}

#[test]
fn server_errors_are_retried() {
    let server = start(&["--fail-first", "2"]);
    let config = quick().with_retries(3);
    let client = RewardServer::new(&server.url, Protocol::Json, config).unwrap();
    let (images, prompts) = batch();
    assert_eq!(client.score(&images, &prompts).unwrap().len(), images.len());
}

#[test]
fn every_fault_is_an_error_naming_the_url() {
    let (images, prompts) = batch();
    let faults: [(&str, Protocol, &str); 6] = [
        ("slow", Protocol::Json, "no reply within 2 s"),
        ("wrong-count", Protocol::Pickle, "4 scores for 5 images"),
        ("malformed", Protocol::Pickle, "malformed reply: not a pickle"),
        ("malformed", Protocol::Json, "malformed reply: not JSON"),
        ("nan", Protocol::Pickle, "score 0 is NaN"),
        ("error-500", Protocol::Json, "HTTP 500, after 1 retries"),
    ];
    for (fault, protocol, want) in faults {
        let server = start(&["--fault", fault]);
        let client = RewardServer::new(&server.url, protocol, quick()).unwrap();
        let err = score_checked(&client, &images, &prompts).unwrap_err().to_string();
        assert!(err.contains(&server.url) && err.contains(want), "{fault} {protocol:?}: {err}");
    }
    // Down: a port nothing listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let client = RewardServer::new(&url, Protocol::Pickle, quick()).unwrap();
    let err = client.score(&images, &prompts).unwrap_err();
    assert!(matches!(&err, Error::RewardServer { url: u, .. } if *u == url), "{err:?}");
    let err = err.to_string();
    assert!(err.starts_with("reward server ") && err.contains("connection refused"), "{err}");
    // Not http.
    let err = RewardServer::new("https://x", Protocol::Json, quick()).unwrap_err().to_string();
    assert!(err.contains("must start with http://"), "{err}");
}

/// A server whose every reply is `status`, `headers` and `body` (tiny_http, on loopback).
fn replying(status: u16, headers: &[(&str, &str)], body: Vec<u8>) -> String {
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    let url = format!("http://{}", server.server_addr());
    let headers: Vec<tiny_http::Header> =
        headers.iter().map(|(k, v)| tiny_http::Header::from_bytes(*k, *v).unwrap()).collect();
    std::thread::spawn(move || {
        for request in server.incoming_requests() {
            let mut reply = tiny_http::Response::from_data(body.clone()).with_status_code(status);
            for h in &headers {
                reply.add_header(h.clone());
            }
            let _ = request.respond(reply);
        }
    });
    url
}

/// Replies are untrusted (issue 39, item 3): a redirect is an error naming both URLs (it used
/// to be followed as a GET, without the images, and the other host's scores accepted); a
/// pickle nested 5000 deep (which overflowed the unpickler's stack, aborting the trainer) and
/// a 200-byte pickle that unpickles into 10^8 values are refused as malformed replies.
#[test]
fn redirects_and_hostile_pickles_are_refused_naming_the_url() {
    let (images, prompts) = batch();
    let url = replying(302, &[("Location", "http://elsewhere.example/scores")], vec![]);
    let client = RewardServer::new(&url, Protocol::Pickle, quick()).unwrap();
    let err = client.score(&images, &prompts).unwrap_err().to_string();
    assert!(
        err.contains(&url) && err.contains("HTTP 302") && err.contains("elsewhere.example"),
        "{err}"
    );
    let mut deep = b"\x80\x02".to_vec();
    deep.extend(std::iter::repeat_n(b']', 5000));
    deep.extend(std::iter::repeat_n(b'a', 4999));
    deep.push(b'.');
    let mut laughs = b"\x80\x02](".to_vec();
    laughs.extend(std::iter::repeat_n(*b"K\x01", 10).flatten());
    laughs.extend(b"eq\x00");
    for level in 1..8u8 {
        laughs.extend(b"](");
        laughs.extend((0..10).flat_map(|_| [b'h', level - 1]));
        laughs.extend([b'e', b'q', level]);
    }
    laughs.push(b'.');
    for (body, want) in [(deep, "nested more than"), (laughs, "once references are copied")] {
        let url = replying(200, &[], body);
        let client = RewardServer::new(&url, Protocol::Pickle, quick()).unwrap();
        let err = client.score(&images, &prompts).unwrap_err().to_string();
        assert!(
            err.contains(&url) && err.contains("malformed reply") && err.contains(want),
            "{err}"
        );
    }
}
