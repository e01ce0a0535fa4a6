//! Settings overrides: `key.path = value` updates of any serialisable settings struct (a
//! JSON file's leaves or command-line assignments), each checked as it is applied so that an
//! unknown key or a value of the wrong type is an error naming the key.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};

/// `settings` with every `(dotted key, value)` of `updates` applied in order. A key must
/// name an existing field (the error lists the fields known at the level where it failed) and
/// the settings must still deserialise after each update. Range checks are the caller's.
pub(crate) fn apply<T: Serialize + DeserializeOwned>(
    settings: &T,
    updates: &[(String, Value)],
) -> Result<T> {
    let mut value = serde_json::to_value(settings).expect("settings serialise to JSON");
    for (key, new) in updates {
        set_path(&mut value, key, new.clone())?;
        if let Err(e) = serde_json::from_value::<T>(value.clone()) {
            return Err(Error::config(key, format!("invalid value {new}: {e}")));
        }
    }
    Ok(serde_json::from_value(value).expect("checked key by key"))
}

/// `settings` with every field `saved` holds taken from it, the others kept: a settings file
/// written by an older version (without the fields added since) reads with their defaults. An
/// unset optional group of `settings` (`null`) takes `saved`'s group whole; a key `settings`
/// does not have is an error naming it.
pub(crate) fn fill<T: Serialize + DeserializeOwned>(settings: &T, saved: &Value) -> Result<T> {
    fn overlay(base: &mut Value, top: &Value, path: &str) -> Result<()> {
        match (base.as_object_mut(), top.as_object()) {
            (Some(fields), Some(tops)) => {
                for (key, value) in tops {
                    let here = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                    let slot = fields.get_mut(key).ok_or_else(|| {
                        Error::config(here.clone(), "unknown option (written by another version?)")
                    })?;
                    overlay(slot, value, &here)?;
                }
                Ok(())
            }
            _ => {
                *base = top.clone();
                Ok(())
            }
        }
    }
    let mut value = serde_json::to_value(settings).expect("settings serialise to JSON");
    overlay(&mut value, saved, "")?;
    serde_json::from_value(value).map_err(|e| Error::config("settings", e.to_string()))
}

/// `key.path=value` as an update: `value` is JSON, or else a bare string.
pub(crate) fn parse_assignment(text: &str) -> Result<(String, Value)> {
    let (key, raw) = text
        .split_once('=')
        .ok_or_else(|| Error::config(text, "an override is written key.path=value"))?;
    let value = serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()));
    Ok((key.trim().to_string(), value))
}

/// Every leaf of a JSON object as `(dotted key, value)` (an empty object is a leaf).
pub(crate) fn leaves(value: &Value) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    collect_leaves("", value, &mut out);
    out
}

fn collect_leaves(prefix: &str, value: &Value, out: &mut Vec<(String, Value)>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                collect_leaves(&path, v, out);
            }
        }
        _ => out.push((prefix.to_string(), value.clone())),
    }
}

/// Sets `path` (dotted) in `value` to `new`.
fn set_path(value: &mut Value, path: &str, new: Value) -> Result<()> {
    let parts: Vec<&str> = path.split('.').collect();
    let mut node = value;
    for (i, part) in parts.iter().enumerate() {
        let here = parts[..=i].join(".");
        let object = node
            .as_object_mut()
            .ok_or_else(|| Error::config(parts[..i].join("."), "is not a group of options"))?;
        if !object.contains_key(*part) {
            let known: Vec<&str> = object.keys().map(String::as_str).collect();
            return Err(Error::config(
                here,
                format!("unknown option (known here: {})", known.join(", ")),
            ));
        }
        if i + 1 == parts.len() {
            object.insert(part.to_string(), new);
            return Ok(());
        }
        node = object.get_mut(*part).expect("checked above");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Inner {
        rate: f64,
    }

    #[derive(Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Settings {
        steps: usize,
        inner: Inner,
    }

    #[derive(Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Grown {
        steps: usize,
        inner: Inner,
        added: usize,
        optional: Option<Inner>,
    }

    #[test]
    fn fill_takes_saved_fields_and_keeps_the_rest() {
        let defaults = Grown { steps: 1, inner: Inner { rate: 0.5 }, added: 7, optional: None };
        // Written before `added` existed, with the optional group set.
        let saved =
            serde_json::json!({"steps": 3, "inner": {"rate": 2.0}, "optional": {"rate": 9.0}});
        let filled = fill(&defaults, &saved).unwrap();
        let expected = Grown {
            steps: 3,
            inner: Inner { rate: 2.0 },
            added: 7,
            optional: Some(Inner { rate: 9.0 }),
        };
        assert_eq!(filled, expected);
        let e = fill(&defaults, &serde_json::json!({"inner": {"rates": 1.0}})).unwrap_err();
        assert!(e.to_string().contains("inner.rates"), "{e}");
    }

    #[test]
    fn updates_apply_in_order_and_errors_name_the_key() {
        let base = Settings { steps: 1, inner: Inner { rate: 0.5 } };
        let file = serde_json::json!({"steps": 3, "inner": {"rate": 0.25}});
        let mut updates = leaves(&file);
        updates.push(parse_assignment("steps=7").unwrap());
        let out = apply(&base, &updates).unwrap();
        assert_eq!(out, Settings { steps: 7, inner: Inner { rate: 0.25 } });

        let err = |text: &str| apply(&base, &[parse_assignment(text).unwrap()]).unwrap_err();
        let unknown = err("inner.speed=2").to_string();
        assert!(
            unknown.contains("inner.speed") && unknown.contains("known here: rate"),
            "{unknown}"
        );
        assert!(err("steps=fast").to_string().contains("`steps`"));
        assert!(err("steps.x=1").to_string().contains("`steps`: is not a group"));
        assert!(parse_assignment("steps").is_err());
    }
}
