//! Reading the small files an operator names on the command line (a token, a certificate,
//! a key): a path is untrusted input like bytes from a socket, so what is read is bounded
//! (`--auth-token-file /dev/zero` used to grow kvd to 10 GB in 15 s).

use std::io::Read;
use std::path::Path;

/// Reads `path` whole if it holds at most `max` bytes; a larger file (or an endless one,
/// such as a device) is refused naming the limit.
pub fn read_bounded(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    read_all_bounded(std::fs::File::open(path)?, max)
}

/// Reads `input` to its end if it holds at most `max` bytes (stdin, a file); more is
/// refused naming the limit.
pub fn read_all_bounded(input: impl Read, max: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    input.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("it is larger than {max} bytes: not the file meant"),
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endless_file_is_refused_after_the_bound() {
        let err = read_bounded(Path::new("/dev/zero"), 4096).unwrap_err();
        assert!(err.to_string().contains("larger than 4096 bytes"), "{err}");
        let file = kvtestkit::scratch_file("files", "small");
        std::fs::write(&file, b"small").unwrap();
        assert_eq!(read_bounded(&file, 5).unwrap(), b"small");
        assert!(read_bounded(&file, 4).is_err());
    }
}
