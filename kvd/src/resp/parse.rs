//! Reading RESP commands out of a connection's read buffer, in place.
//!
//! A command is either a RESP array of bulk strings (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`, what
//! every client library sends) or an inline command (`GET k\r\n`, what telnet and
//! redis-benchmark's `PING_INLINE` send). The parser returns the arguments as byte ranges of
//! the buffer: nothing is copied or allocated per command. Every length is checked before it
//! is used, and a bulk string longer than the node's frame limit is refused before the
//! connection waits for (or buffers) its bytes.
//!
//! Hand-written rather than taken from `redis-protocol`: it is small, on the hot path, must
//! accept inline commands and must enforce our size limits; the tests check it against
//! `redis-protocol`'s decoder.

use std::ops::Range;

/// Most arguments in one command (as Redis's multibulk limit).
pub const MAX_ARGS: usize = 1024 * 1024;
/// Longest inline command line (as Redis's `PROTO_INLINE_MAX_SIZE`).
pub const MAX_INLINE: usize = 64 * 1024;

/// Why the bytes are not a RESP command. The connection answers `-ERR Protocol error: ...`
/// and closes, as Redis does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// An array header that is not a number, or too large.
    #[error("invalid multibulk length")]
    ArrayLength,
    /// A bulk header that is not a number, negative, or over the limit.
    #[error("invalid bulk length")]
    BulkLength,
    /// An array element that is not a bulk string.
    #[error("expected '$', got '{0}'")]
    ExpectedBulk(char),
    /// A bulk string not followed by CRLF.
    #[error("bulk string not terminated by CRLF")]
    Unterminated,
    /// An inline command line without an end within the limit.
    #[error("too big inline request")]
    InlineTooLong,
    /// An inline command with an unbalanced quote.
    #[error("unbalanced quotes in request")]
    Quotes,
}

/// The arguments of one parsed command, as ranges of the read buffer.
pub struct Args<'a> {
    buf: &'a [u8],
    ranges: &'a [Range<usize>],
}

impl<'a> Args<'a> {
    /// The arguments at `ranges` of `buf` (as [`parse`] left them).
    pub fn new(buf: &'a [u8], ranges: &'a [Range<usize>]) -> Args<'a> {
        Args { buf, ranges }
    }

    /// Argument `i` (0 is the command name), empty past the end.
    pub fn get(&self, i: usize) -> &'a [u8] {
        self.ranges
            .get(i)
            .and_then(|r| self.buf.get(r.clone()))
            .unwrap_or_default()
    }

    /// How many arguments, the name included.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether there is none (not even a name).
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// A copy of the command (its bytes and the ranges of its arguments in them), to run
    /// later (a command queued in MULTI).
    pub fn to_owned(&self) -> (Vec<u8>, Vec<Range<usize>>) {
        (self.buf.to_vec(), self.ranges.to_vec())
    }

    /// Arguments `from..`.
    pub fn rest(&self, from: usize) -> impl Iterator<Item = &'a [u8]> + '_ {
        (from..self.len()).map(|i| self.get(i))
    }
}

/// What [`parse`] found at the start of the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A whole command of `consumed` bytes; its arguments are in `args` (may be none: an
    /// empty line or `*0`, which the caller skips).
    Command {
        /// Bytes the command took.
        consumed: usize,
    },
    /// Not all of it has arrived yet.
    Incomplete,
}

/// Parses one command at the start of `buf`, putting its arguments' ranges (relative to
/// `buf`) into `args` (cleared first). `max_bulk` bounds one argument's length.
pub fn parse(buf: &[u8], max_bulk: usize, args: &mut Vec<Range<usize>>) -> Result<Parsed, ProtocolError> {
    args.clear();
    match buf.first() {
        None => Ok(Parsed::Incomplete),
        Some(b'*') => parse_array(buf, max_bulk, args),
        Some(_) => parse_inline(buf, args),
    }
}

/// The line starting at `from`, without its CRLF, and where the next one starts.
fn line(buf: &[u8], from: usize) -> Option<(Range<usize>, usize)> {
    let rest = buf.get(from..)?;
    let nl = rest.iter().position(|&b| b == b'\n')?;
    let end = if nl > 0 && rest[nl - 1] == b'\r' { nl - 1 } else { nl };
    Some((from..from + end, from + nl + 1))
}

/// A decimal integer, as RESP headers carry them (an optional minus, digits only).
fn number(bytes: &[u8]) -> Option<i64> {
    let (negative, digits) = match bytes.split_first() {
        Some((b'-', d)) => (true, d),
        _ => (false, bytes),
    };
    if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0'));
    Some(if negative { -n } else { n })
}

fn parse_array(buf: &[u8], max_bulk: usize, args: &mut Vec<Range<usize>>) -> Result<Parsed, ProtocolError> {
    let Some((header, mut at)) = line(buf, 0) else {
        return incomplete_header(buf, ProtocolError::ArrayLength);
    };
    let count = number(&buf[header.start + 1..header.end]).ok_or(ProtocolError::ArrayLength)?;
    if count <= 0 {
        // `*0` and `*-1`: nothing to run.
        return Ok(Parsed::Command { consumed: at });
    }
    if count as usize > MAX_ARGS {
        return Err(ProtocolError::ArrayLength);
    }
    for _ in 0..count {
        match buf.get(at) {
            None => return Ok(Parsed::Incomplete),
            Some(b'$') => {}
            Some(&other) => return Err(ProtocolError::ExpectedBulk(char::from(other))),
        }
        let Some((bulk_header, start)) = line(buf, at) else {
            return incomplete_header(&buf[at..], ProtocolError::BulkLength);
        };
        let len = number(&buf[bulk_header.start + 1..bulk_header.end]).ok_or(ProtocolError::BulkLength)?;
        if len < 0 || len as usize > max_bulk {
            return Err(ProtocolError::BulkLength);
        }
        let end = start + len as usize;
        match buf.get(end..end + 2) {
            None => return Ok(Parsed::Incomplete),
            Some(b"\r\n") => {}
            Some(_) => return Err(ProtocolError::Unterminated),
        }
        args.push(start..end);
        at = end + 2;
    }
    Ok(Parsed::Command { consumed: at })
}

/// A header line not yet ended: fine while it could still be a short header, refused once
/// it is longer than any valid one (so a peer cannot make us buffer an endless header).
fn incomplete_header(buf: &[u8], error: ProtocolError) -> Result<Parsed, ProtocolError> {
    if buf.len() > 32 {
        Err(error)
    } else {
        Ok(Parsed::Incomplete)
    }
}

/// An inline command: arguments separated by spaces or tabs, optionally in double quotes
/// (without escapes inside; Redis's own escapes are rarely typed by hand).
fn parse_inline(buf: &[u8], args: &mut Vec<Range<usize>>) -> Result<Parsed, ProtocolError> {
    let Some((text, next)) = line(buf, 0) else {
        return if buf.len() > MAX_INLINE {
            Err(ProtocolError::InlineTooLong)
        } else {
            Ok(Parsed::Incomplete)
        };
    };
    if text.len() > MAX_INLINE {
        return Err(ProtocolError::InlineTooLong);
    }
    let mut i = text.start;
    while i < text.end {
        match buf[i] {
            b' ' | b'\t' => i += 1,
            b'"' => {
                let close = buf[i + 1..text.end]
                    .iter()
                    .position(|&b| b == b'"')
                    .ok_or(ProtocolError::Quotes)?;
                args.push(i + 1..i + 1 + close);
                i += close + 2;
            }
            _ => {
                let len = buf[i..text.end]
                    .iter()
                    .position(|&b| b == b' ' || b == b'\t')
                    .unwrap_or(text.end - i);
                args.push(i..i + len);
                i += len;
            }
        }
    }
    Ok(Parsed::Command { consumed: next })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A whole command's arguments and the bytes it took.
    type Words = Option<(Vec<Vec<u8>>, usize)>;

    fn words(buf: &[u8]) -> Result<Words, ProtocolError> {
        let mut args = Vec::new();
        Ok(match parse(buf, 1 << 20, &mut args)? {
            Parsed::Incomplete => None,
            Parsed::Command { consumed } => Some((args.iter().map(|r| buf[r.clone()].to_vec()).collect(), consumed)),
        })
    }

    fn encode(args: &[Vec<u8>]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    #[test]
    fn arrays_and_inline_commands() {
        let (args, used) = words(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nrest").unwrap().unwrap();
        assert_eq!(args, vec![b"GET".to_vec(), b"k".to_vec()]);
        assert_eq!(used, 20);
        let (args, used) = words(b"SET k \"a b\"\r\n").unwrap().unwrap();
        assert_eq!(args, vec![b"SET".to_vec(), b"k".to_vec(), b"a b".to_vec()]);
        assert_eq!(used, 13);
        assert_eq!(words(b"PING\n").unwrap().unwrap().0, vec![b"PING".to_vec()]);
        assert_eq!(words(b"\r\n").unwrap().unwrap(), (vec![], 2));
        assert_eq!(words(b"*0\r\n").unwrap().unwrap(), (vec![], 4));
        assert_eq!(words(b"*2\r\n$3\r\nGET\r\n$1\r\n").unwrap(), None);
        assert_eq!(words(b"GET k").unwrap(), None);
    }

    #[test]
    fn bad_headers_and_lengths_are_refused_before_buffering() {
        let mut args = Vec::new();
        assert_eq!(parse(b"*x\r\n", 100, &mut args), Err(ProtocolError::ArrayLength));
        assert_eq!(parse(b"*99999999\r\n", 100, &mut args), Err(ProtocolError::ArrayLength));
        assert_eq!(parse(b"*1\r\n$101\r\n", 100, &mut args), Err(ProtocolError::BulkLength));
        assert_eq!(parse(b"*1\r\n$-1\r\n", 100, &mut args), Err(ProtocolError::BulkLength));
        assert_eq!(
            parse(b"*1\r\n:1\r\n", 100, &mut args),
            Err(ProtocolError::ExpectedBulk(':'))
        );
        assert_eq!(
            parse(b"*1\r\n$1\r\nab\r\n", 100, &mut args),
            Err(ProtocolError::Unterminated)
        );
        assert_eq!(parse(b"SET \"k\r\n", 100, &mut args), Err(ProtocolError::Quotes));
        assert_eq!(parse(&[b'*'; 40], 100, &mut args), Err(ProtocolError::ArrayLength));
        assert_eq!(
            parse(&vec![b'a'; MAX_INLINE + 1], 100, &mut args),
            Err(ProtocolError::InlineTooLong)
        );
    }

    proptest! {
        /// Any command round trips, and every prefix of it is incomplete (never an error or
        /// a shorter command).
        #[test]
        fn commands_round_trip_and_prefixes_wait(args in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..6)) {
            let bytes = encode(&args);
            let (back, used) = words(&bytes).unwrap().unwrap();
            prop_assert_eq!(back, args);
            prop_assert_eq!(used, bytes.len());
            for cut in 0..bytes.len() {
                prop_assert_eq!(words(&bytes[..cut]).unwrap(), None);
            }
        }

        /// Mutated streams never panic, and whatever parses lies within the buffer.
        #[test]
        fn mutations_never_panic(args in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..20), 1..4),
                                 flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
            let mut bytes = encode(&args);
            for (at, b) in flips {
                let i = at.index(bytes.len());
                bytes[i] = b;
            }
            let mut out = Vec::new();
            if let Ok(Parsed::Command { consumed }) = parse(&bytes, 64, &mut out) {
                prop_assert!(consumed <= bytes.len());
                for r in &out {
                    prop_assert!(r.end <= consumed);
                }
            }
        }

        /// The same answers as an independent decoder (`redis-protocol`) on valid streams.
        #[test]
        fn agrees_with_redis_protocol(args in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..30), 1..5)) {
            use redis_protocol::resp2::decode::decode;
            use redis_protocol::resp2::types::OwnedFrame;
            let bytes = encode(&args);
            let (frame, used) = decode(&bytes).unwrap().unwrap();
            let OwnedFrame::Array(items) = frame else { panic!("not an array") };
            let theirs: Vec<Vec<u8>> = items
                .into_iter()
                .map(|f| match f {
                    OwnedFrame::BulkString(b) => b,
                    other => panic!("{other:?}"),
                })
                .collect();
            let (ours, our_used) = words(&bytes).unwrap().unwrap();
            prop_assert_eq!(ours, theirs);
            prop_assert_eq!(our_used, used);
        }
    }
}
