//! The public problem and result types, and the JSON schema (see `docs/placement.md`).
//!
//! Steps in JSON problems are inclusive: a request with `first: 2, last: 5` is live
//! at steps 2, 3, 4 and 5. Addresses are absolute tile addresses.

use serde::{Deserialize, Serialize};

// The class is a fact of the memory map, defined with it; re-exported so that
// problems keep naming it `tessera_place::MemClass`.
pub use tessera_machine::MemClass;

fn one() -> u64 {
    1
}

/// One buffer to place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub name: String,
    pub size: u64,
    /// Power of two; the address is a multiple of it.
    #[serde(default = "one")]
    pub align: u64,
    /// The occupied size is `size` rounded up to a multiple of this (power of two).
    #[serde(default = "one")]
    pub end_round: u64,
    /// First step at which the request is live (inclusive).
    pub first: u64,
    /// Last step at which the request is live (inclusive).
    pub last: u64,
    #[serde(default)]
    pub class: MemClass,
    /// Bytes a kernel may read past the (rounded) end; they must lie in the same region.
    #[serde(default)]
    pub tail: u64,
    /// Initialised by the loader: must end at or below the loader limit.
    #[serde(default)]
    pub loaded: bool,
    /// Free-form label for diagnostics ("weights", "activations", ...); defaults to
    /// the memory class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
}

/// A fixed address range nothing may overlap, at any step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reservation {
    pub name: String,
    pub start: u64,
    /// One past the last reserved byte.
    pub end: u64,
}

/// `name` lives at the address of `of` plus `offset` (a view or an in-place output).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Alias {
    pub name: String,
    pub of: String,
    #[serde(default)]
    pub offset: i64,
}

/// `count` buffers of one shape walked by one pointer; the engine picks the stride.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sequence {
    pub name: String,
    pub count: u64,
    pub size: u64,
    #[serde(default = "one")]
    pub align: u64,
    #[serde(default = "one")]
    pub end_round: u64,
    pub first: u64,
    pub last: u64,
    #[serde(default)]
    pub class: MemClass,
    #[serde(default)]
    pub tail: u64,
    #[serde(default)]
    pub loaded: bool,
    /// The members are streamed together: no two may share a memory element.
    #[serde(default)]
    pub separate: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
}

/// Everything to place on one tile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TileProblem {
    #[serde(default)]
    pub tile: u32,
    #[serde(default)]
    pub requests: Vec<Request>,
    #[serde(default)]
    pub reservations: Vec<Reservation>,
    /// Groups of request or sequence names that must not share a memory element.
    #[serde(default)]
    pub separation: Vec<Vec<String>>,
    #[serde(default)]
    pub aliases: Vec<Alias>,
    #[serde(default)]
    pub sequences: Vec<Sequence>,
}

/// A JSON problem file: one or many tiles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Problem {
    /// Machine preset or TOML path; `c600` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    pub tiles: Vec<TileProblem>,
}

impl Problem {
    /// Parses a problem: either `{"tiles": [...]}` or a single tile object.
    pub fn from_json(text: &str) -> Result<Problem, crate::PlaceError> {
        Problem::parse(text, "JSON problem")
    }

    /// Parses a problem; errors name `origin` (the file) with the line and column
    /// serde_json reports.
    pub fn parse(text: &str, origin: &str) -> Result<Problem, crate::PlaceError> {
        let located = |e: serde_json::Error| {
            // serde_json appends " at line L column C"; the position leads instead.
            let suffix = format!(" at line {} column {}", e.line(), e.column());
            let message = e.to_string();
            let message = message
                .strip_suffix(&suffix)
                .unwrap_or(&message)
                .to_string();
            crate::PlaceError::Parse {
                what: format!("{origin}:{}:{}", e.line(), e.column()),
                message,
            }
        };
        let value: serde_json::Value = serde_json::from_str(text).map_err(located)?;
        // Typed parsing from the text, not from `value`: only the text has positions.
        if value.get("tiles").is_some() {
            serde_json::from_str::<Problem>(text).map_err(located)
        } else {
            serde_json::from_str::<TileProblem>(text)
                .map(|t| Problem {
                    machine: None,
                    tiles: vec![t],
                })
                .map_err(located)
        }
    }

    /// Refuses tile numbers the machine does not have and tiles listed twice:
    /// either would place one tile's buffers against another tile's rules or merge
    /// two problems silently. `text`, the problem's JSON, locates the tile's line.
    pub fn check_tiles(
        &self,
        m: &tessera_machine::Machine,
        origin: &str,
        text: &str,
    ) -> Result<(), crate::PlaceError> {
        let at = |i: usize| match tile_line(text, i) {
            Some(line) => format!("{origin}:{line}"),
            None => origin.to_string(),
        };
        let mut first = std::collections::HashMap::new();
        for (i, t) in self.tiles.iter().enumerate() {
            if t.tile >= m.tiles {
                return Err(crate::PlaceError::Invalid(format!(
                    "{}: tiles[{i}].tile = {}: machine `{}` has tiles 0 to {}",
                    at(i),
                    t.tile,
                    m.name,
                    m.tiles - 1
                )));
            }
            if let Some(j) = first.insert(t.tile, i) {
                return Err(crate::PlaceError::Invalid(format!(
                    "{}: tiles[{i}].tile = {}: tile {} is listed twice (also tiles[{j}])",
                    at(i),
                    t.tile,
                    t.tile
                )));
            }
        }
        Ok(())
    }
}

/// The line on which the `i`th tile object of a problem's `tiles` starts (1 for a
/// single-tile problem, which is the whole text).
fn tile_line(text: &str, i: usize) -> Option<usize> {
    #[derive(Deserialize)]
    struct Raw<'a> {
        #[serde(borrow)]
        tiles: Vec<&'a serde_json::value::RawValue>,
    }
    let offset = match serde_json::from_str::<Raw>(text) {
        Ok(raw) => {
            let t = raw.tiles.get(i)?.get();
            // The raw value borrows from `text`: its address gives its offset.
            (t.as_ptr() as usize).checked_sub(text.as_ptr() as usize)?
        }
        Err(_) if i == 0 => text.len() - text.trim_start().len(),
        Err(_) => return None,
    };
    Some(text.get(..offset)?.matches('\n').count() + 1)
}

/// One placed request or sequence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub id: String,
    /// Absolute address (tile problems) or offset from the arena start (CSV).
    pub offset: u64,
    /// Distance between consecutive members, for sequences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stride: Option<u64>,
}

/// Which allocator produced a placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Lifetime-ordered first fit (the default, as in the seed).
    Lifetime,
    /// Decreasing alignment, size and duration, first fit against overlapping lifetimes.
    Retry,
    /// Bounded branch and bound.
    Search,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Lifetime => "lifetime",
            Mode::Retry => "retry",
            Mode::Search => "search",
        }
    }
}

/// A placement of one tile's requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TilePlacement {
    pub tile: u32,
    pub mode_used: Mode,
    /// Highest end address used (exclusive), tails excluded.
    pub peak: u64,
    pub allocations: Vec<Allocation>,
}

impl TilePlacement {
    pub fn offset_of(&self, id: &str) -> Option<u64> {
        self.allocations
            .iter()
            .find(|a| a.id == id)
            .map(|a| a.offset)
    }
}
