//! How a layer loop's body constants follow from their layer's parameters, so
//! that each later layer's weight images are made from its own parameters
//! directly instead of by lowering the body again for it.
//!
//! The body's lowering records, beside each constant it makes, a recipe: a
//! parameter as it is (a LayerNorm's), or a piece of a linear's packed weights
//! or bias, whose linear is described by a [`LinearSource`]. The linear rule
//! builds its own weights through the same [`LinearSource::build`], so the two
//! cannot drift apart; a test compares every layer's images both ways
//! (`tests/recipes.rs`). A body constant made without a recipe sends the later
//! layers back to replaying the body, as before.

use half::f16;
use tessera_graph::TensorId;
use tessera_machine::fp8;

use super::linear::packed_weights;
use crate::PlanError;
use crate::matmul::AMP_WIDTH;

/// How a linear's stored weights and bias come from its parameters: the
/// members fused into it (a weight, an optional bias and a scale each, with
/// `pre` on all), and where each logical row and column is stored.
#[derive(Debug, Clone)]
pub(crate) struct LinearSource {
    pub members: Vec<(TensorId, Option<TensorId>, f32)>,
    pub pre: f32,
    pub k_log: u32,
    pub n_log: u32,
    /// Stored columns a member takes.
    pub per: u32,
    /// Stored columns in all, and stored rows (the input's padded columns).
    pub n: u32,
    pub kp: u32,
    /// Stored row of each logical input column.
    pub rows: Vec<u32>,
    /// Stored column, within its member, of each logical output column.
    pub cols: Vec<u32>,
}

/// A linear's weights `[kp, n]` row-major as stored, each stored column's
/// member and logical column (`u32::MAX` for padding), and its member's bias
/// value there as the parameter holds it (zero without a bias).
pub(crate) struct Built {
    pub w: Vec<f32>,
    pub logical: Vec<(usize, u32)>,
    pub bias: Vec<f32>,
}

impl LinearSource {
    /// The stored weights from the parameters `data` gives (a tensor's values,
    /// checked to have `len` of them).
    pub fn build<'d>(
        &self,
        data: &dyn Fn(TensorId, usize) -> Result<&'d [f32], PlanError>,
    ) -> Result<Built, PlanError> {
        let (n, n_log) = (self.n, self.n_log);
        let mut w = vec![0f32; (self.kp * n) as usize];
        let mut logical = vec![(0usize, u32::MAX); n as usize];
        let mut bias = vec![0f32; n as usize];
        for (m, &(wt, bt, scale)) in self.members.iter().enumerate() {
            let wd = data(wt, (self.k_log * n_log) as usize)?;
            let bd = match bt {
                Some(b) => Some(data(b, n_log as usize)?),
                None => None,
            };
            let base = m as u32 * self.per;
            for (r, &pr) in self.rows.iter().enumerate() {
                for (c, &pc) in self.cols.iter().enumerate() {
                    w[(pr * n + base + pc) as usize] =
                        wd[r * n_log as usize + c] * scale * self.pre;
                }
            }
            for (c, &pc) in self.cols.iter().enumerate() {
                logical[(base + pc) as usize] = (m, c as u32);
                bias[(base + pc) as usize] = bd.map_or(0.0, |b| b[c]);
            }
        }
        Ok(Built { w, logical, bias })
    }

    /// The bias added to stored column `col`: its member's bias value, plus
    /// `extra` (a fused per-row constant) where given, times the member's
    /// scale and `pre`; zero for a padding column.
    pub fn bias_at(&self, built: &Built, col: u32, extra: Option<f32>) -> f32 {
        let (m, c) = built.logical[col as usize];
        if c == u32::MAX {
            return 0.0;
        }
        let mut v = built.bias[col as usize];
        if let Some(e) = extra {
            v += e;
        }
        v * self.members[m].2 * self.pre
    }
}

/// How one body constant's bytes follow from its layer's parameters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Recipe {
    /// A parameter of `len` values, as f16.
    Param(TensorId, usize),
    /// Linear `lin`'s packed weights: each part's chunks `(first, count)` one
    /// after another, of blocks `(first, count)` padded to `nb_pad`, as FP8 at
    /// the scale where one is given.
    Weights {
        lin: usize,
        parts: Vec<(u32, u32)>,
        blocks: (u32, u32),
        nb_pad: u32,
        fp8: Option<i8>,
    },
    /// Linear `lin`'s bias over blocks `first..first + count` of the column
    /// group whose blocks are `(first, count)` (zero past them), each block's
    /// 16 values `rows` times, as f16.
    Bias {
        lin: usize,
        blocks: (u32, u32),
        first: u32,
        count: u32,
        rows: u32,
    },
}

/// The bytes of `recipe` from the linears' descriptions `sources`, their
/// stored weights `built` (by linear) and the parameters `data` gives.
pub(crate) fn bytes<'d>(
    recipe: &Recipe,
    sources: &[LinearSource],
    built: &[Built],
    data: &dyn Fn(TensorId, usize) -> Result<&'d [f32], PlanError>,
) -> Result<Vec<u8>, PlanError> {
    Ok(match recipe {
        Recipe::Param(t, len) => super::ctx::f16_bytes(data(*t, *len)?.iter().copied()),
        Recipe::Weights {
            lin,
            parts,
            blocks,
            nb_pad,
            fp8,
        } => {
            let b = &built[*lin];
            let n = sources[*lin].n;
            let f16s: Vec<u8> = parts
                .iter()
                .flat_map(|&chunks| packed_weights(&b.w, n, chunks, *blocks, *nb_pad))
                .collect();
            match fp8 {
                None => f16s,
                Some(scale) => f16s
                    .chunks_exact(2)
                    .map(|h| fp8::encode(f16::from_le_bytes([h[0], h[1]]).to_f32(), *scale))
                    .collect(),
            }
        }
        Recipe::Bias {
            lin,
            blocks: (b0, nb),
            first,
            count,
            rows,
        } => {
            let b = &built[*lin];
            let src = &sources[*lin];
            let mut v = Vec::with_capacity((count * rows * AMP_WIDTH) as usize);
            for q in *first..first + count {
                let block: Vec<f32> = (0..AMP_WIDTH)
                    .map(|c| {
                        if q < *nb {
                            src.bias_at(b, (b0 + q) * AMP_WIDTH + c, None)
                        } else {
                            0.0
                        }
                    })
                    .collect();
                for _ in 0..*rows {
                    v.extend_from_slice(&block);
                }
            }
            super::ctx::f16_bytes(v)
        }
    })
}
