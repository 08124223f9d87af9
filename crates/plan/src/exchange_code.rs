//! Each tile's part of an exchange phase, before addresses: the messages it sends
//! and the ones it lands. One definition for the code the compiler emits
//! (`tessera_kernels::exchange`) and for the estimate's cost of that code.
//!
//! A copy is one message of its source tile (several when it is longer than
//! [`MAX_MESSAGE`]), numbered in the order of the phase's copies; every
//! destination lands it. A tile lands its messages grouped by source tile in tile
//! order, so that its incoming mux switches once per source.

use tessera_kernels::exchange::MAX_MESSAGE;
use tessera_machine::Machine;

use crate::ir::{Exchange, Loc, TilePlan};

/// One tile's part of one exchange phase.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TilePart {
    /// Where each message starts and its bytes, in message order.
    pub sends: Vec<(Loc, u32)>,
    /// (source tile, message, where it lands), by source tile, then message.
    pub recvs: Vec<(u32, u32, Loc)>,
}

impl TilePart {
    pub fn is_empty(&self) -> bool {
        self.sends.is_empty() && self.recvs.is_empty()
    }

    /// Messages landed from each source tile, in the block's order.
    pub fn recv_groups(&self) -> Vec<usize> {
        self.recvs
            .chunk_by(|a, b| a.0 == b.0)
            .map(<[_]>::len)
            .collect()
    }

    /// The most messages of one source tile this part names (sent or landed): what
    /// the 16-bit message field must hold.
    pub fn max_message(&self) -> usize {
        let landed = self.recvs.iter().map(|r| r.1 as usize + 1).max();
        self.sends.len().max(landed.unwrap_or(0))
    }
}

/// Every tile's part of `x`, indexed by tile (empty parts for tiles it leaves out).
pub fn exchange_parts(plan: &TilePlan, x: &Exchange) -> Vec<TilePart> {
    let mut parts = vec![TilePart::default(); plan.tiles as usize];
    for c in &x.copies {
        let src = plan.buffer(c.src.buf).tile;
        let mut offset = 0;
        while offset < c.bytes {
            let bytes = (c.bytes - offset).min(MAX_MESSAGE);
            let at = Loc {
                buf: c.src.buf,
                offset: c.src.offset + offset,
            };
            let sender = &mut parts[src as usize];
            let msg = sender.sends.len() as u32;
            sender.sends.push((at, bytes));
            for d in &c.dsts {
                let to = Loc {
                    buf: d.buf,
                    offset: d.offset + offset,
                };
                parts[plan.buffer(d.buf).tile as usize]
                    .recvs
                    .push((src, msg, to));
            }
            offset += bytes;
        }
    }
    for p in &mut parts {
        // Stable: a message landed twice on a tile keeps its copies' order.
        p.recvs.sort_by_key(|r| (r.0, r.1));
    }
    parts
}

/// Cycles each tile's exchange code takes in phase `x` (from its parts).
pub fn code_cycles(machine: &Machine, parts: &[TilePart]) -> Vec<u64> {
    parts
        .iter()
        .map(|p| {
            tessera_kernels::exchange::block_cycles(
                &machine.timing,
                p.sends.len(),
                &p.recv_groups(),
            )
        })
        .collect()
}
