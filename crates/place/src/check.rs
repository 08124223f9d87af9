//! The independent checker. It validates a placement against the problem as the
//! user wrote it, using only the machine description: it shares no code with the
//! allocators, so a bug in their shared rule engine cannot hide here. It reports
//! every violation it finds, with the names involved, the rule and the bytes.

use crate::csv::FlatProblem;
use crate::problem::{MemClass, TilePlacement, TileProblem};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use tessera_machine::Machine;

/// The rule a violation breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// A request or sequence has no allocation.
    Missing,
    /// An allocation names nothing in the problem, or names it twice.
    Unknown,
    Alignment,
    /// The end, rounded up, leaves the region or meets other data.
    EndRound,
    /// Not inside one SRAM region (or beyond the requested capacity).
    Region,
    Class,
    Tail,
    LoaderLimit,
    Reservation,
    Overlap,
    Alias,
    Separation,
    Stride,
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub rule: Rule,
    /// Names of the requests involved.
    pub names: Vec<String>,
    /// Bytes in conflict (overlap size, overrun, misalignment), when meaningful.
    pub bytes: u64,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} [{}]: {} ({} bytes)",
            self.rule,
            self.names.join(", "),
            self.detail,
            self.bytes
        )
    }
}

fn v(rule: Rule, names: &[&str], bytes: u64, detail: String) -> Violation {
    Violation {
        rule,
        names: names.iter().map(|s| s.to_string()).collect(),
        bytes,
        detail,
    }
}

fn round(x: u64, to: u64) -> u64 {
    if to <= 1 {
        x
    } else {
        x.div_ceil(to).saturating_mul(to)
    }
}

/// One stretch of placed data: a request or one member of a sequence.
struct Piece<'a> {
    name: String,
    owner: &'a str,
    start: u64,
    raw_end: u64,
    end: u64,
    tail_end: u64,
    first: u64,
    last: u64,
    class: MemClass,
    loaded: bool,
    align: u64,
    /// Alias component, or a sequence's own index offset past all requests.
    group: usize,
}

/// Checks a tile placement. `capacity`, when given, bounds the usable bytes from
/// the first SRAM address, as the allocator was told.
pub fn check_placement(
    m: &Machine,
    t: &TileProblem,
    pl: &TilePlacement,
    capacity: Option<u64>,
) -> Vec<Violation> {
    let mut out = Vec::new();
    let sram_start = u64::from(m.sram_start());
    let usable_end = capacity.map_or(u64::MAX, |c| sram_start.saturating_add(c));

    let mut at: HashMap<&str, (u64, Option<u64>)> = HashMap::new();
    for a in &pl.allocations {
        let known =
            t.requests.iter().any(|r| r.name == a.id) || t.sequences.iter().any(|s| s.name == a.id);
        if !known {
            out.push(v(
                Rule::Unknown,
                &[&a.id],
                0,
                "allocation for an unknown name".into(),
            ));
        } else if at.insert(&a.id, (a.offset, a.stride)).is_some() {
            out.push(v(Rule::Unknown, &[&a.id], 0, "allocated twice".into()));
        }
    }

    // Alias components by breadth-first search over the declared relations.
    let idx: HashMap<&str, usize> = t
        .requests
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name.as_str(), i))
        .collect();
    let mut adj: Vec<Vec<usize>> = vec![Vec::new(); t.requests.len()];
    for a in &t.aliases {
        if let (Some(&x), Some(&y)) = (idx.get(a.name.as_str()), idx.get(a.of.as_str())) {
            adj[x].push(y);
            adj[y].push(x);
        }
    }
    let mut comp = vec![usize::MAX; t.requests.len()];
    for s in 0..t.requests.len() {
        if comp[s] != usize::MAX {
            continue;
        }
        comp[s] = s;
        let mut stack = vec![s];
        while let Some(x) = stack.pop() {
            for &y in &adj[x] {
                if comp[y] == usize::MAX {
                    comp[y] = s;
                    stack.push(y);
                }
            }
        }
    }

    let mut pieces: Vec<Piece> = Vec::new();
    for (i, r) in t.requests.iter().enumerate() {
        let Some(&(off, _)) = at.get(r.name.as_str()) else {
            out.push(v(
                Rule::Missing,
                &[&r.name],
                r.size,
                "request not placed".into(),
            ));
            continue;
        };
        let rounded = round(r.size, r.end_round);
        pieces.push(Piece {
            name: r.name.clone(),
            owner: &r.name,
            start: off,
            raw_end: off.saturating_add(r.size),
            end: off.saturating_add(rounded),
            tail_end: off.saturating_add(rounded).saturating_add(r.tail),
            first: r.first,
            last: r.last,
            class: r.class,
            loaded: r.loaded,
            align: r.align,
            group: comp[i],
        });
    }
    for (k, s) in t.sequences.iter().enumerate() {
        let Some(&(off, stride)) = at.get(s.name.as_str()) else {
            out.push(v(
                Rule::Missing,
                &[&s.name],
                s.size,
                "sequence not placed".into(),
            ));
            continue;
        };
        let rounded = round(s.size, s.end_round);
        let Some(stride) = stride else {
            out.push(v(
                Rule::Stride,
                &[&s.name],
                0,
                "sequence without a stride".into(),
            ));
            continue;
        };
        if s.count > 1 && stride < rounded {
            out.push(v(
                Rule::Stride,
                &[&s.name],
                rounded - stride,
                format!("stride {stride} is below the rounded size {rounded}"),
            ));
        }
        if s.align > 1 && stride % s.align != 0 {
            out.push(v(
                Rule::Stride,
                &[&s.name],
                stride % s.align,
                format!(
                    "stride {stride} is not a multiple of the alignment {}",
                    s.align
                ),
            ));
        }
        let first_piece = pieces.len();
        for i in 0..s.count.min(1 << 20) {
            let start = off.saturating_add(stride.saturating_mul(i));
            pieces.push(Piece {
                name: format!("{}[{i}]", s.name),
                owner: &s.name,
                start,
                raw_end: start.saturating_add(s.size),
                end: start.saturating_add(rounded),
                tail_end: start.saturating_add(rounded).saturating_add(s.tail),
                first: s.first,
                last: s.last,
                class: s.class,
                loaded: s.loaded,
                align: s.align,
                group: t.requests.len() + k,
            });
        }
        if s.separate {
            let members = &pieces[first_piece..];
            for a in 0..members.len() {
                for b in (a + 1)..members.len() {
                    if let Some(e) = shared_element(m, &members[a], &members[b]) {
                        out.push(v(
                            Rule::Separation,
                            &[&members[a].name, &members[b].name],
                            0,
                            format!("members of a separated sequence share element span {e}"),
                        ));
                    }
                }
            }
        }
    }

    for p in &pieces {
        if p.align > 1 && p.start % p.align != 0 {
            out.push(v(
                Rule::Alignment,
                &[&p.name],
                p.start % p.align,
                format!("address {:#x} is not a multiple of {}", p.start, p.align),
            ));
        }
        let region = u32::try_from(p.start).ok().and_then(|a| m.region_of(a));
        let Some(ri) = region else {
            if p.end > p.start {
                out.push(v(
                    Rule::Region,
                    &[&p.name],
                    p.end - p.start,
                    format!("address {:#x} is outside SRAM", p.start),
                ));
            }
            continue;
        };
        let r = &m.regions[ri];
        let rend = u64::from(r.end);
        if p.raw_end > rend || p.raw_end > usable_end {
            out.push(v(
                Rule::Region,
                &[&p.name],
                p.raw_end - rend.min(usable_end),
                format!(
                    "data [{:#x}, {:#x}) leaves region {ri} or the capacity",
                    p.start, p.raw_end
                ),
            ));
        } else if p.end > rend || p.end > usable_end {
            out.push(v(
                Rule::EndRound,
                &[&p.name],
                p.end - rend.min(usable_end),
                format!(
                    "rounded end {:#x} leaves region {ri} or the capacity",
                    p.end
                ),
            ));
        } else if p.tail_end > rend {
            out.push(v(
                Rule::Tail,
                &[&p.name],
                p.tail_end - rend,
                format!("access tail to {:#x} leaves region {ri}", p.tail_end),
            ));
        }
        if !p.class.admits(r.interleaved, r.executable) {
            out.push(v(
                Rule::Class,
                &[&p.name],
                p.end - p.start,
                format!("class {} placed in region {ri}", p.class.name()),
            ));
        }
        if p.loaded && p.end > u64::from(m.loader_limit) {
            out.push(v(
                Rule::LoaderLimit,
                &[&p.name],
                p.end - u64::from(m.loader_limit),
                format!("loaded data ends at {:#x}, above the loader limit", p.end),
            ));
        }
        for res in &t.reservations {
            let lo = p.start.max(res.start);
            let hi = p.end.min(res.end);
            if lo < hi {
                out.push(v(
                    Rule::Reservation,
                    &[&p.name, &res.name],
                    hi - lo,
                    format!("overlaps reservation [{:#x}, {:#x})", res.start, res.end),
                ));
            }
        }
    }

    // Pairwise: lifetimes and addresses.
    for a in 0..pieces.len() {
        for b in (a + 1)..pieces.len() {
            let (x, y) = (&pieces[a], &pieces[b]);
            if x.group == y.group || x.last < y.first || y.last < x.first {
                continue;
            }
            let lo = x.start.max(y.start);
            let hi = x.end.min(y.end);
            if lo < hi {
                let raw = x.raw_end.min(y.raw_end) > lo;
                out.push(v(
                    if raw { Rule::Overlap } else { Rule::EndRound },
                    &[&x.name, &y.name],
                    hi - lo,
                    format!("live together and share [{lo:#x}, {hi:#x})"),
                ));
            }
        }
    }

    for a in &t.aliases {
        if let (Some(&(x, _)), Some(&(y, _))) = (at.get(a.name.as_str()), at.get(a.of.as_str())) {
            let want = y as i128 + a.offset as i128;
            if x as i128 != want {
                out.push(v(
                    Rule::Alias,
                    &[&a.name, &a.of],
                    (x as i128 - want).unsigned_abs() as u64,
                    format!("`{}` must be at `{}` + {}", a.name, a.of, a.offset),
                ));
            }
        }
    }

    for group in &t.separation {
        let members: Vec<&Piece> = pieces
            .iter()
            .filter(|p| group.iter().any(|g| g == p.owner))
            .collect();
        for a in 0..members.len() {
            for b in (a + 1)..members.len() {
                if members[a].owner == members[b].owner {
                    continue;
                }
                if let Some(e) = shared_element(m, members[a], members[b]) {
                    out.push(v(
                        Rule::Separation,
                        &[&members[a].name, &members[b].name],
                        0,
                        format!("separated requests share element span {e}"),
                    ));
                }
            }
        }
    }
    out
}

/// The first element span (element, or interleaved pair) both pieces touch,
/// counting their access tails.
fn shared_element(m: &Machine, a: &Piece, b: &Piece) -> Option<u32> {
    let span = |p: &Piece| -> Option<(u32, u32)> {
        if p.tail_end <= p.start {
            return None;
        }
        let lo = m.element_span_of(u32::try_from(p.start).ok()?)?;
        let hi = m.element_span_of(u32::try_from(p.tail_end - 1).ok()?)?;
        Some((lo, hi))
    };
    let (x, y) = (span(a)?, span(b)?);
    let lo = x.0.max(y.0);
    (lo <= x.1.min(y.1)).then_some(lo)
}

/// Checks a flat placement: `offsets[i]` for `p.buffers[i]`; every buffer inside
/// `[0, capacity)`, aligned, and clear of every buffer it is live with.
pub fn check_flat(p: &FlatProblem, offsets: &[u64], capacity: Option<u64>) -> Vec<Violation> {
    let mut out = Vec::new();
    if offsets.len() != p.buffers.len() {
        out.push(v(
            Rule::Missing,
            &[],
            0,
            format!("{} offsets for {} buffers", offsets.len(), p.buffers.len()),
        ));
        return out;
    }
    for (b, &o) in p.buffers.iter().zip(offsets) {
        if b.align > 1 && o % b.align != 0 {
            out.push(v(
                Rule::Alignment,
                &[&b.id],
                o % b.align,
                format!("offset {o}"),
            ));
        }
        if let Some(c) = capacity
            && o.saturating_add(b.size) > c
        {
            out.push(v(
                Rule::Region,
                &[&b.id],
                o.saturating_add(b.size) - c,
                format!("ends at {} beyond capacity {c}", o.saturating_add(b.size)),
            ));
        }
    }
    // Sweep in time; the active set stays disjoint in address unless a violation
    // was already found, so comparing with address neighbours finds overlaps.
    let mut ev: Vec<(i64, u8, usize)> = Vec::new();
    for (i, b) in p.buffers.iter().enumerate() {
        if b.lower < b.upper && b.size > 0 {
            ev.push((b.lower, 1, i));
            ev.push((b.upper, 0, i));
        }
    }
    ev.sort_unstable();
    let mut active: BTreeMap<(u64, usize), u64> = BTreeMap::new();
    for (_, kind, i) in ev {
        let (o, e) = (offsets[i], offsets[i].saturating_add(p.buffers[i].size));
        if kind == 0 {
            active.remove(&(o, i));
            continue;
        }
        let prev = active.range(..(o, usize::MAX)).next_back();
        let next = active.range((o, 0)..).next();
        for (&(po, pi), &pe) in prev.into_iter().chain(next) {
            let lo = po.max(o);
            let hi = pe.min(e);
            if lo < hi && out.len() < 1000 {
                out.push(v(
                    Rule::Overlap,
                    &[&p.buffers[pi].id, &p.buffers[i].id],
                    hi - lo,
                    format!("live together and share [{lo}, {hi})"),
                ));
            }
        }
        active.insert((o, i), e);
    }
    out
}
