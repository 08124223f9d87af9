//! One tile: its memory, decoded code, supervisor and workers. A tile runs on its
//! own (in parallel with the others) until its supervisor reaches an instruction
//! that involves other tiles (sync, exchange, host transfer), exits or faults.
//!
//! Workers run to completion when started (their clocks still model the barrel:
//! each issues at most once per `worker_issue_interval` cycles from its start
//! cycle). Contexts of one tile only interact through memory and AMP weights, and
//! a program whose contexts race on those has no defined result anyway.

use crate::fault::{Context, Fault, FaultKind};
use crate::interp::{self, Amp, Ctx, Env, Shared, Stop, Trap, trap};
use crate::{TraceEvent, TraceKind};
use tessera_isa::{Inst, Word};
use tessera_package::{Segment, SymbolKind, TileImage};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TileState {
    Running,
    AtSync,
    AtExchange { id: u16, pc: u32, word: Word },
    AtHost { desc: u32, pc: u32, word: Word },
    Exited,
    Faulted,
}

#[derive(Default, Clone)]
pub(crate) struct Worker {
    pub ctx: Ctx,
    pub amp: Amp,
    /// Cycle after this worker's last issue.
    pub busy_until: u64,
    pub busy_cycles: u64,
}

pub(crate) struct Tile {
    pub id: u32,
    /// Index of the tile's image in the package.
    pub image: usize,
    pub sh: Shared,
    pub sup: Ctx,
    pub workers: Vec<Worker>,
    pub state: TileState,
    pub faults: Vec<Fault>,
    pub trace: Vec<TraceEvent>,
    /// Each kernel entry's name in the trace, made once.
    pub names: std::collections::HashMap<u32, std::sync::Arc<str>>,
    /// Workers were started since the last global sync (an exchange must not
    /// follow compute without a sync).
    pub computed_since_sync: bool,
    /// The cycle the last global sync released this tile: where its exchange
    /// code's time starts.
    pub released: u64,
}

/// The text of an instruction in fault reports.
pub(crate) fn word_text(w: &Word) -> String {
    format!("{w}")
}

/// The code symbol containing `pc`, and the offset into it.
pub(crate) fn symbolize(image: &TileImage, pc: u32) -> (Option<String>, u32) {
    let hit = image
        .symbols
        .iter()
        .filter(|s| s.kind == SymbolKind::Code && s.addr <= pc && pc - s.addr < s.size.max(1))
        .max_by_key(|s| s.addr);
    match hit {
        Some(s) => (Some(s.name.clone()), pc - s.addr),
        None => (None, pc),
    }
}

pub(crate) fn load_segments(mem: &mut [u8], sram_start: u32, segments: &[Segment]) {
    for s in segments {
        let off = (s.addr - sram_start) as usize;
        let n = s.bytes.len().min(s.size as usize);
        mem[off..off + n].copy_from_slice(&s.bytes[..n]);
    }
}

impl Tile {
    pub fn reset(&mut self, image: &TileImage, workers: usize, slots: u64) {
        self.sup = Ctx {
            pc: image.entry,
            ..Ctx::default()
        };
        self.workers = vec![Worker::default(); workers];
        self.sh.barrel = crate::barrel::Barrel::new(slots, workers);
        self.sh.weights = [[0.0; 16]; 16];
        self.sh.hz.reset();
        self.state = TileState::Running;
        self.faults.clear();
        self.trace.clear();
        self.computed_since_sync = false;
        self.released = 0;
        self.sh.xlog = Default::default();
    }

    pub fn clock(&self) -> u64 {
        self.sup.clock
    }

    pub fn fault(
        &mut self,
        image: &TileImage,
        context: Context,
        trap: Trap,
        pc: u32,
        word: Option<Word>,
        cycle: u64,
    ) {
        let (symbol, offset) = symbolize(image, pc);
        self.faults.push(Fault {
            tile: self.id,
            context,
            kind: trap.kind,
            cause: trap.cause,
            pc,
            symbol,
            offset,
            instruction: word.as_ref().map(word_text).unwrap_or_default(),
            address: trap.address,
            cycle,
            races: trap.races,
        });
    }

    /// Runs the supervisor until it stops at a chip-level instruction, exits or
    /// faults. Worker faults are recorded and the tile carries on.
    pub fn run_until_stop(&mut self, env: &Env, image: &TileImage, tracing: bool) {
        let mut no_amp = Amp::default();
        loop {
            let stop = interp::run::<true>(&mut self.sh, &mut self.sup, &mut no_amp, env);
            let (inst, pc, word) = match stop {
                Stop::Fault { trap, pc, word } => {
                    let cycle = self.sup.clock;
                    self.fault(image, Context::Supervisor, *trap, pc, word, cycle);
                    self.state = TileState::Faulted;
                    return;
                }
                Stop::Mark { tag, cycle } => {
                    if tracing {
                        self.trace.push(TraceEvent {
                            cycle,
                            tile: Some(self.id),
                            context: Some(Context::Supervisor),
                            kind: TraceKind::Mark { tag },
                        });
                    }
                    continue;
                }
                Stop::Super { inst, pc, word } => (inst, pc, word),
            };
            let issue = self.sup.last_issue;
            // Exchange code belongs between a global sync and its `exchange`.
            if !matches!(inst, Inst::Exchange { .. }) && !self.sh.xlog.is_empty() {
                let t = trap(
                    FaultKind::InvalidExchangeConfiguration,
                    format!(
                        "`{}` with exchange code not ended by `exchange` ({} sends, {} receives pending)",
                        word_text(&word),
                        self.sh.xlog.sends.len(),
                        self.sh.xlog.recvs.len()
                    ),
                    None,
                );
                self.fault(image, Context::Supervisor, *t, pc, Some(word), issue);
                self.state = TileState::Faulted;
                return;
            }
            match inst {
                Inst::Exit => {
                    self.sup.clock = self.sup.clock.max(self.workers_done());
                    self.sh.hz.retire(self.sup.clock);
                    self.state = TileState::Exited;
                    return;
                }
                Inst::SyncLocal => {
                    self.sup.clock = self.sup.clock.max(self.workers_done());
                    self.sh.hz.retire(self.sup.clock);
                }
                Inst::SyncGlobal => {
                    self.state = TileState::AtSync;
                    return;
                }
                Inst::Exchange { id } => {
                    self.state = TileState::AtExchange { id, pc, word };
                    return;
                }
                Inst::HostXfer { desc } => {
                    let desc = self.sup.m[(desc.0 & 15) as usize];
                    self.state = TileState::AtHost { desc, pc, word };
                    return;
                }
                Inst::Run {
                    entry,
                    state,
                    worker,
                } => {
                    let entry = self.sup.m[(entry.0 & 15) as usize];
                    let state = self.sup.m[(state.0 & 15) as usize];
                    if let Err(t) = self.check_start(entry, state, worker as usize) {
                        self.fault(image, Context::Supervisor, *t, pc, Some(word), issue);
                        self.state = TileState::Faulted;
                        return;
                    }
                    self.computed_since_sync = true;
                    // `run` hands over the slot it issued in: the worker's first
                    // issue is that slot's next turn.
                    let end = self.start_worker(
                        env,
                        image,
                        worker as usize,
                        entry,
                        state,
                        issue + env.interval,
                        tracing,
                    );
                    self.kernel_trace(image, tracing, entry, 1 << worker, issue, end);
                }
                Inst::RunAll {
                    entry,
                    state,
                    stride,
                } => {
                    let entry = self.sup.m[(entry.0 & 15) as usize];
                    let base = self.sup.m[(state.0 & 15) as usize];
                    if let Err(t) = self
                        .check_start(entry, base, 0)
                        .and_then(|_| check_state(u64::from(stride)))
                    {
                        self.fault(image, Context::Supervisor, *t, pc, Some(word), issue);
                        self.state = TileState::Faulted;
                        return;
                    }
                    self.computed_since_sync = true;
                    let mut end = issue;
                    // `runall` hands over every slot the supervisor holds: the
                    // workers take the free slots that follow, in worker order.
                    for w in 0..self.workers.len() {
                        let state = base.wrapping_add(w as u32 * u32::from(stride));
                        end = end.max(self.start_worker(
                            env,
                            image,
                            w,
                            entry,
                            state,
                            issue + 1,
                            tracing,
                        ));
                    }
                    let mask = ((1u32 << self.workers.len()) - 1) as u8;
                    self.kernel_trace(image, tracing, entry, mask, issue, end);
                }
                _ => {}
            }
        }
    }

    fn workers_done(&self) -> u64 {
        self.workers.iter().map(|w| w.busy_until).max().unwrap_or(0)
    }

    fn check_start(&self, entry: u32, state: u32, worker: usize) -> Result<(), Box<Trap>> {
        if worker >= self.workers.len() {
            return Err(trap(
                FaultKind::InvalidOperand,
                format!(
                    "worker {worker} does not exist ({} workers)",
                    self.workers.len()
                ),
                None,
            ));
        }
        if !entry.is_multiple_of(4) || !self.sh.prog.is_code(entry) {
            let why = if !entry.is_multiple_of(4) {
                "is not 4-byte aligned"
            } else {
                "is not executable code"
            };
            return Err(trap(
                FaultKind::InvalidProgramCounter,
                format!("worker entry {entry:#x} {why}"),
                Some(entry),
            ));
        }
        check_state(state.into())
    }

    #[allow(clippy::too_many_arguments)]
    fn start_worker(
        &mut self,
        env: &Env,
        image: &TileImage,
        w: usize,
        entry: u32,
        state: u32,
        start: u64,
        tracing: bool,
    ) -> u64 {
        // A busy context starts when it exits; then the first slot no other
        // worker holds (its own slot is free again from its exit).
        let start = self
            .sh
            .barrel
            .first_free(start.max(self.workers[w].busy_until), Some(w));
        let wk = &mut self.workers[w];
        let mut ctx = Ctx {
            pc: entry,
            clock: start,
            issues: wk.ctx.issues,
            instructions: wk.ctx.instructions,
            ..Ctx::default()
        };
        ctx.m[0] = state;
        ctx.m[1] = w as u32;
        wk.ctx = ctx;
        wk.amp = Amp::default();
        // The supervisor issues only from here on: runs over by now cannot race it.
        self.sh.hz.retire(self.sup.last_issue);
        self.sh.hz.begin(w);
        loop {
            let wk = &mut self.workers[w];
            match interp::run::<false>(&mut self.sh, &mut wk.ctx, &mut wk.amp, env) {
                Stop::Super {
                    inst: Inst::Exit, ..
                } => break,
                Stop::Mark { tag, cycle } => {
                    if tracing {
                        self.trace.push(TraceEvent {
                            cycle,
                            tile: Some(self.id),
                            context: Some(Context::Worker(w as u8)),
                            kind: TraceKind::Mark { tag },
                        });
                    }
                }
                Stop::Fault { trap, pc, word } => {
                    let cycle = wk.ctx.clock;
                    self.fault(image, Context::Worker(w as u8), *trap, pc, word, cycle);
                    break;
                }
                Stop::Super { pc, word, .. } => {
                    // Supervisor-only instructions fault inside the interpreter;
                    // this arm only guards against a future instruction slipping by.
                    let cycle = wk.ctx.clock;
                    let t = trap(
                        FaultKind::InvalidInstruction,
                        "supervisor-only instruction in a worker".into(),
                        None,
                    );
                    self.fault(image, Context::Worker(w as u8), *t, pc, Some(word), cycle);
                    break;
                }
            }
        }
        let wk = &mut self.workers[w];
        wk.busy_until = wk.ctx.clock;
        wk.busy_cycles += wk.ctx.clock - start;
        let end = wk.busy_until;
        self.sh.barrel.hold(w, start, end);
        self.sh.hz.end(
            start,
            end,
            &self.workers[w].ctx.m,
            self.workers[w].ctx.last_issue,
        );
        end
    }

    fn kernel_trace(
        &mut self,
        image: &TileImage,
        tracing: bool,
        entry: u32,
        workers: u8,
        start: u64,
        end: u64,
    ) {
        if !tracing {
            return;
        }
        let name = self
            .names
            .entry(entry)
            .or_insert_with(|| {
                let (symbol, offset) = symbolize(image, entry);
                match symbol {
                    Some(s) if offset == 0 => s,
                    Some(s) => format!("{s}+{offset:#x}"),
                    None => format!("{entry:#x}"),
                }
                .into()
            })
            .clone();
        let ctx = Some(Context::Supervisor);
        self.trace.push(TraceEvent {
            cycle: start,
            tile: Some(self.id),
            context: ctx,
            kind: TraceKind::KernelStart {
                symbol: name.clone(),
                workers,
            },
        });
        self.trace.push(TraceEvent {
            cycle: end,
            tile: Some(self.id),
            context: ctx,
            kind: TraceKind::KernelEnd {
                symbol: name,
                workers,
            },
        });
    }
}

fn check_state(state: u64) -> Result<(), Box<Trap>> {
    if !state.is_multiple_of(4) {
        return Err(trap(
            FaultKind::InvalidMemoryAddress,
            format!("worker state pointer (or stride) {state:#x} is not 4-byte aligned"),
            u32::try_from(state).ok(),
        ));
    }
    Ok(())
}
