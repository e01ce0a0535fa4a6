//! Text tokenizers (SD3's encoders, CLIP rewards) through the `tokenizers` crate, padded and
//! truncated to a fixed length as `StableDiffusion3Pipeline` calls them (`padding="max_length",
//! truncation=True`).
//!
//! A folder with `tokenizer.json` is read as is (T5). The CLIP folders SD3 ships hold
//! `vocab.json` + `merges.txt` only; the CLIP pipeline is then built as transformers'
//! `CLIPTokenizer` builds it: NFC, whitespace runs to one space, lower case; CLIP's split
//! regex and byte-level pre-tokenisation; BPE with `</w>` word ends; `<|startoftext|>` ...
//! `<|endoftext|>` around every sequence.

use std::collections::BTreeMap;
use std::path::Path;

use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{Lowercase, Replace, Sequence as Normalizers, NFC};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizers;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::roberta::RobertaProcessing;
use tokenizers::{
    AddedToken, PaddingParams, PaddingStrategy, SplitDelimiterBehavior, Tokenizer, TruncationParams,
};

use crate::error::{Error, Result};

/// CLIP's pre-tokenisation pattern (words, digits, punctuation runs, the two specials).
const CLIP_SPLIT: &str =
    r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+";
/// CLIP's begin-of-text token.
pub(crate) const CLIP_BOS: &str = "<|startoftext|>";
/// CLIP's end-of-text token.
pub(crate) const CLIP_EOS: &str = "<|endoftext|>";

/// A tokenizer producing sequences of exactly `length` ids.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    length: usize,
    folder: std::path::PathBuf,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TextTokenizer({}, length {})", self.folder.display(), self.length)
    }
}

/// The special tokens (`bos_token`, `eos_token`, `unk_token`, `pad_token`) of a tokenizer
/// folder, each from `tokenizer_config.json`, else `special_tokens_map.json` (a string or
/// `{"content": ...}`); each file is read once.
fn special_tokens(dir: &Path) -> Result<BTreeMap<&'static str, String>> {
    let mut files = Vec::new();
    for file in ["tokenizer_config.json", "special_tokens_map.json"] {
        let path = dir.join(file);
        if !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::format(&path, format!("invalid JSON: {e}")))?;
        files.push(json);
    }
    let mut found = BTreeMap::new();
    for name in ["bos_token", "eos_token", "unk_token", "pad_token"] {
        let token = files.iter().find_map(|json| match &json[name] {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
            _ => None,
        });
        if let Some(t) = token {
            found.insert(name, t);
        }
    }
    Ok(found)
}

fn tok_err(path: &Path, what: &str, e: impl std::fmt::Display) -> Error {
    Error::format(path, format!("{what}: {e}"))
}

/// The CLIP tokenizer pipeline over `vocab.json` + `merges.txt`.
fn clip_from_vocab(dir: &Path) -> Result<Tokenizer> {
    let (vocab, merges) = (dir.join("vocab.json"), dir.join("merges.txt"));
    for f in [&vocab, &merges] {
        if !f.is_file() {
            return Err(Error::format(
                dir,
                "holds neither tokenizer.json nor vocab.json + merges.txt",
            ));
        }
    }
    let bpe = BPE::builder()
        .files(vocab.to_string_lossy().into(), merges.to_string_lossy().into())
        .continuing_subword_prefix(String::new())
        .end_of_word_suffix("</w>".into())
        .unk_token(CLIP_EOS.into())
        .build()
        .map_err(|e| tok_err(dir, "cannot read the BPE vocabulary", e))?;
    let mut tok = Tokenizer::new(bpe);
    let spaces =
        Replace::new(tokenizers::normalizers::replace::ReplacePattern::Regex(r"\s+".into()), " ")
            .map_err(|e| tok_err(dir, "normalizer", e))?;
    tok.with_normalizer(Some(Normalizers::new(vec![NFC.into(), spaces.into(), Lowercase.into()])));
    let split =
        Split::new(SplitPattern::Regex(CLIP_SPLIT.into()), SplitDelimiterBehavior::Removed, true)
            .map_err(|e| tok_err(dir, "pre-tokenizer", e))?;
    tok.with_pre_tokenizer(Some(PreTokenizers::new(vec![
        split.into(),
        ByteLevel::default().add_prefix_space(false).into(),
    ])));
    let id = |t: &str| {
        tok.token_to_id(t)
            .ok_or_else(|| Error::format(dir.join("vocab.json"), format!("has no {t} token")))
    };
    let processor =
        RobertaProcessing::new((CLIP_EOS.into(), id(CLIP_EOS)?), (CLIP_BOS.into(), id(CLIP_BOS)?))
            .trim_offsets(false)
            .add_prefix_space(false);
    tok.with_post_processor(Some(processor));
    Ok(tok)
}

impl TextTokenizer {
    /// Opens a tokenizer folder (`tokenizer.json`, or CLIP's `vocab.json` + `merges.txt`) and
    /// fixes the output length: shorter sequences are padded with the folder's `pad_token`,
    /// longer ones truncated keeping the special tokens.
    pub fn open(dir: impl AsRef<Path>, length: usize) -> Result<Self> {
        let dir = dir.as_ref();
        let json = dir.join("tokenizer.json");
        let mut inner = if json.is_file() {
            Tokenizer::from_file(&json).map_err(|e| tok_err(&json, "cannot read tokenizer", e))?
        } else {
            clip_from_vocab(dir)?
        };
        // transformers registers the special tokens as added tokens, so they match as whole
        // units inside text (SD3's CLIP-G pads with "!", which then never merges).
        let specials = special_tokens(dir)?;
        let added: Vec<AddedToken> =
            specials.values().map(|t| AddedToken::from(t.clone(), true)).collect();
        inner.add_special_tokens(&added);
        let pad = specials.get("pad_token").cloned().ok_or_else(|| {
            Error::format(dir, "no pad_token in tokenizer_config.json or special_tokens_map.json")
        })?;
        let pad_id = inner.token_to_id(&pad).ok_or_else(|| {
            Error::format(dir, format!("pad_token {pad:?} is not in the vocabulary"))
        })?;
        inner
            .with_truncation(Some(TruncationParams { max_length: length, ..Default::default() }))
            .map_err(|e| tok_err(dir, "truncation", e))?;
        inner.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::Fixed(length),
            pad_id,
            pad_token: pad,
            ..Default::default()
        }));
        Ok(TextTokenizer { inner, length, folder: dir.to_path_buf() })
    }

    /// The fixed sequence length.
    pub fn length(&self) -> usize {
        self.length
    }

    /// Token ids of each text, special tokens added, exactly [`Self::length`] each.
    pub fn encode(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>> {
        texts
            .iter()
            .map(|t| {
                let enc = self
                    .inner
                    .encode(*t, true)
                    .map_err(|e| tok_err(&self.folder, &format!("cannot tokenise {t:?}"), e))?;
                Ok(enc.get_ids().to_vec())
            })
            .collect()
    }
}
