//! Hazards between the contexts of a tile: a supervisor access, or an AMP weight
//! load, that the machine would order differently from the simulator.
//!
//! The simulator runs a worker to completion when `run`/`runall` starts it, then
//! carries on with the supervisor; the cycles it charges say how the contexts
//! really interleave. Where two contexts touch the same bytes (or the AMP
//! weights), at least one of them writing, the simulator's order (every access of
//! the worker first) is the machine's only when the worker's access came first in
//! cycles too. Otherwise the simulated result is not the machine's, and the
//! program depends on the barrel's interleaving: a fault (`docs/sim.md`,
//! "Hazards").
//!
//! So each worker run keeps the byte ranges it accessed with the cycle of its
//! latest access (and latest write) to them, and the cycle of its latest AMP use;
//! a supervisor access at cycle `c` is checked against the runs started before
//! it and not over by `c`. Ranges are coalesced per pointer register while the
//! worker runs (a stream through one register stays one range), so the hot loop
//! pays a compare and a few stores per access (a compare per AMP feeder issue,
//! [`Feed`]); a run's list is sorted only when a supervisor access asks.

use crate::fault::{Context, FaultKind};
use crate::interp::Trap;
use tessera_isa::MReg;

/// Bytes `lo..hi` a worker run accessed, the cycle of its latest access to them
/// and of its latest write (0: never written; no worker issues at cycle 0, since
/// a worker starts at least a cycle after the `run` that starts it).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Span {
    pub lo: u32,
    pub hi: u32,
    pub last: u64,
    pub last_write: u64,
}

/// A batch of consecutive AMP feeder bundles on the same three pointer
/// registers (two loads, a store, each advancing by 8). Updating three spans on
/// every feeder issue cost the AMP kernel a sixth of its time; a batch costs a
/// compare per issue. Nothing else runs between the batch's issues (any other
/// issue closes it first), so each stream covers `start` up to its register's
/// value when the batch closes, and the batch's last issue is the one before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Feed {
    active: bool,
    /// The three registers, packed four bits each.
    regs: u16,
    start: [u32; 3],
}

fn pack(regs: [MReg; 3]) -> u16 {
    u16::from(regs[0].0 & 15) | (u16::from(regs[1].0 & 15) << 4) | (u16::from(regs[2].0 & 15) << 8)
}

/// What the running worker has done so far.
#[derive(Debug, Clone, Default)]
pub(crate) struct Log {
    feed: Feed,
    /// The range being extended through each base register.
    open: [Span; 16],
    closed: Vec<Span>,
    /// Latest cycle at which this run read (`amp`) or wrote (`ampw`) the weights.
    weights_last: u64,
    /// Latest cycle at which this run wrote them.
    ampw_last: u64,
}

/// One finished worker run, kept while the supervisor may still issue during it.
#[derive(Debug, Clone)]
struct RunRecord {
    worker: u8,
    start: u64,
    end: u64,
    spans: Vec<Span>,
    /// `spans` is sorted by `lo` and `reach[i]` is the largest `hi` of
    /// `spans[..=i]`, so overlaps are found by a binary search.
    indexed: bool,
    reach: Vec<u32>,
    weights_last: u64,
}

impl RunRecord {
    fn index(&mut self) {
        if self.indexed {
            return;
        }
        self.spans.sort_unstable_by_key(|s| s.lo);
        let mut reach = 0;
        self.reach = self
            .spans
            .iter()
            .map(|s| {
                reach = reach.max(s.hi);
                reach
            })
            .collect();
        self.indexed = true;
    }

    /// The latest access (a write only, when `writes_only`) to any byte of
    /// `lo..hi` after cycle `after`, as (cycle, span).
    fn after(&mut self, lo: u32, hi: u32, after: u64, writes_only: bool) -> Option<(u64, Span)> {
        self.index();
        // Spans starting below `hi`; walking down, stop once none reaches `lo`.
        let mut i = self.spans.partition_point(|s| s.lo < hi);
        let mut hit: Option<(u64, Span)> = None;
        while i > 0 && self.reach[i - 1] > lo {
            i -= 1;
            let s = self.spans[i];
            let t = if writes_only { s.last_write } else { s.last };
            if s.hi > lo && t > after && hit.is_none_or(|(h, _)| t > h) {
                hit = Some((t, s));
            }
        }
        hit
    }
}

/// A tile's hazard state (in [`crate::interp::Shared`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Hazards {
    /// The worker running now (its accesses go to `log`).
    worker: u8,
    log: Log,
    runs: Vec<RunRecord>,
    /// Span lists of retired runs, emptied, for the next runs to reuse.
    spare: Vec<Vec<Span>>,
    /// Latest `ampw` by any finished worker run, and whose: a later-simulated
    /// worker's `amp` before it in cycles read weights the simulator had already
    /// replaced.
    worker_ampw: (u64, u8),
    /// Latest `amp` or `ampw` by any finished worker run, and whose.
    worker_weights: (u64, u8),
}

/// How the supervisor touches memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Load,
    Store,
}

impl Hazards {
    pub fn reset(&mut self) {
        *self = Hazards::default();
    }

    /// A worker run starts: its accesses are logged from here.
    pub fn begin(&mut self, worker: usize) {
        self.worker = worker as u8;
        self.log.feed = Feed::default();
        self.log.open = [Span::default(); 16];
        self.log.closed = self.spare.pop().unwrap_or_default();
        self.log.weights_last = 0;
        self.log.ampw_last = 0;
    }

    /// The run started by [`Hazards::begin`] took cycles `start..end`.
    /// `m` and `last_issue` are the worker's registers and latest issue when it
    /// stopped.
    pub fn end(&mut self, start: u64, end: u64, m: &[u32; 16], last_issue: u64) {
        self.close_feed(m, last_issue);
        // Later runs are checked against this one's weights accesses; its own
        // came before its later ones, so it need not be (and the hot `amp`
        // updates one field).
        let w = self.worker;
        if self.log.weights_last > self.worker_weights.0 {
            self.worker_weights = (self.log.weights_last, w);
        }
        if self.log.ampw_last > self.worker_ampw.0 {
            self.worker_ampw = (self.log.ampw_last, w);
        }
        let mut spans = std::mem::take(&mut self.log.closed);
        spans.extend(self.log.open.iter().filter(|s| s.hi > s.lo));
        self.runs.push(RunRecord {
            worker: self.worker,
            start,
            end,
            spans,
            indexed: false,
            reach: Vec::new(),
            weights_last: self.log.weights_last,
        });
    }

    /// Forgets runs that ended by cycle `now`: the supervisor, whose issues only
    /// move forward, can no longer race them.
    pub fn retire(&mut self, now: u64) {
        let mut i = 0;
        while i < self.runs.len() {
            if self.runs[i].end > now {
                i += 1;
                continue;
            }
            let mut spans = self.runs.swap_remove(i).spans;
            spans.clear();
            self.spare.push(spans);
        }
    }

    /// A worker's access to `len` bytes at `addr` (inside SRAM) through pointer
    /// register `base`, issued at cycle `t`.
    #[inline(always)]
    pub fn note(&mut self, base: MReg, addr: u32, len: u32, t: u64, write: bool) {
        debug_assert!(!self.log.feed.active, "a feeder batch left open");
        let r = (base.0 & 15) as usize;
        let s = &mut self.log.open[r];
        // The stream's next bytes: the common case, kept to a compare and stores.
        if addr == s.hi {
            s.hi = addr + len;
            s.last = t;
            if write {
                s.last_write = t;
            }
        } else {
            self.note_jump(r, addr, len, t, write);
        }
    }

    /// The feeder bundle's accesses at cycle `t`: loads at `addrs[0]` and
    /// `addrs[1]`, a store at `addrs[2]` (8 bytes each), through `regs` (whose
    /// values `m` has not yet advanced); the first pointer then advances by
    /// `inc0`. `prev` is the worker's issue before this one.
    #[inline(always)]
    pub fn feed(
        &mut self,
        m: &[u32; 16],
        regs: [MReg; 3],
        addrs: [u32; 3],
        inc0: i64,
        t: u64,
        prev: u64,
    ) {
        let f = &self.log.feed;
        if f.active && f.regs == pack(regs) {
            if inc0 != 8 {
                self.feed_jump(addrs[0], inc0, t);
            }
            return;
        }
        self.feed_restart(m, regs, addrs, inc0, t, prev);
    }

    /// A strided feeder issue: its first stream's access at `a0` ends that
    /// stream's range, and the stream goes on from `a0 + inc0` (a row-major
    /// input's next row); the other two streams go on as they were.
    #[inline(never)]
    fn feed_jump(&mut self, a0: u32, inc0: i64, t: u64) {
        let r = usize::from(self.log.feed.regs & 15);
        let lo = self.log.feed.start[0];
        self.note_jump(r, lo, a0 + 8 - lo, t, false);
        // The general path has checked that the advanced pointer fits in 32 bits.
        self.log.feed.start[0] = (i64::from(a0) + inc0) as u32;
    }

    #[inline(never)]
    fn feed_restart(
        &mut self,
        m: &[u32; 16],
        regs: [MReg; 3],
        addrs: [u32; 3],
        inc0: i64,
        t: u64,
        prev: u64,
    ) {
        self.close_feed(m, prev);
        self.log.feed = Feed {
            active: true,
            regs: pack(regs),
            start: addrs,
        };
        if inc0 != 8 {
            self.feed_jump(addrs[0], inc0, t);
        }
    }

    /// Whether a feeder batch is open (the interpreter closes it before any
    /// other issue).
    #[inline(always)]
    pub fn feeding(&self) -> bool {
        self.log.feed.active
    }

    /// Closes the feeder batch, if any: `m` holds the registers after its last
    /// issue, made at cycle `last`.
    #[inline(never)]
    pub fn close_feed(&mut self, m: &[u32; 16], last: u64) {
        let f = std::mem::take(&mut self.log.feed);
        if !f.active {
            return;
        }
        for k in 0..3 {
            let r = usize::from((f.regs >> (4 * k)) & 15);
            let (lo, hi) = (f.start[k], m[r]);
            if hi > lo {
                self.note_jump(r, lo, hi - lo, last, k == 2);
            }
        }
    }

    #[inline(never)]
    fn note_jump(&mut self, r: usize, addr: u32, len: u32, t: u64, write: bool) {
        let end = addr + len;
        let s = &mut self.log.open[r];
        if addr <= s.hi && end >= s.lo {
            s.lo = s.lo.min(addr);
            s.hi = s.hi.max(end);
        } else {
            if s.hi > s.lo {
                self.log.closed.push(*s);
            }
            *s = Span {
                lo: addr,
                hi: end,
                last: 0,
                last_write: 0,
            };
        }
        s.last = t;
        if write {
            s.last_write = t;
        }
    }

    /// A worker's `amp` at cycle `t` (it reads the weights).
    #[inline(always)]
    pub fn worker_amp(&mut self, t: u64) -> Result<(), Box<Trap>> {
        if t < self.worker_ampw.0 {
            return Err(self.weights_race("amp", t, self.worker_ampw, "loads them with `ampw`"));
        }
        self.log.weights_last = t;
        Ok(())
    }

    /// A worker's `ampw` at cycle `t` (it writes the weights).
    pub fn worker_ampw(&mut self, t: u64) -> Result<(), Box<Trap>> {
        if t < self.worker_weights.0 {
            let w = self.worker_weights;
            return Err(self.weights_race("ampw", t, w, "uses them"));
        }
        self.log.weights_last = t;
        self.log.ampw_last = t;
        Ok(())
    }

    #[cold]
    fn weights_race(&self, what: &str, t: u64, (at, w): (u64, u8), they: &str) -> Box<Trap> {
        Box::new(Trap {
            kind: FaultKind::ExecutionHazard,
            cause: format!(
                "`{what}` at cycle {t} races worker {w}, which {they} at cycle {at}: the \
                 AMP weights are shared by the tile's workers"
            ),
            address: None,
            races: Some(Context::Worker(w)),
        })
    }

    /// A supervisor access to `len` bytes at `addr` (inside SRAM) at cycle `t`:
    /// a hazard when a worker run going at `t` accesses those bytes after `t`
    /// (writes them, for a load).
    #[inline]
    pub fn supervisor(
        &mut self,
        t: u64,
        addr: u32,
        len: u32,
        access: Access,
    ) -> Result<(), Box<Trap>> {
        if self.runs.is_empty() {
            return Ok(());
        }
        self.supervisor_slow(t, addr, len, access)
    }

    #[cold]
    fn supervisor_slow(
        &mut self,
        t: u64,
        addr: u32,
        len: u32,
        access: Access,
    ) -> Result<(), Box<Trap>> {
        let (lo, hi) = (addr, addr + len);
        let writes_only = access == Access::Load;
        // The earliest-started run names the fault, so the report does not
        // depend on the order runs were recorded in.
        let mut found: Option<(u8, u64, Span, u64)> = None;
        // Every recorded run was started by a `run` issued before `t`; one that
        // has not yet begun to issue races as much as one that has.
        for r in self.runs.iter_mut() {
            if r.end <= t {
                continue;
            }
            if let Some((at, span)) = r.after(lo, hi, t, writes_only)
                && found.is_none_or(|(w, ..)| r.worker < w)
            {
                found = Some((r.worker, at, span, r.end));
            }
        }
        let Some((w, at, span, end)) = found else {
            return Ok(());
        };
        let (sup, theirs) = match access {
            Access::Load => ("load from", "writes"),
            Access::Store => (
                "store to",
                if span.last_write > t {
                    "writes"
                } else {
                    "reads"
                },
            ),
        };
        Err(Box::new(Trap {
            kind: FaultKind::ExecutionHazard,
            cause: format!(
                "supervisor {sup} {lo:#x}..{hi:#x} at cycle {t} races worker {w}, which {theirs} \
                 {:#x}..{:#x} until cycle {at} (it runs until cycle {end})",
                span.lo, span.hi,
            ),
            address: Some(addr),
            races: Some(Context::Worker(w)),
        }))
    }

    /// The supervisor's `ampw` at cycle `t`: a hazard when a worker run going at
    /// `t` uses the weights after `t`.
    pub fn supervisor_ampw(&self, t: u64) -> Result<(), Box<Trap>> {
        let hit = self
            .runs
            .iter()
            .filter(|r| r.weights_last > t)
            .min_by_key(|r| r.worker);
        match hit {
            None => Ok(()),
            Some(r) => Err(Box::new(Trap {
                kind: FaultKind::ExecutionHazard,
                cause: format!(
                    "supervisor `ampw` at cycle {t} loads AMP weights that worker {} uses until \
                     cycle {} (it runs from cycle {} to {})",
                    r.worker, r.weights_last, r.start, r.end
                ),
                address: None,
                races: Some(Context::Worker(r.worker)),
            })),
        }
    }
}
