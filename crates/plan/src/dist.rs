//! Distributed tensors and the one redistribution between them.
//!
//! A [`DistTensor`] is a row-major 2-D tensor spread over tiles as rectangular
//! blocks ([`Part`]s), each stored row-major in a buffer. Parts of a source may
//! overlap (replicas): every element is read from the first part that holds it.
//! Parts of a destination may overlap too (a replicated consumer): each gets its
//! own copy of the bytes.
//!
//! [`redistribute`] turns any layout into any other as exchange copies: it
//! intersects each destination block with the source blocks, emits one copy per
//! contiguous run (whole blocks when both sides are row-contiguous), and merges
//! copies of the same source bytes into one copy with several destinations, which
//! the exchange then sends once. It never chooses addresses or steps: the caller
//! places the copies in an exchange phase.

use std::collections::{HashMap, HashSet};

use foldhash::fast::FixedState;
use std::ops::Range;

use crate::ir::{BufId, Copy, Loc};

/// One block of a distributed tensor: rows and columns of the whole tensor, stored
/// row-major (row stride `cols.len()` elements) at `at`. The tile is the buffer's:
/// it is not repeated here, so the two cannot disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub at: Loc,
    pub rows: Range<u32>,
    pub cols: Range<u32>,
}

impl Part {
    fn width(&self) -> u32 {
        self.cols.end - self.cols.start
    }
}

/// A `[rows, cols]` tensor of `elem_bytes`-byte elements spread over tiles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistTensor {
    pub rows: u32,
    pub cols: u32,
    pub elem_bytes: u32,
    pub parts: Vec<Part>,
}

/// Why a redistribution is impossible.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DistError {
    #[error("the tensors differ: source [{0}x{1}], destination [{2}x{3}]")]
    Shape(u32, u32, u32, u32),
    #[error("part {part} covers rows {rows:?} and columns {cols:?}, outside the tensor [{r}x{c}]")]
    OutOfRange {
        part: usize,
        rows: Range<u32>,
        cols: Range<u32>,
        r: u32,
        c: u32,
    },
    #[error("element ({row}, {col}) is in no source part")]
    Uncovered { row: u32, col: u32 },
}

impl DistTensor {
    fn check(&self) -> Result<(), DistError> {
        for (i, p) in self.parts.iter().enumerate() {
            if p.rows.start > p.rows.end
                || p.cols.start > p.cols.end
                || p.rows.end > self.rows
                || p.cols.end > self.cols
            {
                return Err(DistError::OutOfRange {
                    part: i,
                    rows: p.rows.clone(),
                    cols: p.cols.clone(),
                    r: self.rows,
                    c: self.cols,
                });
            }
        }
        Ok(())
    }
}

/// Exchange copies that fill every destination part from the source parts. A
/// destination element already at its source's place (same buffer and offset)
/// needs no copy; otherwise it is copied, even within a tile.
pub fn redistribute(src: &DistTensor, dst: &DistTensor) -> Result<Vec<Copy>, DistError> {
    if (src.rows, src.cols) != (dst.rows, dst.cols) {
        return Err(DistError::Shape(src.rows, src.cols, dst.rows, dst.cols));
    }
    src.check()?;
    dst.check()?;
    let eb = src.elem_bytes;
    let cover = row_covers(src);
    // A replicated consumer holds the same block on many tiles: the pieces of a
    // block are found once per distinct block (a group of parts), and every
    // member takes its copy. The result is what walking the parts one by one
    // gives: pieces in first-seen order (a group's first member is the first part
    // that sees them) and each piece's destinations in part order.
    let src_bufs: HashSet<BufId, FixedState> = src.parts.iter().map(|p| p.at.buf).collect();
    let mut group_of: HashMap<(u32, u32, u32, u32), usize, FixedState> = HashMap::default();
    let mut groups: Vec<Group> = Vec::new();
    for (i, d) in dst.parts.iter().enumerate() {
        let key = (d.rows.start, d.rows.end, d.cols.start, d.cols.end);
        let g = *group_of.entry(key).or_insert_with(|| {
            groups.push(Group::default());
            groups.len() - 1
        });
        groups[g].members.push((i, d.at));
        // Only a destination in a source buffer can already hold its bytes.
        groups[g].in_src |= src_bufs.contains(&d.at.buf);
    }
    // Every piece of source bytes gets an index in first-seen order (so the map's
    // own order never shows); `sends` lists (piece, group, offset in the block).
    let mut index: HashMap<(BufId, u32, u32), u32, FixedState> = HashMap::default();
    let mut pieces: Vec<(BufId, u32, u32)> = Vec::new();
    let mut sends: Vec<(u32, u32, u32)> = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        let d = &dst.parts[group.members[0].0];
        for row in d.rows.clone() {
            let segs = &cover[row as usize];
            let mut col = d.cols.start;
            // The segment holding `col`: the last one starting at or before it;
            // the segments are disjoint and sorted, so the one after it holds
            // the column where it ends, or nothing does.
            let mut k = segs.partition_point(|s| s.0 <= col).checked_sub(1);
            while col < d.cols.end {
                let Some(&(seg_start, seg_end, part)) = k.and_then(|k| segs.get(k)) else {
                    return Err(DistError::Uncovered { row, col });
                };
                if seg_start > col || seg_end <= col {
                    return Err(DistError::Uncovered { row, col });
                }
                k = k.map(|k| k + 1);
                let s = &src.parts[part];
                let end = seg_end.min(d.cols.end);
                let src_off = ((row - s.rows.start) * s.width() + (col - s.cols.start)) * eb;
                let dst_off = ((row - d.rows.start) * d.width() + (col - d.cols.start)) * eb;
                let bytes = (end - col) * eb;
                let from = s.at.plus(src_off);
                if group.sends_any(from, dst_off) {
                    let key = (from.buf, from.offset, bytes);
                    let next = pieces.len() as u32;
                    let k = *index.entry(key).or_insert(next);
                    if k == next {
                        pieces.push(key);
                    }
                    sends.push((k, g as u32, dst_off));
                }
                col = end;
            }
        }
    }
    // In piece order; a piece seen by one group only (the usual case) is already.
    if !sends.is_sorted_by_key(|s| s.0) {
        sends.sort_by_key(|s| s.0);
    }
    Ok(coalesce(&pieces, &sends, &groups))
}

/// Destination parts holding the same block: (part index, place), in part order.
#[derive(Default)]
struct Group {
    members: Vec<(usize, Loc)>,
    /// Some member is in a buffer of the source.
    in_src: bool,
}

impl Group {
    /// Whether some member needs the piece at `from` copied to block offset `off`.
    fn sends_any(&self, from: Loc, off: u32) -> bool {
        !self.in_src || self.members.iter().any(|&(_, at)| at.plus(off) != from)
    }
}

impl Loc {
    fn plus(self, by: u32) -> Loc {
        Loc {
            buf: self.buf,
            offset: self.offset + by,
        }
    }
}

/// The copies of `pieces` (in order) to their destinations (`sends`, by piece),
/// joining a piece to the copy before it when its source and every destination
/// continue that copy's (rows of row-contiguous blocks), so that a whole block
/// moves as one copy.
fn coalesce(
    pieces: &[(BufId, u32, u32)],
    sends: &[(u32, u32, u32)],
    groups: &[Group],
) -> Vec<Copy> {
    let mut out: Vec<Copy> = Vec::new();
    // When the last copy goes to exactly the members of one group that holds no
    // source bytes, that group and the block offset where the copy ends: a piece
    // for the same group at that offset continues every destination at once.
    let mut last_run: Option<(u32, u32)> = None;
    let mut dsts: Vec<(usize, Loc)> = Vec::new();
    let mut rest = sends;
    for (k, &(buf, offset, bytes)) in pieces.iter().enumerate() {
        // Usually one send a piece: counted from the front, not searched for.
        let n = rest.iter().take_while(|s| s.0 as usize == k).count();
        let (mine, after) = rest.split_at(n);
        rest = after;
        let from = Loc { buf, offset };
        let src_follows =
            |last: &Copy| last.src.buf == buf && last.src.offset + last.bytes == offset;
        let run = match mine {
            [(_, g, off)] if !groups[*g as usize].in_src => Some((*g, *off)),
            _ => None,
        };
        if let (Some(last), Some((g, off))) = (out.last_mut(), run)
            && last_run == Some((g, off))
            && src_follows(last)
        {
            last.bytes += bytes;
            last_run = Some((g, off + bytes));
            continue;
        }
        dsts.clear();
        for &(_, g, off) in mine {
            dsts.extend(
                groups[g as usize]
                    .members
                    .iter()
                    .map(|&(m, at)| (m, at.plus(off)))
                    .filter(|&(_, to)| to != from),
            );
        }
        if mine.len() > 1 {
            dsts.sort_by_key(|d| d.0);
        }
        last_run = run.map(|(g, off)| (g, off + bytes));
        if let Some(last) = out.last_mut()
            && src_follows(last)
            && last.dsts.len() == dsts.len()
            && last
                .dsts
                .iter()
                .zip(&dsts)
                .all(|(a, b)| a.buf == b.1.buf && a.offset + last.bytes == b.1.offset)
        {
            last.bytes += bytes;
            continue;
        }
        out.push(Copy {
            src: from,
            bytes,
            dsts: dsts.iter().map(|d| d.1).collect(),
        });
    }
    out
}

/// For every row, the source parts that serve it as disjoint column segments
/// `(start, end, part)` sorted by start: each column from the first part (in
/// order) holding it. Looking a column up is then a binary search, which keeps
/// whole-chip layouts (thousands of parts) fast.
fn row_covers(src: &DistTensor) -> Vec<Vec<(u32, u32, usize)>> {
    let mut by_row: Vec<Vec<usize>> = vec![Vec::new(); src.rows as usize];
    for (k, p) in src.parts.iter().enumerate() {
        if p.cols.start < p.cols.end {
            for r in p.rows.clone() {
                by_row[r as usize].push(k);
            }
        }
    }
    by_row
        .into_iter()
        .map(|parts| {
            let mut segs: Vec<(u32, u32, usize)> = parts
                .iter()
                .map(|&k| (src.parts[k].cols.start, src.parts[k].cols.end, k))
                .collect();
            segs.sort_unstable();
            if segs.windows(2).all(|w| w[0].1 <= w[1].0) {
                return segs;
            }
            // Overlapping replicas: cut at every boundary and give each piece to
            // the first part holding it.
            let mut cuts: Vec<u32> = segs.iter().flat_map(|s| [s.0, s.1]).collect();
            cuts.sort_unstable();
            cuts.dedup();
            let mut out: Vec<(u32, u32, usize)> = Vec::new();
            for w in cuts.windows(2) {
                let owner = parts
                    .iter()
                    .copied()
                    .find(|&k| src.parts[k].cols.start <= w[0] && w[1] <= src.parts[k].cols.end);
                if let Some(k) = owner {
                    match out.last_mut() {
                        Some(last) if last.1 == w[0] && last.2 == k => last.1 = w[1],
                        _ => out.push((w[0], w[1], k)),
                    }
                }
            }
            out
        })
        .collect()
}
