//! The control code: `kvd admin` (group membership, slot moves, rebalance, add and remove
//! shard), `kvd manager` (hot shards) and the client verbs (`kvd get/put/stats`). It is a
//! client of the cluster like any other: it talks to kvd nodes with kvshared's client and
//! admin wire types (`kvshared::admin`) and uses nothing of the server's internals (the
//! node, the store, the log: see docs/whiteboard.json's "admin tools are clients").

pub(crate) mod admin_cmd;
pub mod client_cmd;
pub mod error;
pub mod manager;
pub mod move_slots;
pub mod reshard;
