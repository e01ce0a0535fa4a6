//! Bounds on pickled reward-server messages, checked before they are unpickled: a reply is
//! untrusted input, and a pickle a few kilobytes long can nest deeper than the unpickler's
//! recursion survives, or reference memoised containers so often that unpickling it copies
//! gigabytes (each memo `GET` of a container materialises a full copy of it).
//!
//! [`check_pickle`] walks the opcodes as the pickle machine would, keeping for every object
//! only its children, then measures the value the unpickler would build: its nesting depth,
//! and its size counting every reference as a copy. It executes nothing.

use std::collections::HashMap;

/// The deepest nesting accepted (a reward reply nests 3 levels: dict, list, number).
pub const MAX_PICKLE_DEPTH: usize = 100;

/// The most values a pickle may materialise, references counted as copies (a batch of a few
/// thousand scores and their metadata is well below).
pub const MAX_PICKLE_VALUES: usize = 1 << 20;

/// `Ok` when the pickle in `body` is at most [`MAX_PICKLE_DEPTH`] deep and materialises at most
/// [`MAX_PICKLE_VALUES`] values; else what it exceeds (or why it cannot be read).
pub fn check_pickle(body: &[u8]) -> Result<(), String> {
    let objects = walk(body).map_err(|e| format!("not a pickle ({e})"))?;
    measure(&objects)
}

/// An item of the pickle machine's stack: an object (index into the arena) or a mark.
#[derive(Clone, Copy)]
enum Item {
    Object(usize),
    Mark,
}

/// The pickle machine's objects, each as the list of the objects it contains.
fn walk(body: &[u8]) -> Result<Vec<Vec<usize>>, String> {
    let mut objects: Vec<Vec<usize>> = Vec::new();
    let mut stack: Vec<Item> = Vec::new();
    let mut memo: HashMap<u64, usize> = HashMap::new();
    let mut at = 0usize;
    let take = |at: &mut usize, n: usize| -> Result<&[u8], String> {
        let end = at.checked_add(n).filter(|&e| e <= body.len()).ok_or("truncated pickle")?;
        let bytes = &body[*at..end];
        *at = end;
        Ok(bytes)
    };
    let le = |b: &[u8]| b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | u64::from(x));
    let line = |at: &mut usize| -> Result<&[u8], String> {
        let rest = &body[*at..];
        let n = rest.iter().position(|&b| b == b'\n').ok_or("truncated pickle")?;
        *at += n + 1;
        Ok(&rest[..n])
    };
    macro_rules! new {
        ($children:expr) => {{
            if objects.len() >= MAX_PICKLE_VALUES {
                return Err(format!("more than {MAX_PICKLE_VALUES} values"));
            }
            objects.push($children);
            stack.push(Item::Object(objects.len() - 1));
        }};
    }
    let pop = |stack: &mut Vec<Item>| match stack.pop() {
        Some(Item::Object(o)) => Ok(o),
        _ => Err("stack underflow".to_string()),
    };
    let pop_mark = |stack: &mut Vec<Item>| -> Result<Vec<usize>, String> {
        let mark = stack.iter().rposition(|i| matches!(i, Item::Mark)).ok_or("no mark")?;
        let items = stack.split_off(mark + 1);
        stack.pop();
        Ok(items
            .into_iter()
            .filter_map(|i| if let Item::Object(o) = i { Some(o) } else { None })
            .collect())
    };
    let top = |stack: &[Item]| match stack.last() {
        Some(Item::Object(o)) => Ok(*o),
        _ => Err("stack underflow".to_string()),
    };
    loop {
        let op = *take(&mut at, 1)?.first().expect("one byte");
        match op {
            b'.' => return Ok(objects),
            0x80 => drop(take(&mut at, 1)?),
            0x95 => drop(take(&mut at, 8)?),
            b'(' => stack.push(Item::Mark),
            b'0' => drop(pop(&mut stack)?),
            b'1' => drop(pop_mark(&mut stack)?),
            b'2' => stack.push(Item::Object(top(&stack)?)),
            // Scalars, with their arguments skipped.
            b'N' | 0x88 | 0x89 => new!(vec![]),
            // BININT1, BININT2, BININT, BINFLOAT: 1, 2, 4 and 8 argument bytes.
            b'K' | b'M' | b'J' | b'G' => {
                let width = match op {
                    b'K' => 1,
                    b'M' => 2,
                    b'J' => 4,
                    _ => 8,
                };
                take(&mut at, width)?;
                new!(vec![])
            }
            b'F' | b'I' | b'L' | b'S' | b'V' => {
                line(&mut at)?;
                new!(vec![])
            }
            b'c' => {
                line(&mut at)?;
                line(&mut at)?;
                new!(vec![])
            }
            0x8a | b'U' | b'C' | 0x8c => {
                let n = le(take(&mut at, 1)?) as usize;
                take(&mut at, n)?;
                new!(vec![])
            }
            0x8b | b'T' | b'X' | b'B' => {
                let n = le(take(&mut at, 4)?) as usize;
                take(&mut at, n)?;
                new!(vec![])
            }
            0x8d | 0x8e | 0x96 => {
                let n = usize::try_from(le(take(&mut at, 8)?)).map_err(|_| "truncated pickle")?;
                take(&mut at, n)?;
                new!(vec![])
            }
            // Containers.
            b']' | b'}' | b')' | 0x8f => new!(vec![]),
            b'l' | b't' | b'd' | 0x91 => {
                let items = pop_mark(&mut stack)?;
                new!(items)
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let mut items = (0..n).map(|_| pop(&mut stack)).collect::<Result<Vec<_>, _>>()?;
                items.reverse();
                new!(items)
            }
            b'a' => {
                let item = pop(&mut stack)?;
                objects[top(&stack)?].push(item);
            }
            b's' => {
                let (v, k) = (pop(&mut stack)?, pop(&mut stack)?);
                objects[top(&stack)?].extend([k, v]);
            }
            b'e' | b'u' | 0x90 | b'b' => {
                let items = if op == b'b' { vec![pop(&mut stack)?] } else { pop_mark(&mut stack)? };
                objects[top(&stack)?].extend(items);
            }
            // Calls (refused by the unpickler for anything but plain values; measured anyway).
            b'R' | 0x81 | 0x93 => {
                let (b, a) = (pop(&mut stack)?, pop(&mut stack)?);
                new!(vec![a, b])
            }
            0x92 => {
                let items = (0..3).map(|_| pop(&mut stack)).collect::<Result<Vec<_>, _>>()?;
                new!(items)
            }
            // Memo.
            b'p' => {
                let key = std::str::from_utf8(line(&mut at)?).ok().and_then(|s| s.parse().ok());
                memo.insert(key.ok_or("bad PUT")?, top(&stack)?);
            }
            b'q' => {
                let k = le(take(&mut at, 1)?);
                memo.insert(k, top(&stack)?);
            }
            b'r' => {
                let k = le(take(&mut at, 4)?);
                memo.insert(k, top(&stack)?);
            }
            0x94 => {
                let k = memo.len() as u64;
                memo.insert(k, top(&stack)?);
            }
            b'g' | b'h' | b'j' => {
                let key = match op {
                    b'g' => std::str::from_utf8(line(&mut at)?).ok().and_then(|s| s.parse().ok()),
                    b'h' => Some(le(take(&mut at, 1)?)),
                    _ => Some(le(take(&mut at, 4)?)),
                };
                let o =
                    key.and_then(|k| memo.get(&k).copied()).ok_or("a memo reference to nothing")?;
                stack.push(Item::Object(o));
            }
            other => return Err(format!("opcode 0x{other:02x} is not read")),
        }
    }
}

/// The depth and size of the value rooted at the last object, references counted as copies;
/// an error when it refers to itself, nests deeper than [`MAX_PICKLE_DEPTH`] or has more than
/// [`MAX_PICKLE_VALUES`] values.
fn measure(objects: &[Vec<usize>]) -> Result<(), String> {
    // Objects only contain objects made before them or memoised containers; a container that
    // (through references) contains itself is a cycle, which the unpickler cannot copy out.
    const NEW: u8 = 0;
    const OPEN: u8 = 1;
    const DONE: u8 = 2;
    let mut state = vec![NEW; objects.len()];
    let mut depth = vec![0usize; objects.len()];
    let mut size = vec![0usize; objects.len()];
    for root in 0..objects.len() {
        if state[root] == DONE {
            continue;
        }
        let mut path: Vec<(usize, usize)> = vec![(root, 0)];
        state[root] = OPEN;
        while let Some(&mut (node, ref mut next)) = path.last_mut() {
            if let Some(&child) = objects[node].get(*next) {
                *next += 1;
                match state[child] {
                    OPEN => return Err("a container that contains itself".into()),
                    NEW => {
                        state[child] = OPEN;
                        path.push((child, 0));
                    }
                    _ => {}
                }
                continue;
            }
            let children = &objects[node];
            let d = 1 + children.iter().map(|&c| depth[c]).max().unwrap_or(0);
            let s = children.iter().try_fold(1usize, |acc, &c| acc.checked_add(size[c]));
            let s = s.filter(|&s| s <= MAX_PICKLE_VALUES);
            let Some(s) = s else {
                return Err(format!(
                    "more than {MAX_PICKLE_VALUES} values once references are copied"
                ));
            };
            if d > MAX_PICKLE_DEPTH {
                return Err(format!("nested more than {MAX_PICKLE_DEPTH} levels deep"));
            }
            (depth[node], size[node], state[node]) = (d, s, DONE);
            path.pop();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_pickle::{HashableValue, Value};

    /// A reply as flow_grpo's servers send it (protocol 3, as `pickle.dumps` writes by
    /// default in Python 3.7) and one with a shared list (a `BINGET`) pass.
    #[test]
    fn ordinary_replies_pass() {
        let scores = Value::List((0..4096).map(|i| Value::F64(f64::from(i) / 4096.0)).collect());
        let dict =
            Value::Dict([(HashableValue::String("scores".into()), scores)].into_iter().collect());
        let body = serde_pickle::value_to_vec(&dict, Default::default()).unwrap();
        check_pickle(&body).expect("a reply of 4096 scores");
        // {"a": L, "b": L} for one list L = [1.0]: `(` `}` ... with L memoised and fetched.
        let shared = b"\x80\x03}q\x00(X\x01\x00\x00\x00aq\x01]q\x02G?\xf0\x00\x00\x00\x00\x00\x00aX\x01\x00\x00\x00bq\x03h\x02u.";
        check_pickle(shared).expect("a shared list");
        assert!(serde_pickle::value_from_slice(shared, Default::default()).is_ok());
    }

    /// Lists nested 5000 deep (a few kilobytes; the unpickler overflows its stack on such
    /// input) are refused by depth; 100 levels pass.
    #[test]
    fn deep_nesting_is_refused() {
        let nested = |n: usize| {
            let mut b = b"\x80\x02".to_vec();
            b.extend(std::iter::repeat_n(b']', n));
            b.extend(std::iter::repeat_n(b'a', n - 1));
            b.push(b'.');
            b
        };
        check_pickle(&nested(MAX_PICKLE_DEPTH)).expect("at the limit");
        let e = check_pickle(&nested(5000)).unwrap_err();
        assert!(e.contains("nested more than 100 levels"), "{e}");
    }

    /// Eight levels of lists of ten references to the level below (about 100 bytes) would
    /// unpickle into 10^8 values: refused by size. A list that contains itself is refused too.
    #[test]
    fn memo_amplification_and_cycles_are_refused() {
        let mut b = b"\x80\x02](".to_vec();
        b.extend(std::iter::repeat_n(*b"K\x01", 10).flatten());
        b.extend(b"eq\x00");
        for level in 1..8u8 {
            b.extend(b"](");
            for _ in 0..10 {
                b.extend([b'h', level - 1]);
            }
            b.extend([b'e', b'q', level]);
        }
        b.push(b'.');
        assert!(b.len() < 300);
        let e = check_pickle(&b).unwrap_err();
        assert!(e.contains("once references are copied"), "{e}");
        let e = check_pickle(b"\x80\x02]q\x00h\x00a.").unwrap_err();
        assert!(e.contains("contains itself"), "{e}");
    }

    /// Truncated input and opcodes outside the pickle protocols are errors, not panics.
    #[test]
    fn malformed_pickles_are_errors() {
        for bad in [&b""[..], b"\x80", b"X\xff\xff\xff\xff", b"a.", b"h\x05.", b"\xff."] {
            assert!(check_pickle(bad).is_err(), "{bad:?}");
        }
    }
}
