//! The bounded search: a depth-first branch and bound in the spirit of minimalloc.
//!
//! Units are placed in non-decreasing address order, each at its lowest feasible
//! base given the units already placed ("canonical" placements: any feasible
//! placement can be pushed down into one). A node branches on which unit comes next.
//! Pruning:
//! - ties at one address are taken in a fixed unit order (they cannot interact);
//! - a unit is never placed at or above the top some other unit would reach at its
//!   own lowest base (that unit could always drop into the gap below);
//! - per time section, the unplaced units must stack above the lowest base any of
//!   them can take (and above the current address) within the space.
//!
//! Several static orders race on separate threads. The winner is the one that
//! succeeds after the fewest nodes (ties to the lower order index), whatever the
//! thread timing, so results are deterministic.

use crate::model::Instance;
use std::sync::atomic::{AtomicU64, Ordering};

/// What the search concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SearchResult {
    Found {
        bases: Vec<u64>,
        nodes: u64,
    },
    /// Every canonical placement was ruled out.
    Exhausted {
        nodes: u64,
    },
    /// The node budget ran out first.
    GaveUp {
        nodes: u64,
    },
}

/// Static orders that break ties between units at one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    /// Largest section total the unit takes part in.
    Total,
    /// Size times duration.
    Area,
    /// Duration.
    Length,
}

/// Measured on the minimalloc suite: these two between them solve all eleven
/// instances fastest; more orders only slow the race on two cores.
const ORDERS: &[&[Key]] = &[
    &[Key::Total, Key::Length, Key::Area],
    &[Key::Total, Key::Area],
];

/// Shared, order-independent preprocessing.
struct Prep {
    /// Units the search places (positive extent); others go afterwards.
    ids: Vec<usize>,
    extent: Vec<u64>,
    s_lo: Vec<u32>,
    s_hi: Vec<u32>,
    sections: Vec<Vec<u32>>,
    /// Neighbours: (other, kind) with bit 0 = lifetimes overlap, bit 1 = separated.
    nbr: Vec<Vec<(u32, u8)>>,
    has_sep: Vec<bool>,
    total0: Vec<u64>,
    min0: Vec<u64>,
    cap_end: u64,
}

fn prepare(inst: &Instance) -> Prep {
    let ids: Vec<usize> = (0..inst.units.len())
        .filter(|&u| inst.units[u].extent > 0)
        .collect();
    let n = ids.len();
    let mut times: Vec<i64> = Vec::with_capacity(2 * n);
    for &u in &ids {
        let x = &inst.units[u];
        if x.lo < x.hi {
            times.push(x.lo);
            times.push(x.hi);
        }
    }
    times.sort_unstable();
    times.dedup();
    let nsec = times.len().saturating_sub(1);
    let mut s_lo = vec![0u32; n];
    let mut s_hi = vec![0u32; n];
    let mut sections = vec![Vec::new(); nsec];
    let mut total0 = vec![0u64; nsec];
    for (i, &u) in ids.iter().enumerate() {
        let x = &inst.units[u];
        if x.lo < x.hi {
            let a = times.partition_point(|&t| t < x.lo);
            let b = times.partition_point(|&t| t < x.hi);
            s_lo[i] = a as u32;
            s_hi[i] = b as u32;
            for s in a..b {
                sections[s].push(i as u32);
                total0[s] += x.extent;
            }
        }
    }
    // Lifetime overlaps by a sweep over starts.
    let mut nbr: Vec<Vec<(u32, u8)>> = vec![Vec::new(); n];
    let mut by_lo: Vec<u32> = (0..n as u32).collect();
    by_lo.sort_unstable_by_key(|&i| (inst.units[ids[i as usize]].lo, i));
    let mut active: Vec<u32> = Vec::new();
    for &i in &by_lo {
        let x = &inst.units[ids[i as usize]];
        if x.lo >= x.hi {
            continue;
        }
        active.retain(|&j| inst.units[ids[j as usize]].hi > x.lo);
        for &j in &active {
            nbr[i as usize].push((j, 1));
            nbr[j as usize].push((i, 1));
        }
        active.push(i);
    }
    let has_sep: Vec<bool> = ids.iter().map(|&u| !inst.units[u].sep.is_empty()).collect();
    for i in 0..n {
        if !has_sep[i] {
            continue;
        }
        for j in (i + 1)..n {
            let shares = inst.units[ids[i]]
                .sep
                .iter()
                .any(|a| inst.units[ids[j]].sep.iter().any(|b| a.group == b.group));
            if shares {
                for (a, b) in [(i, j), (j, i)] {
                    match nbr[a].iter_mut().find(|e| e.0 == b as u32) {
                        Some(e) => e.1 |= 2,
                        None => nbr[a].push((b as u32, 2)),
                    }
                }
            }
        }
    }
    for l in &mut nbr {
        l.sort_unstable();
    }
    let min0 = ids
        .iter()
        .map(|&u| inst.static_fit(u, inst.base).unwrap_or(u64::MAX))
        .collect();
    Prep {
        extent: ids.iter().map(|&u| inst.units[u].extent).collect(),
        ids,
        s_lo,
        s_hi,
        sections,
        nbr,
        has_sep,
        total0,
        min0,
        cap_end: inst.space_end(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Found,
    NotFound,
    Abort,
}

/// An independent subproblem: units that no unplaced unit links to the rest, over a
/// range of sections.
struct Part {
    units: Vec<u32>,
    sa: u32,
    sb: u32,
}

struct Solver<'a> {
    inst: &'a Instance,
    p: &'a Prep,
    order: Vec<Key>,
    pre: Vec<u32>,
    min_off: Vec<u64>,
    base: Vec<u64>,
    placed: Vec<bool>,
    total: Vec<u64>,
    /// Per section, an unplaced unit whose lowest base leaves room for the section's
    /// unplaced total. Only a cache: re-verified on use, so never undone.
    witness: Vec<u32>,
    /// Per boundary between sections `k` and `k + 1`: unplaced units crossing it.
    cuts: Vec<u32>,
    decompose: bool,
    /// Unplaced neighbours per unit. A unit with none is frozen: its lowest base,
    /// hence its place in the canonical sequence, can no longer change.
    open: Vec<u32>,
    trail_off: Vec<(u32, u64)>,
    /// Placed units with their `trail_off` marks, innermost last.
    stack: Vec<(u32, usize)>,
    cand: Vec<(u64, u32, u32)>,
    nodes: u64,
    /// Placement attempts: the effort measure that decides the race.
    places: u64,
    /// The placement count at which the race is next looked at.
    look_at: u64,
    budget: u64,
    tag: u64,
    best: &'a AtomicU64,
}

const TAG_BITS: u32 = 4;

/// Placements between looks at the race from within a node.
const LOOK_EVERY: u64 = 64;

impl<'a> Solver<'a> {
    fn new(
        inst: &'a Instance,
        p: &'a Prep,
        order: &[Key],
        tag: u64,
        budget: u64,
        best: &'a AtomicU64,
    ) -> Self {
        let n = p.ids.len();
        let pre = vec![0u32; n];
        let nsec = p.sections.len();
        let mut cuts = vec![0u32; nsec.saturating_sub(1)];
        for i in 0..n {
            for k in p.s_lo[i]..p.s_hi[i].saturating_sub(1) {
                cuts[k as usize] += 1;
            }
        }
        let witness = p
            .sections
            .iter()
            .map(|us| us.first().copied().unwrap_or(0))
            .collect();
        let mut solver = Solver {
            inst,
            p,
            order: order.to_vec(),
            pre,
            min_off: p.min0.clone(),
            base: vec![0; n],
            placed: vec![false; n],
            total: p.total0.clone(),
            witness,
            cuts,
            // Separation links units across time, so time cuts do not split them.
            decompose: !p.has_sep.iter().any(|&b| b),
            open: p.nbr.iter().map(|l| l.len() as u32).collect(),
            trail_off: Vec::new(),
            stack: Vec::new(),
            cand: Vec::new(),
            nodes: 0,
            places: 0,
            look_at: LOOK_EVERY,
            budget,
            tag,
            best,
        };
        let all: Vec<u32> = (0..n as u32).collect();
        solver.rank(&all);
        solver
    }

    /// Ranks `units` by the static order, with section totals as they stand now
    /// (a subproblem is ranked by what is left of it).
    fn rank(&mut self, units: &[u32]) {
        // Range maxima of the section totals over the units' span (a sparse table:
        // long-lived units span thousands of sections in real traces).
        let lo = units
            .iter()
            .map(|&u| self.p.s_lo[u as usize])
            .min()
            .unwrap_or(0) as usize;
        let hi = units
            .iter()
            .map(|&u| self.p.s_hi[u as usize])
            .max()
            .unwrap_or(0) as usize;
        let mut table: Vec<Vec<u64>> = vec![self.total[lo..hi.max(lo)].to_vec()];
        let mut w = 1;
        while 2 * w <= hi.saturating_sub(lo) {
            let prev = &table[table.len() - 1];
            let next: Vec<u64> = (0..prev.len() - w)
                .map(|i| prev[i].max(prev[i + w]))
                .collect();
            table.push(next);
            w *= 2;
        }
        let range_max = |a: usize, b: usize| -> u64 {
            if b <= a {
                return 0;
            }
            let k = (usize::BITS - 1 - (b - a).leading_zeros()) as usize;
            let row = &table[k];
            row[a - lo].max(row[b - lo - (1 << k)])
        };
        let key_of = |i: usize, k: Key| -> u128 {
            let x = &self.inst.units[self.p.ids[i]];
            let len = (x.hi - x.lo).max(0) as u128;
            match k {
                Key::Total => range_max(self.p.s_lo[i] as usize, self.p.s_hi[i] as usize) as u128,
                Key::Area => len * x.extent as u128,
                Key::Length => len,
            }
        };
        let mut keyed: Vec<([u128; 3], u32)> = units
            .iter()
            .map(|&u| {
                let mut ks = [0u128; 3];
                for (slot, &k) in ks.iter_mut().zip(&self.order) {
                    *slot = key_of(u as usize, k);
                }
                (ks, u)
            })
            .collect();
        keyed.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for (r, (_, u)) in keyed.iter().enumerate() {
            // Ranks start at 1 so a fresh search's `(0, 0)` precedes every candidate.
            self.pre[*u as usize] = r as u32 + 1;
        }
    }

    /// Top a unit would reach at its lowest base, separation grain included.
    fn height(&self, c: usize) -> u64 {
        let o = self.min_off[c];
        let mut h = o + self.p.extent[c];
        if self.p.has_sep[c] {
            for piece in &self.inst.units[self.p.ids[c]].sep {
                h = h.max(self.inst.element_round(o + piece.lo, o + piece.hi).1);
            }
        }
        h
    }

    /// Lowest base `d` may take once `c` sits at `o`, for the relation `kind`.
    fn top_for(&self, c: usize, o: u64, d: usize, kind: u8) -> u64 {
        let mut top = 0;
        if kind & 1 != 0 {
            top = o + self.p.extent[c];
        }
        if kind & 2 != 0 {
            let uc = &self.inst.units[self.p.ids[c]];
            let ud = &self.inst.units[self.p.ids[d]];
            for a in &uc.sep {
                for b in &ud.sep {
                    if a.group == b.group {
                        let hi = self.inst.element_round(o + a.lo, o + a.hi).1;
                        top = top.max(hi.saturating_sub(b.lo));
                    }
                }
            }
        }
        top
    }

    /// Places `c` at `o` and propagates; false if the node is infeasible. The
    /// placement is on the stack either way, for [`Solver::undo_to`].
    fn place(&mut self, c: usize, o: u64, part: &Part) -> bool {
        self.places += 1;
        self.stack.push((c as u32, self.trail_off.len()));
        self.placed[c] = true;
        self.base[c] = o;
        let ext = self.p.extent[c];
        for s in self.p.s_lo[c]..self.p.s_hi[c] {
            self.total[s as usize] -= ext;
        }
        for k in self.p.s_lo[c]..self.p.s_hi[c].saturating_sub(1) {
            self.cuts[k as usize] -= 1;
        }
        let mut ok = true;
        for k in 0..self.p.nbr[c].len() {
            let (d, kind) = self.p.nbr[c][k];
            let d = d as usize;
            self.open[d] -= 1;
            if self.placed[d] {
                continue;
            }
            let cur = self.min_off[d];
            if cur == u64::MAX {
                continue;
            }
            let top = self.top_for(c, o, d, kind);
            if top <= cur {
                continue;
            }
            let new = self.inst.static_fit(self.p.ids[d], top).unwrap_or(u64::MAX);
            if new != cur {
                self.trail_off.push((d as u32, cur));
                self.min_off[d] = new;
                if new == u64::MAX {
                    ok = false;
                }
            }
        }
        ok && self.sections_ok(o, part)
    }

    /// Every section's unplaced units must fit above both `o` (later units never go
    /// lower) and the lowest base any of them can take.
    fn sections_ok(&mut self, o: u64, part: &Part) -> bool {
        let cap = self.p.cap_end;
        for s in part.sa as usize..part.sb as usize {
            let t = self.total[s];
            if t == 0 {
                continue;
            }
            let Some(th) = cap.checked_sub(t) else {
                return false;
            };
            if o > th {
                return false;
            }
            let w = self.witness[s] as usize;
            if !self.placed[w] && self.min_off[w] <= th {
                continue;
            }
            match self.p.sections[s]
                .iter()
                .find(|&&u| !self.placed[u as usize] && self.min_off[u as usize] <= th)
            {
                Some(&u) => self.witness[s] = u,
                None => return false,
            }
        }
        true
    }

    fn undo_to(&mut self, mark: usize) {
        while self.stack.len() > mark {
            let Some((c, mark_off)) = self.stack.pop() else {
                break;
            };
            let c = c as usize;
            while self.trail_off.len() > mark_off {
                let (d, v) = self.trail_off.pop().unwrap_or((0, 0));
                self.min_off[d as usize] = v;
            }
            let ext = self.p.extent[c];
            for s in self.p.s_lo[c]..self.p.s_hi[c] {
                self.total[s as usize] += ext;
            }
            for k in self.p.s_lo[c]..self.p.s_hi[c].saturating_sub(1) {
                self.cuts[k as usize] += 1;
            }
            for &(d, _) in &self.p.nbr[c] {
                self.open[d as usize] += 1;
            }
            self.placed[c] = false;
        }
    }

    /// Boundaries inside `part` that no unplaced unit crosses any more, among
    /// those `c` crossed.
    fn new_cuts(&self, c: usize, part: &Part) -> Vec<u32> {
        if !self.decompose {
            return Vec::new();
        }
        let a = self.p.s_lo[c].max(part.sa);
        let b = self.p.s_hi[c].min(part.sb).saturating_sub(1);
        (a..b).filter(|&k| self.cuts[k as usize] == 0).collect()
    }

    /// Solves the pieces between `cuts` one after the other: they share nothing,
    /// so one failing piece fails them all.
    fn solve_split(&mut self, part: &Part, cuts: &[u32]) -> Status {
        let mark = self.stack.len();
        let mut bounds = vec![part.sa];
        bounds.extend(cuts.iter().map(|&k| k + 1));
        bounds.push(part.sb);
        // No unplaced unit crosses a cut, so each lies in exactly one window.
        let mut windows: Vec<Vec<u32>> = vec![Vec::new(); bounds.len() - 1];
        for &u in &part.units {
            let ui = u as usize;
            if self.placed[ui] {
                continue;
            }
            let w = bounds.partition_point(|&b| b <= self.p.s_lo[ui]);
            if let Some(list) = windows.get_mut(w.saturating_sub(1)) {
                list.push(u);
            }
        }
        for (wi, units) in windows.into_iter().enumerate() {
            let (x, y) = (bounds[wi], bounds[wi + 1]);
            if units.is_empty() {
                continue;
            }
            let saved: Vec<u32> = units.iter().map(|&u| self.pre[u as usize]).collect();
            self.rank(&units);
            let sub = Part {
                units,
                sa: x,
                sb: y,
            };
            let st = self.dfs(&sub, 0, 0);
            // Restore the ranks so the enclosing search keeps one canonical order.
            for (u, r) in sub.units.iter().zip(saved) {
                self.pre[*u as usize] = r;
            }
            if st != Status::Found {
                self.undo_to(mark);
                return st;
            }
        }
        Status::Found
    }

    fn dfs(&mut self, part: &Part, last_o: u64, last_pre: u32) -> Status {
        self.nodes += 1;
        if self.places > self.budget {
            return Status::Abort;
        }
        if self.nodes & 255 == 0 && self.lost() {
            return Status::Abort;
        }
        let mut min_h = u64::MAX;
        let mut remaining = 0usize;
        // The canonical sequence is strictly increasing in (base, rank), and a
        // frozen unit's key is final: it must come next or later, never be skipped.
        let mut frozen = (u64::MAX, u32::MAX);
        for &c in &part.units {
            let c = c as usize;
            if self.placed[c] {
                continue;
            }
            if self.min_off[c] == u64::MAX {
                return Status::NotFound;
            }
            remaining += 1;
            min_h = min_h.min(self.height(c));
            if self.open[c] == 0 {
                let key = (self.min_off[c], self.pre[c]);
                if key < (last_o, last_pre) {
                    return Status::NotFound;
                }
                frozen = frozen.min(key);
            }
        }
        if remaining == 0 {
            return Status::Found;
        }
        let start = self.cand.len();
        for &c in &part.units {
            let c = c as usize;
            if self.placed[c] {
                continue;
            }
            let o = self.min_off[c];
            let pr = self.pre[c];
            if o < min_h && (o, pr) > (last_o, last_pre) && (o, pr) <= frozen {
                self.cand.push((o, pr, c as u32));
            }
        }
        let end = self.cand.len();
        for i in start..end {
            // Selection on demand: most nodes only ever try their first candidate.
            let mut m = i;
            for j in (i + 1)..end {
                if self.cand[j] < self.cand[m] {
                    m = j;
                }
            }
            self.cand.swap(i, m);
            let (o, pr, c) = self.cand[i];
            let mark = self.stack.len();
            // A node may try thousands of candidates that fail at once (an
            // order that has lost makes 12,000 placements in 256 nodes on
            // So400m's tiles), so the race is also looked at every so many
            // placements.
            if self.places >= self.look_at {
                self.look_at = self.places + LOOK_EVERY;
                if self.lost() {
                    self.cand.truncate(start);
                    return Status::Abort;
                }
            }
            if self.place(c as usize, o, part) {
                let cuts = self.new_cuts(c as usize, part);
                let st = if cuts.is_empty() {
                    self.dfs(part, o, pr)
                } else {
                    self.solve_split(part, &cuts)
                };
                if st != Status::NotFound {
                    self.cand.truncate(start);
                    if st == Status::Abort {
                        self.undo_to(mark);
                    }
                    return st;
                }
            }
            self.undo_to(mark);
        }
        self.cand.truncate(start);
        Status::NotFound
    }

    /// Another order has succeeded after fewer placements than this one has
    /// made: this one can no longer win.
    fn lost(&self) -> bool {
        self.places > self.best.load(Ordering::Relaxed) >> TAG_BITS
    }

    fn solve(&mut self) -> Status {
        let root = Part {
            units: (0..self.p.ids.len() as u32).collect(),
            sa: 0,
            sb: self.p.sections.len() as u32,
        };
        let cuts: Vec<u32> = if self.decompose {
            (0..self.cuts.len() as u32)
                .filter(|&k| self.cuts[k as usize] == 0)
                .collect()
        } else {
            Vec::new()
        };
        // Units with no lifetime belong to no section: give them their own piece.
        let (timed, untimed): (Vec<u32>, Vec<u32>) = root
            .units
            .iter()
            .partition(|&&u| self.p.s_lo[u as usize] < self.p.s_hi[u as usize]);
        if !untimed.is_empty() && self.decompose {
            let st = self.dfs(
                &Part {
                    units: untimed,
                    sa: 0,
                    sb: 0,
                },
                0,
                0,
            );
            if st != Status::Found {
                return st;
            }
            let root = Part {
                units: timed,
                ..root
            };
            return if cuts.is_empty() {
                self.dfs(&root, 0, 0)
            } else {
                self.solve_split(&root, &cuts)
            };
        }
        if cuts.is_empty() {
            self.dfs(&root, 0, 0)
        } else {
            self.solve_split(&root, &cuts)
        }
    }
}

/// How the orders of the portfolio share the machine. Either way the winner is
/// the order that succeeds after the fewest placements (ties to the lower
/// index), so both give the same placement; they differ in wall time and work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Race {
    /// Each order on a thread of its own, every order stopping once it has made
    /// more placements than one that succeeded: one hard problem on idle cores.
    Threads,
    /// The orders one after the other on one thread, each later one stopping
    /// once it has made more placements than the best before it: many tiles
    /// placed in parallel, where the cores are already busy. The work is then
    /// the same whatever the threads' timing (and so are the placements
    /// counted in reports), and one tile's orders do not take cores from
    /// another tile (docs/placement.md has the figures).
    InTurn,
}

/// One order's outcome: how it ended, its placements, its bases.
type OrderRun = (Status, u64, Vec<u64>);

/// Runs `f` on a thread of its own with a deep stack: the search recurses once a
/// placed unit, deep on large problems.
fn deep<'scope, T: Send + 'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    f: impl FnOnce() -> Vec<T> + Send + 'scope,
) -> std::io::Result<std::thread::ScopedJoinHandle<'scope, Vec<T>>> {
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn_scoped(scope, f)
}

/// A thread's outcomes; one that panicked or could not start gave up.
fn joined(h: std::io::Result<std::thread::ScopedJoinHandle<'_, Vec<OrderRun>>>) -> Vec<OrderRun> {
    h.ok()
        .and_then(|j| j.join().ok())
        .unwrap_or_else(|| vec![(Status::Abort, 0, Vec::new())])
}

/// Runs the portfolio with `budget` nodes per order.
pub(crate) fn search(inst: &Instance, budget: u64, race: Race) -> SearchResult {
    let prep = prepare(inst);
    let best = AtomicU64::new(u64::MAX);
    let run = |h: usize| -> OrderRun {
        let mut s = Solver::new(inst, &prep, ORDERS[h], h as u64, budget, &best);
        let st = s.solve();
        if st == Status::Found {
            best.fetch_min((s.places << TAG_BITS) | s.tag, Ordering::Relaxed);
        }
        (st, s.places, s.base)
    };
    let results: Vec<OrderRun> = std::thread::scope(|scope| match race {
        Race::Threads => {
            let handles: Vec<_> = (0..ORDERS.len())
                .map(|h| deep(scope, move || vec![run(h)]))
                .collect();
            handles.into_iter().flat_map(joined).collect()
        }
        Race::InTurn => joined(deep(scope, || (0..ORDERS.len()).map(run).collect())),
    });
    let nodes: u64 = results.iter().map(|r| r.1).sum();
    let winner = results
        .iter()
        .enumerate()
        .filter(|(_, r)| r.0 == Status::Found)
        .min_by_key(|(h, r)| (r.1, *h));
    if let Some((_, (_, _, b))) = winner {
        let mut bases = vec![0u64; inst.units.len()];
        for (i, &u) in prep.ids.iter().enumerate() {
            bases[u] = b[i];
        }
        return finish_zero_extent(inst, &prep, bases, nodes);
    }
    if results.iter().any(|r| r.0 == Status::NotFound) {
        SearchResult::Exhausted { nodes }
    } else {
        SearchResult::GaveUp { nodes }
    }
}

/// Zero-size units occupy nothing but still need a legal address.
fn finish_zero_extent(inst: &Instance, prep: &Prep, bases: Vec<u64>, nodes: u64) -> SearchResult {
    if prep.ids.len() == inst.units.len() {
        return SearchResult::Found { bases, nodes };
    }
    let mut board = crate::alloc::Board::new(inst);
    for &u in &prep.ids {
        board.commit(u, bases[u]);
    }
    for u in 0..inst.units.len() {
        if inst.units[u].extent == 0 && board.place(u).is_err() {
            return SearchResult::GaveUp { nodes };
        }
    }
    let bases = board.base.into_iter().map(|b| b.unwrap_or(0)).collect();
    SearchResult::Found { bases, nodes }
}
