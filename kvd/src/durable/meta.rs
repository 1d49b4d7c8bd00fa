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

/// The file whose lock says a kvd serves the directory.
pub const LOCK_FILE: &str = "LOCK";
/// The file that says which shard the directory holds.
pub const SHARD_FILE: &str = "shard";
/// The file that says which member of which replica group the directory is.
pub const IDENTITY_FILE: &str = "identity";

/// Largest metadata file read (each is a line or two).
const MAX_META_FILE: u64 = 4096;

fn err(kind: std::io::ErrorKind, message: String) -> std::io::Error {
    std::io::Error::new(kind, message)
}

/// Replaces `path` with `bytes` so that a crash leaves the old contents or the new, never a
/// mix or an empty file: a temporary file is written and fsynced, renamed over `path`, and
/// the directory fsynced.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
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
}

/// Reads a metadata file: `None` when it does not exist, its text otherwise; an empty one
/// is refused (a file written atomically is never empty: it was cut by a crash of the file
/// system or a repair), as is one that is not text or too large to be ours.
fn read_meta(path: &Path, what: &str) -> std::io::Result<Option<String>> {
    let bytes = match kvshared::files::read_bounded(path, MAX_META_FILE) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(e.kind(), format!("{}: cannot read {what}: {e}", path.display()))),
    };
    let text = String::from_utf8(bytes).map_err(|_| {
        err(
            std::io::ErrorKind::InvalidData,
            format!("{}: {what} is not text: the file is damaged", path.display()),
        )
    })?;
    if text.trim().is_empty() {
        return Err(err(
            std::io::ErrorKind::InvalidData,
            format!(
                "{}: {what} is empty: the file was cut short (a file system crash or repair). \
                 kvd writes it atomically, so it never left it so; see docs/LOG_FORMAT.md \
                 (\"metadata files\") for how to restore it",
                path.display()
            ),
        ));
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
    pub fn take(dir: &Path) -> std::io::Result<DataDirLock> {
        if dir.exists() && !dir.is_dir() {
            return Err(err(
                std::io::ErrorKind::NotADirectory,
                format!(
                    "--data-dir {}: not a directory (give a directory, or a path that does not exist yet)",
                    dir.display()
                ),
            ));
        }
        std::fs::create_dir_all(dir).map_err(|e| {
            err(
                e.kind(),
                format!("--data-dir {}: cannot create the directory: {e}", dir.display()),
            )
        })?;
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| err(e.kind(), format!("{}: cannot open the lock file: {e}", path.display())))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.take(64).read_to_string(&mut holder);
                let holder = match holder.trim() {
                    "" => "another process".to_string(),
                    pid => format!("the kvd with pid {pid}"),
                };
                return Err(err(
                    std::io::ErrorKind::WouldBlock,
                    format!(
                        "{} is in use by {holder}: two kvd processes on one data directory would each \
                         acknowledge writes that the other's log loses. Stop that kvd first, or give \
                         this one its own --data-dir",
                        dir.display()
                    ),
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(err(e.kind(), format!("{}: cannot lock: {e}", path.display())));
            }
        }
        // Who holds it, for the message above (not needed for the lock itself).
        file.set_len(0)?;
        file.write_all(format!("{}\n", std::process::id()).as_bytes())?;
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
pub fn check_shard(dir: &Path, me: ShardId, no_slots: bool) -> std::io::Result<()> {
    let path = dir.join(SHARD_FILE);
    let mine = if no_slots { ADDED_PLACEMENT } else { SLOT_PLACEMENT };
    let Some(found) = read_meta(&path, "the shard file")? else {
        return write_atomically(&path, format!("{me} {mine}\n").as_bytes());
    };
    let mut words = found.split_whitespace();
    let shard = words.next().and_then(|w| w.parse::<ShardId>().ok());
    let placement = words.next();
    let invalid = |message: String| err(std::io::ErrorKind::InvalidData, message);
    match (shard, placement, words.next()) {
        (Some(s), Some(p), None) if s == me && p == mine => Ok(()),
        (Some(s), Some(SLOT_PLACEMENT | ADDED_PLACEMENT), None) if s == me => Err(invalid(format!(
            "{} holds shard {s} started {}, but this kvd was started {}: start it as the directory was first started \
             (a group's slots come from its log, and the start is where that log begins)",
            dir.display(),
            if no_slots {
                "with the even split of --shard"
            } else {
                "with --no-slots (a group added to a running cluster)"
            },
            if no_slots {
                "with --no-slots"
            } else {
                "without --no-slots"
            },
        ))),
        (Some(s), Some(SLOT_PLACEMENT | ADDED_PLACEMENT), None) => Err(invalid(format!(
            "{} holds shard {s} but this kvd serves --shard {me}: point --data-dir at this shard's directory",
            dir.display()
        ))),
        (Some(s), None, None) => Err(invalid(format!(
            "{} holds shard {s} as written by a kvd from before hash slots, which placed keys by \
             another function: under hash slots most of its keys belong to other shards, so this \
             kvd will not serve it (nothing in it is changed). Serve it with the kvd that wrote it, \
             copy its keys out (`redis-cli --scan` against that kvd, or `kvbench`), and load them \
             into a cluster started on fresh directories (docs/CLUSTER.md, \"data directories from before hash slots\")",
            dir.display()
        ))),
        _ => Err(invalid(format!(
            "{}: the shard file says {:?}, which is not a shard (`I/N slots`): the file is damaged; \
             write the shard this directory holds into it (e.g. `0/2 slots`) if you know it",
            path.display(),
            found.trim()
        ))),
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
    pub fn load_or_create(dir: &Path) -> std::io::Result<Identity> {
        let path = dir.join(IDENTITY_FILE);
        match read_meta(&path, "the member's identity")? {
            Some(text) => Identity::parse(&text).ok_or_else(|| {
                err(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "{}: does not read as `member N` and `group N|none`: the file is damaged. \
                         Restore the directory from a copy, or move it away and add this member back \
                         as a new one (docs/REPLICATION.md, \"a member that lost its disk\")",
                        path.display()
                    ),
                )
            }),
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
    pub fn store(&self, dir: &Path) -> std::io::Result<()> {
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
        let not_a_dir = DataDirLock::take(Path::new("/dev/null")).err().unwrap().to_string();
        assert!(
            not_a_dir.contains("--data-dir /dev/null: not a directory"),
            "{not_a_dir}"
        );
        let held = DataDirLock::take(&dir).unwrap();
        let e = DataDirLock::take(&dir).err().unwrap().to_string();
        assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
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
        let e = check_shard(&dir, me, true).unwrap_err().to_string();
        assert!(e.contains("started with the even split of --shard"), "{e}");
        assert_eq!(std::fs::read(dir.join(SHARD_FILE)).unwrap(), b"1/2 slots\n");
        std::fs::write(dir.join(SHARD_FILE), b"").unwrap();
        let e = check_shard(&dir, me, false).unwrap_err().to_string();
        assert!(e.contains("is empty") && e.contains("shard"), "{e}");
        std::fs::write(dir.join(SHARD_FILE), b"\x00\x00garbage").unwrap();
        let e = check_shard(&dir, me, false).unwrap_err().to_string();
        assert!(e.contains("damaged"), "{e}");
        std::fs::write(dir.join(SHARD_FILE), b"0/2 slots\n").unwrap();
        let e = check_shard(&dir, me, false).unwrap_err().to_string();
        assert!(e.contains("holds shard 0/2 but"), "{e}");
        std::fs::write(dir.join(SHARD_FILE), b"1/2 slots extra\n").unwrap();
        let e = check_shard(&dir, me, false).unwrap_err().to_string();
        assert!(e.contains("damaged"), "{e}");
        // A directory from before hash slots: refused, and left as it was.
        std::fs::write(dir.join(SHARD_FILE), b"1/2\n").unwrap();
        let e = check_shard(&dir, me, false).unwrap_err().to_string();
        assert!(e.contains("before hash slots"), "{e}");
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
        let e = Identity::load_or_create(&dir).unwrap_err().to_string();
        assert!(e.contains("damaged"), "{e}");
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
