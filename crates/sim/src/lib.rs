//! The instruction-level simulator: Tessera's hardware. It owns the execution of a
//! package on the machine it names: per-tile memory, the supervisor and six
//! barrel-scheduled worker contexts of every tile, AMP state, BSP supersteps
//! (compute, global sync, exchange), host transfers, the cycle model, faults named
//! after the architecture's exception types, per-context statistics and the event
//! trace. Tiles run in parallel (rayon) and the result is deterministic.
//!
//! It depends only on `machine`, `isa` and `package`, never on compiler crates: the
//! simulator is the last, independent checker of what the compiler emits. It must
//! never panic on any package, however malformed: load problems are a typed
//! [`LoadError`], run-time problems typed [`Fault`]s; address arithmetic is checked
//! (a fault, never a wrap); and a cycle budget turns runaway programs into a
//! deterministic `Timeout` fault. Semantics are in `docs/isa.md`, the timing model
//! in `docs/sim.md`.

mod barrel;
pub mod bench;
mod capture;
mod exchange;
mod fault;
mod fp;
mod fp8;
mod hazard;
mod interp;
mod mem;
mod program;
#[cfg(test)]
mod tests;
mod tile;

pub use capture::{Capture, CapturePoint, Perturb};
pub use fault::{Context, Fault, FaultKind};

use interp::{Env, Shared, Trap, trap};
use mem::Layout;
use rayon::prelude::*;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tessera_machine::{Machine, MachineError};
use tessera_package::{BindingKind, Package};
use tile::{Tile, TileState};

/// Each machine tile's index into the simulator's tiles (`usize::MAX`: no
/// image), a vector over the machine's tiles: exchanges look their sources up
/// for every message.
pub(crate) struct Slots(Vec<usize>);

impl Slots {
    pub(crate) fn get(&self, tile: u32) -> Option<usize> {
        self.0
            .get(tile as usize)
            .copied()
            .filter(|&s| s != usize::MAX)
    }

    /// The slot of a tile the package was checked to have an image for.
    fn of(&self, tile: u32) -> usize {
        self.get(tile)
            .expect("a binding's tiles have images (checked at load)")
    }
}

/// Why a package cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("machine description: {0}")]
    Machine(#[from] MachineError),
    #[error("tile image for tile {tile}: the machine has {tiles} tiles")]
    TileOutOfRange { tile: u32, tiles: u32 },
    #[error("two images for tile {0}")]
    DuplicateTile(u32),
    #[error("tile {tile} segment `{segment}`: {reason}")]
    Segment {
        tile: u32,
        segment: String,
        reason: String,
    },
    #[error("binding `{binding}`: {reason}")]
    Binding { binding: String, reason: String },
    #[error("exchange programs: {0}")]
    Exchange(String),
    #[error("unsupported machine: {0}")]
    Unsupported(String),
}

/// Misuse of the simulator's API.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("no binding named `{0}`")]
    UnknownBinding(String),
    #[error("binding `{name}` has {expected} bytes, {got} given")]
    BindingSize {
        name: String,
        expected: usize,
        got: usize,
    },
}

/// Options of one run.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// A context whose clock reaches this many cycles faults with `Timeout`.
    pub cycle_budget: u64,
    /// Before running, write every Input and Weight binding's slices into tile
    /// memory; after it, read every Output binding's slices back. A shortcut for
    /// packages without host-transfer code (docs/sim.md).
    pub preload_bindings: bool,
    /// Record trace events.
    pub trace: bool,
    /// Tile memory to copy out at superstep boundaries ([`Simulator::captured`]).
    pub captures: Vec<Capture>,
    /// Test hook: f16 values scaled in tile memory at superstep boundaries.
    pub perturb: Vec<Perturb>,
    /// Told of every superstep the run completes, for a caller showing progress.
    pub on_superstep: Option<SuperstepHook>,
    /// Handed each capture's bytes as they are copied out (its index in
    /// `captures`), which [`Simulator::captured`] then does not keep: a caller
    /// that consumes them as the run goes holds none it is done with (a whole
    /// So400m tower's captures at batch 4 are more than the machine's memory).
    pub on_capture: Option<CaptureHook>,
}

/// Takes a capture's index in [`SimOptions::captures`] and its bytes. It runs
/// on the simulator's thread between supersteps: the run waits while it does,
/// which a consumer that falls behind may use to hold the run back.
#[derive(Clone)]
pub struct CaptureHook(pub std::sync::Arc<dyn Fn(usize, Vec<u8>) + Send + Sync>);

impl std::fmt::Debug for CaptureHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CaptureHook")
    }
}

/// Called after each superstep with the number completed so far. It runs on the
/// simulator's thread between supersteps, so it should be quick.
#[derive(Clone)]
pub struct SuperstepHook(pub std::sync::Arc<dyn Fn(u32) + Send + Sync>);

impl std::fmt::Debug for SuperstepHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SuperstepHook")
    }
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            cycle_budget: DEFAULT_CYCLE_BUDGET,
            preload_bindings: false,
            trace: true,
            captures: Vec::new(),
            perturb: Vec::new(),
            on_superstep: None,
            on_capture: None,
        }
    }
}

/// 200 M cycles: about 133 ms of C600 time, nearly four times the whole So400m tower at
/// batch 4 with its weights streamed first (51 M), which 50 M cut short.
pub const DEFAULT_CYCLE_BUDGET: u64 = 200_000_000;

/// Whether the run completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Fault,
}

/// Counts of one context of one tile.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ContextStats {
    /// Issue slots used (a bundle is one issue).
    pub issues: u64,
    /// Instructions executed (a bundle is two).
    pub instructions: u64,
    /// Cycles from each start to each finish, summed (the supervisor: its whole
    /// run).
    pub cycles: u64,
}

/// Counts of one tile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TileStats {
    pub tile: u32,
    /// The tile's clock when it finished (or stopped).
    pub cycles: u64,
    pub supervisor: ContextStats,
    pub workers: Vec<ContextStats>,
}

/// What a trace event marks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TraceKind {
    SuperstepStart {
        index: u32,
    },
    SuperstepEnd {
        index: u32,
    },
    /// `run`/`runall` started `workers` (a bit mask) at `symbol`.
    KernelStart {
        /// Shared by every event of the tile at the same entry, not a string
        /// an event: a So400m tower at batch 4 traces some 2.1 million kernel
        /// events a layer.
        symbol: std::sync::Arc<str>,
        workers: u8,
    },
    /// The workers that a `KernelStart` started have all exited.
    KernelEnd {
        symbol: std::sync::Arc<str>,
        workers: u8,
    },
    ExchangeStart {
        id: u16,
    },
    ExchangeEnd {
        id: u16,
    },
    HostTransferStart {
        bytes: u64,
    },
    HostTransferEnd {
        bytes: u64,
    },
    Mark {
        tag: u16,
    },
}

/// One event for the profile. Chip-wide events have no tile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TraceEvent {
    pub cycle: u64,
    pub tile: Option<u32>,
    pub context: Option<Context>,
    #[serde(flatten)]
    pub kind: TraceKind,
}

/// The outcome of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimReport {
    pub status: Status,
    /// Chip cycles: the latest tile clock (supersteps are summed through syncs).
    pub cycles: u64,
    /// Supersteps run: global syncs plus one (the last ends with the run).
    pub supersteps: u32,
    /// Issue slots and instructions over all tiles and contexts.
    pub issues: u64,
    pub instructions: u64,
    /// Tiles with an image, in tile order.
    pub per_tile: Vec<TileStats>,
    /// Every faulting context, by tile then context.
    pub faults: Vec<Fault>,
    /// Events in cycle order (tile order within a cycle).
    pub trace: Vec<TraceEvent>,
}

/// A loaded package, ready to run.
pub struct Simulator {
    machine: Machine,
    package: Package,
    layout: Layout,
    tiles: Vec<Tile>,
    /// Machine tile -> index into `tiles`.
    slot_of: Slots,
    bindings: Vec<Vec<u8>>,
    binding_index: HashMap<String, usize>,
    exchange_index: HashMap<u16, usize>,
    dirty: bool,
    /// The last run's captures (`SimOptions::captures`), in request order.
    captured: Vec<Option<Vec<u8>>>,
    /// Per capture point, the indices of the captures taken there, for the run.
    capture_points: HashMap<CapturePoint, Vec<usize>>,
    /// Times the last run's tiles have reached each exchange id, for captures.
    exchanges_reached: std::collections::HashMap<u16, u32>,
    /// Wall time of the last run inside its parallel per-tile sections (loading
    /// the tiles, running them to their next stop): what the rest of a run's wall
    /// time is compared against to find the serial share.
    parallel: std::time::Duration,
    /// One buffer a tile slot for the bytes an exchange phase lands on it, kept
    /// from phase to phase so that a phase does not allocate (and fault in)
    /// fresh pages for every tile's bytes.
    landing: Vec<Vec<u8>>,
}

impl Simulator {
    /// Loads a package: parses its machine, validates segments (inside SRAM, within
    /// the loader limit when initialised, code 4-byte aligned in an executable
    /// region, no overlaps), bindings and exchange ids, and decodes the code.
    pub fn new(package: &Package) -> Result<Simulator, LoadError> {
        // The simulator keeps its own copy; the tile images, most of a package's
        // bytes, are copied in parallel like the rest of loading.
        let t0 = std::time::Instant::now();
        let copy = Package {
            machine_toml: package.machine_toml.clone(),
            tiles: package.tiles.par_iter().cloned().collect(),
            exchanges: package.exchanges.clone(),
            bindings: package.bindings.clone(),
        };
        let copied = t0.elapsed();
        let mut sim = Simulator::from_package(copy)?;
        sim.parallel += copied;
        Ok(sim)
    }

    /// [`Simulator::new`] on a package the caller gives up: nothing copied (a
    /// whole tower's package is hundreds of megabytes).
    pub fn from_package(mut package: Package) -> Result<Simulator, LoadError> {
        let machine = Machine::from_toml(&package.machine_toml, "package")?;
        if machine.workers > 6 {
            // `run` encodes worker numbers 0..=5 and the trace keeps worker masks
            // in a byte.
            return Err(LoadError::Unsupported(format!(
                "{} workers per tile (at most 6)",
                machine.workers
            )));
        }
        let layout = Layout::new(&machine);
        let mut slot_of = Slots(vec![usize::MAX; machine.tiles as usize]);
        for (i, image) in package.tiles.iter().enumerate() {
            if image.tile >= machine.tiles {
                return Err(LoadError::TileOutOfRange {
                    tile: image.tile,
                    tiles: machine.tiles,
                });
            }
            if slot_of.get(image.tile).is_some() {
                return Err(LoadError::DuplicateTile(image.tile));
            }
            slot_of.0[image.tile as usize] = i;
        }
        // Loading is per-tile work like running: done in parallel, with the first
        // error in tile order reported, so that a bad package says the same thing
        // on any number of threads.
        let t0 = std::time::Instant::now();
        let progs = program::programs(&package.tiles);
        let tiles: Vec<Result<Tile, LoadError>> = package
            .tiles
            .par_iter()
            .zip(progs)
            .enumerate()
            .map(|(i, (image, prog))| {
                validate_segments(&machine, &layout, image)?;
                // Zeroed by writing rather than by a lazily mapped allocation: the
                // page faults of first touch belong to loading, not to every run.
                #[allow(clippy::slow_vector_initialization)]
                let mut mem = Vec::with_capacity(layout.bytes());
                mem.resize(layout.bytes(), 0u8);
                tile::load_segments(&mut mem, layout.start, &image.segments);
                let mut t = Tile {
                    id: image.tile,
                    image: i,
                    sh: Shared {
                        mem,
                        prog,
                        weights: [[0.0; 16]; 16],
                        code_dirty: false,
                        barrel: barrel::Barrel::default(),
                        xlog: Default::default(),
                        hz: Default::default(),
                    },
                    sup: Default::default(),
                    workers: Vec::new(),
                    state: TileState::Running,
                    faults: Vec::new(),
                    trace: Vec::new(),
                    names: HashMap::new(),
                    computed_since_sync: false,
                    released: 0,
                };
                t.reset(
                    image,
                    machine.workers as usize,
                    u64::from(machine.timing.worker_issue_interval),
                );
                Ok(t)
            })
            .collect();
        let tiles = tiles
            .into_iter()
            .collect::<Result<Vec<Tile>, LoadError>>()?;
        let parallel = t0.elapsed();
        let mut binding_index = HashMap::new();
        for (i, b) in package.bindings.iter().enumerate() {
            if binding_index.insert(b.name.clone(), i).is_some() {
                return Err(LoadError::Binding {
                    binding: b.name.clone(),
                    reason: "defined twice".into(),
                });
            }
            for s in &b.slices {
                let bad = |reason: String| LoadError::Binding {
                    binding: b.name.clone(),
                    reason,
                };
                if u64::from(s.offset) + u64::from(s.bytes) > u64::from(b.bytes) {
                    return Err(bad(format!(
                        "slice at offset {} of {} bytes exceeds the {} bytes of the binding",
                        s.offset, s.bytes, b.bytes
                    )));
                }
                if slot_of.get(s.tile).is_none() {
                    return Err(bad(format!("slice on tile {} which has no image", s.tile)));
                }
                if !layout.range_ok(s.tile_addr, s.bytes) {
                    return Err(bad(format!(
                        "slice on tile {} at {:#x} of {} bytes is outside SRAM",
                        s.tile, s.tile_addr, s.bytes
                    )));
                }
            }
        }
        let mut exchange_index = HashMap::new();
        for (i, x) in package.exchanges.iter().enumerate() {
            if exchange_index.insert(x.id, i).is_some() {
                return Err(LoadError::Exchange(format!("id {} defined twice", x.id)));
            }
        }
        // A weight binding starts with the image the package carries; the host
        // streams it in through descriptors like any input.
        // The contents move to `bindings`: a second copy in the package would
        // hold every weight image twice.
        let bindings = package
            .bindings
            .iter_mut()
            .map(|b| {
                let data = std::mem::take(&mut b.data);
                if data.len() == b.bytes as usize {
                    data
                } else {
                    vec![0u8; b.bytes as usize]
                }
            })
            .collect();
        Ok(Simulator {
            machine,
            package,
            layout,
            tiles,
            slot_of,
            bindings,
            binding_index,
            exchange_index,
            dirty: false,
            captured: Vec::new(),
            exchanges_reached: HashMap::new(),
            capture_points: HashMap::new(),
            parallel,
            landing: Vec::new(),
        })
    }

    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    /// Sets a host buffer (an input or weight before a run).
    pub fn set_binding(&mut self, name: &str, bytes: &[u8]) -> Result<(), SimError> {
        let &i = self
            .binding_index
            .get(name)
            .ok_or_else(|| SimError::UnknownBinding(name.into()))?;
        let buf = &mut self.bindings[i];
        if buf.len() != bytes.len() {
            return Err(SimError::BindingSize {
                name: name.into(),
                expected: buf.len(),
                got: bytes.len(),
            });
        }
        buf.copy_from_slice(bytes);
        Ok(())
    }

    /// A host buffer (an output after a run).
    pub fn binding(&self, name: &str) -> Option<&[u8]> {
        self.binding_index
            .get(name)
            .map(|&i| self.bindings[i].as_slice())
    }

    /// Bytes of a tile's memory: the loaded image before a run, the final state
    /// after one. `None` for a tile without image or a range outside SRAM.
    pub fn read_memory(&self, tile: u32, addr: u32, len: u32) -> Option<&[u8]> {
        let t = &self.tiles[self.slot_of.get(tile)?];
        if !self.layout.range_ok(addr, len) {
            return None;
        }
        let off = (addr - self.layout.start) as usize;
        t.sh.mem.get(off..off + len as usize)
    }

    /// Writes bytes into a tile's memory before a run (test set-up).
    pub fn write_memory(&mut self, tile: u32, addr: u32, bytes: &[u8]) -> bool {
        let Some(i) = self.slot_of.get(tile) else {
            return false;
        };
        let Ok(len) = u32::try_from(bytes.len()) else {
            return false;
        };
        if !self.layout.range_ok(addr, len) {
            return false;
        }
        let off = (addr - self.layout.start) as usize;
        let sh = &mut self.tiles[i].sh;
        sh.mem[off..off + bytes.len()].copy_from_slice(bytes);
        if sh.prog.overlaps(addr, len) {
            Arc::make_mut(&mut sh.prog).redecode(&sh.mem, self.layout.start, addr, len);
        }
        true
    }

    fn env(&self, opts: &SimOptions) -> Env {
        Env {
            layout: self.layout.clone(),
            interval: u64::from(self.machine.timing.worker_issue_interval),
            latency: u64::from(self.machine.timing.supervisor_result_latency),
            amp_extra: amp_extra_cycles(&self.machine),
            transcendental_issues: u64::from(self.machine.timing.f32_transcendental_issues),
            tanh_issues: u64::from(self.machine.timing.f32_tanh_issues),
            f16_exp_issues: u64::from(self.machine.timing.f16_exp_issues),
            rpt_max: self.machine.rpt_max_count,
            budget: opts.cycle_budget,
            feed_fast: true,
        }
    }

    /// Runs the package from its loaded state until every tile exits, or until
    /// a superstep in which some context faulted has ended everywhere.
    pub fn run(&mut self, opts: &SimOptions) -> SimReport {
        if self.dirty {
            self.reload();
        }
        self.dirty = true;
        self.captured = vec![None; opts.captures.len()];
        self.capture_points.clear();
        for (k, c) in opts.captures.iter().enumerate() {
            self.capture_points.entry(c.at).or_default().push(k);
        }
        self.exchanges_reached.clear();
        if opts.preload_bindings {
            self.preload();
        }
        let env = self.env(opts);
        let mut chip_trace = Vec::new();
        let mut superstep = 0u32;
        if opts.trace {
            chip_trace.push(chip_event(0, TraceKind::SuperstepStart { index: 0 }));
        }
        loop {
            let package = &self.package;
            let t0 = std::time::Instant::now();
            self.tiles.par_iter_mut().for_each(|t| {
                if t.state == TileState::Running {
                    t.run_until_stop(&env, &package.tiles[t.image], opts.trace);
                }
            });
            self.parallel += t0.elapsed();
            if self.any_fault() {
                break;
            }
            let pending = self.tiles.iter().any(|t| {
                matches!(
                    t.state,
                    TileState::AtExchange { .. } | TileState::AtHost { .. }
                )
            });
            if pending {
                self.capture_at_exchanges(opts);
                self.exchanges(opts.trace, &mut chip_trace);
                self.host_transfers(opts.trace, &mut chip_trace);
                if self.any_fault() {
                    break;
                }
                continue;
            }
            let arrived = self
                .tiles
                .iter()
                .filter(|t| t.state == TileState::AtSync)
                .map(|t| t.clock())
                .max();
            let Some(arrived) = arrived else { break };
            let resume = arrived + u64::from(self.machine.timing.sync_cycles);
            for t in &mut self.tiles {
                if t.state == TileState::AtSync {
                    t.sup.clock = resume;
                    t.released = resume;
                    t.state = TileState::Running;
                    t.computed_since_sync = false;
                }
            }
            if opts.trace {
                chip_trace.push(chip_event(
                    arrived,
                    TraceKind::SuperstepEnd { index: superstep },
                ));
                chip_trace.push(chip_event(
                    resume,
                    TraceKind::SuperstepStart {
                        index: superstep + 1,
                    },
                ));
            }
            superstep += 1;
            if let Some(hook) = &opts.on_superstep {
                (hook.0)(superstep);
            }
        }
        if opts.preload_bindings {
            self.collect_outputs();
        }
        self.capture_at(CapturePoint::End, opts);
        // The last superstep ends with the run (every tile exited, or a fault), so
        // that the trace's phases add up to the run's cycles.
        if opts.trace {
            let end = self.tiles.iter().map(|t| t.clock()).max().unwrap_or(0);
            chip_trace.push(chip_event(
                end,
                TraceKind::SuperstepEnd { index: superstep },
            ));
        }
        self.report(superstep + 1, chip_trace)
    }

    /// Milliseconds this simulator has spent in parallel per-tile work since it
    /// was made (loading the tiles, running them to their next stop, landing an
    /// exchange's bytes, sorting the trace); the rest of a run's wall time is
    /// serial (matching and timing exchanges, host transfers, syncs, the report).
    pub fn parallel_ms(&self) -> f64 {
        self.parallel.as_secs_f64() * 1e3
    }

    fn any_fault(&self) -> bool {
        self.tiles.iter().any(|t| !t.faults.is_empty())
    }

    fn reload(&mut self) {
        let workers = self.machine.workers as usize;
        let slots = u64::from(self.machine.timing.worker_issue_interval);
        let start = self.layout.start;
        let package = &self.package;
        let t0 = std::time::Instant::now();
        let progs = program::programs(&package.tiles);
        for t in &mut self.tiles {
            t.sh.prog = progs[t.image].clone();
        }
        self.tiles.par_iter_mut().for_each(|t| {
            let image = &package.tiles[t.image];
            t.sh.mem.fill(0);
            tile::load_segments(&mut t.sh.mem, start, &image.segments);
            t.reset(image, workers, slots);
        });
        self.parallel += t0.elapsed();
    }

    fn preload(&mut self) {
        for (b, binding) in self.package.bindings.iter().enumerate() {
            if binding.kind == BindingKind::Output {
                continue;
            }
            for s in &binding.slices {
                let src = &self.bindings[b][s.offset as usize..(s.offset + s.bytes) as usize];
                let i = self.slot_of.of(s.tile);
                let off = (s.tile_addr - self.layout.start) as usize;
                self.tiles[i].sh.mem[off..off + src.len()].copy_from_slice(src);
                write_code_check(
                    &mut self.tiles[i].sh,
                    self.layout.start,
                    s.tile_addr,
                    s.bytes,
                );
            }
        }
    }

    fn collect_outputs(&mut self) {
        for (b, binding) in self.package.bindings.iter().enumerate() {
            if binding.kind != BindingKind::Output {
                continue;
            }
            for s in &binding.slices {
                let i = self.slot_of.of(s.tile);
                let off = (s.tile_addr - self.layout.start) as usize;
                let src = &self.tiles[i].sh.mem[off..off + s.bytes as usize];
                self.bindings[b][s.offset as usize..(s.offset + s.bytes) as usize]
                    .copy_from_slice(src);
            }
        }
    }

    fn exchange_fault(&mut self, slot: usize, cause: String) {
        let t = &mut self.tiles[slot];
        let (pc, word) = match t.state {
            TileState::AtExchange { pc, word, .. } | TileState::AtHost { pc, word, .. } => {
                (pc, Some(word))
            }
            _ => (t.sup.pc, None),
        };
        let kind = FaultKind::InvalidExchangeConfiguration;
        let image = &self.package.tiles[t.image];
        let cycle = t.clock();
        t.fault(
            image,
            Context::Supervisor,
            *trap(kind, cause, None),
            pc,
            word,
            cycle,
        );
        t.state = TileState::Faulted;
    }

    /// Carries out every exchange that tiles stopped at, each as one BSP exchange
    /// phase matched from the tiles' exchange code (`exchange::match_phase`).
    fn exchanges(&mut self, tracing: bool, chip_trace: &mut Vec<TraceEvent>) {
        let mut by_id: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, t) in self.tiles.iter().enumerate() {
            if let TileState::AtExchange { id, .. } = t.state {
                by_id.entry(id).or_default().push(i);
            }
        }
        for (id, executers) in by_id {
            if !self.exchange_index.contains_key(&id) {
                for &s in &executers {
                    self.exchange_fault(s, format!("the package has no exchange program #{id}"));
                }
                continue;
            }
            let mut bad = false;
            for &s in &executers {
                if self.tiles[s].computed_since_sync {
                    self.exchange_fault(
                        s,
                        format!("exchange #{id} follows compute without a global sync"),
                    );
                    bad = true;
                }
            }
            if bad {
                continue;
            }
            let matched = exchange::match_phase(
                &self.machine,
                &self.layout,
                &self.tiles,
                &self.slot_of,
                id,
                &executers,
            );
            let matched = match matched {
                Ok(m) => m,
                Err(faults) => {
                    for (s, cause) in faults {
                        self.exchange_fault(s, cause);
                    }
                    continue;
                }
            };
            // Matching is mostly serial (its per-tile checks aside); moving the
            // bytes is per-tile work.
            let t0 = std::time::Instant::now();
            exchange::land(&mut self.tiles, &self.layout, &matched, &mut self.landing);
            self.parallel += t0.elapsed();
            for &s in &executers {
                let t = &mut self.tiles[s];
                t.sup.clock = matched.end;
                t.state = TileState::Running;
                t.sh.xlog = Default::default();
            }
            if tracing {
                chip_trace.push(chip_event(matched.begin, TraceKind::ExchangeStart { id }));
                chip_trace.push(chip_event(matched.end, TraceKind::ExchangeEnd { id }));
            }
        }
    }

    /// Carries out the host transfers of every tile stopped at `hostxfer`, as one
    /// chip-wide phase sharing the host link: inward and outward bytes of the phase
    /// move at once, each direction at its own rate.
    fn host_transfers(&mut self, tracing: bool, chip_trace: &mut Vec<TraceEvent>) {
        let slots: Vec<usize> = (0..self.tiles.len())
            .filter(|&i| matches!(self.tiles[i].state, TileState::AtHost { .. }))
            .collect();
        if slots.is_empty() {
            return;
        }
        // Bytes into the chip and out of it: each direction has its own lanes.
        let (mut inward, mut outward) = (0u64, 0u64);
        let mut done = Vec::new();
        for s in slots {
            let TileState::AtHost { desc, pc, word } = self.tiles[s].state else {
                continue;
            };
            let parsed = self.parse_descriptors(s, desc).and_then(|records| {
                // The transfer happens at or after the issue: a running worker's
                // later access to its bytes races it.
                let tile = &mut self.tiles[s];
                let issue = tile.sup.last_issue;
                for r in &records {
                    let how = if r.to_host {
                        hazard::Access::Load
                    } else {
                        hazard::Access::Store
                    };
                    tile.sh.hz.supervisor(issue, r.tile_addr, r.len, how)?;
                }
                Ok(records)
            });
            match parsed {
                Err(t) => {
                    let tile = &mut self.tiles[s];
                    let image = &self.package.tiles[tile.image];
                    let cycle = tile.clock();
                    tile.fault(image, Context::Supervisor, *t, pc, Some(word), cycle);
                    tile.state = TileState::Faulted;
                }
                Ok(records) => {
                    let start = self.layout.start;
                    for r in &records {
                        let off = (r.tile_addr - start) as usize;
                        let len = r.len as usize;
                        let host = r.host_off as usize;
                        let sh = &mut self.tiles[s].sh;
                        if r.to_host {
                            self.bindings[r.binding][host..host + len]
                                .copy_from_slice(&sh.mem[off..off + len]);
                        } else {
                            sh.mem[off..off + len]
                                .copy_from_slice(&self.bindings[r.binding][host..host + len]);
                            write_code_check(sh, start, r.tile_addr, r.len);
                        }
                        if r.to_host {
                            outward += u64::from(r.len);
                        } else {
                            inward += u64::from(r.len);
                        }
                    }
                    done.push(s);
                }
            }
        }
        if done.is_empty() {
            return;
        }
        let cost = self.machine.host_phase_cycles(inward, outward);
        let total = inward + outward;
        let begin = done
            .iter()
            .map(|&s| self.tiles[s].clock())
            .max()
            .unwrap_or(0);
        for &s in &done {
            self.tiles[s].sup.clock = begin + cost;
            self.tiles[s].state = TileState::Running;
        }
        if tracing {
            chip_trace.push(chip_event(
                begin,
                TraceKind::HostTransferStart { bytes: total },
            ));
            chip_trace.push(chip_event(
                begin + cost,
                TraceKind::HostTransferEnd { bytes: total },
            ));
        }
    }

    fn parse_descriptors(&self, s: usize, desc: u32) -> Result<Vec<HostRecord>, Box<Trap>> {
        let mem = &self.tiles[s].sh.mem;
        let l = &self.layout;
        let bad_addr =
            |cause: String, a: u32| trap(FaultKind::InvalidMemoryAddress, cause, Some(a));
        let bad_op = |cause: String| trap(FaultKind::InvalidOperand, cause, Some(desc));
        let off = l.check(u64::from(desc), 4).map_err(|_| {
            bad_addr(
                format!("host descriptor list at {desc:#x} is misaligned or outside SRAM"),
                desc,
            )
        })?;
        let rd32 = |o: usize| u32::from_le_bytes([mem[o], mem[o + 1], mem[o + 2], mem[o + 3]]);
        let rd16 = |o: usize| u16::from_le_bytes([mem[o], mem[o + 1]]);
        let count = rd32(off);
        if !l.range_ok(desc, 4u32.saturating_add(count.saturating_mul(16))) || count > (1 << 20) {
            return Err(bad_addr(
                format!("host descriptor list at {desc:#x} with {count} records runs outside SRAM"),
                desc,
            ));
        }
        let mut out = Vec::with_capacity(count as usize);
        for k in 0..count as usize {
            let o = off + 4 + 16 * k;
            let (b, flags) = (rd16(o), rd16(o + 2));
            let (host_off, tile_addr, len) = (rd32(o + 4), rd32(o + 8), rd32(o + 12));
            let Some(binding) = self.package.bindings.get(usize::from(b)) else {
                return Err(bad_op(format!("host descriptor {k}: no binding #{b}")));
            };
            if flags & !1 != 0 {
                return Err(bad_op(format!(
                    "host descriptor {k}: unknown flags {flags:#x}"
                )));
            }
            let to_host = flags & 1 == 1;
            let ok_dir = match binding.kind {
                BindingKind::Output => to_host,
                BindingKind::Input | BindingKind::Weight => !to_host,
            };
            if !ok_dir {
                return Err(bad_op(format!(
                    "host descriptor {k}: binding `{}` is {:?} but the transfer goes {}",
                    binding.name,
                    binding.kind,
                    if to_host {
                        "to the host"
                    } else {
                        "to the tile"
                    }
                )));
            }
            // A record covers any number of link packets, but at least one: an
            // empty record is a corrupted list, not a no-op.
            if len == 0 {
                return Err(bad_op(format!(
                    "host descriptor {k}: empty record (0 bytes) for binding `{}`",
                    binding.name
                )));
            }
            if u64::from(host_off) + u64::from(len) > u64::from(binding.bytes) {
                return Err(bad_op(format!(
                    "host descriptor {k}: bytes {host_off}..{} exceed binding `{}` of {} bytes",
                    u64::from(host_off) + u64::from(len),
                    binding.name,
                    binding.bytes
                )));
            }
            if !l.range_ok(tile_addr, len) {
                return Err(bad_addr(
                    format!("host descriptor {k}: tile range {tile_addr:#x}+{len} is outside SRAM"),
                    tile_addr,
                ));
            }
            out.push(HostRecord {
                binding: usize::from(b),
                to_host,
                host_off,
                tile_addr,
                len,
            });
        }
        Ok(out)
    }

    fn report(&mut self, supersteps: u32, mut trace: Vec<TraceEvent>) -> SimReport {
        let mut faults = Vec::new();
        let mut per_tile = Vec::with_capacity(self.tiles.len());
        let (mut issues, mut instructions) = (0, 0);
        let mut cycles = 0;
        // The chip's events first, then each tile's: at equal times the stable
        // sort below keeps that order.
        let mut parts = Vec::with_capacity(self.tiles.len() + 1);
        parts.push(std::mem::take(&mut trace));
        for t in &mut self.tiles {
            faults.append(&mut t.faults);
            parts.push(std::mem::take(&mut t.trace));
            let sup = ContextStats {
                issues: t.sup.issues,
                instructions: t.sup.instructions,
                cycles: t.clock(),
            };
            let workers: Vec<ContextStats> = t
                .workers
                .iter()
                .map(|w| ContextStats {
                    issues: w.ctx.issues,
                    instructions: w.ctx.instructions,
                    cycles: w.busy_cycles,
                })
                .collect();
            issues += sup.issues + workers.iter().map(|w| w.issues).sum::<u64>();
            instructions += sup.instructions + workers.iter().map(|w| w.instructions).sum::<u64>();
            cycles = cycles.max(t.clock());
            per_tile.push(TileStats {
                tile: t.id,
                cycles: t.clock(),
                supervisor: sup,
                workers,
            });
        }
        per_tile.sort_by_key(|t| t.tile);
        faults.sort_by_key(|f| (f.tile, f.context));
        // One trace in time order: the parts moved into place and sorted in
        // parallel (stable, so events of one tile at one cycle keep their order).
        // A whole-chip trace holds millions of events; appending them one tile
        // after another would be most of the serial time of a traced run.
        let t0 = std::time::Instant::now();
        let mut trace = concat_parallel(parts);
        trace.par_sort_by_key(trace_order);
        self.parallel += t0.elapsed();
        SimReport {
            status: if faults.is_empty() {
                Status::Ok
            } else {
                Status::Fault
            },
            cycles,
            supersteps,
            issues,
            instructions,
            per_tile,
            faults,
            trace,
        }
    }
}

/// Where an event goes in a trace: by cycle, chip-wide events before tiles' and
/// tiles in increasing order.
fn trace_order(e: &TraceEvent) -> (u64, u64) {
    (e.cycle, e.tile.map_or(0, |t| u64::from(t) + 1))
}

/// The parts one after another, each moved into its place in parallel (a
/// placeholder fills the vector first, written in parallel too).
fn concat_parallel(parts: Vec<Vec<TraceEvent>>) -> Vec<TraceEvent> {
    let total = parts.iter().map(Vec::len).sum();
    let placeholder = TraceEvent {
        cycle: 0,
        tile: None,
        context: None,
        kind: TraceKind::Mark { tag: 0 },
    };
    let mut out = Vec::new();
    (0..total)
        .into_par_iter()
        .map(|_| placeholder.clone())
        .collect_into_vec(&mut out);
    let mut places = Vec::with_capacity(parts.len());
    let mut rest = out.as_mut_slice();
    for p in &parts {
        let (place, tail) = rest.split_at_mut(p.len());
        places.push(place);
        rest = tail;
    }
    places.into_par_iter().zip(parts).for_each(|(place, part)| {
        for (d, e) in place.iter_mut().zip(part) {
            *d = e;
        }
    });
    out
}

struct HostRecord {
    binding: usize,
    to_host: bool,
    host_off: u32,
    tile_addr: u32,
    len: u32,
}

fn amp_extra_cycles(machine: &Machine) -> u64 {
    let round = u64::from(machine.timing.worker_issue_interval.max(1));
    let rate = u64::from(machine.timing.amp_f16_macs_per_cycle.max(1));
    let busy = (64 * round).div_ceil(rate);
    busy.div_ceil(round).saturating_sub(1) * round
}

fn chip_event(cycle: u64, kind: TraceKind) -> TraceEvent {
    TraceEvent {
        cycle,
        tile: None,
        context: None,
        kind,
    }
}

pub(crate) fn write_code_check(sh: &mut Shared, sram_start: u32, addr: u32, len: u32) {
    if sh.prog.overlaps(addr, len) {
        Arc::make_mut(&mut sh.prog).redecode(&sh.mem, sram_start, addr, len);
    }
}

fn validate_segments(
    machine: &Machine,
    layout: &Layout,
    image: &tessera_package::TileImage,
) -> Result<(), LoadError> {
    let mut ranges: Vec<(u64, u64, &str)> = Vec::new();
    for s in &image.segments {
        let bad = |reason: String| LoadError::Segment {
            tile: image.tile,
            segment: s.name.clone(),
            reason,
        };
        if s.bytes.len() as u64 > u64::from(s.size) {
            return Err(bad(format!(
                "{} initial bytes exceed its size of {}",
                s.bytes.len(),
                s.size
            )));
        }
        if !layout.range_ok(s.addr, s.size) {
            return Err(bad(format!(
                "{:#x}+{} is outside SRAM {:#x}..{:#x}",
                s.addr, s.size, layout.start, layout.end
            )));
        }
        if !s.bytes.is_empty()
            && u64::from(s.addr) + s.bytes.len() as u64 > u64::from(machine.loader_limit)
        {
            return Err(bad(format!(
                "initialised bytes end past the loader limit {:#x}",
                machine.loader_limit
            )));
        }
        if s.perms.execute {
            if !s.addr.is_multiple_of(4) || !s.size.is_multiple_of(4) {
                return Err(bad("code must be 4-byte aligned and sized".into()));
            }
            if !layout.range_executable(s.addr, s.size) {
                return Err(bad(format!(
                    "code at {:#x}+{} is not inside an executable region",
                    s.addr, s.size
                )));
            }
        }
        ranges.push((
            u64::from(s.addr),
            u64::from(s.addr) + u64::from(s.size),
            &s.name,
        ));
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(LoadError::Segment {
                tile: image.tile,
                segment: w[1].2.to_string(),
                reason: format!("overlaps segment `{}`", w[0].2),
            });
        }
    }
    Ok(())
}
