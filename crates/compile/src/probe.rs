//! Where each operation's results can be read back from a run: the plan's
//! [`OpResult`]s at placed addresses, with the superstep boundary at which each
//! still holds the operation's output.
//!
//! The simulator can copy tile memory out only where every tile has stopped: at
//! the `sync` before an exchange program or at the end of the run. An operation's
//! last step ends before the next exchange step of the plan, but compute steps of
//! the next operation may run in between; the output is read there only when
//! nothing in those steps can have written its bytes (its buffers live through
//! them, so placement gave no other buffer their bytes, and no call writes them).

use serde::Serialize;
use tessera_kernels::Role;
use tessera_plan::{BufId, OpResult, StepKind, StoredTensor, TilePlan};

/// One graph tensor of a plan operation, and where a run leaves it.
#[derive(Debug, Clone)]
pub struct ResultProbe {
    /// Index into [`crate::Compiled::plan_ops`].
    pub op: usize,
    /// The graph operation whose output this is.
    pub tensor: String,
    /// Where to read it; `None` when it cannot be read (see `note`).
    pub at: Option<ProbeAt>,
    /// How it is stored, or why it cannot be read.
    pub note: Option<String>,
}

/// Where a result can be read: its layout and, per part of it (in the order of
/// `stored.t.parts`), the tile and address of the part's first byte.
#[derive(Debug, Clone)]
pub struct ProbeAt {
    /// Read when the tiles reach this exchange program, before it runs; `None`:
    /// at the end of the run.
    pub exchange: Option<u16>,
    /// Which time the run reaches that exchange (from 0): a layer loop's body
    /// runs its exchanges once a layer, and layer `i`'s tensors are read at the
    /// `i`-th.
    pub nth: u32,
    pub stored: StoredTensor,
    pub parts: Vec<PlacedPart>,
}

/// One part of a distributed tensor at its placed address: rows and columns of the
/// stored tensor, row-major from `addr` (row stride `cols.len() * elem_bytes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlacedPart {
    pub tile: u32,
    pub addr: u32,
    pub rows: std::ops::Range<u32>,
    pub cols: std::ops::Range<u32>,
    pub elem_bytes: u32,
}

impl PlacedPart {
    /// Bytes the part spans in tile memory.
    pub fn bytes(&self) -> u32 {
        (self.rows.end - self.rows.start) * (self.cols.end - self.cols.start) * self.elem_bytes
    }

    /// Byte offset, from `addr`, of stored element (`row`, `col`), if the part
    /// holds it.
    pub fn offset_of(&self, row: u32, col: u32) -> Option<u32> {
        (self.rows.contains(&row) && self.cols.contains(&col)).then(|| {
            ((row - self.rows.start) * (self.cols.end - self.cols.start) + col - self.cols.start)
                * self.elem_bytes
        })
    }
}

/// The plan's results at the addresses `addr` gives each buffer.
pub fn probes(plan: &TilePlan, addr: &dyn Fn(BufId) -> u32) -> Vec<ResultProbe> {
    let end = plan.steps.len() as u32;
    let mut last_step = vec![None; plan.ops.len()];
    for (s, name) in plan.step_ops.iter().enumerate() {
        if let Some(i) = plan.ops.iter().position(|o| &o.name == name) {
            last_step[i] = Some(s as u32);
        }
    }
    let once: Vec<ResultProbe> = plan
        .results
        .iter()
        .map(|r| probe(plan, r, last_step[r.op], end, addr))
        .collect();
    let Some(lp) = &plan.layer_loop else {
        return once;
    };
    // A body's results once a layer, named for it and read in its iteration;
    // `op` indexes the unrolled operations.
    let mut of_op: Vec<Vec<&ResultProbe>> = vec![Vec::new(); plan.ops.len()];
    for p in &once {
        of_op[p.op].push(p);
    }
    let u = tessera_plan::unroll(plan);
    let mut out = Vec::new();
    for (ui, &(pi, layer)) in u.origin.iter().enumerate() {
        let body = tessera_plan::unroll::in_body(plan, &plan.ops[pi].name);
        for p in &of_op[pi] {
            let mut p = (*p).clone();
            p.op = ui;
            if body {
                p.tensor = lp.rename(&p.tensor, layer);
                if let Some(at) = &mut p.at {
                    at.nth = layer;
                }
            }
            out.push(p);
        }
    }
    out
}

fn probe(
    plan: &TilePlan,
    r: &OpResult,
    last: Option<u32>,
    end: u32,
    addr: &dyn Fn(BufId) -> u32,
) -> ResultProbe {
    let unread = |note: String| ResultProbe {
        op: r.op,
        tensor: r.tensor.clone(),
        at: None,
        note: Some(note),
    };
    let Some(stored) = &r.stored else {
        return unread(r.note.clone().unwrap_or_default());
    };
    // An operation that added no step (views) leaves its operand where it was.
    let last = last.unwrap_or(0);
    let (exchange, boundary) = plan
        .steps
        .iter()
        .enumerate()
        .skip(last as usize + 1)
        .find_map(|(s, k)| match k {
            StepKind::Exchange(id) => Some((Some(*id), s as u32)),
            _ => None,
        })
        .unwrap_or((None, end));
    for p in &stored.t.parts {
        let b = plan.buffer(p.at.buf);
        if b.last + 1 < boundary {
            return unread(format!(
                "its buffer `{}` on tile {} is free after step {}, before the next superstep boundary (step {boundary}): not readable",
                b.name, b.tile, b.last
            ));
        }
    }
    let writes = plan
        .calls
        .iter()
        .filter(|c| c.step > last && c.step < boundary)
        .find_map(|c| {
            let contract = c.kernel.contract();
            c.operands.iter().find_map(|(name, loc)| {
                let writes = contract
                    .operands
                    .iter()
                    .any(|o| &o.name == name && matches!(o.role, Role::Output | Role::InOut));
                (writes && stored.t.parts.iter().any(|p| p.at.buf == loc.buf))
                    .then(|| (c.step, c.kernel.kernel().symbol()))
            })
        });
    if let Some((step, symbol)) = writes {
        return unread(format!(
            "`{symbol}` writes its buffer at step {step}, before the next superstep boundary (step {boundary}): not readable"
        ));
    }
    let parts = stored
        .t
        .parts
        .iter()
        .map(|p| PlacedPart {
            tile: plan.buffer(p.at.buf).tile,
            addr: addr(p.at.buf) + p.at.offset,
            rows: p.rows.clone(),
            cols: p.cols.clone(),
            elem_bytes: stored.t.elem_bytes,
        })
        .collect();
    ResultProbe {
        op: r.op,
        tensor: r.tensor.clone(),
        at: Some(ProbeAt {
            exchange,
            nth: 0,
            stored: stored.clone(),
            parts,
        }),
        note: r.note.clone(),
    }
}
