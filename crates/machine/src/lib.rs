//! The machine description: architectural facts about an IPU-class tile machine, as
//! data. Every other crate reads it; it reads nothing of theirs. It owns tile counts,
//! clock, the SRAM map (regions, memory elements, the loader limit), context counts,
//! arithmetic and exchange rates, synchronisation overheads and the host link.
//!
//! It must never hold conventions (runtime layout, calling convention, package
//! format) or policies (mapping, allocator order): those change freely, facts change
//! only with evidence. Each number is sourced in `docs/machine.md`.

mod exchange;
pub mod fp8;
pub use exchange::ExchangeLoad;

use serde::{Deserialize, Serialize};
use std::path::Path;

/// Errors from loading or validating a machine description.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    #[error("unknown machine preset `{0}` (known: {known})", known = PRESETS.join(", "))]
    UnknownPreset(String),
    // The OS error is the source only, so that a printed chain shows it once.
    #[error("cannot read machine file {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("machine file {path} is not a valid description: {message}")]
    Parse { path: String, message: String },
    #[error("machine `{name}` is inconsistent: {message}")]
    Invalid { name: String, message: String },
    #[error("machine `{name}`: `{field}` = {value} is out of range (accepted: {accepted})")]
    Field {
        name: String,
        field: String,
        value: String,
        accepted: String,
    },
}

/// The most tiles a description may have: a few chips' worth.
pub const MAX_TILES: u64 = 16_384;
// The facts below are what every kernel is written for. They are constants rather
// than fields because the emitted code bakes them in (six worker records, repeat
// counts up to the limit, 16-wide weight blocks); `Machine::validate` refuses a
// description that contradicts them, so no run reports a mismatch it cannot explain.

/// Worker contexts per tile that the kernels split their work over (poplibs
/// `CTXT_WORKERS`); `workers` must equal it.
pub const WORKERS: u32 = 6;
/// Largest `rpt` count the kernels emit: the 12-bit limit of the oldest part, kept
/// so that the code runs on every part. `rpt_max_count` must be at least this.
pub const RPT_MAX: u32 = 4095;
/// Largest `rpt` count a description may state: the 16-bit count of later parts.
pub const RPT_MAX_COUNT_LIMIT: u32 = 65_535;
/// Rows and columns of the AMP's weight block (`W[16][16]` f16): a matmul's
/// contraction and output dimensions are cut into pieces of this width.
pub const AMP_WIDTH: u32 = 16;
/// One past the highest byte address a description may use: addresses are 20-bit
/// immediates in the instruction set.
pub const ADDRESS_LIMIT: u64 = 1 << 20;

impl MachineError {
    /// Names the file a description came from, beside the machine's own name.
    fn with_origin(self, origin: &str) -> MachineError {
        match self {
            MachineError::Invalid { name, message } => MachineError::Invalid {
                name: format!("{name} (from {origin})"),
                message,
            },
            MachineError::Field {
                name,
                field,
                value,
                accepted,
            } => MachineError::Field {
                name: format!("{name} (from {origin})"),
                field,
                value,
                accepted,
            },
            other => other,
        }
    }
}

/// Names accepted by [`Machine::preset`].
pub const PRESETS: &[&str] = &["c600", "bow", "small"];

/// One address region of tile SRAM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
#[serde(deny_unknown_fields)]
pub struct Timing {
    /// f16 multiply-accumulates per cycle per tile from the AMP unit; the simulator
    /// charges each `amp` step (64 MACs) against it.
    pub amp_f16_macs_per_cycle: u32,
    /// Bytes per cycle a tile can send, and separately receive, on the exchange.
    pub exchange_bytes_per_cycle: u32,
    /// Tiles sharing one exchange bus (aligned groups: 2k and 2k+1 for 2). A transfer
    /// that every tile of a group receives arrives at this many times
    /// `exchange_bytes_per_cycle` on each of them. 1 disables the rule.
    pub tiles_per_shared_exchange_bus: u32,
    /// Cycles for a chip-internal barrier synchronisation.
    pub sync_cycles: u32,
    /// Fixed cycles of overhead per exchange phase.
    pub exchange_overhead_cycles: u32,
    /// Host link bandwidth into the chip, bytes per second (one direction).
    pub host_to_chip_bytes_per_second: u64,
    /// Host link bandwidth out of the chip, bytes per second (the other direction).
    pub chip_to_host_bytes_per_second: u64,
    /// Largest payload of one host link packet, bytes.
    pub host_packet_payload_bytes: u32,
    /// Barrel slots: cycles from one issue of a worker to its next. The supervisor
    /// issues in the slots no worker holds.
    pub worker_issue_interval: u32,
    /// Cycles from a supervisor instruction's issue until an instruction that reads
    /// its result may issue (the pipeline depth the barrel hides for workers).
    #[serde(default = "default_supervisor_latency")]
    pub supervisor_result_latency: u32,
    /// Issue slots taken by an f32 exp, reciprocal, square root or reciprocal square
    /// root (the other floating-point instructions take one).
    #[serde(default = "default_transcendental_issues")]
    pub f32_transcendental_issues: u32,
    /// Issue slots taken by an f32 tanh (`f16v2tanh` takes one).
    #[serde(default = "default_tanh_issues")]
    pub f32_tanh_issues: u32,
    /// Issue slots taken by an `f16v2exp` (both lanes).
    #[serde(default = "default_f16_exp_issues")]
    pub f16_exp_issues: u32,
    /// Fixed cycles of one chip-wide host transfer phase, on top of the link time.
    #[serde(default = "default_host_transfer_overhead")]
    pub host_transfer_overhead_cycles: u32,
    /// How much of a tile's exchange code overlaps its bytes, in percent of the
    /// shorter of the two: 0 charges the code then the bytes (their sum), 100 the
    /// longer alone ([`ExchangeLoad::cycles_with`]). Left out of the TOML at 0 so
    /// that descriptions, and the packages that embed them, read as they did
    /// before the field existed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub exchange_code_overlap_percent: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

fn default_tanh_issues() -> u32 {
    5
}

fn default_f16_exp_issues() -> u32 {
    1
}

fn default_supervisor_latency() -> u32 {
    6
}

fn default_transcendental_issues() -> u32 {
    2
}

fn default_host_transfer_overhead() -> u32 {
    1500
}

/// PCIe Gen4 x16, one direction: 16 GT/s x 16 lanes x 128/130 / 8 bits.
const PCIE_GEN4_X16_BYTES_PER_SECOND: u64 = 31_507_692_307;

/// A tile machine, as data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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

/// Which memory a buffer may live in: the region properties a kernel's access
/// needs (kernels state it in their contracts, placement honours it), named once here
/// because it is a property of the memory map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum MemClass {
    #[default]
    Any,
    NonInterleaved,
    Interleaved,
    /// Instruction fetch is possible: the executable region only.
    Executable,
}

impl MemClass {
    pub fn name(self) -> &'static str {
        match self {
            MemClass::Any => "any",
            MemClass::NonInterleaved => "non_interleaved",
            MemClass::Interleaved => "interleaved",
            MemClass::Executable => "executable",
        }
    }

    /// Whether a region with these properties can hold this class.
    pub fn admits(self, interleaved: bool, executable: bool) -> bool {
        match self {
            MemClass::Any => true,
            MemClass::NonInterleaved => !interleaved,
            MemClass::Interleaved => interleaved,
            MemClass::Executable => executable,
        }
    }
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
        m.validate().map_err(|e| e.with_origin(origin))?;
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
                exchange_bytes_per_cycle: 4,
                tiles_per_shared_exchange_bus: 2,
                sync_cycles: 90,
                exchange_overhead_cycles: 100,
                host_to_chip_bytes_per_second: PCIE_GEN4_X16_BYTES_PER_SECOND,
                chip_to_host_bytes_per_second: PCIE_GEN4_X16_BYTES_PER_SECOND,
                host_packet_payload_bytes: 1024,
                worker_issue_interval: 6,
                supervisor_result_latency: default_supervisor_latency(),
                f32_transcendental_issues: default_transcendental_issues(),
                f32_tanh_issues: default_tanh_issues(),
                f16_exp_issues: default_f16_exp_issues(),
                host_transfer_overhead_cycles: default_host_transfer_overhead(),
                exchange_code_overlap_percent: 0,
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

    /// Checks every field against the range the model can stand behind, then the
    /// description's internal consistency. The first problem found is returned,
    /// naming the field, its value and what is accepted.
    pub fn validate(&self) -> Result<(), MachineError> {
        let field = |field: &str, value: u64, range: std::ops::RangeInclusive<u64>| {
            if range.contains(&value) {
                Ok(())
            } else {
                Err(MachineError::Field {
                    name: self.name.clone(),
                    field: field.to_string(),
                    value: value.to_string(),
                    accepted: format!("{} to {}", range.start(), range.end()),
                })
            }
        };
        let t = &self.timing;
        field("tiles", self.tiles.into(), 1..=MAX_TILES)?;
        field("clock_hz", self.clock_hz, 1_000_000..=20_000_000_000)?;
        if self.workers != WORKERS {
            return Err(MachineError::Field {
                name: self.name.clone(),
                field: "workers".into(),
                value: self.workers.to_string(),
                accepted: format!("{WORKERS}, the worker count every kernel is written for"),
            });
        }
        // A higher limit is harmless (the kernels stay below theirs); a lower one
        // would fault their repeat loops.
        field(
            "rpt_max_count",
            self.rpt_max_count.into(),
            u64::from(RPT_MAX)..=u64::from(RPT_MAX_COUNT_LIMIT),
        )?;
        field("regions (count)", self.regions.len() as u64, 1..=16)?;
        field(
            "timing.amp_f16_macs_per_cycle",
            t.amp_f16_macs_per_cycle.into(),
            1..=4096,
        )?;
        field(
            "timing.exchange_bytes_per_cycle",
            t.exchange_bytes_per_cycle.into(),
            1..=1024,
        )?;
        field(
            "timing.tiles_per_shared_exchange_bus",
            t.tiles_per_shared_exchange_bus.into(),
            1..=64,
        )?;
        field("timing.sync_cycles", t.sync_cycles.into(), 0..=1_000_000)?;
        field(
            "timing.exchange_overhead_cycles",
            t.exchange_overhead_cycles.into(),
            0..=1_000_000,
        )?;
        let link = 1_000_000..=10_000_000_000_000;
        field(
            "timing.host_to_chip_bytes_per_second",
            t.host_to_chip_bytes_per_second,
            link.clone(),
        )?;
        field(
            "timing.chip_to_host_bytes_per_second",
            t.chip_to_host_bytes_per_second,
            link,
        )?;
        field(
            "timing.host_packet_payload_bytes",
            t.host_packet_payload_bytes.into(),
            16..=65_536,
        )?;
        // The barrel needs a slot for every worker.
        field(
            "timing.worker_issue_interval",
            t.worker_issue_interval.into(),
            u64::from(self.workers)..=64,
        )?;
        field(
            "timing.supervisor_result_latency",
            t.supervisor_result_latency.into(),
            1..=64,
        )?;
        field(
            "timing.f32_transcendental_issues",
            t.f32_transcendental_issues.into(),
            1..=64,
        )?;
        field("timing.f32_tanh_issues", t.f32_tanh_issues.into(), 1..=64)?;
        field("timing.f16_exp_issues", t.f16_exp_issues.into(), 1..=64)?;
        field(
            "timing.host_transfer_overhead_cycles",
            t.host_transfer_overhead_cycles.into(),
            0..=100_000_000,
        )?;
        field(
            "timing.exchange_code_overlap_percent",
            t.exchange_code_overlap_percent.into(),
            0..=100,
        )?;
        let bad = |message: String| MachineError::Invalid {
            name: self.name.clone(),
            message,
        };
        if self.name.trim().is_empty() {
            return Err(bad("the name is empty".into()));
        }
        for (i, r) in self.regions.iter().enumerate() {
            // Addresses are 20-bit immediates in the instruction set.
            field(
                &format!("regions[{i}].end"),
                r.end.into(),
                1..=ADDRESS_LIMIT,
            )?;
            field(
                &format!("regions[{i}].start"),
                r.start.into(),
                0..=u64::from(r.end.saturating_sub(1)),
            )?;
            // Bounded by the address space before `element_span` doubles it.
            if r.element_bytes < 8
                || !r.element_bytes.is_power_of_two()
                || u64::from(r.element_bytes) > ADDRESS_LIMIT
            {
                return Err(MachineError::Field {
                    name: self.name.clone(),
                    field: format!("regions[{i}].element_bytes"),
                    value: r.element_bytes.to_string(),
                    accepted: format!("a power of two from 8 to {ADDRESS_LIMIT}"),
                });
            }
            if (r.start % r.element_span()) != 0 || (r.end - r.start) % r.element_span() != 0 {
                return Err(bad(format!(
                    "region {i}: bounds {:#x}..{:#x} must be whole elements of {} bytes",
                    r.start,
                    r.end,
                    r.element_span()
                )));
            }
            if i > 0 && self.regions[i - 1].end != r.start {
                return Err(bad(format!(
                    "region {i} starts at {:#x}, not where region {} ends ({:#x})",
                    r.start,
                    i - 1,
                    self.regions[i - 1].end
                )));
            }
        }
        field(
            "loader_limit",
            self.loader_limit.into(),
            u64::from(self.sram_start()) + 1..=u64::from(self.sram_end()),
        )?;
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

    /// Host link bytes per tile clock cycle into the chip.
    pub fn host_to_chip_bytes_per_cycle(&self) -> f64 {
        self.timing.host_to_chip_bytes_per_second as f64 / self.clock_hz as f64
    }

    /// Host link bytes per tile clock cycle out of the chip.
    pub fn chip_to_host_bytes_per_cycle(&self) -> f64 {
        self.timing.chip_to_host_bytes_per_second as f64 / self.clock_hz as f64
    }

    /// Cycles of one host transfer phase moving `inward` bytes into the chip and
    /// `outward` bytes out of it: the two directions run at once, each at its own
    /// rate, after the phase's fixed overhead.
    pub fn host_phase_cycles(&self, inward: u64, outward: u64) -> u64 {
        let t = |bytes: u64, per_cycle: f64| (bytes as f64 / per_cycle).ceil() as u64;
        u64::from(self.timing.host_transfer_overhead_cycles)
            + t(inward, self.host_to_chip_bytes_per_cycle())
                .max(t(outward, self.chip_to_host_bytes_per_cycle()))
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
                    && !l.starts_with("supervisor_result_latency")
                    && !l.starts_with("f32_tanh_issues")
                    && !l.starts_with("f16_exp_issues")
            })
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(Machine::from_toml(&old, "old").unwrap(), m);
        // The overlap is written only when set, so the presets' text (and every
        // package embedding it) is what it was without the field.
        assert!(!m.to_toml().contains("exchange_code_overlap_percent"));
        let mut overlapped = m.clone();
        overlapped.timing.exchange_code_overlap_percent = 100;
        let text = overlapped.to_toml();
        assert!(
            text.contains("exchange_code_overlap_percent = 100"),
            "{text}"
        );
        assert_eq!(Machine::from_toml(&text, "test").unwrap(), overlapped);
        assert!(matches!(
            Machine::preset("nope"),
            Err(MachineError::UnknownPreset(_))
        ));
    }

    /// Every field with a bad value, each as a TOML edit, is refused with the field's
    /// name, the value and the accepted range.
    #[test]
    fn invalid_fields_are_rejected() {
        type Edit = fn(&mut Machine);
        let cases: &[(&str, &str, Edit)] = &[
            ("tiles", "0", |m| m.tiles = 0),
            ("tiles", "4294967295", |m| m.tiles = u32::MAX),
            ("clock_hz", "0", |m| m.clock_hz = 0),
            ("workers", "0", |m| m.workers = 0),
            ("workers", "1000", |m| m.workers = 1000),
            ("workers", "4", |m| m.workers = 4),
            ("rpt_max_count", "0", |m| m.rpt_max_count = 0),
            ("rpt_max_count", "4094", |m| m.rpt_max_count = 4094),
            ("rpt_max_count", "65536", |m| m.rpt_max_count = 65_536),
            ("regions (count)", "0", |m| m.regions.clear()),
            ("timing.amp_f16_macs_per_cycle", "0", |m| {
                m.timing.amp_f16_macs_per_cycle = 0
            }),
            ("timing.exchange_bytes_per_cycle", "0", |m| {
                m.timing.exchange_bytes_per_cycle = 0
            }),
            ("timing.tiles_per_shared_exchange_bus", "0", |m| {
                m.timing.tiles_per_shared_exchange_bus = 0
            }),
            ("timing.sync_cycles", "4000000000", |m| {
                m.timing.sync_cycles = 4_000_000_000
            }),
            ("timing.exchange_overhead_cycles", "4000000000", |m| {
                m.timing.exchange_overhead_cycles = 4_000_000_000
            }),
            ("timing.host_to_chip_bytes_per_second", "0", |m| {
                m.timing.host_to_chip_bytes_per_second = 0
            }),
            ("timing.chip_to_host_bytes_per_second", "0", |m| {
                m.timing.chip_to_host_bytes_per_second = 0
            }),
            ("timing.host_packet_payload_bytes", "0", |m| {
                m.timing.host_packet_payload_bytes = 0
            }),
            ("timing.worker_issue_interval", "0", |m| {
                m.timing.worker_issue_interval = 0
            }),
            // Fewer barrel slots than workers.
            ("timing.worker_issue_interval", "3", |m| {
                m.timing.worker_issue_interval = 3
            }),
            ("timing.supervisor_result_latency", "0", |m| {
                m.timing.supervisor_result_latency = 0
            }),
            ("timing.f32_transcendental_issues", "0", |m| {
                m.timing.f32_transcendental_issues = 0
            }),
            ("timing.f32_tanh_issues", "0", |m| {
                m.timing.f32_tanh_issues = 0
            }),
            ("timing.f16_exp_issues", "0", |m| {
                m.timing.f16_exp_issues = 0
            }),
            ("timing.host_transfer_overhead_cycles", "4000000000", |m| {
                m.timing.host_transfer_overhead_cycles = 4_000_000_000
            }),
            ("timing.exchange_code_overlap_percent", "101", |m| {
                m.timing.exchange_code_overlap_percent = 101
            }),
            ("regions[1].end", "2097152", |m| {
                m.regions[1].end = 0x20_0000
            }),
            ("regions[0].start", "557056", |m| {
                m.regions[0].start = 0x8_8000
            }),
            ("regions[0].element_bytes", "0", |m| {
                m.regions[0].element_bytes = 0
            }),
            ("loader_limit", "0", |m| m.loader_limit = 0),
            ("loader_limit", "1048576", |m| m.loader_limit = 0x10_0000),
        ];
        for (field, value, edit) in cases {
            let mut m = Machine::c600();
            edit(&mut m);
            let err = m.validate().unwrap_err();
            match &err {
                MachineError::Field {
                    field: f, value: v, ..
                } => {
                    assert_eq!((f.as_str(), v.as_str()), (*field, *value), "{err}");
                }
                other => panic!("{field}: expected a field error, got {other}"),
            }
            // The same problem in a file is refused when loaded, naming the file.
            if !m.regions.is_empty() {
                let err = Machine::from_toml(&m.to_toml(), "bad.toml").unwrap_err();
                let text = err.to_string();
                assert!(
                    text.contains(field) && text.contains("bad.toml") && text.contains("accepted"),
                    "{text}"
                );
            }
        }
    }

    /// A description whose worker count or repeat limit the kernels were not
    /// written for is refused, naming the field and what the kernels accept, rather
    /// than compiled into code that runs on it and gives wrong answers.
    #[test]
    fn facts_the_kernels_bake_in_are_held_to_them() {
        let four = Machine::small()
            .to_toml()
            .replace("workers = 6", "workers = 4");
        let err = Machine::from_toml(&four, "four.toml").unwrap_err();
        assert_eq!(
            err.to_string(),
            "machine `small (from four.toml)`: `workers` = 4 is out of range \
             (accepted: 6, the worker count every kernel is written for)"
        );
        // The kernels stay below their own repeat limit, so a part with a higher
        // one runs them as they are.
        let mut wide = Machine::c600();
        wide.rpt_max_count = RPT_MAX_COUNT_LIMIT;
        wide.validate().unwrap();
        wide.rpt_max_count = RPT_MAX;
        wide.validate().unwrap();
        for p in PRESETS {
            let m = Machine::preset(p).unwrap();
            assert_eq!(m.workers, WORKERS);
            assert!(m.rpt_max_count >= RPT_MAX);
        }
    }

    #[test]
    fn inconsistent_regions_and_unknown_fields_are_rejected() {
        let mut gap = Machine::c600();
        gap.regions[1].start = 0x8_8000;
        assert!(matches!(gap.validate(), Err(MachineError::Invalid { .. })));
        let mut odd = Machine::c600();
        odd.regions[0].end = 0x7_F000;
        assert!(matches!(odd.validate(), Err(MachineError::Invalid { .. })));
        // A misspelt field is an error, not a silently ignored line.
        let text = Machine::c600()
            .to_toml()
            .replace("sync_cycles", "sync_cycle");
        let err = Machine::from_toml(&text, "typo.toml").unwrap_err();
        assert!(err.to_string().contains("sync_cycle"), "{err}");
    }

    #[test]
    fn host_phases_run_both_directions_at_once() {
        let m = Machine::c600();
        let per = m.host_to_chip_bytes_per_cycle();
        // 31.5 GB/s at 1.5 GHz: exactly 21.005... bytes per cycle each way.
        assert!((per - 21.005_128).abs() < 1e-5, "{per}");
        let o = u64::from(m.timing.host_transfer_overhead_cycles);
        assert_eq!(m.host_phase_cycles(0, 0), o);
        let one_way = m.host_phase_cycles(2_100_513, 0);
        assert_eq!(one_way, o + (2_100_513.0 / per).ceil() as u64);
        assert_eq!(m.host_phase_cycles(0, 2_100_513), one_way);
        // Both directions at once cost no more than the longer one.
        assert_eq!(m.host_phase_cycles(2_100_513, 1_000), one_way);
    }
}
