//! The allocators' internal view of a problem: an address space made of zones, fixed
//! reservations, and units (a request, an alias group placed as one, or a sequence),
//! each with the static rules that bind its base address. Tile problems and flat CSV
//! problems both lower to this, so every mode runs one engine.

use crate::PlaceError;
use crate::csv::FlatProblem;
use crate::problem::{MemClass, TileProblem};
use std::collections::HashMap;
use tessera_machine::Machine;

/// A contiguous stretch of address space with one set of hardware properties.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Zone {
    pub start: u64,
    pub end: u64,
    /// Separation grain: an element, or an element pair when interleaved.
    pub span: u64,
    pub interleaved: bool,
    pub executable: bool,
}

/// A stretch of a unit that belongs to a separation group, relative to the unit base;
/// `hi` includes the access tail (over-reads are streamed too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SepPiece {
    pub group: u32,
    pub lo: u64,
    pub hi: u64,
}

/// Where a unit's members come from, to turn a base address back into allocations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Member {
    Request { index: usize, rel: u64 },
    Sequence { index: usize, stride: u64 },
    Flat { index: usize },
}

/// Something placed as one block: a request, an alias group or a sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unit {
    pub label: String,
    pub category: String,
    /// Bytes occupied from the base.
    pub extent: u64,
    pub align: u64,
    /// The base is congruent to `phase` modulo `align`.
    pub phase: u64,
    /// Half-open lifetime `[lo, hi)` in step units.
    pub lo: i64,
    pub hi: i64,
    /// Bit `i` set: zone `i` may hold this unit.
    pub zones: u64,
    /// `base + reach` must not pass the end of the unit's zone (data plus tails).
    pub reach: u64,
    /// `base + loaded_end` must not pass the loader limit.
    pub loaded_end: Option<u64>,
    pub sep: Vec<SepPiece>,
    pub members: Vec<Member>,
    /// Largest member alignment: the retry order sorts on it.
    pub max_align: u64,
}

impl Unit {
    pub fn overlaps_in_time(&self, other: &Unit) -> bool {
        self.lo < other.hi && other.lo < self.hi && self.lo < self.hi && other.lo < other.hi
    }
}

/// The lowered problem.
#[derive(Debug, Clone)]
pub(crate) struct Instance {
    pub zones: Vec<Zone>,
    /// Sorted, merged fixed ranges.
    pub fixed: Vec<(u64, u64)>,
    pub loader_limit: u64,
    pub units: Vec<Unit>,
    /// First address of the space (the arena start).
    pub base: u64,
    /// Reserved bytes inside the zones, for bounds.
    pub fixed_bytes: u64,
}

/// How the address space is bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct SpaceLimit {
    /// Usable bytes from the start of the space, if narrower than the machine.
    pub capacity: Option<u64>,
    /// Extra bytes appended to the last zone (diagnostics only).
    pub extra: u64,
}

pub(crate) fn round_up(x: u64, to: u64) -> Option<u64> {
    if to <= 1 {
        return Some(x);
    }
    x.checked_add(to - 1).map(|v| v / to * to)
}

/// Smallest `p >= x` with `p % align == phase`.
pub(crate) fn align_up_phase(x: u64, align: u64, phase: u64) -> Option<u64> {
    if align <= 1 {
        return Some(x);
    }
    let r = x % align;
    if r == phase {
        Some(x)
    } else if r < phase {
        Some(x - r + phase)
    } else {
        x.checked_add(align - r + phase)
    }
}

/// Largest size, alignment or address any input may use: keeps all arithmetic far
/// from overflow.
pub(crate) const MAX_BYTES: u64 = 1 << 50;

impl Instance {
    pub fn space_end(&self) -> u64 {
        self.zones.last().map_or(self.base, |z| z.end)
    }

    /// Bytes the zones hold, minus reservations inside them.
    pub fn usable_bytes(&self) -> u64 {
        let total: u64 = self.zones.iter().map(|z| z.end - z.start).sum();
        total.saturating_sub(self.fixed_bytes)
    }

    /// Lowest base `>= from` that satisfies the unit's static rules: alignment,
    /// zone and class, tails, the loader limit and reservations. Monotone and
    /// idempotent, which the search relies on.
    pub fn static_fit(&self, u: usize, from: u64) -> Option<u64> {
        self.static_fit_unit(&self.units[u], from)
    }

    /// [`Instance::static_fit`] for a unit that need not belong to the instance (the
    /// diagnostics relax one rule at a time on a copy).
    pub fn static_fit_unit(&self, unit: &Unit, from: u64) -> Option<u64> {
        let mut p = from;
        loop {
            p = align_up_phase(p, unit.align, unit.phase)?;
            let zi = self.zones.partition_point(|z| z.end <= p);
            let z = self.zones.get(zi)?;
            if p < z.start {
                p = z.start;
                continue;
            }
            if zi >= 64 || unit.zones & (1 << zi) == 0 || p.checked_add(unit.reach)? > z.end {
                p = z.end;
                continue;
            }
            if let Some(le) = unit.loaded_end
                && p.checked_add(le)? > self.loader_limit
            {
                return None;
            }
            let end = p + unit.extent;
            let ri = self.fixed.partition_point(|r| r.1 <= p);
            if let Some(&(rlo, rhi)) = self.fixed.get(ri)
                && rlo < end
            {
                p = rhi;
                continue;
            }
            return Some(p);
        }
    }

    /// The zone holding `addr`.
    pub fn zone_of(&self, addr: u64) -> Option<&Zone> {
        let zi = self.zones.partition_point(|z| z.end <= addr);
        self.zones.get(zi).filter(|z| z.start <= addr)
    }

    /// `[lo, hi)` widened to whole separation elements of its zone.
    pub fn element_round(&self, lo: u64, hi: u64) -> (u64, u64) {
        match self.zone_of(lo) {
            Some(z) if z.span > 1 => {
                let a = z.start + (lo - z.start) / z.span * z.span;
                let b = z.start + (hi.max(lo + 1) - z.start).div_ceil(z.span) * z.span;
                (a, b.min(z.end))
            }
            _ => (lo, hi),
        }
    }

    /// Largest total extent live at one step, and that step.
    pub fn live_peak(&self) -> (u64, i64) {
        let mut ev: Vec<(i64, i8, u64)> = Vec::with_capacity(self.units.len() * 2);
        for u in &self.units {
            if u.lo < u.hi && u.extent > 0 {
                ev.push((u.lo, 1, u.extent));
                ev.push((u.hi, -1, u.extent));
            }
        }
        ev.sort_unstable_by_key(|&(t, k, _)| (t, k));
        let (mut live, mut best, mut at) = (0u64, 0u64, 0i64);
        for (t, k, s) in ev {
            if k > 0 {
                live += s;
                if live > best {
                    best = live;
                    at = t;
                }
            } else {
                live -= s;
            }
        }
        (best, at)
    }

    /// A flat problem: one arena `[0, capacity)` (unbounded without a capacity).
    pub fn from_flat(p: &FlatProblem, capacity: Option<u64>) -> Result<Instance, PlaceError> {
        let end = capacity.unwrap_or(MAX_BYTES * 4).min(MAX_BYTES * 4);
        let mut units = Vec::with_capacity(p.buffers.len());
        for (i, b) in p.buffers.iter().enumerate() {
            if b.size > MAX_BYTES
                || b.align == 0
                || !b.align.is_power_of_two()
                || b.align > MAX_BYTES
            {
                return Err(PlaceError::Invalid(format!(
                    "buffer `{}`: size or alignment out of range",
                    b.id
                )));
            }
            units.push(Unit {
                label: b.id.clone(),
                category: "buffer".into(),
                extent: b.size,
                align: b.align,
                phase: 0,
                lo: b.lower,
                hi: b.upper,
                zones: 1,
                reach: b.size,
                loaded_end: None,
                sep: Vec::new(),
                members: vec![Member::Flat { index: i }],
                max_align: b.align,
            });
        }
        Ok(Instance {
            zones: vec![Zone {
                start: 0,
                end,
                span: 1,
                interleaved: false,
                executable: false,
            }],
            fixed: Vec::new(),
            loader_limit: u64::MAX,
            units,
            base: 0,
            fixed_bytes: 0,
        })
    }

    /// Lowers a tile problem on a machine.
    pub fn from_tile(
        m: &Machine,
        t: &TileProblem,
        limit: SpaceLimit,
    ) -> Result<Instance, PlaceError> {
        let mut zones: Vec<Zone> = Vec::new();
        let start = u64::from(m.sram_start());
        let cap_end = limit.capacity.map_or(u64::MAX, |c| start.saturating_add(c));
        for r in &m.regions {
            let (zs, ze) = (u64::from(r.start), u64::from(r.end).min(cap_end));
            if ze > zs {
                zones.push(Zone {
                    start: zs,
                    end: ze,
                    span: u64::from(r.element_span()).max(1),
                    interleaved: r.interleaved,
                    executable: r.executable,
                });
            }
        }
        if zones.is_empty() {
            return Err(PlaceError::Invalid("the capacity leaves no memory".into()));
        }
        if zones.len() > 64 {
            return Err(PlaceError::Invalid("more than 64 regions".into()));
        }
        if let Some(z) = zones.last_mut() {
            z.end = z.end.saturating_add(limit.extra);
        }
        let machine_admits = |c: MemClass| {
            m.regions
                .iter()
                .any(|r| c.admits(r.interleaved, r.executable))
        };
        let class_mask = |c: MemClass| -> u64 {
            zones
                .iter()
                .enumerate()
                .filter(|(_, z)| c.admits(z.interleaved, z.executable))
                .fold(0u64, |m, (i, _)| m | (1 << i))
        };
        let bad = |msg: String| PlaceError::Invalid(format!("tile {}: {msg}", t.tile));

        // Names: requests then sequences, all distinct.
        let mut names: HashMap<&str, Item> = HashMap::new();
        for (i, r) in t.requests.iter().enumerate() {
            if names.insert(&r.name, Item::Request(i)).is_some() {
                return Err(bad(format!("duplicate name `{}`", r.name)));
            }
            check_shape(
                &r.name,
                r.size,
                r.align,
                r.end_round,
                r.first,
                r.last,
                r.tail,
            )
            .map_err(&bad)?;
        }
        for (i, s) in t.sequences.iter().enumerate() {
            if names.insert(&s.name, Item::Sequence(i)).is_some() {
                return Err(bad(format!("duplicate name `{}`", s.name)));
            }
            check_shape(
                &s.name,
                s.size,
                s.align,
                s.end_round,
                s.first,
                s.last,
                s.tail,
            )
            .map_err(&bad)?;
            if s.count == 0 || s.count > 1 << 20 {
                return Err(bad(format!("sequence `{}`: count must be 1..2^20", s.name)));
            }
        }

        // Alias groups: union-find where `off[i]` is addr(i) - addr(parent[i]).
        let n = t.requests.len();
        let mut parent: Vec<usize> = (0..n).collect();
        let mut off: Vec<i64> = vec![0; n];
        fn find(parent: &mut [usize], off: &mut [i64], i: usize) -> (usize, i64) {
            let mut path = Vec::new();
            let mut r = i;
            while parent[r] != r {
                path.push(r);
                r = parent[r];
            }
            // Compress from the top so each node's offset is relative to the root.
            for &p in path.iter().rev() {
                let q = parent[p];
                if q != r {
                    off[p] += off[q];
                }
                parent[p] = r;
            }
            (r, if i == r { 0 } else { off[i] })
        }
        for a in &t.aliases {
            let req = |name: &str| match names.get(name) {
                Some(Item::Request(i)) => Ok(*i),
                Some(Item::Sequence(_)) => Err(bad(format!(
                    "alias `{}` -> `{}`: sequences cannot alias",
                    a.name, a.of
                ))),
                None => Err(bad(format!("alias names unknown request `{name}`"))),
            };
            let (x, y) = (req(&a.name)?, req(&a.of)?);
            if a.offset.unsigned_abs() > MAX_BYTES {
                return Err(bad(format!("alias `{}`: offset out of range", a.name)));
            }
            let (rx, dx) = find(&mut parent, &mut off, x);
            let (ry, dy) = find(&mut parent, &mut off, y);
            if rx == ry {
                if dx - dy != a.offset {
                    return Err(bad(format!(
                        "alias `{}` = `{}` + {} contradicts earlier aliases (they imply {})",
                        a.name,
                        a.of,
                        a.offset,
                        dx - dy
                    )));
                }
            } else {
                parent[rx] = ry;
                off[rx] = a.offset + dy - dx;
            }
        }
        let mut groups: Vec<Vec<(usize, i64)>> = Vec::new();
        let mut group_of_root: HashMap<usize, usize> = HashMap::new();
        let mut unit_of_request = Vec::with_capacity(n);
        for i in 0..n {
            let (r, d) = find(&mut parent, &mut off, i);
            let g = *group_of_root.entry(r).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[g].push((i, d));
            unit_of_request.push(g);
        }

        let mut units: Vec<Unit> = Vec::new();
        let mut rel_of_request = vec![0u64; n];
        for members in &groups {
            let min = members.iter().map(|&(_, d)| d).min().unwrap_or(0);
            let (mut extent, mut reach, mut loaded_end) = (0u64, 0u64, None::<u64>);
            let (mut lo, mut hi) = (i64::MAX, i64::MIN);
            let mut zmask = u64::MAX;
            let (mut align, mut phase, mut max_align) = (1u64, 0u64, 1u64);
            let mut ms = Vec::new();
            for &(i, d) in members {
                let r = &t.requests[i];
                let rel = (d - min) as u64;
                if rel > MAX_BYTES {
                    return Err(bad(format!("alias offsets of `{}` out of range", r.name)));
                }
                rel_of_request[i] = rel;
                let rounded = round_up(r.size, r.end_round).unwrap_or(u64::MAX);
                extent = extent.max(rel + rounded);
                reach = reach.max(rel + rounded + r.tail);
                if r.loaded {
                    loaded_end = Some(loaded_end.unwrap_or(0).max(rel + rounded));
                }
                lo = lo.min(r.first as i64);
                hi = hi.max(r.last as i64 + 1);
                zmask &= class_mask(r.class);
                if r.align > align {
                    align = r.align;
                    phase = (r.align - rel % r.align) % r.align;
                }
                max_align = max_align.max(r.align);
                ms.push(Member::Request { index: i, rel });
            }
            for &(i, _) in members {
                let r = &t.requests[i];
                if !(phase + rel_of_request[i]).is_multiple_of(r.align) {
                    return Err(bad(format!(
                        "alias group of `{}`: offsets cannot satisfy every alignment",
                        r.name
                    )));
                }
            }
            let first = &t.requests[members[0].0];
            // A class the capacity cut away is a failure to fit, not a bad problem.
            let classes_meet = m.regions.iter().any(|r| {
                members
                    .iter()
                    .all(|&(i, _)| t.requests[i].class.admits(r.interleaved, r.executable))
            });
            if !classes_meet {
                return Err(bad(format!(
                    "`{}`: no region admits its memory class{}",
                    first.name,
                    if members.len() > 1 {
                        " (alias group)"
                    } else {
                        ""
                    }
                )));
            }
            units.push(Unit {
                label: first.name.clone(),
                category: first
                    .category
                    .clone()
                    .unwrap_or_else(|| first.class.name().to_string()),
                extent,
                align,
                phase,
                lo,
                hi,
                zones: zmask,
                reach,
                loaded_end,
                sep: Vec::new(),
                members: ms,
                max_align,
            });
        }
        let mut unit_of_sequence = Vec::new();
        for (i, s) in t.sequences.iter().enumerate() {
            let zmask = class_mask(s.class);
            if !machine_admits(s.class) {
                return Err(bad(format!(
                    "`{}`: no region admits its memory class",
                    s.name
                )));
            }
            let rounded = round_up(s.size, s.end_round).unwrap_or(u64::MAX);
            let (stride, align) = if s.separate {
                // The widest grain the class may land in: aligning the base to it puts
                // every member at an element boundary in any admitted region.
                let grain = zones
                    .iter()
                    .enumerate()
                    .filter(|(zi, _)| zmask & (1 << zi) != 0)
                    .map(|(_, z)| z.span)
                    .max()
                    .unwrap_or(1);
                let a = s.align.max(grain);
                (round_up(rounded + s.tail, a).unwrap_or(u64::MAX), a)
            } else {
                (
                    round_up(rounded.max(1), s.align).unwrap_or(u64::MAX),
                    s.align,
                )
            };
            let extent = stride
                .checked_mul(s.count - 1)
                .and_then(|v| v.checked_add(rounded))
                .filter(|&v| v <= MAX_BYTES)
                .ok_or_else(|| bad(format!("sequence `{}` is too large", s.name)))?;
            unit_of_sequence.push(units.len());
            units.push(Unit {
                label: s.name.clone(),
                category: s
                    .category
                    .clone()
                    .unwrap_or_else(|| s.class.name().to_string()),
                extent,
                align,
                phase: 0,
                lo: s.first as i64,
                hi: s.last as i64 + 1,
                zones: zmask,
                reach: extent + s.tail,
                loaded_end: s.loaded.then_some(extent),
                sep: Vec::new(),
                members: vec![Member::Sequence { index: i, stride }],
                max_align: align,
            });
        }
        for (g, group) in t.separation.iter().enumerate() {
            let mut seen_units = Vec::new();
            for name in group {
                let (u, piece) = match names.get(name.as_str()) {
                    Some(Item::Request(i)) => {
                        let r = &t.requests[*i];
                        let rel = rel_of_request[*i];
                        let rounded = round_up(r.size, r.end_round).unwrap_or(u64::MAX);
                        (unit_of_request[*i], (rel, rel + rounded + r.tail))
                    }
                    Some(Item::Sequence(i)) => {
                        let u = unit_of_sequence[*i];
                        (u, (0, units[u].reach))
                    }
                    None => {
                        return Err(bad(format!("separation group names unknown `{name}`")));
                    }
                };
                if seen_units.contains(&u) {
                    return Err(bad(format!(
                        "separation group {g}: `{name}` shares storage with another member"
                    )));
                }
                seen_units.push(u);
                units[u].sep.push(SepPiece {
                    group: g as u32,
                    lo: piece.0,
                    hi: piece.1,
                });
            }
        }

        let mut fixed: Vec<(u64, u64)> = Vec::new();
        for r in &t.reservations {
            if r.start > r.end || r.end > MAX_BYTES {
                return Err(bad(format!(
                    "reservation `{}` is reversed or out of range",
                    r.name
                )));
            }
            if r.start < r.end {
                fixed.push((r.start, r.end));
            }
        }
        fixed.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (a, b) in fixed {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        let fixed_bytes = merged
            .iter()
            .map(|&(a, b)| {
                zones
                    .iter()
                    .map(|z| b.min(z.end).saturating_sub(a.max(z.start)))
                    .sum::<u64>()
            })
            .sum();
        Ok(Instance {
            base: zones[0].start,
            zones,
            fixed: merged,
            loader_limit: u64::from(m.loader_limit),
            units,
            fixed_bytes,
        })
    }
}

#[derive(Clone, Copy)]
enum Item {
    Request(usize),
    Sequence(usize),
}

fn check_shape(
    name: &str,
    size: u64,
    align: u64,
    end_round: u64,
    first: u64,
    last: u64,
    tail: u64,
) -> Result<(), String> {
    if name.is_empty() {
        return Err("a request has an empty name".into());
    }
    if size > MAX_BYTES || tail > MAX_BYTES {
        return Err(format!("`{name}`: size or tail beyond 2^50"));
    }
    for (what, v) in [("align", align), ("end_round", end_round)] {
        if v == 0 || !v.is_power_of_two() || v > MAX_BYTES {
            return Err(format!("`{name}`: {what} {v} is not a power of two"));
        }
    }
    if first > last || last >= (i64::MAX / 2) as u64 {
        return Err(format!(
            "`{name}`: lifetime [{first}, {last}] is reversed or too large"
        ));
    }
    Ok(())
}

/// Positions of every unit, turned back into allocations in input order.
pub(crate) fn allocations_of(
    inst: &Instance,
    t: Option<&TileProblem>,
    flat_ids: Option<&FlatProblem>,
    bases: &[u64],
) -> Vec<crate::Allocation> {
    let mut req: Vec<Option<crate::Allocation>> = vec![None; t.map_or(0, |t| t.requests.len())];
    let mut seq: Vec<Option<crate::Allocation>> = vec![None; t.map_or(0, |t| t.sequences.len())];
    let mut flat: Vec<Option<crate::Allocation>> =
        vec![None; flat_ids.map_or(0, |f| f.buffers.len())];
    for (u, unit) in inst.units.iter().enumerate() {
        let b = bases[u];
        for m in &unit.members {
            match *m {
                Member::Request { index, rel } => {
                    if let Some(t) = t {
                        req[index] = Some(crate::Allocation {
                            id: t.requests[index].name.clone(),
                            offset: b + rel,
                            stride: None,
                        });
                    }
                }
                Member::Sequence { index, stride } => {
                    if let Some(t) = t {
                        seq[index] = Some(crate::Allocation {
                            id: t.sequences[index].name.clone(),
                            offset: b,
                            stride: Some(stride),
                        });
                    }
                }
                Member::Flat { index } => {
                    if let Some(f) = flat_ids {
                        flat[index] = Some(crate::Allocation {
                            id: f.buffers[index].id.clone(),
                            offset: b,
                            stride: None,
                        });
                    }
                }
            }
        }
    }
    req.into_iter().chain(seq).chain(flat).flatten().collect()
}
