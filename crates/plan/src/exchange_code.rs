//! Each tile's part of an exchange phase, before addresses: the messages it sends
//! and the ones it lands. One definition for the code the compiler emits
//! (`tessera_kernels::exchange`) and for the estimate's cost of that code.
//!
//! A copy is one message of its source tile (several when it is longer than
//! [`MAX_MESSAGE`]; one with the copies it continues, `runs`), numbered in
//! source-buffer order; every destination lands it. A tile lands its messages grouped by source tile in tile
//! order, so that its incoming mux switches once per source.

use tessera_kernels::exchange::MAX_MESSAGE;
use tessera_machine::Machine;

use crate::ir::{BufId, Copy, Exchange, Loc, TilePlan};

/// One tile's part of one exchange phase.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TilePart {
    /// Where each message starts and its bytes, in message order.
    pub sends: Vec<(Loc, u32)>,
    /// (source tile, message, where it lands), by source tile, then message.
    pub recvs: Vec<(u32, u32, Loc)>,
    /// Sent from a layer's instance of a weight store: each address is the
    /// first layer's plus the loop's layer offset.
    pub relative: bool,
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
        tessera_kernels::exchange::block_bytes(
            self.sends.len(),
            self.recvs.len(),
            groups,
            self.relative,
        )
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
    for (first, bytes) in runs(&x.copies, |b| plan.buffer(b).tile) {
        let c = &x.copies[first];
        let src = plan.buffer(c.src.buf).tile;
        let mut offset = 0;
        while offset < bytes {
            let piece = (bytes - offset).min(MAX_MESSAGE);
            let at = Loc {
                buf: c.src.buf,
                offset: c.src.offset + offset,
            };
            let sender = &mut parts[src as usize];
            let msg = sender.sends.len() as u32;
            sender.sends.push((at, piece));
            sender.relative |= plan.buffer(c.src.buf).instances > 1;
            for d in &c.dsts {
                let to = Loc {
                    buf: d.buf,
                    offset: d.offset + offset,
                };
                parts[plan.buffer(d.buf).tile as usize]
                    .recvs
                    .push((src, msg, to));
            }
            offset += piece;
        }
    }
    for p in &mut parts {
        // Stable: a message landed twice on a tile keeps its copies' order.
        p.recvs.sort_by_key(|r| (r.0, r.1));
    }
    parts
}

/// What a tile's part of a phase counts, without where: messages sent, and
/// messages landed from each source tile in block order. What the fit loop and
/// the estimate ask of every phase again and again, so made without building the
/// parts; `exchange_parts` gives the same counts (tested).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TileCounts {
    pub sends: usize,
    pub groups: Vec<usize>,
    /// See [`TilePart::relative`].
    pub relative: bool,
}

impl TileCounts {
    pub fn code_bytes(&self) -> u32 {
        let recvs = self.groups.iter().sum();
        tessera_kernels::exchange::block_bytes(self.sends, recvs, self.groups.len(), self.relative)
    }
}

/// Every tile's [`TileCounts`] for phase `x`, indexed by tile.
pub fn exchange_counts(plan: &TilePlan, x: &Exchange) -> Vec<TileCounts> {
    let mut counts = vec![TileCounts::default(); plan.tiles as usize];
    // The runs come by source tile, so each receiver's groups close in order.
    let mut last_src = vec![u32::MAX; plan.tiles as usize];
    for (first, bytes) in runs(&x.copies, |b| plan.buffer(b).tile) {
        let c = &x.copies[first];
        let src = plan.buffer(c.src.buf).tile;
        let pieces = bytes.div_ceil(MAX_MESSAGE) as usize;
        if pieces == 0 {
            continue;
        }
        counts[src as usize].sends += pieces;
        counts[src as usize].relative |= plan.buffer(c.src.buf).instances > 1;
        for d in &c.dsts {
            let t = plan.buffer(d.buf).tile as usize;
            if last_src[t] == src {
                *counts[t].groups.last_mut().expect("a group is open") += pieces;
            } else {
                counts[t].groups.push(pieces);
                last_src[t] = src;
            }
        }
    }
    counts
}

/// The phase's messages before they are cut at [`MAX_MESSAGE`]: runs of copies in
/// which each continues the one before (its source bytes follow that copy's in
/// the same buffer, and each destination follows that copy's matching one), as
/// (the run's first copy, its bytes), by source tile, then source buffer and
/// offset (so a tile's messages are numbered in that order). Redistributions cut
/// tensors into rows and blocks, and a tile's consecutive pieces sometimes travel
/// together: each message saved is code on the sender and on every receiver.
/// Same bytes, same places.
fn runs(copies: &[Copy], tile_of: impl Fn(BufId) -> u32) -> Vec<(usize, u32)> {
    let key = |c: &Copy| (tile_of(c.src.buf), c.src.buf, c.src.offset);
    let mut order: Vec<usize> = (0..copies.len()).collect();
    // Lowerings mostly emit copies in this order already.
    if !order.is_sorted_by_key(|&i| key(&copies[i])) {
        order.sort_by_key(|&i| key(&copies[i]));
    }
    let mut out: Vec<(usize, u32)> = Vec::with_capacity(order.len());
    let mut last: Option<usize> = None;
    for i in order {
        if let (Some(l), Some(run)) = (last, out.last_mut())
            && continues(&copies[l], &copies[i])
        {
            run.1 += copies[i].bytes;
        } else {
            out.push((i, copies[i].bytes));
        }
        last = Some(i);
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

/// Cycles each tile's exchange code takes in a phase (from its counts).
pub fn code_cycles(machine: &Machine, counts: &[TileCounts]) -> Vec<u64> {
    counts
        .iter()
        .map(|c| {
            tessera_kernels::exchange::block_cycles(&machine.timing, c.sends, &c.groups, c.relative)
        })
        .collect()
}

/// Bytes of exchange code each tile holds for the whole program: every phase's
/// block. It lives in executable SRAM beside the tile's buffers, so the fit loop
/// counts it.
pub fn code_bytes_per_tile(plan: &TilePlan) -> Vec<u64> {
    use rayon::prelude::*;
    // Phases in parallel (a batch-4 layer has millions of landings), summed in
    // phase order.
    let per_phase: Vec<Vec<u32>> = plan
        .exchanges
        .par_iter()
        .map(|x| {
            exchange_counts(plan, x)
                .iter()
                .map(TileCounts::code_bytes)
                .collect()
        })
        .collect();
    let mut bytes = vec![0u64; plan.tiles as usize];
    for phase in per_phase {
        for (t, b) in phase.into_iter().enumerate() {
            bytes[t] += u64::from(b);
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

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

    /// The runs as copies: what the messages move.
    fn coalesced(copies: &[Copy]) -> Vec<Copy> {
        runs(copies, |b| b.0 % 3)
            .into_iter()
            .map(|(i, bytes)| Copy {
                bytes,
                ..copies[i].clone()
            })
            .collect()
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
