//! Redis's glob patterns (`SCAN ... MATCH`, `KEYS`): `*` any bytes, `?` one byte, `[...]`
//! a class (`^` negates, `a-z` a range either way round, `\` escapes), `\` escapes the byte
//! after it, everything else is itself. Bytes, not characters.
//!
//! The matching is the `regex` crate's (linear in the key's length, so no pattern can make
//! a scan slow the way Redis's backtracking matcher can); this only writes the pattern as
//! a byte regex.

use std::fmt::Write;

use crate::keyspace::MAX_PATTERN_BYTES;
use regex::bytes::{Regex, RegexBuilder};

/// A compiled pattern.
pub struct Pattern(Option<Regex>);

/// Why a pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// Longer than [`MAX_PATTERN_BYTES`].
    #[error("a pattern is at most {MAX_PATTERN_BYTES} bytes")]
    TooLong,
    /// The regex it makes is refused (over the regex crate's size limit).
    #[error("the pattern does not compile: {0}")]
    DoesNotCompile(String),
}

impl Pattern {
    /// Compiles `glob` (empty or `*`: every key).
    pub fn new(glob: &[u8]) -> Result<Pattern, PatternError> {
        if glob.is_empty() || glob == b"*" {
            return Ok(Pattern(None));
        }
        if glob.len() > MAX_PATTERN_BYTES {
            return Err(PatternError::TooLong);
        }
        let regex = RegexBuilder::new(&to_regex(glob))
            .unicode(false)
            .dot_matches_new_line(true)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| PatternError::DoesNotCompile(e.to_string()))?;
        Ok(Pattern(Some(regex)))
    }

    /// Whether `key` matches.
    pub fn matches(&self, key: &[u8]) -> bool {
        self.0.as_ref().is_none_or(|r| r.is_match(key))
    }
}

/// The glob as an anchored byte regex.
fn to_regex(glob: &[u8]) -> String {
    let mut out = String::from("^");
    let mut i = 0;
    while let Some(&b) = glob.get(i) {
        i += 1;
        match b {
            b'*' => out.push_str(".*"),
            b'?' => out.push('.'),
            b'[' => i = class(glob, i, &mut out),
            b'\\' if i < glob.len() => {
                byte(glob[i], &mut out);
                i += 1;
            }
            _ => byte(b, &mut out),
        }
    }
    out.push('$');
    out
}

/// A class starting at `glob[i]` (after its `[`); returns where the pattern goes on. An
/// unclosed class runs to the end of the pattern, as Redis reads it.
fn class(glob: &[u8], mut i: usize, out: &mut String) -> usize {
    let negated = glob.get(i) == Some(&b'^');
    i += usize::from(negated);
    let mut items = String::new();
    while let Some(&b) = glob.get(i) {
        if b == b']' {
            i += 1;
            break;
        }
        let (lo, next) = match b {
            b'\\' if i + 1 < glob.len() => (glob[i + 1], i + 2),
            _ => (b, i + 1),
        };
        i = next;
        if glob.get(i) == Some(&b'-') && glob.get(i + 1).is_some_and(|&c| c != b']') {
            let hi = glob[i + 1];
            i += 2;
            let (a, z) = if lo <= hi { (lo, hi) } else { (hi, lo) };
            let _ = write!(items, "\\x{a:02X}-\\x{z:02X}");
        } else {
            let _ = write!(items, "\\x{lo:02X}");
        }
    }
    match (items.is_empty(), negated) {
        (true, false) => out.push_str("[^\\x00-\\xFF]"),
        (true, true) => out.push_str("[\\x00-\\xFF]"),
        (false, false) => {
            let _ = write!(out, "[{items}]");
        }
        (false, true) => {
            let _ = write!(out, "[^{items}]");
        }
    }
    i
}

fn byte(b: u8, out: &mut String) {
    let _ = write!(out, "\\x{b:02X}");
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::Pattern;

    fn m(glob: &str, key: &str) -> bool {
        Pattern::new(glob.as_bytes()).unwrap().matches(key.as_bytes())
    }

    /// The examples of Redis's `KEYS` documentation, and its corner cases.
    #[test]
    fn matches_as_redis_does() {
        assert!(m("h?llo", "hello") && m("h?llo", "hallo") && !m("h?llo", "hllo"));
        assert!(m("h*llo", "hllo") && m("h*llo", "heeeello"));
        assert!(m("h[ae]llo", "hello") && !m("h[ae]llo", "hillo"));
        assert!(m("h[^e]llo", "hallo") && !m("h[^e]llo", "hello"));
        assert!(m("h[a-b]llo", "hbllo") && m("h[b-a]llo", "hallo") && !m("h[a-b]llo", "hcllo"));
        assert!(m("user.*", "user.1") && !m("user.*", "userX1"));
        assert!(m("a\\*b", "a*b") && !m("a\\*b", "axb"));
        assert!(m("[\\]]", "]") && m("x[ab", "xb") && !m("[]", "a") && m("[^]", "a"));
        assert!(m("*", "") && m("", "anything") && m("a*", "a\nb"));
        assert!(m("{a,b}", "{a,b}") && m("a+b", "a+b") && !m("a+b", "aab"));
        assert!(matches!(
            Pattern::new(&vec![b'a'; 2000]),
            Err(super::PatternError::TooLong)
        ));
    }

    proptest! {
        /// Any pattern compiles or is refused, and any key is matched, without a panic.
        #[test]
        fn never_panics(glob in proptest::collection::vec(any::<u8>(), 0..64), key in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(p) = Pattern::new(&glob) {
                let _ = p.matches(&key);
            }
        }
    }
}
