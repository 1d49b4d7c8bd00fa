//! A file written once, front to back, past the page cache (`O_DIRECT`) where the
//! filesystem allows it: snapshot files.
//!
//! A snapshot is the whole store (150 MB for a million 128-byte records). Written through
//! the page cache, the kernel copies every byte into fresh pages first; on a host with a
//! fraction of a core that copy was a third of a follower's CPU under YCSB-A (PERFORMANCE.md,
//! "Snapshots past the page cache"). With `O_DIRECT` the disk reads the bytes from our own
//! buffer. Such writes need block-aligned memory, offsets and lengths, so whole blocks go
//! direct and the file's last partial block is written with `O_DIRECT` turned off. A
//! filesystem that refuses `O_DIRECT` (tmpfs) gets ordinary buffered writes; so does the
//! rest of a file whose direct write is refused midway. Durability is the caller's fsync,
//! as before: `O_DIRECT` alone promises nothing about the disk's cache.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use aligned_vec::{AVec, ConstAlign};
use rustix::fs::OFlags;

/// Alignment and length unit of direct writes (the largest logical block size in use).
const BLOCK: usize = 4096;
/// Bytes gathered before a write: large writes keep the disk streaming.
const BUFFER: usize = 1 << 20;

/// How the file is being written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `O_DIRECT`: whole aligned blocks only.
    Direct,
    /// Through the page cache.
    Buffered,
}

/// Sequential writer of one new file; see the module docs.
pub struct DirectWriter {
    file: File,
    buf: AVec<u8, ConstAlign<BLOCK>>,
    mode: Mode,
}

impl DirectWriter {
    /// Creates (or truncates) `path`, direct if the filesystem allows.
    pub fn create(path: &Path) -> io::Result<DirectWriter> {
        let mut open = OpenOptions::new();
        open.write(true).create(true).truncate(true);
        let (file, mode) = match open.clone().custom_flags(OFlags::DIRECT.bits() as i32).open(path) {
            Ok(file) => (file, Mode::Direct),
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
                (open.open(path)?, Mode::Buffered)
            }
            Err(e) => return Err(e),
        };
        Ok(DirectWriter {
            file,
            buf: AVec::with_capacity(BLOCK, BUFFER),
            mode,
        })
    }

    /// Whether whole blocks still go past the page cache.
    #[cfg(test)]
    fn is_direct(&self) -> bool {
        self.mode == Mode::Direct
    }

    /// Writes the whole buffer when it is full.
    fn drain_full(&mut self) -> io::Result<()> {
        if self.buf.len() == BUFFER {
            write_out(&mut self.file, &mut self.mode, &self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }

    /// Writes what is left (the partial block past the page cache's way) and returns the
    /// file, not yet fsynced.
    pub fn finish(mut self) -> io::Result<File> {
        let whole = self.buf.len() / BLOCK * BLOCK;
        write_out(&mut self.file, &mut self.mode, &self.buf[..whole])?;
        if self.mode == Mode::Direct && whole < self.buf.len() {
            go_buffered(&self.file, &mut self.mode)?;
        }
        write_out(&mut self.file, &mut self.mode, &self.buf[whole..])?;
        Ok(self.file)
    }
}

impl Write for DirectWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let n = bytes.len().min(BUFFER - self.buf.len());
        self.buf.extend_from_slice(&bytes[..n]);
        self.drain_full()?;
        Ok(n)
    }

    /// Nothing: a partial block can only be written at the end (`finish`).
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes all of `bytes`; a direct write refused midway (a short write left the offset
/// unaligned, or the filesystem changed its mind) carries on buffered.
fn write_out(file: &mut File, mode: &mut Mode, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match file.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = bytes.get(n..).unwrap_or_default(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if *mode == Mode::Direct && e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
                go_buffered(file, mode)?
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Turns `O_DIRECT` off for the rest of the file.
fn go_buffered(file: &File, mode: &mut Mode) -> io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(file)?;
    rustix::fs::fcntl_setfl(file, flags - OFlags::DIRECT)?;
    *mode = Mode::Buffered;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length around the block and buffer sizes reads back byte for byte, direct or not.
    #[test]
    fn what_is_written_reads_back_at_every_length() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..(3 * BUFFER + 3 * BLOCK + 17))
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        for len in [
            0,
            1,
            BLOCK - 1,
            BLOCK,
            BLOCK + 1,
            BUFFER - 1,
            BUFFER,
            BUFFER + 5,
            data.len(),
        ] {
            let path = dir.path().join(format!("f{len}"));
            let mut w = DirectWriter::create(&path).unwrap();
            // Odd-sized pieces, as a snapshot's records are.
            for piece in data[..len].chunks(1000) {
                w.write_all(piece).unwrap();
            }
            w.finish().unwrap().sync_all().unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), &data[..len], "length {len}");
        }
    }

    /// A direct write the kernel refuses (here an unaligned length) carries on buffered and
    /// loses nothing.
    #[test]
    fn a_refused_direct_write_carries_on_buffered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut w = DirectWriter::create(&path).unwrap();
        if !w.is_direct() {
            eprintln!("this filesystem takes no O_DIRECT: nothing to check");
            return;
        }
        let data: Vec<u8> = (0..(BLOCK + 100)).map(|i| (i % 241) as u8).collect();
        w.buf.extend_from_slice(&data);
        write_out(&mut w.file, &mut w.mode, &w.buf).unwrap();
        assert!(!w.is_direct(), "an unaligned direct write was taken");
        drop(w);
        assert_eq!(std::fs::read(&path).unwrap(), data);
    }

    /// A writer that turned buffered midway (as after a refused direct write) still writes
    /// every byte in order.
    #[test]
    fn turning_buffered_midway_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..(2 * BUFFER + 100)).map(|i| (i % 253) as u8).collect();
        let mut w = DirectWriter::create(&path).unwrap();
        w.write_all(&data[..BUFFER + 10]).unwrap();
        go_buffered(&w.file, &mut w.mode).unwrap();
        assert!(!w.is_direct());
        w.write_all(&data[BUFFER + 10..]).unwrap();
        w.finish().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), data);
    }
}
