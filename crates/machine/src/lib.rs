//! The machine description: architectural facts about an IPU-class tile machine, as
//! data. Every other crate reads it; it reads nothing of theirs. It owns tile counts,
//! clock, the SRAM map (regions, memory elements, the loader limit), context counts,
//! arithmetic and exchange rates, synchronisation overheads and the host link.
//!
//! It must never hold conventions (runtime layout, calling convention, package
//! format) or policies (mapping, allocator order): those change freely, facts change
//! only with evidence. Each number is sourced in `docs/machine.md`.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// Errors from loading or validating a machine description.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    #[error("unknown machine preset `{0}` (known: {known})", known = PRESETS.join(", "))]
    UnknownPreset(String),
    #[error("cannot read machine file {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("machine file {path} is not a valid description: {message}")]
    Parse { path: String, message: String },
    #[error("machine `{name}` is inconsistent: {message}")]
    Invalid { name: String, message: String },
}

/// Names accepted by [`Machine::preset`].
pub const PRESETS: &[&str] = &["c600", "bow", "small"];

/// One address region of tile SRAM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Region {
    /// First byte address of the region.
    pub start: u32,
    /// One past the last byte address.
    pub end: u32,
    /// Consecutive 64-bit words alternate between the two elements of a pair.
    pub interleaved: bool,
    /// Instructions may be fetched from this region.
    pub executable: bool,
    /// Size of one memory element in bytes (an interleaved pair spans twice this).
    pub element_bytes: u32,
}

impl Region {
    pub fn contains(&self, addr: u32) -> bool {
        self.start <= addr && addr < self.end
    }
    pub fn len(&self) -> u32 {
        self.end - self.start
    }
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
    /// Bytes of address space covered by one placement element: an element, or an
    /// element pair in an interleaved region. Separation rules work at this grain.
    pub fn element_span(&self) -> u32 {
        if self.interleaved {
            self.element_bytes * 2
        } else {
            self.element_bytes
        }
    }
}

/// Cycle costs and rates. All in tile clock cycles unless the name says otherwise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// f16 multiply-accumulates per cycle per tile from the AMP unit.
    pub amp_f16_macs_per_cycle: u32,
    /// f32 multiply-accumulates per cycle per tile from the AMP unit.
    pub amp_f32_macs_per_cycle: u32,
    /// Bytes per cycle a tile can send (and, separately, receive) on the exchange.
    pub exchange_bytes_per_cycle: u32,
    /// Tiles that share one receive bus.
    pub tiles_per_receive_bus: u32,
    /// Cycles for a chip-internal barrier synchronisation.
    pub sync_cycles: u32,
    /// Fixed cycles of overhead per exchange phase.
    pub exchange_overhead_cycles: u32,
    /// Host link bandwidth, bytes per second, for the whole chip.
    pub host_link_bytes_per_second: u64,
    /// Largest payload of one host link packet, bytes.
    pub host_packet_payload_bytes: u32,
    /// Local memory read bandwidth per tile, bytes per cycle.
    pub memory_read_bytes_per_cycle: u32,
    /// Cycles from a worker issue to the next issue of the same worker (barrel depth).
    pub worker_issue_interval: u32,
    /// Issue slots taken by an f32 exp, reciprocal, square root or reciprocal square
    /// root (the other floating-point instructions take one).
    #[serde(default = "default_transcendental_issues")]
    pub f32_transcendental_issues: u32,
    /// Fixed cycles of one chip-wide host transfer phase, on top of the link time.
    #[serde(default = "default_host_transfer_overhead")]
    pub host_transfer_overhead_cycles: u32,
}

fn default_transcendental_issues() -> u32 {
    2
}

fn default_host_transfer_overhead() -> u32 {
    1500
}

/// A tile machine, as data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub name: String,
    /// Number of tiles on the chip.
    pub tiles: u32,
    /// Tile clock, Hz.
    pub clock_hz: u64,
    /// Regions in address order; together they span `sram_start..sram_end`.
    pub regions: Vec<Region>,
    /// Loaded (initialised) segments must end at or below this address.
    pub loader_limit: u32,
    /// Worker contexts per tile (the supervisor is one more).
    pub workers: u32,
    /// Largest count a `rpt` instruction accepts.
    pub rpt_max_count: u32,
    pub timing: Timing,
}

/// A region index into [`Machine::regions`].
pub type RegionId = usize;

impl Machine {
    /// A preset by name (`c600`, `bow`, `small`).
    pub fn preset(name: &str) -> Result<Machine, MachineError> {
        match name {
            "c600" => Ok(Self::c600()),
            "bow" => Ok(Self::bow()),
            "small" => Ok(Self::small()),
            other => Err(MachineError::UnknownPreset(other.to_string())),
        }
    }

    /// A preset name, or else a path to a TOML description.
    pub fn load(name_or_path: &str) -> Result<Machine, MachineError> {
        if PRESETS.contains(&name_or_path) {
            return Self::preset(name_or_path);
        }
        let path = Path::new(name_or_path);
        if path.extension().is_some_and(|e| e == "toml") || path.exists() {
            let text = std::fs::read_to_string(path).map_err(|source| MachineError::Io {
                path: name_or_path.to_string(),
                source,
            })?;
            return Self::from_toml(&text, name_or_path);
        }
        Err(MachineError::UnknownPreset(name_or_path.to_string()))
    }

    /// Parses and validates a TOML description; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Machine, MachineError> {
        let m: Machine = toml::from_str(text).map_err(|e| MachineError::Parse {
            path: origin.to_string(),
            message: e.to_string(),
        })?;
        m.validate()?;
        Ok(m)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a machine always serialises")
    }

    /// IPU21-class tile on a C600 card.
    pub fn c600() -> Machine {
        Machine {
            name: "c600".into(),
            tiles: 1472,
            clock_hz: 1_500_000_000,
            regions: vec![
                Region {
                    start: 0x4_C000,
                    end: 0x8_0000,
                    interleaved: false,
                    executable: true,
                    element_bytes: 16 * 1024,
                },
                Region {
                    start: 0x8_0000,
                    end: 0xE_8000,
                    interleaved: true,
                    executable: false,
                    element_bytes: 16 * 1024,
                },
            ],
            loader_limit: 0xE_7BB0,
            workers: 6,
            rpt_max_count: 4095,
            timing: Timing {
                amp_f16_macs_per_cycle: 64,
                amp_f32_macs_per_cycle: 16,
                exchange_bytes_per_cycle: 4,
                tiles_per_receive_bus: 2,
                sync_cycles: 90,
                exchange_overhead_cycles: 100,
                host_link_bytes_per_second: 64_000_000_000,
                host_packet_payload_bytes: 1024,
                memory_read_bytes_per_cycle: 16,
                worker_issue_interval: 6,
                f32_transcendental_issues: default_transcendental_issues(),
                host_transfer_overhead_cycles: default_host_transfer_overhead(),
            },
        }
    }

    /// Bow: the C600 tile at 1.85 GHz.
    pub fn bow() -> Machine {
        Machine {
            name: "bow".into(),
            clock_hz: 1_850_000_000,
            ..Self::c600()
        }
    }

    /// Four C600 tiles: fast tests with the real memory map.
    pub fn small() -> Machine {
        Machine {
            name: "small".into(),
            ..Self::c600().with_tiles(4)
        }
    }

    /// The same machine with a different tile count (for tests and small runs).
    pub fn with_tiles(mut self, tiles: u32) -> Machine {
        self.tiles = tiles;
        self
    }

    /// Checks the description's internal consistency.
    pub fn validate(&self) -> Result<(), MachineError> {
        let bad = |message: String| MachineError::Invalid {
            name: self.name.clone(),
            message,
        };
        if self.tiles == 0 {
            return Err(bad("tiles must be at least 1".into()));
        }
        if self.regions.is_empty() {
            return Err(bad("at least one region is needed".into()));
        }
        for (i, r) in self.regions.iter().enumerate() {
            if r.start >= r.end {
                return Err(bad(format!("region {i} is empty or reversed")));
            }
            if r.element_bytes == 0 || !r.element_bytes.is_power_of_two() {
                return Err(bad(format!(
                    "region {i}: element size must be a power of two"
                )));
            }
            if (r.start % r.element_span()) != 0 || (r.end - r.start) % r.element_span() != 0 {
                return Err(bad(format!(
                    "region {i}: bounds must be whole elements of {} bytes",
                    r.element_span()
                )));
            }
            if i > 0 && self.regions[i - 1].end != r.start {
                return Err(bad(format!("region {i} does not follow region {}", i - 1)));
            }
        }
        if self.loader_limit <= self.sram_start() || self.loader_limit > self.sram_end() {
            return Err(bad("loader limit lies outside SRAM".into()));
        }
        if self.workers == 0 || self.timing.worker_issue_interval == 0 {
            return Err(bad("workers and issue interval must be positive".into()));
        }
        if self.timing.f32_transcendental_issues == 0 {
            return Err(bad("transcendental issues must be at least 1".into()));
        }
        if self.clock_hz == 0 || self.timing.exchange_bytes_per_cycle == 0 {
            return Err(bad("clock and exchange rate must be positive".into()));
        }
        Ok(())
    }

    pub fn sram_start(&self) -> u32 {
        self.regions[0].start
    }
    pub fn sram_end(&self) -> u32 {
        self.regions[self.regions.len() - 1].end
    }
    pub fn sram_bytes(&self) -> u32 {
        self.sram_end() - self.sram_start()
    }

    /// The region holding `addr`, if any.
    pub fn region_of(&self, addr: u32) -> Option<RegionId> {
        self.regions.iter().position(|r| r.contains(addr))
    }

    /// The memory element serving the byte at `addr`, numbered across all regions;
    /// `None` outside SRAM. Interleaved regions alternate elements per 64-bit word.
    pub fn element_of(&self, addr: u32) -> Option<u32> {
        let mut base = 0u32;
        for r in &self.regions {
            let count = r.len() / r.element_bytes;
            if r.contains(addr) {
                let off = addr - r.start;
                let id = if r.interleaved {
                    (off / r.element_span()) * 2 + (off / 8) % 2
                } else {
                    off / r.element_bytes
                };
                return Some(base + id);
            }
            base += count;
        }
        None
    }

    /// The placement element (element, or element pair in an interleaved region)
    /// holding `addr`, numbered across all regions.
    pub fn element_span_of(&self, addr: u32) -> Option<u32> {
        let mut base = 0u32;
        for r in &self.regions {
            if r.contains(addr) {
                return Some(base + (addr - r.start) / r.element_span());
            }
            base += r.len() / r.element_span();
        }
        None
    }

    /// Whether an instruction may be fetched from `addr`.
    pub fn is_executable(&self, addr: u32) -> bool {
        self.region_of(addr)
            .is_some_and(|r| self.regions[r].executable)
    }

    /// Peak f16 FLOP per cycle for the whole chip (a MAC is two FLOP).
    pub fn peak_f16_flop_per_cycle(&self) -> u64 {
        2 * u64::from(self.timing.amp_f16_macs_per_cycle) * u64::from(self.tiles)
    }

    /// Host link bytes per tile clock cycle, chip-wide.
    pub fn host_bytes_per_cycle(&self) -> f64 {
        self.timing.host_link_bytes_per_second as f64 / self.clock_hz as f64
    }

    pub fn cycles_to_seconds(&self, cycles: u64) -> f64 {
        cycles as f64 / self.clock_hz as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_validate() {
        for p in PRESETS {
            Machine::preset(p).unwrap().validate().unwrap();
        }
    }

    #[test]
    fn c600_memory_map() {
        let m = Machine::c600();
        assert_eq!(m.sram_bytes(), 624 * 1024);
        assert_eq!(m.region_of(0x4_C000), Some(0));
        assert_eq!(m.region_of(0x7_FFFF), Some(0));
        assert_eq!(m.region_of(0x8_0000), Some(1));
        assert_eq!(m.region_of(0xE_8000), None);
        assert_eq!(m.region_of(0x4_BFFF), None);
        assert!(m.is_executable(0x4_C000));
        assert!(!m.is_executable(0x8_0000));
        assert_eq!(m.peak_f16_flop_per_cycle(), 1472 * 128);
    }

    #[test]
    fn elements_alternate_in_interleaved_region() {
        let m = Machine::c600();
        assert_eq!(m.element_of(0x4_C000), Some(0));
        assert_eq!(m.element_of(0x4_FFFF), Some(0));
        assert_eq!(m.element_of(0x5_0000), Some(1));
        // Region 0 has 13 elements; region 1 starts at element 13.
        assert_eq!(m.element_of(0x8_0000), Some(13));
        assert_eq!(m.element_of(0x8_0008), Some(14));
        assert_eq!(m.element_of(0x8_0010), Some(13));
        assert_eq!(m.element_of(0x8_8000), Some(15));
        assert_eq!(m.element_span_of(0x8_7FF8), Some(13));
        assert_eq!(m.element_span_of(0x8_8000), Some(14));
        assert_eq!(m.element_of(0xE_7FFF), Some(38));
    }

    #[test]
    fn toml_round_trip_and_errors() {
        let m = Machine::bow().with_tiles(8);
        let back = Machine::from_toml(&m.to_toml(), "test").unwrap();
        assert_eq!(m, back);
        let err = Machine::from_toml("name = 3", "x.toml").unwrap_err();
        assert!(err.to_string().contains("x.toml"));
        let mut bad = Machine::c600();
        bad.loader_limit = 0;
        assert!(bad.validate().is_err());
        // Descriptions written before the optional timing fields existed still load.
        let old = m
            .to_toml()
            .lines()
            .filter(|l| {
                !l.starts_with("f32_transcendental_issues")
                    && !l.starts_with("host_transfer_overhead_cycles")
            })
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(Machine::from_toml(&old, "old").unwrap(), m);
        assert!(matches!(
            Machine::preset("nope"),
            Err(MachineError::UnknownPreset(_))
        ));
    }
}
