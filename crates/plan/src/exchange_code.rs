//! Each tile's part of an exchange phase, before addresses: the messages it sends
//! and the ones it lands. One definition for the code the compiler emits
//! (`tessera_kernels::exchange`) and for the estimate's cost of that code.
//!
//! A copy is one message of its source tile (several when it is longer than
//! [`MAX_MESSAGE`]; one with the copies it continues, `coalesced`), numbered in
//! source-buffer order; every destination lands it. A tile lands its messages grouped by source tile in tile
//! order, so that its incoming mux switches once per source.

use tessera_kernels::exchange::MAX_MESSAGE;
use tessera_machine::Machine;

use crate::ir::{Copy, Exchange, Loc, TilePlan};

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

    /// Bytes of the tile's exchange code for this phase.
    pub fn code_bytes(&self) -> u32 {
        let groups = self.recvs.chunk_by(|a, b| a.0 == b.0).count();
        tessera_kernels::exchange::block_bytes(self.sends.len(), self.recvs.len(), groups)
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
    for c in coalesced(&x.copies) {
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

/// The phase's copies with every run that continues another merged into it: a
/// copy whose source bytes follow another's in the same buffer, and whose every
/// destination follows that copy's matching destination in the same buffer, is
/// one message with it. Redistributions cut tensors into rows and blocks, and a
/// tile's consecutive pieces often travel together: each message saved is code
/// on the sender and on every receiver. Same bytes, same places.
fn coalesced(copies: &[Copy]) -> Vec<Copy> {
    let mut order: Vec<&Copy> = copies.iter().collect();
    order.sort_by_key(|c| (c.src.buf, c.src.offset));
    let mut out: Vec<Copy> = Vec::with_capacity(order.len());
    for c in order {
        if let Some(last) = out.last_mut()
            && continues(last, c)
        {
            last.bytes += c.bytes;
            continue;
        }
        out.push(c.clone());
    }
    out
}

fn continues(a: &Copy, b: &Copy) -> bool {
    a.src.buf == b.src.buf
        && a.src.offset + a.bytes == b.src.offset
        && a.dsts.len() == b.dsts.len()
        && a.dsts
            .iter()
            .zip(&b.dsts)
            .all(|(x, y)| x.buf == y.buf && x.offset + a.bytes == y.offset)
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

/// Bytes of exchange code each tile holds for the whole program: every phase's
/// block. It lives in executable SRAM beside the tile's buffers, so the fit loop
/// counts it.
pub fn code_bytes_per_tile(plan: &TilePlan) -> Vec<u64> {
    let mut bytes = vec![0u64; plan.tiles as usize];
    for x in &plan.exchanges {
        for (t, p) in exchange_parts(plan, x).iter().enumerate() {
            bytes[t] += u64::from(p.code_bytes());
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::ir::BufId;

    /// Every (source byte, destination byte) pair the copies move: what merging
    /// must keep exactly.
    fn moves(copies: &[Copy]) -> BTreeSet<((u32, u32), (u32, u32))> {
        let mut m = BTreeSet::new();
        for c in copies {
            for i in 0..c.bytes {
                for d in &c.dsts {
                    m.insert(((c.src.buf.0, c.src.offset + i), (d.buf.0, d.offset + i)));
                }
            }
        }
        m
    }

    fn loc(buf: u32, offset: u32) -> Loc {
        Loc {
            buf: BufId(buf),
            offset,
        }
    }

    #[test]
    fn coalescing_keeps_every_byte_and_merges_only_runs() {
        // Rows of a block sent in order to two tiles at matching offsets: one run.
        let rows: Vec<Copy> = (0..8)
            .map(|r| Copy {
                src: loc(1, 32 * r),
                bytes: 32,
                dsts: vec![loc(5, 64 + 32 * r), loc(9, 32 * r)],
            })
            .collect();
        let merged = coalesced(&rows);
        assert_eq!(merged.len(), 1);
        assert_eq!(moves(&merged), moves(&rows));
        // Row 4 moved at one destination: runs 0..4, 4, 5..8.
        let mut broken = rows.clone();
        broken[4].dsts[1].offset += 2;
        assert_eq!(coalesced(&broken).len(), 3);
        assert_eq!(moves(&coalesced(&broken)), moves(&broken));
        // Fixed-seed random copies: the same bytes move, never more messages.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u32| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % u64::from(n)) as u32
        };
        for case in 0..300 {
            let copies: Vec<Copy> = (0..1 + next(12))
                .map(|_| {
                    let (sb, so, bytes) = (next(3), 8 * next(6), 8 * (1 + next(2)));
                    let dsts = (0..1 + next(2))
                        .map(|_| loc(10 + next(3), 8 * next(6)))
                        .collect();
                    Copy {
                        src: loc(sb, so),
                        bytes,
                        dsts,
                    }
                })
                .collect();
            let merged = coalesced(&copies);
            assert!(merged.len() <= copies.len(), "case {case}");
            assert_eq!(moves(&merged), moves(&copies), "case {case}: {copies:?}");
        }
    }
}
