//! The small files that say what a data directory is, and who serves it: `LOCK` (held by
//! the one kvd serving the directory), `shard` (which shard it holds) and `identity` (a
//! replica group member's own id and its group's). They are written atomically (a
//! temporary file, fsynced, renamed over the old one, the directory fsynced), and read as
//! untrusted input: an empty, cut or unreadable one is refused with its own message naming
//! the file and what to do.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;

use kvshared::routing::ShardId;

pub use super::meta_error::MetaError;

/// The file whose lock says a kvd serves the directory.
pub const LOCK_FILE: &str = "LOCK";
/// The file that says which shard the directory holds.
pub const SHARD_FILE: &str = "shard";
/// The file that says which member of which replica group the directory is.
pub const IDENTITY_FILE: &str = "identity";

/// Largest metadata file read (each is a line or two).
const MAX_META_FILE: u64 = 4096;

/// Replaces `path` with `bytes` so that a crash leaves the old contents or the new, never a
/// mix or an empty file: a temporary file is written and fsynced, renamed over `path`, and
/// the directory fsynced.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), MetaError> {
    let write = || -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        {
            let mut f = File::create(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        match path.parent() {
            Some(dir) => super::sync_dir(dir),
            None => Ok(()),
        }
    };
    write().map_err(|source| MetaError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a metadata file: `None` when it does not exist, its text otherwise; an empty one
/// is refused (a file written atomically is never empty: it was cut by a crash of the file
/// system or a repair), as is one that is not text or too large to be ours.
fn read_meta(path: &Path, what: &'static str) -> Result<Option<String>, MetaError> {
    let path_buf = || path.to_path_buf();
    let bytes = match kvshared::files::read_bounded(path, MAX_META_FILE) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(MetaError::Read {
                path: path_buf(),
                what,
                source,
            });
        }
    };
    let text = String::from_utf8(bytes).map_err(|_| MetaError::NotText { path: path_buf(), what })?;
    if text.trim().is_empty() {
        return Err(MetaError::Empty { path: path_buf(), what });
    }
    Ok(Some(text))
}

/// The lock on a data directory, held for the life of the process: a second kvd on the same
/// directory is refused at start, naming the holder (two processes would each acknowledge
/// writes the other's log then loses).
pub struct DataDirLock {
    _file: File,
}

impl DataDirLock {
    /// Takes the lock on `dir` (creating the directory), or says who holds it.
    pub fn take(dir: &Path) -> Result<DataDirLock, MetaError> {
        let dir_buf = || dir.to_path_buf();
        if dir.exists() && !dir.is_dir() {
            return Err(MetaError::NotADirectory { dir: dir_buf() });
        }
        std::fs::create_dir_all(dir).map_err(|source| MetaError::CreateDir { dir: dir_buf(), source })?;
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|source| MetaError::OpenLock {
                path: path.clone(),
                source,
            })?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.take(64).read_to_string(&mut holder);
                let holder = match holder.trim() {
                    "" => "another process".to_string(),
                    pid => format!("the kvd with pid {pid}"),
                };
                return Err(MetaError::InUse { dir: dir_buf(), holder });
            }
            Err(std::fs::TryLockError::Error(source)) => return Err(MetaError::Lock { path, source }),
        }
        // Who holds it, for the message above (not needed for the lock itself).
        let pid = format!("{}\n", std::process::id());
        file.set_len(0)
            .and_then(|()| file.write_all(pid.as_bytes()))
            .map_err(|source| MetaError::Write { path, source })?;
        Ok(DataDirLock { _file: file })
    }
}

/// What the shard file says after the shard: keys are placed by hash slot. A shard file
/// without it was written by a kvd that placed keys by `xxh3` (before 2026-11-26).
const SLOT_PLACEMENT: &str = "slots";
/// The shard file's word for a group started with `--no-slots`: it began owning no slot.
const ADDED_PLACEMENT: &str = "added-slots";

/// Refuses a data directory written for another shard, or by a kvd that placed keys
/// otherwise; marks a new one as this shard's.
pub fn check_shard(dir: &Path, me: ShardId, no_slots: bool) -> Result<(), MetaError> {
    let path = dir.join(SHARD_FILE);
    let mine = if no_slots { ADDED_PLACEMENT } else { SLOT_PLACEMENT };
    let Some(found) = read_meta(&path, "the shard file")? else {
        return write_atomically(&path, format!("{me} {mine}\n").as_bytes());
    };
    let mut words = found.split_whitespace();
    let shard = words.next().and_then(|w| w.parse::<ShardId>().ok());
    let placement = words.next();
    let dir = dir.to_path_buf();
    match (shard, placement, words.next()) {
        (Some(s), Some(p), None) if s == me && p == mine => Ok(()),
        (Some(shard), Some(SLOT_PLACEMENT | ADDED_PLACEMENT), None) if shard == me => {
            Err(MetaError::OtherStart { dir, shard, no_slots })
        }
        (Some(found), Some(SLOT_PLACEMENT | ADDED_PLACEMENT), None) => Err(MetaError::OtherShard { dir, found, me }),
        (Some(found), None, None) => Err(MetaError::BeforeSlots { dir, found }),
        _ => Err(MetaError::DamagedShard {
            path,
            found: found.trim().to_string(),
        }),
    }
}

/// Who a replica group member's data directory is: its own member id (made when the
/// directory is first used, so that a member whose disk was wiped comes back as a new
/// member, never as the old one) and its group's id (set once, by `kvd admin init-group` or
/// when a leader adds it; none while it waits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// This member's raft id.
    pub member: u64,
    /// Its group's id, once it belongs to one.
    pub group: Option<u64>,
}

impl Identity {
    /// Reads the identity of `dir`, or makes (and writes) a new one with a fresh member id.
    pub fn load_or_create(dir: &Path) -> Result<Identity, MetaError> {
        let path = dir.join(IDENTITY_FILE);
        match read_meta(&path, "the member's identity")? {
            Some(text) => Identity::parse(&text).ok_or(MetaError::DamagedIdentity { path }),
            None => {
                let me = Identity {
                    member: new_member_id(),
                    group: None,
                };
                me.store(dir)?;
                Ok(me)
            }
        }
    }

    /// Writes it into `dir` (atomically).
    pub fn store(&self, dir: &Path) -> Result<(), MetaError> {
        let group = self.group.map_or("none".to_string(), |g| g.to_string());
        write_atomically(
            &dir.join(IDENTITY_FILE),
            format!("member {}\ngroup {group}\n", self.member).as_bytes(),
        )
    }

    fn parse(text: &str) -> Option<Identity> {
        let mut member = None;
        let mut group = None;
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            match line.split_once(' ')? {
                ("member", n) => member = Some(n.trim().parse::<u64>().ok().filter(|&n| n != 0)?),
                ("group", "none") => group = Some(None),
                ("group", n) => group = Some(Some(n.trim().parse::<u64>().ok().filter(|&n| n != 0)?)),
                _ => return None,
            }
        }
        Some(Identity {
            member: member?,
            group: group?,
        })
    }
}

/// A new member id (see `kvshared::admin::new_id`).
pub fn new_member_id() -> u64 {
    kvshared::admin::new_id()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> kvtestkit::Scratch {
        kvtestkit::scratch(&format!("meta-{name}"))
    }

    #[test]
    fn a_second_lock_is_refused_naming_the_holder() {
        let dir = scratch("lock");
        let not_a_dir = DataDirLock::take(Path::new("/dev/null")).err().unwrap();
        assert!(matches!(not_a_dir, MetaError::NotADirectory { .. }), "{not_a_dir}");
        // What an operator reads, tested once here.
        let not_a_dir = not_a_dir.to_string();
        assert!(
            not_a_dir.contains("--data-dir /dev/null: not a directory"),
            "{not_a_dir}"
        );
        let held = DataDirLock::take(&dir).unwrap();
        let e = DataDirLock::take(&dir).err().unwrap();
        let pid = format!("pid {}", std::process::id());
        assert!(
            matches!(&e, MetaError::InUse { holder, .. } if holder.ends_with(&pid)),
            "{e}"
        );
        drop(held);
        DataDirLock::take(&dir).unwrap();
    }

    #[test]
    fn an_empty_or_damaged_shard_file_gets_its_own_message() {
        let dir = scratch("shard");
        let me = ShardId { index: 1, count: 2 };
        check_shard(&dir, me, false).unwrap();
        check_shard(&dir, me, false).unwrap();
        // Started with the even split: a restart with --no-slots is refused, and back.
        let e = check_shard(&dir, me, true).unwrap_err();
        assert!(matches!(e, MetaError::OtherStart { no_slots: true, .. }), "{e}");
        assert_eq!(std::fs::read(dir.join(SHARD_FILE)).unwrap(), b"1/2 slots\n");
        std::fs::write(dir.join(SHARD_FILE), b"").unwrap();
        let e = check_shard(&dir, me, false).unwrap_err();
        assert!(
            matches!(
                e,
                MetaError::Empty {
                    what: "the shard file",
                    ..
                }
            ),
            "{e}"
        );
        std::fs::write(dir.join(SHARD_FILE), b"\x00\x00garbage").unwrap();
        let e = check_shard(&dir, me, false).unwrap_err();
        assert!(matches!(e, MetaError::DamagedShard { .. }), "{e}");
        std::fs::write(dir.join(SHARD_FILE), b"0/2 slots\n").unwrap();
        let e = check_shard(&dir, me, false).unwrap_err();
        assert!(
            matches!(e, MetaError::OtherShard { found, .. } if found == ShardId { index: 0, count: 2 }),
            "{e}"
        );
        std::fs::write(dir.join(SHARD_FILE), b"1/2 slots extra\n").unwrap();
        let e = check_shard(&dir, me, false).unwrap_err();
        assert!(matches!(e, MetaError::DamagedShard { .. }), "{e}");
        // A directory from before hash slots: refused, and left as it was.
        std::fs::write(dir.join(SHARD_FILE), b"1/2\n").unwrap();
        let e = check_shard(&dir, me, false).unwrap_err();
        assert!(matches!(e, MetaError::BeforeSlots { .. }), "{e}");
        assert_eq!(std::fs::read(dir.join(SHARD_FILE)).unwrap(), b"1/2\n");
    }

    #[test]
    fn an_identity_survives_a_reopen_and_a_damaged_one_is_refused() {
        let dir = scratch("identity");
        let a = Identity::load_or_create(&dir).unwrap();
        assert_eq!(a.group, None);
        let b = Identity { group: Some(77), ..a };
        b.store(&dir).unwrap();
        assert_eq!(Identity::load_or_create(&dir).unwrap(), b);
        std::fs::write(dir.join(IDENTITY_FILE), b"member x\n").unwrap();
        let e = Identity::load_or_create(&dir).unwrap_err();
        assert!(matches!(e, MetaError::DamagedIdentity { .. }), "{e}");
    }

    proptest::proptest! {
        #[test]
        fn any_shard_file_is_taken_or_refused_without_a_panic(text in "\\PC{0,64}") {
            let dir = scratch("shard-any");
            std::fs::write(dir.join(SHARD_FILE), text.as_bytes()).unwrap();
            let _ = check_shard(&dir, ShardId::SOLO, false);
        }

        #[test]
        fn any_identity_text_parses_or_is_refused_without_a_panic(text in "\\\\PC{0,64}") {
            let _ = Identity::parse(&text);
        }
    }
}
