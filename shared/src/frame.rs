//! Framing: how one message crosses a byte stream.
//!
//! Every message is a 16-byte header followed by an rkyv-encoded body:
//!
//! ```text
//! offset 0  2     3        4       8        16
//!        | "KV" | version | kind | len u32 | request id u64 | body (len bytes) ...
//! ```
//!
//! All integers are little-endian. The magic and version sit in *every* frame, not only at
//! connection start, so a peer speaking another protocol or version is caught on its first
//! bytes and on every frame after, and never mistaken for a huge length prefix.
//!
//! The request id lives in the header rather than the body so that a server can still answer
//! "your body was malformed" to the right request, and a client can match responses to
//! pipelined requests without touching the body.
//!
//! The body length is checked against a hard limit *before* anything is allocated for it.
//! Each body is read into its own reused [`AlignedVec`], because rkyv needs the archive to be
//! aligned and to end exactly where the frame ends.

pub use rkyv::util::AlignedVec;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Bytes that open every frame.
pub const MAGIC: [u8; 2] = *b"KV";
/// Protocol version; bumped on any incompatible change of the header or the body types.
/// 2: `NodeStats` carries `Counts` and `SystemFigures` (one definition of each counter).
/// 3: batch responses carry error details in the op's value slots (no error list), the
/// statuses `TooLarge` and `OutOfMemory`, the `AuthRequest`/`AuthOk` handshake, and
/// `ConfigRequest`/`ConfigOk`.
/// 4: the conditional puts `PutIfAbsent`/`PutIfPresent` and the status `NotStored`.
/// 5: `NodeStats` carries service-time histograms (`LatencyStats`) and a replica group's
/// figures; the frames `RaftRequest`/`RaftResponse` and `NotLeader`.
/// 6: a group's figures carry its commit index and learners; member ids come from addresses
/// and `RaftRequest` carries `kvd admin` requests.
/// 7: `NodeStats` carries the last window's load (`RecentLoad`).
/// 8: the `StaleReads` frame; followers and learners serve reads; a group's figures carry
/// the shard manager's decisions.
/// 9: `Counts` carries per-front auth failures, read and write timeouts, and connections
/// that spoke another front's protocol.
/// 10: the `PinGroup` frame and the error `WrongGroup`; a group's figures carry its id.
/// 11: the op `IncrBy` and the statuses `Counted`, `NotAnInteger`, `Overflow`.
/// 12: a node's durability figures carry the fsync times as a histogram; `Counts` carries
/// `applied` (ops applied from the log, apart from the ops served); `SystemFigures` carries
/// the host's CPU time by state; a group's figures carry its leader changes; the ops `Append` and `SetRange`.
/// 13: the expiry ops `PutWith`, `Expire`, `Ttl`, `Expired` and the log's `Clock`; `Counts`
/// carries `expired` and `expire_cycle_microseconds`.
/// 14: the keyspace ops `Scan`, `KeyCount`, `Flush` and `Rename`.
/// 15: `NodeStats` carries `resp_addr`.
/// 16: hash-slot maps: the ops `SlotSet`, `SlotScan`, `Load` and `SlotMap`, the statuses
/// `Moved` (was `WrongShard`) and `TryAgain`; `NodeStats` carries `slots` and `slot_moves`.
/// 17: `Counts` carries `keys_loaded`, `slots_in` and `slots_out`.
/// 18: a node's durability figures carry `log_memory_bytes`.
/// 19: the op `SlotTrack` (a migration's copy before the freeze); a `Load` of no bytes
/// removes the key; a copied page marks a key absent; `SlotMoves` carries `taken`.
pub const VERSION: u8 = 19;
/// The version of the raft RPCs between a replica group's members (the `RaftRequest` and
/// `RaftResponse` frames carry it in place of [`VERSION`]): counted on its own, because what
/// members send each other is log entries in the log's own format and openraft's messages,
/// which change apart from the client protocol.
///
/// 20: log entries in kvd's entry format 1 (`durable::entry`). The builds before spoke the
/// client protocol's v19 here and sent the client's batches; members of those builds and of
/// this one cannot share a group (docs/UPGRADING.md).
pub const RAFT_VERSION: u8 = 20;
/// Size of the fixed header.
pub const HEADER_LEN: usize = 16;
/// Default hard limit on a frame body (64 MiB).
pub const DEFAULT_MAX_FRAME: u32 = 64 * 1024 * 1024;
/// The largest frame limit a server may be configured with (1 GiB). Clients accept replies up
/// to this size, so they can read every reply any server may send; it keeps every frame far
/// from the 2 GiB where rkyv's relative pointers end.
pub const MAX_FRAME_LIMIT: u32 = 1 << 30;
/// The request id of an error reply about the connection as a whole (a bad header: the
/// stream is out of step and is closed after it). Clients never use it for a request.
pub const CONNECTION_ERROR_ID: u64 = 0;

/// What a frame's body is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Body: [`crate::wire::BatchRequest`].
    BatchRequest = 0x01,
    /// Body: empty.
    StatsRequest = 0x02,
    /// Body: the token's bytes (see [`crate::auth`]); a client's first frame when the
    /// server requires a token.
    AuthRequest = 0x03,
    /// Body: [`crate::wire::ConfigRequest`]; a change to the node's settings at run time.
    ConfigRequest = 0x04,
    /// Body: a raft RPC between the members of a replica group (kvd's own encoding; opaque
    /// here).
    RaftRequest = 0x05,
    /// Body: 4 bytes, a little-endian u32 of milliseconds (0: linearizable, the default).
    /// From now on this connection's reads may be answered by a follower or learner of a
    /// replica group from its own store while it is at most that far behind its leader
    /// (bounded staleness, like Redis Cluster's `READONLY`). Answered `ConfigOk`.
    StaleReads = 0x06,
    /// Body: 8 bytes, a little-endian u64: the replica group this client believes the
    /// member belongs to (0: not known yet). Answered `ConfigOk` whose body is the member's
    /// own group id (8 bytes; 0 while it has none), or `ErrorResponse` `WrongGroup` when it
    /// belongs to another. From then on the connection's batches run only while the member
    /// is in that group.
    PinGroup = 0x07,
    /// Body: [`crate::wire::BatchResponse`].
    BatchResponse = 0x81,
    /// Body: [`crate::stats::NodeStats`].
    StatsResponse = 0x82,
    /// Body: empty; the token was accepted.
    AuthOk = 0x83,
    /// Body: empty; the settings were changed.
    ConfigOk = 0x84,
    /// Body: the answer to a [`FrameKind::RaftRequest`].
    RaftResponse = 0x85,
    /// Body: the leader's address as UTF-8, or empty when unknown. This member of a replica
    /// group is not its leader and ran nothing of the request: send it to the leader.
    NotLeader = 0x86,
    /// Body: [`crate::wire::ErrorReply`]; the request with this id failed as a whole.
    ErrorResponse = 0xFF,
}

impl FrameKind {
    /// The protocol a frame of this kind belongs to.
    pub fn protocol(self) -> Protocol {
        match self {
            FrameKind::RaftRequest | FrameKind::RaftResponse => Protocol::Raft,
            _ => Protocol::Client,
        }
    }

    fn from_byte(b: u8) -> Option<FrameKind> {
        Some(match b {
            0x01 => FrameKind::BatchRequest,
            0x02 => FrameKind::StatsRequest,
            0x03 => FrameKind::AuthRequest,
            0x04 => FrameKind::ConfigRequest,
            0x05 => FrameKind::RaftRequest,
            0x06 => FrameKind::StaleReads,
            0x07 => FrameKind::PinGroup,
            0x81 => FrameKind::BatchResponse,
            0x82 => FrameKind::StatsResponse,
            0x83 => FrameKind::AuthOk,
            0x84 => FrameKind::ConfigOk,
            0x85 => FrameKind::RaftResponse,
            0x86 => FrameKind::NotLeader,
            0xFF => FrameKind::ErrorResponse,
            _ => return None,
        })
    }
}

/// The two protocols kvd's frames carry, each with its own version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Clients, `kvd admin` and the tools ([`VERSION`]).
    Client,
    /// A replica group's members ([`RAFT_VERSION`]).
    Raft,
}

impl Protocol {
    /// The version this build speaks.
    pub fn version(self) -> u8 {
        match self {
            Protocol::Client => VERSION,
            Protocol::Raft => RAFT_VERSION,
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::Client => "client protocol",
            Protocol::Raft => "raft protocol between group members",
        })
    }
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// What the body is.
    pub kind: FrameKind,
    /// Body length in bytes.
    pub len: u32,
    /// The request id (a reply carries its request's id).
    pub id: u64,
}

impl FrameHeader {
    /// The header's 16 bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..2].copy_from_slice(&MAGIC);
        out[2] = self.kind.protocol().version();
        out[3] = self.kind as u8;
        out[4..8].copy_from_slice(&self.len.to_le_bytes());
        out[8..16].copy_from_slice(&self.id.to_le_bytes());
        out
    }

    /// Parses and checks a header: magic, the version of its kind's protocol, kind, and the
    /// body length against `max`. (A kind this build does not know, in a frame of another
    /// version, is a version mismatch: that version may define it.)
    pub fn decode(bytes: &[u8; HEADER_LEN], max: u32) -> Result<FrameHeader, FrameError> {
        let [m0, m1, version, kind, l0, l1, l2, l3, i0, i1, i2, i3, i4, i5, i6, i7] = *bytes;
        if [m0, m1] != MAGIC {
            return Err(FrameError::BadMagic([m0, m1]));
        }
        let protocol = FrameKind::from_byte(kind).map_or(Protocol::Client, FrameKind::protocol);
        if version != protocol.version() {
            return Err(FrameError::VersionMismatch {
                protocol,
                ours: protocol.version(),
                theirs: version,
            });
        }
        let kind = FrameKind::from_byte(kind).ok_or(FrameError::UnknownKind(kind))?;
        let len = u32::from_le_bytes([l0, l1, l2, l3]);
        if len > max {
            return Err(FrameError::TooLarge { len, max });
        }
        let id = u64::from_le_bytes([i0, i1, i2, i3, i4, i5, i6, i7]);
        Ok(FrameHeader { kind, len, id })
    }
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)] // the messages say it
pub enum FrameError {
    #[error("not a kvd peer: frame starts with {0:02x?}, expected \"KV\"")]
    BadMagic([u8; 2]),
    #[error(
        "{protocol} version mismatch: this end speaks v{ours}, the other end v{theirs}; upgrade the {older} (see docs/UPGRADING.md)",
        older = older_end(*ours, *theirs)
    )]
    VersionMismatch { protocol: Protocol, ours: u8, theirs: u8 },
    #[error("unknown frame kind 0x{0:02x}")]
    UnknownKind(u8),
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: u32, max: u32 },
    #[error("connection closed in the middle of a frame")]
    Truncated,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Which end of a version mismatch to upgrade.
fn older_end(ours: u8, theirs: u8) -> String {
    match theirs < ours {
        true => format!("other end (the one on v{theirs})"),
        false => format!("end on v{ours} (this one)"),
    }
}

/// The first piece of a body read before more memory is committed to it.
const FIRST_CHUNK: usize = 64 * 1024;

/// Reads the next frame's header and body; the body lands in `body` (resized to fit).
///
/// Returns `Ok(None)` on a clean end of stream at a frame boundary.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    body: &mut AlignedVec,
    max: u32,
) -> Result<Option<FrameHeader>, FrameError> {
    let Some(header) = read_header(reader, max).await? else {
        return Ok(None);
    };
    read_body(reader, body, header.len as usize).await?;
    Ok(Some(header))
}

/// Reads and checks the next frame's header (the first half of [`read_frame`], for a
/// reader that must decide whether it can hold the body before reading it).
///
/// Returns `Ok(None)` on a clean end of stream at a frame boundary.
pub async fn read_header<R: AsyncRead + Unpin>(reader: &mut R, max: u32) -> Result<Option<FrameHeader>, FrameError> {
    let mut raw = [0u8; HEADER_LEN];
    let mut filled = 0;
    while filled < HEADER_LEN {
        let n = reader.read(&mut raw[filled..]).await?;
        if n == 0 {
            return if filled == 0 {
                Ok(None)
            } else {
                Err(FrameError::Truncated)
            };
        }
        filled += n;
    }
    FrameHeader::decode(&raw, max).map(Some)
}

/// Reads a body of `len` bytes into `body` (the second half of [`read_frame`]).
///
/// The body grows as its bytes arrive (at most doubling what has arrived), so a header that
/// announces a large body costs memory only once the body is really being sent. Bytes a
/// reused buffer already holds are read over, not zeroed first: only growth is zeroed (a
/// connection's steady frames cost no `memset`).
pub async fn read_body<R: AsyncRead + Unpin>(
    reader: &mut R,
    body: &mut AlignedVec,
    len: usize,
) -> Result<(), FrameError> {
    let mut have = 0;
    while have < len {
        let step = (len - have).min(have.max(FIRST_CHUNK));
        if body.len() < have + step {
            body.resize(have + step, 0);
        }
        let chunk = &mut body.as_mut_slice()[have..have + step];
        match reader.read_exact(chunk).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Truncated),
            Err(e) => return Err(e.into()),
        }
        have += step;
    }
    body.resize(len, 0); // shrinks a longer reused buffer: nothing written
    Ok(())
}

/// Appends one frame (header, then `body`) to `out`.
pub fn append_frame(out: &mut Vec<u8>, kind: FrameKind, id: u64, body: &[u8]) {
    let header = FrameHeader {
        kind,
        len: body.len() as u32,
        id,
    };
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(body);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = FrameHeader {
            kind: FrameKind::BatchRequest,
            len: 1234,
            id: 0xdead_beef_0102,
        };
        assert_eq!(FrameHeader::decode(&h.encode(), DEFAULT_MAX_FRAME).unwrap(), h);
    }

    #[test]
    fn oversize_is_refused_from_the_header_alone() {
        let h = FrameHeader {
            kind: FrameKind::BatchRequest,
            len: u32::MAX,
            id: 1,
        };
        assert!(matches!(
            FrameHeader::decode(&h.encode(), DEFAULT_MAX_FRAME),
            Err(FrameError::TooLarge { .. })
        ));
    }

    #[test]
    fn wrong_magic_and_version_are_named() {
        let mut raw = FrameHeader {
            kind: FrameKind::StatsRequest,
            len: 0,
            id: 1,
        }
        .encode();
        raw[2] = 9;
        let err = FrameHeader::decode(&raw, 100).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "client protocol version mismatch: this end speaks v{VERSION}, the other end v9; \
                 upgrade the other end (the one on v9) (see docs/UPGRADING.md)"
            )
        );
        // A raft frame of the builds before the raft protocol had a version of its own.
        let mut raft = FrameHeader {
            kind: FrameKind::RaftRequest,
            len: 0,
            id: 1,
        }
        .encode();
        assert_eq!(raft[2], RAFT_VERSION);
        raft[2] = 19;
        let err = FrameHeader::decode(&raft, 100).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "raft protocol between group members version mismatch: this end speaks v20, the other end v19"
            ),
            "{err}"
        );
        raw[2] = VERSION + 1;
        raw[3] = 0x42;
        let err = FrameHeader::decode(&raw, 100).unwrap_err().to_string();
        assert!(err.contains("upgrade the end on v19 (this one)"), "{err}");
        raw[0] = b'G';
        assert!(matches!(FrameHeader::decode(&raw, 100), Err(FrameError::BadMagic(_))));
    }

    /// A connection's body buffer is reused: each read holds exactly its own frame's bytes,
    /// longer or shorter than the last, and a cut one is `Truncated`.
    #[tokio::test]
    async fn a_reused_body_holds_exactly_each_frame() {
        let mut body = AlignedVec::new();
        for len in [100_000usize, 10, 0, 70_000, 3] {
            let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8 ^ len as u8).collect();
            read_body(&mut &bytes[..], &mut body, len).await.unwrap();
            assert_eq!(body.as_slice(), &bytes[..], "len {len}");
        }
        let short = [1u8; 10];
        assert!(matches!(
            read_body(&mut &short[..], &mut body, 11).await,
            Err(FrameError::Truncated)
        ));
    }

    #[tokio::test]
    async fn read_frame_handles_eof_positions() {
        let mut body: AlignedVec = AlignedVec::new();
        let mut empty: &[u8] = &[];
        assert!(read_frame(&mut empty, &mut body, 100).await.unwrap().is_none());

        let mut out = Vec::new();
        append_frame(&mut out, FrameKind::BatchRequest, 7, b"hello");
        let mut whole: &[u8] = &out;
        let h = read_frame(&mut whole, &mut body, 100).await.unwrap().unwrap();
        assert_eq!((h.id, body.as_slice()), (7, &b"hello"[..]));

        for cut in [3, HEADER_LEN, HEADER_LEN + 2] {
            let mut part: &[u8] = &out[..cut];
            assert!(matches!(
                read_frame(&mut part, &mut body, 100).await,
                Err(FrameError::Truncated)
            ));
        }
    }
}
