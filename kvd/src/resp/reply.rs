//! Writing RESP2 replies into a connection's output buffer.

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

/// `$-1`: a missing value.
pub fn null(out: &mut Vec<u8>) {
    out.extend_from_slice(b"$-1\r\n");
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
        null(&mut out);
        array(&mut out, 2);
        assert_eq!(out, b"+OK\r\n-ERR bad  thing\r\n:-3\r\n$1\r\nv\r\n$-1\r\n*2\r\n");
    }
}
