//! The one emitter: descriptor blocks, their deduplicated placement in the ranges
//! a caller hands over, and the supervisor snippet of each phase. Provisional
//! sizing and the final package both come through here.

use crate::{BLOCK_HEADER_BYTES, HostError, HostPlan, RECORD_BYTES};
use serde::Serialize;
use std::collections::HashMap;
use std::ops::Range;
use tessera_isa::{Inst, IntOp, MReg, Word};
use tessera_package::{Perms, Segment};

/// Words of one phase's supervisor snippet: `sync global`, the three words of
/// `li $mK, block`, `hostxfer $mK`. Fixed, so code size never depends on where
/// descriptors land.
pub const SNIPPET_WORDS: usize = 5;
/// Bytes of one phase's supervisor snippet.
pub const SNIPPET_BYTES: u32 = 4 * SNIPPET_WORDS as u32;

/// One contiguous run of placed descriptor blocks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostSegment {
    pub addr: u32,
    pub bytes: Vec<u8>,
}

/// One tile's emitted host data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TileHost {
    pub tile: u32,
    /// Placed blocks, in range order.
    pub segments: Vec<HostSegment>,
    /// Address of the block each phase's `hostxfer` reads, indexed by phase.
    pub phase_block_addr: Vec<u32>,
    /// Descriptor bytes after deduplication.
    pub bytes_used: u32,
    /// Descriptor bytes before deduplication (the bound's count, at this plan's
    /// addresses).
    pub bytes_before_dedup: u32,
    /// Records stored in the placed blocks.
    pub records_stored: u32,
    /// Records saved because their block repeats an earlier one on this tile.
    pub records_deduplicated: u32,
}

/// The descriptor block `tile` reads in `phase`: a u32 record count and that
/// many 16-byte records (binding index, flags, host offset, tile address,
/// length), or a count of 0 when the tile sits the phase out. A transfer is one
/// record however many packets it takes. The only encoder of descriptor bytes.
pub fn encode_block(plan: &HostPlan, tile: u32, phase: usize) -> Vec<u8> {
    let records: Vec<_> = plan
        .transfers(tile, phase)
        .map(|t| plan.record(t))
        .collect();
    let mut out =
        Vec::with_capacity(BLOCK_HEADER_BYTES as usize + RECORD_BYTES as usize * records.len());
    // A tile's records in one phase come from its slices, whose count the plan
    // already holds in u32.
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    for r in records {
        out.extend_from_slice(&r.binding.to_le_bytes());
        out.extend_from_slice(&u16::from(r.to_host).to_le_bytes());
        out.extend_from_slice(&r.host_offset.to_le_bytes());
        out.extend_from_slice(&r.tile_addr.to_le_bytes());
        out.extend_from_slice(&r.bytes.to_le_bytes());
    }
    out
}

/// Emits `tile`'s descriptor blocks, identical blocks stored once, first fit
/// into `ranges` taken in the given order (the reservation first, then any
/// otherwise unused ranges). Ranges are clipped to `[SRAM start, loader limit)`
/// and to 4-byte alignment. Needing more than `bound` bytes (the tile's bound
/// from provisional sizing) is [`HostError::ExceedsBound`], an internal error;
/// ranges too small are [`HostError::NoRoom`].
pub fn emit_tile(
    plan: &HostPlan,
    tile: u32,
    bound: u32,
    ranges: &[(u32, u32)],
) -> Result<TileHost, HostError> {
    if tile >= plan.tiles {
        return Err(HostError::NoSuchTile {
            tile,
            tiles: plan.tiles,
        });
    }
    // The packet cache: one stored block per distinct byte string.
    let mut distinct: Vec<Vec<u8>> = Vec::new();
    let mut index: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut block_of = Vec::with_capacity(plan.phases.len());
    let (mut before, mut sat_out) = (0u64, false);
    let (mut stored, mut saved) = (0u32, 0u32);
    for phase in 0..plan.phases.len() {
        let block = encode_block(plan, tile, phase);
        let records = u32::try_from((block.len() - 4) / RECORD_BYTES as usize).unwrap_or(u32::MAX);
        if records == 0 {
            sat_out = true;
        } else {
            before += block.len() as u64;
        }
        let k = match index.get(&block) {
            Some(&k) => {
                saved = saved.saturating_add(records);
                k
            }
            None => {
                stored = stored.saturating_add(records);
                index.insert(block.clone(), distinct.len());
                distinct.push(block);
                distinct.len() - 1
            }
        };
        block_of.push(k);
    }
    if sat_out {
        before += 4;
    }
    let too_large = || HostError::TooLarge { tile };
    let bytes_before_dedup = u32::try_from(before.next_multiple_of(4)).map_err(|_| too_large())?;
    let needed: u64 = distinct.iter().map(|b| b.len() as u64).sum();
    let needed = u32::try_from(needed).map_err(|_| too_large())?;
    if needed > bound {
        return Err(HostError::ExceedsBound {
            tile,
            needed,
            bound,
        });
    }

    let spans = usable_ranges(plan, ranges)?;
    let available = spans.iter().map(|r| r.1 - r.0).sum();
    let mut cursor: Vec<u32> = spans.iter().map(|r| r.0).collect();
    // Blocks are multiples of 4 bytes packed from an aligned start, so each
    // range's blocks, appended in placement order, form one contiguous segment.
    let mut contents: Vec<Vec<u8>> = vec![Vec::new(); spans.len()];
    let mut addr_of = Vec::with_capacity(distinct.len());
    for b in &distinct {
        let len = b.len() as u32;
        let Some(r) = (0..spans.len()).find(|&r| spans[r].1 - cursor[r] >= len) else {
            return Err(HostError::NoRoom {
                tile,
                block: len,
                needed,
                available,
            });
        };
        addr_of.push(cursor[r]);
        cursor[r] += len;
        contents[r].extend_from_slice(b);
    }
    let segments = spans
        .iter()
        .zip(contents)
        .filter(|(_, bytes)| !bytes.is_empty())
        .map(|(s, bytes)| HostSegment { addr: s.0, bytes })
        .collect();
    Ok(TileHost {
        tile,
        segments,
        phase_block_addr: block_of.iter().map(|&k| addr_of[k]).collect(),
        bytes_used: needed,
        bytes_before_dedup,
        records_stored: stored,
        records_deduplicated: saved,
    })
}

/// Provisional sizing: the same emission at [`HostPlan::provisional_range`]
/// against the plan's own bound. Its addresses are virtual; never package it.
pub fn emit_provisional(plan: &HostPlan, tile: u32) -> Result<TileHost, HostError> {
    let (start, _) = plan.provisional_range();
    let bound = plan.bound(tile);
    emit_tile(plan, tile, bound, &[(start, start.saturating_add(bound))])
}

fn usable_ranges(plan: &HostPlan, ranges: &[(u32, u32)]) -> Result<Vec<(u32, u32)>, HostError> {
    let mut spans = Vec::new();
    for &(s, e) in ranges {
        let s = s.max(plan.sram_start).next_multiple_of(4);
        // Descriptors are initialised bytes, so they must load.
        let e = e.min(plan.loader_limit) & !3;
        if s < e {
            spans.push((s, e));
        }
    }
    let mut sorted = spans.clone();
    sorted.sort_unstable();
    for w in sorted.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(HostError::OverlappingRanges {
                a: w[0].0,
                a_end: w[0].1,
                b: w[1].0,
            });
        }
    }
    Ok(spans)
}

/// `li $mK, imm`: always three words so snippet size never depends on `imm`.
fn li(reg: MReg, imm: u32) -> [Word; 3] {
    [
        Word::Single(Inst::Setzi {
            d: reg,
            imm: imm >> 12,
        }),
        Word::Single(Inst::IntImm {
            op: IntOp::Shl,
            d: reg,
            a: reg,
            imm: 12,
        }),
        Word::Single(Inst::IntImm {
            op: IntOp::Or,
            d: reg,
            a: reg,
            imm: (imm & 0xfff) as u16,
        }),
    ]
}

impl TileHost {
    /// The supervisor snippet of `phase`: `sync global` (so every tile's
    /// `hostxfer` of the phase lands in one superstep), `li reg, block`,
    /// `hostxfer reg`. [`SNIPPET_WORDS`] words; clobbers `reg`. Every tile of the
    /// program must run every phase's snippet, in phase order.
    pub fn supervisor_words(&self, phase: usize, reg: MReg) -> Result<Vec<Word>, HostError> {
        if reg.0 >= MReg::ZERO.0 {
            return Err(HostError::BadRegister(reg.0));
        }
        let &addr = self
            .phase_block_addr
            .get(phase)
            .ok_or(HostError::NoSuchPhase {
                phase,
                phases: self.phase_block_addr.len(),
            })?;
        let mut out = Vec::with_capacity(SNIPPET_WORDS);
        out.push(Word::Single(Inst::SyncGlobal));
        out.extend(li(reg, addr));
        out.push(Word::Single(Inst::HostXfer { desc: reg }));
        Ok(out)
    }

    /// The snippets of consecutive phases (e.g. [`HostPlan::phases_of`]).
    pub fn supervisor_code(&self, phases: Range<usize>, reg: MReg) -> Result<Vec<Word>, HostError> {
        let mut out = Vec::with_capacity(phases.len() * SNIPPET_WORDS);
        for p in phases {
            out.extend(self.supervisor_words(p, reg)?);
        }
        Ok(out)
    }

    /// The placed blocks as package segments (read-only data named
    /// `host.desc.N`).
    pub fn package_segments(&self) -> Vec<Segment> {
        self.segments
            .iter()
            .enumerate()
            .map(|(i, s)| Segment {
                name: format!("host.desc.{i}"),
                addr: s.addr,
                size: s.bytes.len() as u32,
                bytes: s.bytes.clone(),
                perms: Perms {
                    read: true,
                    write: false,
                    execute: false,
                },
            })
            .collect()
    }
}

/// Host descriptor storage over the tiles of a package, for reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct HostSummary {
    pub tiles: u32,
    pub bytes_before_dedup: u64,
    pub bytes_used: u64,
    /// The most any one tile uses (at most the common reservation).
    pub max_tile_bytes_used: u32,
    pub records_stored: u64,
    pub records_deduplicated: u64,
}

impl HostSummary {
    pub fn of(hosts: &[TileHost]) -> HostSummary {
        hosts
            .iter()
            .fold(HostSummary::default(), |s, h| HostSummary {
                tiles: s.tiles + 1,
                bytes_before_dedup: s.bytes_before_dedup + u64::from(h.bytes_before_dedup),
                bytes_used: s.bytes_used + u64::from(h.bytes_used),
                max_tile_bytes_used: s.max_tile_bytes_used.max(h.bytes_used),
                records_stored: s.records_stored + u64::from(h.records_stored),
                records_deduplicated: s.records_deduplicated + u64::from(h.records_deduplicated),
            })
    }
}
