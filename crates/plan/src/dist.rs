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

use std::collections::HashMap;
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
    // (source loc, bytes) -> destinations; `order` keeps first-seen order, so the
    // map's own order never shows.
    let mut merged: HashMap<(BufId, u32, u32), Vec<Loc>> = HashMap::new();
    let mut order: Vec<(BufId, u32, u32)> = Vec::new();
    for d in &dst.parts {
        for row in d.rows.clone() {
            let segs = &cover[row as usize];
            let mut col = d.cols.start;
            while col < d.cols.end {
                // The segment holding `col`: the last one starting at or before it.
                let k = segs.partition_point(|s| s.0 <= col);
                let Some(&(_, seg_end, part)) = k.checked_sub(1).map(|k| &segs[k]) else {
                    return Err(DistError::Uncovered { row, col });
                };
                if seg_end <= col {
                    return Err(DistError::Uncovered { row, col });
                }
                let s = &src.parts[part];
                let end = seg_end.min(d.cols.end);
                let src_off = ((row - s.rows.start) * s.width() + (col - s.cols.start)) * eb;
                let dst_off = ((row - d.rows.start) * d.width() + (col - d.cols.start)) * eb;
                let bytes = (end - col) * eb;
                let from = Loc {
                    buf: s.at.buf,
                    offset: s.at.offset + src_off,
                };
                let to = Loc {
                    buf: d.at.buf,
                    offset: d.at.offset + dst_off,
                };
                if from != to {
                    let key = (from.buf, from.offset, bytes);
                    let dsts = merged.entry(key).or_default();
                    if dsts.is_empty() {
                        order.push(key);
                    }
                    dsts.push(to);
                }
                col = end;
            }
        }
    }
    let copies: Vec<Copy> = order
        .into_iter()
        .map(|key| Copy {
            src: Loc {
                buf: key.0,
                offset: key.1,
            },
            bytes: key.2,
            dsts: merged.remove(&key).unwrap_or_default(),
        })
        .collect();
    Ok(coalesce(copies))
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

/// Joins copies whose sources and every destination continue each other (rows of
/// row-contiguous blocks), so that a whole block moves as one copy.
fn coalesce(copies: Vec<Copy>) -> Vec<Copy> {
    let mut out: Vec<Copy> = Vec::with_capacity(copies.len());
    for c in copies {
        if let Some(last) = out.last_mut() {
            let follows = |a: Loc, b: Loc| a.buf == b.buf && a.offset + last.bytes == b.offset;
            if follows(last.src, c.src)
                && last.dsts.len() == c.dsts.len()
                && last.dsts.iter().zip(&c.dsts).all(|(a, b)| follows(*a, *b))
            {
                last.bytes += c.bytes;
                continue;
            }
        }
        out.push(c);
    }
    out
}
