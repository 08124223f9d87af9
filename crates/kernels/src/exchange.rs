//! Exchange code: one tile's part of one exchange phase as supervisor
//! instructions, which live in the tile's executable SRAM like any other code.
//!
//! The supervisor reaches a block with `call $m14, block` after its `sync global`.
//! The block sends (`send`: a message of this tile's bus, numbered in issue
//! order), then for each source tile points the incoming mux at it and lands the
//! messages it wants (`recv`), ends the phase with `exchange id` and returns. A
//! tile with nothing to move runs `exchange id` in place and has no block.
//!
//! Addresses go through `$m0..$m11`, a batch of up to twelve loaded before they
//! are used, so that no `send` or `recv` waits on the `setzi` before it. Every
//! word has one size whatever the addresses, so sizing before placement gives the
//! size emitted.

use tessera_isa::{Inst, MReg, Word};
use tessera_machine::Timing;

/// The largest message a `send` names; a longer copy goes as several. A multiple
/// of 8, so every piece of an aligned copy stays aligned.
pub const MAX_MESSAGE: u32 = 65_528;

/// The link register the supervisor calls a block with.
pub const LINK: MReg = MReg(14);

/// Address registers a batch loads before using them.
const BATCH: usize = 12;

/// The register that holds, inside a layer loop, the byte offset of the current
/// layer's instance of the tile's weight store: a relative block
/// ([`ExchangePart::relative`]) adds it to every address it sends from. Kernel
/// snippets use `$m0..=$m12` and blocks `$m0..=$m11` and the link, so it lives
/// across the whole body; the host snippets that also use it run outside loops.
pub const LAYER: MReg = MReg(13);

/// One tile's part of one exchange phase, at addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExchangePart {
    /// (address, bytes) of each message, in message order; bytes at most
    /// [`MAX_MESSAGE`].
    pub sends: Vec<(u32, u32)>,
    /// (source tile, message, address), grouped by source tile.
    pub recvs: Vec<(u32, u16, u32)>,
    /// The sends' addresses are the first layer's: each is offset by [`LAYER`]
    /// (a layer loop's staging of a layer's weights from its store).
    pub relative: bool,
}

impl ExchangePart {
    pub fn is_empty(&self) -> bool {
        self.sends.is_empty() && self.recvs.is_empty()
    }

    /// The block's words: sends, then receives by source, `exchange id`, return.
    pub fn words(&self, id: u16) -> Vec<Word> {
        let mut w = Vec::new();
        for batch in self.sends.chunks(BATCH) {
            for (r, &(addr, _)) in batch.iter().enumerate() {
                w.push(setzi(r, addr));
            }
            if self.relative {
                for r in 0..batch.len() {
                    w.push(Word::Single(Inst::Int {
                        op: tessera_isa::IntOp::Add,
                        d: reg(r),
                        a: reg(r),
                        b: LAYER,
                    }));
                }
            }
            for (r, &(_, bytes)) in batch.iter().enumerate() {
                let bytes = u16::try_from(bytes).expect("messages are cut at MAX_MESSAGE");
                w.push(Word::Single(Inst::Send { a: reg(r), bytes }));
            }
        }
        for group in self.recvs.chunk_by(|a, b| a.0 == b.0) {
            w.push(Word::Single(Inst::Mux { tile: group[0].0 }));
            for batch in group.chunks(BATCH) {
                for (r, &(_, _, addr)) in batch.iter().enumerate() {
                    w.push(setzi(r, addr));
                }
                for (r, &(_, msg, _)) in batch.iter().enumerate() {
                    w.push(Word::Single(Inst::Recv { a: reg(r), msg }));
                }
            }
        }
        w.push(Word::Single(Inst::Exchange { id }));
        w.push(Word::Single(Inst::Br { a: LINK }));
        w
    }

    /// Bytes of the block (none for an empty part, which has no block).
    pub fn code_bytes(&self) -> u32 {
        let groups = self.recvs.chunk_by(|a, b| a.0 == b.0).count();
        block_bytes(self.sends.len(), self.recvs.len(), groups, self.relative)
    }
}

/// Bytes of a block with `sends` messages sent and `recvs` landed from `groups`
/// source tiles (none when it moves nothing: such a tile has no block).
/// A relative block has an `add` per send.
pub fn block_bytes(sends: usize, recvs: usize, groups: usize, relative: bool) -> u32 {
    if sends == 0 && recvs == 0 {
        return 0;
    }
    let adds = if relative { sends } else { 0 };
    4 * (2 * sends + adds + groups + 2 * recvs + 2) as u32
}

fn reg(r: usize) -> MReg {
    MReg(r as u8)
}

fn setzi(r: usize, imm: u32) -> Word {
    Word::Single(Inst::Setzi { d: reg(r), imm })
}

/// Cycles from the supervisor's first issue after its `sync global` until it has
/// issued `exchange`: the `call` (a taken branch, so the pipeline refills), then
/// the block. `sends` is the tile's message count and `recv_groups` its received
/// messages per source tile, in block order. A tile with no part issues
/// `exchange` in place: one cycle. No worker runs during an exchange, so the
/// supervisor has every slot; the only waits are the refill and a batch shorter
/// than the result latency, whose first use waits for its first `setzi`. In a
/// relative block each send batch's `add`s wait the same way for the `setzi`s,
/// and its sends for the `add`s.
pub fn block_cycles(t: &Timing, sends: usize, recv_groups: &[usize], relative: bool) -> u64 {
    if sends == 0 && recv_groups.iter().all(|&n| n == 0) {
        return 1;
    }
    let latency = u64::from(t.supervisor_result_latency).max(1);
    let batches = |n: usize, waits: u64| -> u64 {
        let full = (n / BATCH) as u64;
        let rest = (n % BATCH) as u64;
        let b = BATCH as u64;
        let full_cost = full * (b + waits * b.max(latency));
        let rest_cost = if rest == 0 {
            0
        } else {
            rest + waits * rest.max(latency)
        };
        full_cost + rest_cost
    };
    let mut c = latency + batches(sends, if relative { 2 } else { 1 });
    for &n in recv_groups.iter().filter(|&&n| n > 0) {
        c += 1 + batches(n, 1);
    }
    c + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_machine::Machine;

    fn part(sends: usize, groups: &[usize], relative: bool) -> ExchangePart {
        let mut p = ExchangePart {
            relative,
            ..ExchangePart::default()
        };
        for i in 0..sends {
            p.sends.push((0x8_0000 + 8 * i as u32, 8));
        }
        for (g, &n) in groups.iter().enumerate() {
            for k in 0..n {
                p.recvs
                    .push((g as u32 + 1, k as u16, 0x9_0000 + 8 * k as u32));
            }
        }
        p
    }

    /// The closed form against the independent walk of the emitted words (the
    /// call's refill added, since the walk starts at the block).
    #[test]
    fn block_cycles_match_the_walk_of_its_words() {
        for latency in [1, 3, 6, 13] {
            let mut m = Machine::small();
            m.timing.supervisor_result_latency = latency;
            let t = &m.timing;
            for (sends, relative) in [0, 1, 2, 5, 6, 11, 12, 13, 24, 25, 40]
                .into_iter()
                .flat_map(|s| [(s, false), (s, true)])
            {
                for groups in [&[][..], &[1], &[3, 12], &[13, 1, 7], &[30]] {
                    let p = part(sends, groups, relative);
                    if p.is_empty() {
                        assert_eq!(block_cycles(t, 0, groups, relative), 1);
                        continue;
                    }
                    let words = p.words(7);
                    // The walk stops at the `exchange`: leave out the return.
                    let upto = &words[..words.len() - 1];
                    let walked = crate::timing::supervisor_cycles(t, upto, |_| Vec::new());
                    let refill = u64::from(latency).max(1);
                    assert_eq!(
                        block_cycles(t, sends, groups, relative),
                        refill + walked,
                        "latency {latency}, {sends} sends (relative: {relative}), groups {groups:?}"
                    );
                    assert_eq!(
                        p.code_bytes(),
                        crate::code_bytes(&words),
                        "{sends} sends, groups {groups:?}"
                    );
                }
            }
        }
    }
}
