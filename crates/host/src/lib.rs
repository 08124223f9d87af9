//! Host transfers: how named weights, inputs and outputs move between the host
//! and tile SRAM. This crate owns the slicing of host bindings into link packets,
//! the phases in which every tile takes part in at most one transfer, the per-tile
//! bound on descriptor storage (counted before packet-cache deduplication, so it
//! holds for any tensor addresses), the packet cache that stores identical
//! descriptor blocks once per tile, and the one emitter that writes descriptor
//! blocks and the supervisor's host instructions, both for provisional sizing and
//! for the final package. It must never choose tensor addresses (they come in with
//! the bindings, provisional or final, and descriptor storage is placed only in
//! ranges the caller hands over); it must never size storage from anything but
//! binding sizes and tile membership; and it must never emit descriptors by any
//! second path: [`encode_block`] is the only encoder, and [`emit_tile`] the only
//! placer, of descriptor bytes. The format it writes is the simulator's
//! `hostxfer` descriptor list (docs/isa.md); the design is in docs/host.md.

mod emit;
mod plan;

pub use emit::*;
pub use plan::*;

/// Why a host plan or its emission failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("host binding #{index} has an empty name")]
    EmptyName { index: usize },
    #[error("host binding `{0}` is defined twice")]
    DuplicateBinding(String),
    #[error("{count} host bindings: a descriptor indexes at most 65,536")]
    TooManyBindings { count: usize },
    #[error("the machine's host packet payload is 0 bytes")]
    ZeroPayload,
    #[error("host binding `{binding}` slice {slice} is empty")]
    EmptySlice { binding: String, slice: usize },
    #[error(
        "host binding `{binding}` slice {slice}: bytes {offset}..{end} exceed the {bytes} bytes of the binding",
        end = u64::from(*offset) + u64::from(*len)
    )]
    SliceOutsideBinding {
        binding: String,
        slice: usize,
        offset: u32,
        len: u32,
        bytes: u32,
    },
    #[error(
        "host binding `{binding}` slice {slice} is on tile {tile}; the machine has {tiles} tiles"
    )]
    TileOutOfRange {
        binding: String,
        slice: usize,
        tile: u32,
        tiles: u32,
    },
    #[error(
        "host binding `{binding}` slice {slice}: tile range {tile_addr:#x}+{len} is outside SRAM {start:#x}..{end:#x}"
    )]
    SliceOutsideSram {
        binding: String,
        slice: usize,
        tile_addr: u32,
        len: u32,
        start: u32,
        end: u32,
    },
    #[error(
        "output binding `{binding}`: slices {a} and {b} both write host bytes from offset {offset}"
    )]
    OverlappingOutput {
        binding: String,
        a: usize,
        b: usize,
        offset: u32,
    },
    #[error("tile {tile} would need more than 4 GiB of host descriptors")]
    TooLarge { tile: u32 },
    #[error("tile {tile} is not a tile of the machine ({tiles} tiles)")]
    NoSuchTile { tile: u32, tiles: u32 },
    #[error("host phase {phase} does not exist (the plan has {phases})")]
    NoSuchPhase { phase: usize, phases: usize },
    #[error("$m{0} cannot hold a descriptor address")]
    BadRegister(u8),
    #[error("descriptor ranges {a:#x}..{} and {b:#x}.. overlap", a_end)]
    OverlappingRanges { a: u32, a_end: u32, b: u32 },
    #[error(
        "internal error: tile {tile} needs {needed} bytes of host descriptors, more than the {bound} bytes bound reserved before tensor placement"
    )]
    ExceedsBound { tile: u32, needed: u32, bound: u32 },
    #[error(
        "tile {tile}: no room for a {block}-byte host descriptor block ({needed} bytes needed in all, {available} available in the given ranges)"
    )]
    NoRoom {
        tile: u32,
        block: u32,
        needed: u32,
        available: u32,
    },
}
