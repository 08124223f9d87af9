//! The in-memory package model. The binary format (format.rs) is a faithful,
//! validated serialisation of exactly these types.

use serde::{Deserialize, Serialize};

/// Access permissions of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Perms {
    pub read: bool,
    pub write: bool,
    pub execute: bool,
}

impl Perms {
    /// Code: read and execute.
    pub const RX: Perms = Perms {
        read: true,
        write: false,
        execute: true,
    };
    /// Data: read and write.
    pub const RW: Perms = Perms {
        read: true,
        write: true,
        execute: false,
    };
}

/// A contiguous range of one tile's SRAM with its initial contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// For diagnostics (`code`, `weights.fc1`, ...).
    pub name: String,
    pub addr: u32,
    /// Size in bytes; `bytes.len() <= size`, the rest is zero-filled at load.
    pub size: u32,
    /// Initial contents written by the loader (may be empty: a zero-filled range).
    pub bytes: Vec<u8>,
    pub perms: Perms,
}

/// What a symbol names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SymbolKind {
    Code,
    Data,
}

/// A named address range on one tile, for diagnostics and disassembly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Symbol {
    pub name: String,
    pub addr: u32,
    pub size: u32,
    pub kind: SymbolKind,
}

/// Everything the loader places on one tile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TileImage {
    pub tile: u32,
    pub segments: Vec<Segment>,
    /// Supervisor entry point.
    pub entry: u32,
    pub symbols: Vec<Symbol>,
}

/// The name of exchange phase `id`, for traces and profiles. What moves is the
/// tiles' own exchange code (`send`, `mux`, `recv`, ended by `exchange id`), which
/// lives in their segments like any other code: the package holds no list of
/// transfers beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExchangeProgram {
    pub id: u16,
    pub name: String,
}

/// The direction and lifetime of a host binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BindingKind {
    /// Host to tiles, every run.
    Input,
    /// Tiles to host, every run.
    Output,
    /// Host to tiles, once at initialisation.
    Weight,
}

/// Where a byte range of a binding lives on a tile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingSlice {
    pub tile: u32,
    pub tile_addr: u32,
    /// Byte offset within the binding's host buffer.
    pub offset: u32,
    pub bytes: u32,
}

/// A named host buffer and its per-tile slices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostBinding {
    pub name: String,
    pub kind: BindingKind,
    /// Total bytes of the host buffer.
    pub bytes: u32,
    pub slices: Vec<BindingSlice>,
    /// Host contents the package carries: for a Weight binding, the image the host
    /// streams to the tiles once, at initialisation (`bytes` long); empty for
    /// inputs and outputs, whose contents come and go with every run.
    pub data: Vec<u8>,
}

/// A complete, loadable program for a machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Package {
    /// The machine description it was built for, as TOML (so a package runs alone).
    pub machine_toml: String,
    /// Tiles in increasing tile order; tiles without an image stay idle.
    pub tiles: Vec<TileImage>,
    pub exchanges: Vec<ExchangeProgram>,
    pub bindings: Vec<HostBinding>,
}
