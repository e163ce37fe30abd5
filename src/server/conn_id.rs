//! The address of one client connection, as operations and effects carry it.

use crate::core::codec;

/// Identity of one client connection: the cluster node that accepted it (0 on a single
/// node), which worker owns it, its slab slot, and the generation of that slot. A slot is
/// reused after a close; the generation is not, so a late reply addressed to a closed
/// connection can never reach the stranger that reuses its slot. The state machine never sees
/// it: its holders are [`Session`]s, mapped from connections by `owner::Sessions`. In a
/// cluster every node applies every node's commands; a node delivers only what is addressed to
/// its own connections.
///
/// [`Session`]: crate::core::Session
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ConnId {
    pub node: u16,
    pub worker: u16,
    pub slot: u32,
    pub gen: u32,
}

impl ConnId {
    /// A connection of a single node (node 0).
    pub const fn new(worker: u16, slot: u32, gen: u32) -> Self {
        ConnId {
            node: 0,
            worker,
            slot,
            gen,
        }
    }

    /// A connection accepted by cluster node `node`.
    pub const fn on_node(node: u16, worker: u16, slot: u32, gen: u32) -> Self {
        ConnId {
            node,
            worker,
            slot,
            gen,
        }
    }

    /// The connection in a command entry or a snapshot. The node shares the worker's number
    /// (bits 16..32), so that a single node's entries (node 0) read as they always did.
    pub fn encode(&self, out: &mut Vec<u8>) {
        codec::put_u64(out, u64::from(self.node) << 16 | u64::from(self.worker));
        codec::put_u64(out, u64::from(self.slot));
        codec::put_u64(out, u64::from(self.gen));
    }

    pub fn decode(r: &mut codec::Reader<'_>) -> Result<ConnId, codec::DecodeError> {
        let both = r.u64()?;
        let node = u16::try_from(both >> 16)
            .map_err(|_| codec::DecodeError::Invalid("node over 16 bits"))?;
        Ok(ConnId::on_node(node, both as u16, r.u32()?, r.u32()?))
    }
}
