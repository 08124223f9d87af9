//! The greedy modes (lifetime order and the retry order) and the rule engine they
//! share. A unit goes at the lowest address that satisfies its static rules and
//! clears every placed unit whose lifetime overlaps it and every placed member of
//! its separation groups. Both orders call exactly this; only the order differs.

use crate::model::{Instance, Unit};
use serde::{Deserialize, Serialize};

/// The rule that kept a request from fitting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockingRule {
    /// Fewer free bytes than the request needs among the live data.
    Capacity,
    /// Enough free bytes, but no free span long enough.
    Fragmentation,
    /// No admitted region is large enough for it.
    Class,
    /// The access tail would run past the end of its region.
    Tail,
    /// A loaded request would end above the loader limit.
    LoaderLimit,
    /// Every span large enough is crossed by a reservation.
    Reservation,
    /// Every free span shares a memory element with a separated request.
    Separation,
}

impl BlockingRule {
    pub fn name(self) -> &'static str {
        match self {
            BlockingRule::Capacity => "capacity",
            BlockingRule::Fragmentation => "fragmentation",
            BlockingRule::Class => "class",
            BlockingRule::Tail => "tail",
            BlockingRule::LoaderLimit => "loader_limit",
            BlockingRule::Reservation => "reservation",
            BlockingRule::Separation => "separation",
        }
    }
}

/// Where a greedy run stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    pub unit: usize,
    pub rule: BlockingRule,
}

/// Placed units, kept so conflicts can be gathered quickly.
pub(crate) struct Board<'a> {
    inst: &'a Instance,
    pub base: Vec<Option<u64>>,
    placed: Vec<usize>,
    /// Element-rounded separation pieces: (group, lo, hi).
    sep: Vec<(u32, u64, u64)>,
    scratch: Vec<(u64, u64)>,
}

impl<'a> Board<'a> {
    pub fn new(inst: &'a Instance) -> Board<'a> {
        Board {
            inst,
            base: vec![None; inst.units.len()],
            placed: Vec::new(),
            sep: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// Merged address ranges of placed units whose lifetimes overlap `unit`.
    fn occupied(&mut self, unit: &Unit) -> Vec<(u64, u64)> {
        let mut iv = std::mem::take(&mut self.scratch);
        iv.clear();
        for &p in &self.placed {
            let o = &self.inst.units[p];
            if o.extent > 0 && o.overlaps_in_time(unit) {
                let b = self.base[p].unwrap_or(0);
                iv.push((b, b + o.extent));
            }
        }
        iv.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(iv.len());
        for &(a, b) in &iv {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        self.scratch = iv;
        merged
    }

    /// Lowest base for `unit` given what is placed, or `None`.
    fn fit(&self, unit: &Unit, occupied: &[(u64, u64)], sep: &[(u32, u64, u64)]) -> Option<u64> {
        let mut p = self.inst.base;
        loop {
            p = self.inst.static_fit_unit(unit, p)?;
            let end = p + unit.extent;
            let i = occupied.partition_point(|iv| iv.1 <= p);
            if let Some(&(lo, hi)) = occupied.get(i)
                && lo < end
            {
                p = hi;
                continue;
            }
            let mut bump: Option<u64> = None;
            for piece in &unit.sep {
                for &(g, lo, hi) in sep {
                    if g == piece.group && p + piece.lo < hi && lo < p + piece.hi {
                        let q = hi.saturating_sub(piece.lo).max(p + 1);
                        bump = Some(bump.map_or(q, |b: u64| b.max(q)));
                    }
                }
            }
            if let Some(q) = bump {
                p = q;
                continue;
            }
            return Some(p);
        }
    }

    /// Places `u` at the lowest feasible address; on failure says which rule blocked.
    pub fn place(&mut self, u: usize) -> Result<u64, BlockingRule> {
        let unit = &self.inst.units[u];
        let occ = self.occupied(unit);
        match self.fit(unit, &occ, &self.sep) {
            Some(p) => {
                self.commit(u, p);
                Ok(p)
            }
            None => Err(self.explain(unit, &occ)),
        }
    }

    pub fn commit(&mut self, u: usize, p: u64) {
        let unit = &self.inst.units[u];
        self.base[u] = Some(p);
        self.placed.push(u);
        for piece in &unit.sep {
            let (lo, hi) = self.inst.element_round(p + piece.lo, p + piece.hi);
            self.sep.push((piece.group, lo, hi));
        }
    }

    /// Relaxes one rule at a time to name the one that blocked.
    fn explain(&self, unit: &Unit, occ: &[(u64, u64)]) -> BlockingRule {
        if !unit.sep.is_empty() && self.fit(unit, occ, &[]).is_some() {
            return BlockingRule::Separation;
        }
        if self.inst.static_fit_unit(unit, self.inst.base).is_none() {
            let mut u = unit.clone();
            u.loaded_end = None;
            if self.inst.static_fit_unit(&u, self.inst.base).is_some() {
                return BlockingRule::LoaderLimit;
            }
            u.reach = u.extent;
            if self.inst.static_fit_unit(&u, self.inst.base).is_some() {
                return BlockingRule::Tail;
            }
            u.zones = u64::MAX;
            if self.inst.static_fit_unit(&u, self.inst.base).is_some() {
                return BlockingRule::Class;
            }
            return BlockingRule::Capacity;
        }
        let mut relaxed = unit.clone();
        relaxed.loaded_end = None;
        if unit.loaded_end.is_some() && self.fit(&relaxed, occ, &self.sep).is_some() {
            return BlockingRule::LoaderLimit;
        }
        relaxed.reach = relaxed.extent;
        if unit.reach > unit.extent && self.fit(&relaxed, occ, &self.sep).is_some() {
            return BlockingRule::Tail;
        }
        relaxed.zones = u64::MAX;
        if self.fit(&relaxed, occ, &self.sep).is_some() {
            return BlockingRule::Class;
        }
        if !self.inst.fixed.is_empty() {
            let mut free_inst = self.inst.clone();
            free_inst.fixed.clear();
            let b = Board {
                inst: &free_inst,
                base: Vec::new(),
                placed: Vec::new(),
                sep: Vec::new(),
                scratch: Vec::new(),
            };
            if b.fit(unit, occ, &self.sep).is_some() {
                return BlockingRule::Reservation;
            }
        }
        // Free bytes in the admitted zones, outside reservations and live data.
        let mut free = 0u64;
        for (zi, z) in self.inst.zones.iter().enumerate() {
            if zi >= 64 || unit.zones & (1 << zi) == 0 {
                continue;
            }
            let mut used = 0u64;
            for &(a, b) in occ.iter().chain(self.inst.fixed.iter()) {
                used += b.min(z.end).saturating_sub(a.max(z.start));
            }
            free += (z.end - z.start).saturating_sub(used);
        }
        if free >= unit.extent {
            BlockingRule::Fragmentation
        } else {
            BlockingRule::Capacity
        }
    }
}

/// The seed's order: by first step, longer lifetimes first, then input order.
pub(crate) fn lifetime_order(inst: &Instance) -> Vec<usize> {
    let mut order: Vec<usize> = (0..inst.units.len()).collect();
    order.sort_by_key(|&u| {
        let x = &inst.units[u];
        (x.lo, std::cmp::Reverse(x.hi), u)
    });
    order
}

/// The retry order: decreasing alignment, size and lifetime duration.
pub(crate) fn retry_order(inst: &Instance) -> Vec<usize> {
    let mut order: Vec<usize> = (0..inst.units.len()).collect();
    order.sort_by_key(|&u| {
        let x = &inst.units[u];
        (
            std::cmp::Reverse(x.max_align),
            std::cmp::Reverse(x.extent),
            std::cmp::Reverse(x.hi.saturating_sub(x.lo)),
            u,
        )
    });
    order
}

/// Places units in `order`; the bases, or the first unit that failed.
pub(crate) fn greedy(inst: &Instance, order: &[usize]) -> Result<Vec<u64>, Failure> {
    let mut board = Board::new(inst);
    for &u in order {
        board.place(u).map_err(|rule| Failure { unit: u, rule })?;
    }
    Ok(board.base.into_iter().map(|b| b.unwrap_or(0)).collect())
}
