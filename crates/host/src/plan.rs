//! The host plan: bindings sliced into packets, packets grouped into phases, and
//! the per-tile descriptor storage bound. Nothing here reads a tile address except
//! to copy it into a [`Packet`]; that is what makes the bound hold at any address.

use crate::HostError;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::ops::Range;
use tessera_machine::Machine;
use tessera_package::{BindingKind, BindingSlice, HostBinding};

/// Bytes of one record in a descriptor block (docs/isa.md, host section). A
/// record covers a whole slice: the link, not the descriptor, cuts it into
/// payload-sized packets, so a tile's storage grows with its slices, not its
/// bytes.
pub const RECORD_BYTES: u32 = 16;
/// Bytes of a descriptor block's record count.
pub const BLOCK_HEADER_BYTES: u32 = 4;
/// Phases run weights first (initialisation), then inputs, then outputs, so a
/// driver can put compute between the input and output phases.
pub const KIND_ORDER: [BindingKind; 3] =
    [BindingKind::Weight, BindingKind::Input, BindingKind::Output];

/// Whether all of a kind's transfers share one phase, each tile's block listing
/// its transfers of that kind, instead of one transfer per tile per phase.
/// Weights stream once, before anything runs, so splitting them into phases
/// buys nothing and costs every tile a snippet, a sync and a link overhead per
/// phase. Inputs and outputs keep one transfer per phase, which keeps each
/// block to one record (so the packet cache can share repeated ones) and the
/// per-inference schedule as it was.
pub fn one_phase(kind: BindingKind) -> bool {
    kind == BindingKind::Weight
}

/// Where a byte range of a binding lives on a tile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceSpec {
    pub tile: u32,
    /// Byte offset within the binding's host buffer.
    pub offset: u32,
    pub bytes: u32,
    /// Provisional (sizing) or final (emission) tile address; never used to size.
    pub tile_addr: u32,
}

/// A named host buffer and its per-tile slices, as the tile plan gives them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingSpec {
    pub name: String,
    pub kind: BindingKind,
    /// Total bytes of the host buffer.
    pub bytes: u32,
    pub slices: Vec<SliceSpec>,
}

/// One slice moved in one phase: a tile's whole part in that phase.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Transfer {
    pub tile: u32,
    /// Index into the plan's bindings, which is the package's binding index.
    pub binding: u16,
    /// Index into that binding's slices.
    pub slice: u32,
    pub offset: u32,
    pub bytes: u32,
    pub tile_addr: u32,
    /// Link packets the transfer takes: its bytes in payload-sized pieces. Its
    /// descriptor is one record whatever this count.
    pub packets: u32,
}

/// One descriptor record: a contiguous run of bytes between a host buffer and a
/// tile, which the link carries as `bytes.div_ceil(payload)` packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Record {
    pub binding: u16,
    pub to_host: bool,
    pub host_offset: u32,
    pub tile_addr: u32,
    pub bytes: u32,
}

/// One link packet: at most the payload, in offset order within its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Packet {
    pub binding: u16,
    pub to_host: bool,
    pub host_offset: u32,
    pub tile_addr: u32,
    pub bytes: u32,
}

/// One chip-wide host phase: every tile of the program executes its snippet; the
/// tiles listed here move one slice each, the others an empty block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Phase {
    pub kind: BindingKind,
    /// At most one per tile, in tile order.
    pub transfers: Vec<Transfer>,
}

/// One kind's share of a tile's host storage: the figures behind its bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KindUsage {
    pub kind: BindingKind,
    /// Phases of this kind in the plan: the tile runs a snippet for each.
    pub phases: u32,
    /// Phases the tile takes part in, one block each.
    pub joined: u32,
    /// Records in those blocks: one per transfer.
    pub records: u32,
    /// Link packets and payload bytes the tile's transfers of this kind move.
    pub packets: u64,
    pub bytes: u64,
    /// Bytes of the joined phases' blocks.
    pub descriptor_bytes: u64,
    /// What those blocks would take with a record per packet and a phase per
    /// transfer (the seed's format, without run-length records or the weights'
    /// single phase), kept so the saving stays measurable.
    pub per_packet_descriptor_bytes: u64,
    /// Supervisor code of this kind's snippets.
    pub snippet_bytes: u64,
}

/// Where one tile's host bytes go: descriptor blocks per kind, the shared empty
/// block, and the snippets' code (which lives in the supervisor program, not in
/// the reservation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TileUsage {
    pub tile: u32,
    pub kinds: Vec<KindUsage>,
    /// The empty block, when the tile sits out a phase.
    pub empty_block_bytes: u32,
    /// The tile's bound: blocks and empty block, rounded up to 4.
    pub bound: u32,
}

/// A host plan for one set of bindings on one machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPlan {
    pub(crate) tiles: u32,
    pub(crate) payload: u32,
    pub(crate) sram_start: u32,
    pub(crate) sram_end: u32,
    pub(crate) loader_limit: u32,
    pub(crate) bindings: Vec<BindingSpec>,
    pub(crate) phases: Vec<Phase>,
    /// Per tile, (phase, index into that phase's transfers), by phase.
    pub(crate) by_tile: Vec<Vec<(u32, u32)>>,
    bound: Vec<u32>,
}

/// Records needed for `bytes` at `payload` bytes per packet.
pub fn packet_count(bytes: u32, payload: u32) -> u32 {
    bytes.div_ceil(payload.max(1))
}

impl HostPlan {
    /// Slices, phases and the storage bound. Validates the bindings' shape
    /// (names, slice ranges within the buffer, tiles, non-overlapping output
    /// slices) but deliberately not tile addresses, so provisional addresses of
    /// any value plan the same (see [`HostPlan::check_addresses`]).
    pub fn new(machine: &Machine, bindings: &[BindingSpec]) -> Result<HostPlan, HostError> {
        let payload = machine.timing.host_packet_payload_bytes;
        if payload == 0 {
            return Err(HostError::ZeroPayload);
        }
        if bindings.len() > usize::from(u16::MAX) + 1 {
            return Err(HostError::TooManyBindings {
                count: bindings.len(),
            });
        }
        let mut names = HashSet::new();
        for (index, b) in bindings.iter().enumerate() {
            if b.name.is_empty() {
                return Err(HostError::EmptyName { index });
            }
            if !names.insert(b.name.as_str()) {
                return Err(HostError::DuplicateBinding(b.name.clone()));
            }
            validate_slices(b, machine.tiles)?;
        }

        let tiles = machine.tiles as usize;
        let mut phases = Vec::new();
        let mut by_tile: Vec<Vec<(u32, u32)>> = vec![Vec::new(); tiles];
        for kind in KIND_ORDER {
            // Each tile's transfers of this kind, in an order that depends only on
            // binding order and host offsets, never on tile addresses.
            let mut queue: Vec<Vec<Transfer>> = vec![Vec::new(); tiles];
            for (bi, b) in bindings.iter().enumerate().filter(|(_, b)| b.kind == kind) {
                for (si, s) in b.slices.iter().enumerate() {
                    queue[s.tile as usize].push(Transfer {
                        tile: s.tile,
                        binding: bi as u16,
                        slice: si as u32,
                        offset: s.offset,
                        bytes: s.bytes,
                        tile_addr: s.tile_addr,
                        packets: packet_count(s.bytes, payload),
                    });
                }
            }
            for q in &mut queue {
                q.sort_by_key(|t| (t.binding, t.offset, t.bytes, t.slice));
            }
            let depth = queue.iter().map(Vec::len).max().unwrap_or(0);
            let count = if one_phase(kind) { depth.min(1) } else { depth };
            let first = phases.len();
            for _ in 0..count {
                phases.push(Phase {
                    kind,
                    transfers: Vec::new(),
                });
            }
            for (tile, q) in queue.into_iter().enumerate() {
                for (k, t) in q.into_iter().enumerate() {
                    let p = first + if one_phase(kind) { 0 } else { k };
                    by_tile[tile].push((p as u32, phases[p].transfers.len() as u32));
                    phases[p].transfers.push(t);
                }
            }
        }

        let mut plan = HostPlan {
            tiles: machine.tiles,
            payload,
            sram_start: machine.sram_start(),
            sram_end: machine.sram_end(),
            loader_limit: machine.loader_limit,
            bindings: bindings.to_vec(),
            phases,
            by_tile,
            bound: Vec::new(),
        };
        plan.bound = (0..machine.tiles)
            .map(|t| plan.count_before_dedup(t))
            .collect::<Result<_, _>>()?;
        Ok(plan)
    }

    /// Descriptor bytes of `tile` before deduplication: a block per phase it
    /// takes part in, of one record per transfer, plus one shared empty block if
    /// it sits out any phase. Reads only phase membership.
    fn count_before_dedup(&self, tile: u32) -> Result<u32, HostError> {
        let mine = &self.by_tile[tile as usize];
        let joined = self.joined(tile);
        let mut total = u64::from(BLOCK_HEADER_BYTES) * joined as u64;
        total += u64::from(RECORD_BYTES) * mine.len() as u64;
        if joined < self.phases.len() {
            total += u64::from(BLOCK_HEADER_BYTES);
        }
        let total = total.next_multiple_of(4);
        u32::try_from(total).map_err(|_| HostError::TooLarge { tile })
    }

    /// Where `tile`'s host bytes go, kind by kind (`None` for a tile outside the
    /// machine).
    pub fn usage(&self, tile: u32) -> Option<TileUsage> {
        let mine = self.by_tile.get(tile as usize)?;
        let kinds = KIND_ORDER
            .iter()
            .map(|&kind| {
                let phases = self.phases_of(kind);
                let mut u = KindUsage {
                    kind,
                    phases: phases.len() as u32,
                    joined: 0,
                    records: 0,
                    packets: 0,
                    bytes: 0,
                    descriptor_bytes: 0,
                    per_packet_descriptor_bytes: 0,
                    snippet_bytes: u64::from(crate::SNIPPET_BYTES) * phases.len() as u64,
                };
                let mut last = None;
                for &(p, i) in mine.iter().filter(|e| phases.contains(&(e.0 as usize))) {
                    let t = &self.phases[p as usize].transfers[i as usize];
                    if last != Some(p) {
                        u.joined += 1;
                        u.descriptor_bytes += u64::from(BLOCK_HEADER_BYTES);
                        last = Some(p);
                    }
                    u.records += 1;
                    u.packets += u64::from(t.packets);
                    u.bytes += u64::from(t.bytes);
                    u.descriptor_bytes += u64::from(RECORD_BYTES);
                    u.per_packet_descriptor_bytes += u64::from(BLOCK_HEADER_BYTES)
                        + u64::from(RECORD_BYTES) * u64::from(t.packets);
                }
                u
            })
            .collect();
        Some(TileUsage {
            tile,
            kinds,
            empty_block_bytes: if self.joined(tile) < self.phases.len() {
                BLOCK_HEADER_BYTES
            } else {
                0
            },
            bound: self.bound(tile),
        })
    }

    /// The tile with the largest bound (the lowest such tile), which sizes the
    /// common reservation.
    pub fn busiest_tile(&self) -> u32 {
        let max = self.max_bound();
        self.bound.iter().position(|&b| b == max).unwrap_or(0) as u32
    }

    /// Every phase, in execution order.
    pub fn phases(&self) -> &[Phase] {
        &self.phases
    }

    /// The phases of one kind: a contiguous range, in [`KIND_ORDER`].
    pub fn phases_of(&self, kind: BindingKind) -> Range<usize> {
        let start = self.phases.iter().position(|p| p.kind == kind);
        match start {
            Some(s) => {
                s..s + self.phases[s..]
                    .iter()
                    .take_while(|p| p.kind == kind)
                    .count()
            }
            None => {
                // An empty range where the kind would sit keeps ranges ordered.
                let rank = KIND_ORDER.iter().position(|&k| k == kind).unwrap_or(0);
                let at = self
                    .phases
                    .iter()
                    .position(|p| KIND_ORDER.iter().position(|&k| k == p.kind).unwrap_or(0) > rank)
                    .unwrap_or(self.phases.len());
                at..at
            }
        }
    }

    /// The bindings, in the order descriptors index them.
    pub fn bindings(&self) -> &[BindingSpec] {
        &self.bindings
    }

    /// The machine's packet payload the plan sliced with.
    pub fn payload(&self) -> u32 {
        self.payload
    }

    /// `tile`'s transfer in `phase`, if it takes part.
    pub fn transfer(&self, tile: u32, phase: usize) -> Option<&Transfer> {
        self.transfers(tile, phase).next()
    }

    /// `tile`'s transfers in `phase`, in record order: at most one, except in a
    /// kind that runs in [`one_phase`].
    pub fn transfers(&self, tile: u32, phase: usize) -> impl Iterator<Item = &Transfer> {
        let mine = self
            .by_tile
            .get(tile as usize)
            .map_or(&[][..], Vec::as_slice);
        let p = phase as u32;
        let from = mine.partition_point(|e| e.0 < p);
        let to = mine.partition_point(|e| e.0 <= p);
        mine[from..to]
            .iter()
            .filter_map(move |e| self.phases.get(phase)?.transfers.get(e.1 as usize))
    }

    /// Phases `tile` takes part in.
    fn joined(&self, tile: u32) -> usize {
        let mine = &self.by_tile[tile as usize];
        mine.iter()
            .enumerate()
            .filter(|&(k, e)| k == 0 || mine[k - 1].0 != e.0)
            .count()
    }

    /// The descriptor record of a transfer: the whole slice.
    pub fn record(&self, t: &Transfer) -> Record {
        Record {
            binding: t.binding,
            to_host: self.to_host(t),
            host_offset: t.offset,
            tile_addr: t.tile_addr,
            bytes: t.bytes,
        }
    }

    fn to_host(&self, t: &Transfer) -> bool {
        self.bindings
            .get(usize::from(t.binding))
            .is_some_and(|b| b.kind == BindingKind::Output)
    }

    /// The link packets of a transfer: its bytes in pieces of at most the
    /// payload, in offset order.
    pub fn packets(&self, t: &Transfer) -> impl Iterator<Item = Packet> + use<> {
        let to_host = self.to_host(t);
        let (binding, payload, offset, bytes, addr) =
            (t.binding, self.payload, t.offset, t.bytes, t.tile_addr);
        (0..t.packets).map(move |k| {
            let skip = k * payload;
            Packet {
                binding,
                to_host,
                host_offset: offset + skip,
                tile_addr: addr.wrapping_add(skip),
                bytes: payload.min(bytes - skip),
            }
        })
    }

    /// Descriptor bytes per tile before deduplication, rounded up to 4: the
    /// storage bound, indexed by tile. Independent of tile addresses.
    pub fn bound_per_tile(&self) -> &[u32] {
        &self.bound
    }

    /// The bound of one tile (0 for a tile outside the machine).
    pub fn bound(&self, tile: u32) -> u32 {
        self.bound.get(tile as usize).copied().unwrap_or(0)
    }

    /// The largest per-tile bound: the size of the common reservation.
    pub fn max_bound(&self) -> u32 {
        self.bound.iter().copied().max().unwrap_or(0)
    }

    /// The temporary descriptor range provisional sizing emits into: it starts
    /// at SRAM and is never part of a package, so sizing needs no hole in tensor
    /// placement.
    pub fn provisional_range(&self) -> (u32, u32) {
        (
            self.sram_start,
            self.sram_start.saturating_add(self.max_bound()),
        )
    }

    /// Descriptor records over all phases and tiles: one per transfer.
    pub fn record_total(&self) -> u64 {
        self.phases.iter().map(|p| p.transfers.len() as u64).sum()
    }

    /// Link packets over all phases and tiles.
    pub fn packet_total(&self) -> u64 {
        self.phases
            .iter()
            .flat_map(|p| &p.transfers)
            .map(|t| u64::from(t.packets))
            .sum()
    }

    /// Payload bytes one phase moves over the shared link.
    pub fn phase_bytes(&self, phase: usize) -> u64 {
        self.phases
            .get(phase)
            .map_or(0, |p| p.transfers.iter().map(|t| u64::from(t.bytes)).sum())
    }

    /// Cycles the link is busy for `phases` on `machine`, by the simulator's host
    /// model (fixed overhead plus bytes over the link in the phase's direction, per
    /// phase); syncs and supervisor issue are not included.
    pub fn link_cycles(&self, machine: &Machine, phases: Range<usize>) -> u64 {
        phases
            .filter_map(|p| self.phases.get(p).map(|ph| (p, ph.kind)))
            .map(|(p, kind)| {
                let bytes = self.phase_bytes(p);
                match kind {
                    BindingKind::Output => machine.host_phase_cycles(0, bytes),
                    BindingKind::Input | BindingKind::Weight => machine.host_phase_cycles(bytes, 0),
                }
            })
            .sum()
    }

    /// Checks that every slice lies in tile SRAM: the final plan's addresses
    /// must, provisional ones need not.
    pub fn check_addresses(&self) -> Result<(), HostError> {
        for b in &self.bindings {
            for (slice, s) in b.slices.iter().enumerate() {
                let end = u64::from(s.tile_addr) + u64::from(s.bytes);
                if s.tile_addr < self.sram_start || end > u64::from(self.sram_end) {
                    return Err(HostError::SliceOutsideSram {
                        binding: b.name.clone(),
                        slice,
                        tile_addr: s.tile_addr,
                        len: s.bytes,
                        start: self.sram_start,
                        end: self.sram_end,
                    });
                }
            }
        }
        Ok(())
    }

    /// The package's bindings: exactly these, in this order, since descriptor
    /// records name bindings by index.
    pub fn package_bindings(&self) -> Vec<HostBinding> {
        self.bindings
            .iter()
            .map(|b| HostBinding {
                data: Vec::new(),
                name: b.name.clone(),
                kind: b.kind,
                bytes: b.bytes,
                slices: b
                    .slices
                    .iter()
                    .map(|s| BindingSlice {
                        tile: s.tile,
                        tile_addr: s.tile_addr,
                        offset: s.offset,
                        bytes: s.bytes,
                    })
                    .collect(),
            })
            .collect()
    }
}

fn validate_slices(b: &BindingSpec, tiles: u32) -> Result<(), HostError> {
    for (slice, s) in b.slices.iter().enumerate() {
        if s.bytes == 0 {
            return Err(HostError::EmptySlice {
                binding: b.name.clone(),
                slice,
            });
        }
        if u64::from(s.offset) + u64::from(s.bytes) > u64::from(b.bytes) {
            return Err(HostError::SliceOutsideBinding {
                binding: b.name.clone(),
                slice,
                offset: s.offset,
                len: s.bytes,
                bytes: b.bytes,
            });
        }
        if s.tile >= tiles {
            return Err(HostError::TileOutOfRange {
                binding: b.name.clone(),
                slice,
                tile: s.tile,
                tiles,
            });
        }
    }
    if b.kind == BindingKind::Output {
        // Two tiles writing the same host bytes would make the result depend on
        // record order; the package validator rejects it too.
        let mut order: Vec<usize> = (0..b.slices.len()).collect();
        order.sort_by_key(|&i| (b.slices[i].offset, i));
        for w in order.windows(2) {
            let (x, y) = (&b.slices[w[0]], &b.slices[w[1]]);
            if y.offset < x.offset + x.bytes {
                return Err(HostError::OverlappingOutput {
                    binding: b.name.clone(),
                    a: w[0],
                    b: w[1],
                    offset: y.offset,
                });
            }
        }
    }
    Ok(())
}
