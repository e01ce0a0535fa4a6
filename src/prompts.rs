//! Prompt sets in flow_grpo's dataset layout: a folder with `train.txt` / `test.txt` (one
//! prompt a line: PickScore, OCR) or `train_metadata.jsonl` / `test_metadata.jsonl` (one JSON
//! object a line with a `"prompt"` string: GenEval; the whole object is the prompt's metadata).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A prompt and the metadata a reward may read (GenEval-style object lists, OCR text, ...).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Prompt {
    /// The text given to the text encoders.
    pub text: String,
    /// Per-prompt metadata (`null` when the reward needs none).
    #[serde(default)]
    pub metadata: serde_json::Value,
}

/// A dataset folder's two splits.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptSet {
    /// Training prompts.
    pub train: Vec<Prompt>,
    /// Held-out prompts.
    pub test: Vec<Prompt>,
    /// The files they were read from (training, held-out): prompt `i` is on line `i + 1`.
    pub files: [PathBuf; 2],
}

impl PromptSet {
    /// Reads `dir/{split}.txt` or `dir/{split}_metadata.jsonl` for `train` and `test`; a split
    /// with both files, or with neither, is an error naming them.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            return Err(Error::format(dir, "no such folder (expected a flow_grpo prompt set)"));
        }
        let split = |name: &str| -> Result<(Vec<Prompt>, PathBuf)> {
            let txt = dir.join(format!("{name}.txt"));
            let jsonl = dir.join(format!("{name}_metadata.jsonl"));
            match (txt.is_file(), jsonl.is_file()) {
                (true, false) => Ok((read_prompts(&txt)?, txt)),
                (false, true) => Ok((read_prompts(&jsonl)?, jsonl)),
                (true, true) => Err(Error::format(
                    dir,
                    format!("holds both {name}.txt and {name}_metadata.jsonl: keep one"),
                )),
                (false, false) => Err(Error::format(
                    dir,
                    format!("holds neither {name}.txt nor {name}_metadata.jsonl"),
                )),
            }
        };
        let ((train, train_file), (test, test_file)) = (split("train")?, split("test")?);
        Ok(PromptSet { train, test, files: [train_file, test_file] })
    }

    /// Checks every prompt with `check` (a reward's
    /// [`Reward::check_prompt`](crate::reward::Reward::check_prompt)); the first refused is an
    /// error naming its `file:line`.
    pub fn check(&self, check: &dyn Fn(&Prompt) -> Result<()>) -> Result<()> {
        for (file, prompts) in self.files.iter().zip([&self.train, &self.test]) {
            for (i, prompt) in prompts.iter().enumerate() {
                check(prompt).map_err(|e| Error::format(line_path(file, i + 1), e.to_string()))?;
            }
        }
        Ok(())
    }
}

/// The longest prompt line read, in bytes: far more than the text encoders keep (77 CLIP
/// tokens, at most 512 T5 tokens: a few kilobytes of text), far less than would cost memory
/// to tokenize (a 10 MB line used to take 3.4 GB).
pub const MAX_PROMPT_BYTES: usize = 16 << 10;

/// The largest prompt file read (GenEval's metadata files are a few hundred kilobytes).
const MAX_PROMPT_FILE_BYTES: u64 = 256 << 20;

/// The lines of `text`, each ended by LF, CRLF or a lone CR (old Mac files); a final line
/// end is optional.
fn lines(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let end = rest.find(['\n', '\r']).unwrap_or(rest.len());
        out.push(&rest[..end]);
        let skip = match &rest.as_bytes()[end..] {
            [b'\r', b'\n', ..] => 2,
            [] => 0,
            _ => 1,
        };
        rest = &rest[end + skip..];
    }
    out
}

/// Reads a prompt file: `*.jsonl` as metadata lines, anything else as one prompt a line (LF,
/// CRLF or CR line ends). A trailing line end is allowed; blank lines, lines longer than
/// [`MAX_PROMPT_BYTES`], invalid JSON, a missing or empty `"prompt"` are errors naming the
/// file and line; an empty file, or one larger than 256 MiB, is an error.
pub fn read_prompts(path: &Path) -> Result<Vec<Prompt>> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut bytes = Vec::new();
    file.take(MAX_PROMPT_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > MAX_PROMPT_FILE_BYTES {
        return Err(Error::format(path, "is larger than 256 MiB (not a prompt file?)"));
    }
    let text = String::from_utf8(bytes)
        .map_err(|e| Error::format(path, format!("is not UTF-8 text ({e})")))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let jsonl = path.extension().is_some_and(|e| e == "jsonl");
    let at = |n: usize, msg: String| Error::format(line_path(path, n), msg);
    let mut prompts = Vec::new();
    for (i, line) in lines(text).into_iter().enumerate() {
        let n = i + 1;
        if line.len() > MAX_PROMPT_BYTES {
            return Err(at(
                n,
                format!("a line of {} bytes (at most {MAX_PROMPT_BYTES})", line.len()),
            ));
        }
        if line.trim().is_empty() {
            return Err(at(n, "blank line (one prompt a line)".into()));
        }
        if !jsonl {
            prompts
                .push(Prompt { text: line.trim().to_string(), metadata: serde_json::Value::Null });
            continue;
        }
        let meta: serde_json::Value =
            serde_json::from_str(line).map_err(|e| at(n, format!("invalid JSON: {e}")))?;
        let text = match meta.get("prompt") {
            Some(serde_json::Value::String(s)) if !s.trim().is_empty() => s.clone(),
            Some(other) => {
                return Err(at(n, format!("\"prompt\" must be a non-empty string, found {other}")))
            }
            None => return Err(at(n, "no \"prompt\" field".into())),
        };
        prompts.push(Prompt { text, metadata: meta });
    }
    if prompts.is_empty() {
        return Err(Error::format(path, "holds no prompts"));
    }
    Ok(prompts)
}

/// `file:line`, as compilers name a place in a file.
fn line_path(path: &Path, line: usize) -> PathBuf {
    PathBuf::from(format!("{}:{line}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("tpgrpo-prompts-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (f, text) in files {
            std::fs::write(dir.join(f), text).unwrap();
        }
        dir
    }

    #[test]
    fn text_and_metadata_splits() {
        let geneval = r#"{"tag": "counting", "include": [{"class": "cat", "count": 2}], "prompt": "a photo of two cats"}"#;
        let dir = folder(
            "ok",
            &[
                ("train.txt", "a cat\r\n  a dog on a mat  \n"),
                ("test_metadata.jsonl", &format!("{geneval}\n")),
            ],
        );
        let set = PromptSet::load(&dir).unwrap();
        assert_eq!(
            set.train.iter().map(|p| p.text.as_str()).collect::<Vec<_>>(),
            ["a cat", "a dog on a mat"]
        );
        assert_eq!(set.test[0].text, "a photo of two cats");
        assert_eq!(set.test[0].metadata["include"][0]["count"], 2);
        assert_eq!(set.train[0].metadata, serde_json::Value::Null);
    }

    #[test]
    fn malformed_lines_name_file_and_line() {
        let cases: [(&str, &str, &str); 5] = [
            ("train.txt", "a\n\nb\n", "train.txt:2: blank line"),
            (
                "train_metadata.jsonl",
                "{\"prompt\": \"a\"}\n{oops}\n",
                "train_metadata.jsonl:2: invalid JSON",
            ),
            ("train_metadata.jsonl", "{\"tag\": 1}\n", "train_metadata.jsonl:1: no \"prompt\""),
            (
                "train_metadata.jsonl",
                "{\"prompt\": 3}\n",
                "train_metadata.jsonl:1: \"prompt\" must be",
            ),
            ("train.txt", "", "train.txt: holds no prompts"),
        ];
        for (i, (file, text, want)) in cases.into_iter().enumerate() {
            let dir = folder(&format!("bad{i}"), &[(file, text), ("test.txt", "x\n")]);
            let err = PromptSet::load(&dir).unwrap_err().to_string();
            assert!(err.contains(want), "{file} {text:?}: {err}");
        }
        let dir = folder("both", &[("train.txt", "a\n"), ("train_metadata.jsonl", "{}\n")]);
        assert!(PromptSet::load(&dir).unwrap_err().to_string().contains("keep one"));
        let dir = folder("none", &[("train.txt", "a\n")]);
        assert!(PromptSet::load(&dir).unwrap_err().to_string().contains("neither test.txt"));
    }

    /// LF, CRLF and lone CR all end lines (a CR-only file used to read as one prompt); a final
    /// line end is optional.
    #[test]
    fn every_line_end_convention_splits_lines() {
        assert_eq!(lines("a\nb\r\nc\rd"), ["a", "b", "c", "d"]);
        assert_eq!(lines("a\r\n"), ["a"]);
        assert_eq!(lines("a\r\rb"), ["a", "", "b"]);
        assert!(lines("").is_empty());
        let dir = folder("cr", &[("p.txt", "a cat\ra dog\r")]);
        let got: Vec<String> =
            read_prompts(&dir.join("p.txt")).unwrap().into_iter().map(|p| p.text).collect();
        assert_eq!(got, ["a cat", "a dog"]);
    }

    /// A line longer than the limit is refused at its `file:line` before anything else is
    /// done with it.
    #[test]
    fn overlong_lines_are_refused_naming_the_line() {
        let long = format!("a cat\n{}\n", "x".repeat(MAX_PROMPT_BYTES + 1));
        let dir = folder("long", &[("p.txt", &long)]);
        let e = read_prompts(&dir.join("p.txt")).unwrap_err().to_string();
        assert!(e.contains("p.txt:2: a line of 16385 bytes"), "{e}");
    }

    /// What a reward reads of the metadata is checked when the set is loaded, at `file:line`
    /// (a toy scene whose position names a later group used to panic after the rollouts).
    #[test]
    fn a_rewards_check_names_the_file_and_line() {
        use crate::reward::Reward;
        let good = r#"{"prompt": "a red circle", "tag": "counting", "include": [{"class": "circle", "color": "red", "count": 1}]}"#;
        let bad = r#"{"prompt": "two", "tag": "position", "include": [{"class": "circle", "color": "red", "count": 1}, {"class": "square", "color": "blue", "count": 1, "position": ["above", 5]}]}"#;
        let dir = folder(
            "check",
            &[
                ("train_metadata.jsonl", &format!("{good}\n{bad}\n")),
                ("test_metadata.jsonl", &format!("{good}\n")),
            ],
        );
        let set = PromptSet::load(&dir).unwrap();
        let toy = crate::toy::ToyScorer;
        let e = set.check(&|p| toy.check_prompt(p)).unwrap_err().to_string();
        assert!(e.contains("train_metadata.jsonl:2:") && e.contains("position"), "{e}");
        set.check(&|_| Ok(())).expect("a reward that reads no metadata accepts it");
    }
}
