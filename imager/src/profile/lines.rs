//! Lines of keys, and messages that quote no more than an excerpt.
//!
//! serde_yaml keeps no positions once a profile is deserialised, so the
//! line of a key that fails a check after parsing ([`super::Profile`]'s
//! validation) is found by parsing the (already bounded) text once more
//! with a probe that walks the key path and stops with an error at the key:
//! serde_yaml attaches the position of the node where an error arises.

use crate::secret::{EXCERPT_CHARS, looks_like_key_material};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// The marker of the probe's own error.
const FOUND: &str = "profile-key-found";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Key(String),
    Index(usize),
}

/// `kernel.cmdline[3]` → `kernel`, `cmdline`, `3`.
fn steps(path: &str) -> Vec<Step> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let mut it = part.split('[');
        if let Some(k) = it.next().filter(|k| !k.is_empty()) {
            out.push(Step::Key(k.to_string()));
        }
        for idx in it {
            if let Ok(i) = idx.trim_end_matches(']').parse() {
                out.push(Step::Index(i));
            }
        }
    }
    out
}

/// The line of the key path `path` (`kernel.cmdline[3]`, `disk.size`) in
/// `text`: the line of the key (or of the list item), else of its nearest
/// enclosing key that is written, else `None`.
pub fn line_of(text: &str, path: &str) -> Option<usize> {
    let steps = steps(path);
    (1..=steps.len())
        .rev()
        .find_map(|n| probe(text, &steps[..n]))
}

fn probe(text: &str, steps: &[Step]) -> Option<usize> {
    let de = serde_yaml::Deserializer::from_str(text);
    match (Probe { steps }).deserialize(de) {
        Err(e) if e.to_string().contains(FOUND) => e.location().map(|l| l.line()),
        _ => None,
    }
}

struct Probe<'a> {
    steps: &'a [Step],
}

impl<'de> DeserializeSeed<'de> for Probe<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Probe<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((Step::Key(want), rest)) = self.steps.split_first() else {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            return Ok(());
        };
        let target = rest.is_empty().then_some(want.as_str());
        while let Some(key) = map.next_key_seed(Key { target })? {
            if key == *want {
                return map.next_value_seed(Probe { steps: rest });
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some((Step::Index(want), rest)) = self.steps.split_first() else {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(());
        };
        for _ in 0..*want {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Ok(());
            }
        }
        if rest.is_empty() {
            seq.next_element_seed(Found)?;
        } else {
            seq.next_element_seed(Probe { steps: rest })?;
        }
        Ok(())
    }
    // Scalars: the path goes no further.
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

/// A mapping key; the probe's error when it is the target.
struct Key<'a> {
    target: Option<&'a str>,
}

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        if self.target == Some(v) {
            return Err(E::custom(FOUND));
        }
        Ok(v.to_string())
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_unit<E: de::Error>(self) -> Result<String, E> {
        Ok(String::new())
    }
}

/// A list item that is the target: fails with the probe's error wherever
/// it stands.
struct Found;

impl<'de> DeserializeSeed<'de> for Found {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Found {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(FOUND))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(FOUND))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
}

/// A parser's message made safe to print: every quoted part (`` `…` `` or
/// `"…"`, where serde quotes values and keys) cut to an excerpt and hidden
/// when it looks like key material, every other long word cut too, control
/// characters escaped.
pub fn sanitise(msg: &str) -> String {
    let out = sanitise_parts(msg);
    // Whatever the parts, the whole stays short.
    if out.chars().count() > MAX_MESSAGE {
        let cut: String = out.chars().take(MAX_MESSAGE).collect();
        return format!("{cut}… (message cut)");
    }
    out
}

/// The longest message [`sanitise`] returns, in characters.
const MAX_MESSAGE: usize = 600;

fn sanitise_parts(msg: &str) -> String {
    // serde's "unknown field `NAME`, expected …": NAME is the input's and
    // may itself hold backquotes, so it runs to serde's own closing words.
    for pre in ["unknown field `", "unknown variant `"] {
        if let Some(i) = msg.find(pre) {
            let after = &msg[i + pre.len()..];
            if let Some(end) = after
                .rfind("`, expected")
                .or_else(|| after.rfind("`, there are no"))
            {
                return format!(
                    "{}{pre}{}`{}",
                    plain(&msg[..i]),
                    shorten(&after[..end]),
                    sanitise_parts(&after[end + 1..])
                );
            }
        }
    }
    let mut out = String::new();
    let mut rest = msg;
    while let Some(start) = rest.find(['`', '"']) {
        let q = rest[start..].chars().next().unwrap_or('"');
        out.push_str(&plain(&rest[..start]));
        let body = &rest[start + 1..];
        let end = closing(body, q);
        match end {
            Some(end) => {
                out.push(q);
                out.push_str(&shorten(&body[..end]));
                out.push(q);
                rest = &body[end + 1..];
            }
            None => {
                out.push(q);
                out.push_str(&shorten(body));
                rest = "";
            }
        }
    }
    out.push_str(&plain(rest));
    out
}

/// The end of a quoted part; `"…"` is Rust-escaped (serde's `{:?}`).
fn closing(body: &str, q: char) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match c {
            '\\' if q == '"' && !escaped => escaped = true,
            c if c == q && !escaped => return Some(i),
            _ => escaped = false,
        }
    }
    None
}

fn shorten(s: &str) -> String {
    let n = s.chars().count();
    if looks_like_key_material(s) {
        return format!("<{n} characters, not shown>");
    }
    let mut out = escape(&s.chars().take(EXCERPT_CHARS).collect::<String>());
    if n > EXCERPT_CHARS {
        out.push_str(&format!("… ({n} characters)"));
    }
    out
}

/// Text outside quotes: long words cut, control characters escaped.
fn plain(s: &str) -> String {
    s.split(' ')
        .map(|w| {
            if w.chars().count() > 2 * EXCERPT_CHARS || looks_like_key_material(w) {
                shorten(w)
            } else {
                escape(w)
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn escape(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}
