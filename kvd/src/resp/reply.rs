//! Writing RESP replies into a connection's output buffer: RESP2, and RESP3 (after
//! `HELLO 3`) where its types differ: a null and a map.

/// The protocol a connection speaks (RESP2 until `HELLO 3`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Proto {
    #[default]
    Resp2,
    Resp3,
}

impl Proto {
    /// Its number, as `HELLO` shows it.
    pub fn number(self) -> i64 {
        match self {
            Proto::Resp2 => 2,
            Proto::Resp3 => 3,
        }
    }
}

/// `+OK`-style simple string (must not hold CR or LF).
pub fn simple(out: &mut Vec<u8>, s: &str) {
    out.push(b'+');
    out.extend_from_slice(s.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// `-ERR ...` error; CR and LF in the message become spaces (they would end the reply).
pub fn error(out: &mut Vec<u8>, message: &str) {
    out.push(b'-');
    out.extend(message.bytes().map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
    out.extend_from_slice(b"\r\n");
}

/// `:N` integer.
pub fn integer(out: &mut Vec<u8>, n: i64) {
    out.push(b':');
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// `$len` bulk string.
pub fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'$');
    out.extend_from_slice(itoa::Buffer::new().format(bytes.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// A missing value: `$-1` in RESP2, `_` in RESP3.
pub fn null(out: &mut Vec<u8>, proto: Proto) {
    out.extend_from_slice(match proto {
        Proto::Resp2 => b"$-1\r\n",
        Proto::Resp3 => b"_\r\n",
    });
}

/// No array (EXEC of a transaction a watched key aborted): `*-1` in RESP2, `_` in RESP3.
pub fn null_array(out: &mut Vec<u8>, proto: Proto) {
    out.extend_from_slice(match proto {
        Proto::Resp2 => b"*-1\r\n",
        Proto::Resp3 => b"_\r\n",
    });
}

/// A map of the `n` key-value pairs that follow: `%n` in RESP3, a flat array of `2n` in
/// RESP2 (as Redis answers `HELLO` and `CONFIG GET`).
pub fn map(out: &mut Vec<u8>, n: usize, proto: Proto) {
    match proto {
        Proto::Resp2 => array(out, 2 * n),
        Proto::Resp3 => {
            out.push(b'%');
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// `*n`: an array of the `n` replies that follow.
pub fn array(out: &mut Vec<u8>, n: usize) {
    out.push(b'*');
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_resp2() {
        let mut out = Vec::new();
        simple(&mut out, "OK");
        error(&mut out, "ERR bad\r\nthing");
        integer(&mut out, -3);
        bulk(&mut out, b"v");
        null(&mut out, Proto::Resp2);
        array(&mut out, 2);
        map(&mut out, 1, Proto::Resp2);
        assert_eq!(out, b"+OK\r\n-ERR bad  thing\r\n:-3\r\n$1\r\nv\r\n$-1\r\n*2\r\n*2\r\n");
    }

    #[test]
    fn resp3_has_its_own_null_and_map() {
        let mut out = Vec::new();
        null(&mut out, Proto::Resp3);
        map(&mut out, 2, Proto::Resp3);
        assert_eq!(out, b"_\r\n%2\r\n");
    }
}
