//! Tiles that differ only in names. A whole-chip plan gives most tiles the same
//! buffers under different names (the tile's number is part of every buffer's
//! name); the allocator reads sizes, lifetimes and rules, never names, so such
//! tiles place alike. `place_tiles` places one tile per shape and gives the others
//! the same addresses under their own names, each then checked on its own.

use std::collections::HashMap;

use crate::{Allocation, MemClass, TilePlacement, TileProblem};

/// Everything about a tile the allocator reads, with names replaced by their
/// position (requests first, then sequences). `None` when a name is repeated or
/// unknown: such a problem is placed on its own, which reports the error.
pub(crate) fn shape_key(t: &TileProblem) -> Option<Vec<u64>> {
    let index = name_index(t)?;
    let class = |c: MemClass| match c {
        MemClass::Any => 0,
        MemClass::NonInterleaved => 1,
        MemClass::Interleaved => 2,
        MemClass::Executable => 3,
    };
    let mut k = Vec::with_capacity(8 * (t.requests.len() + t.sequences.len()) + 16);
    k.push(t.requests.len() as u64);
    for r in &t.requests {
        k.extend([
            r.size,
            r.align,
            r.end_round,
            r.first,
            r.last,
            class(r.class),
            r.tail,
            u64::from(r.loaded),
        ]);
    }
    k.push(t.sequences.len() as u64);
    for s in &t.sequences {
        k.extend([
            s.count,
            s.size,
            s.align,
            s.end_round,
            s.first,
            s.last,
            class(s.class),
            s.tail,
            u64::from(s.loaded),
            u64::from(s.separate),
        ]);
    }
    k.push(t.reservations.len() as u64);
    for r in &t.reservations {
        k.extend([r.start, r.end]);
    }
    k.push(t.separation.len() as u64);
    for g in &t.separation {
        k.push(g.len() as u64);
        for name in g {
            k.push(*index.get(name.as_str())? as u64);
        }
    }
    k.push(t.aliases.len() as u64);
    for a in &t.aliases {
        k.extend([
            *index.get(a.name.as_str())? as u64,
            *index.get(a.of.as_str())? as u64,
            a.offset as u64,
        ]);
    }
    Some(k)
}

fn name_index(t: &TileProblem) -> Option<HashMap<&str, usize>> {
    let mut index = HashMap::with_capacity(t.requests.len() + t.sequences.len());
    let names = t.requests.iter().map(|r| r.name.as_str());
    let names = names.chain(t.sequences.iter().map(|s| s.name.as_str()));
    for (i, name) in names.enumerate() {
        if index.insert(name, i).is_some() {
            return None;
        }
    }
    Some(index)
}

/// `placed` (a placement of `from`) for `to`, a tile of the same shape: the same
/// addresses under `to`'s names.
pub(crate) fn rename(
    placed: &TilePlacement,
    from: &TileProblem,
    to: &TileProblem,
) -> Option<TilePlacement> {
    let index = name_index(from)?;
    let name_at = |i: usize| -> Option<&String> {
        match i.checked_sub(to.requests.len()) {
            None => to.requests.get(i).map(|r| &r.name),
            Some(j) => to.sequences.get(j).map(|s| &s.name),
        }
    };
    let allocations = placed
        .allocations
        .iter()
        .map(|a| {
            Some(Allocation {
                id: name_at(*index.get(a.id.as_str())?)?.clone(),
                offset: a.offset,
                stride: a.stride,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(TilePlacement {
        tile: to.tile,
        mode_used: placed.mode_used,
        peak: placed.peak,
        allocations,
    })
}
