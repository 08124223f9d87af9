//! Canonicalisation: the folded graph is matched, by dataflow from its outputs,
//! onto the SigLIP vision tower's parts, and each part's weights are put back in
//! Hugging Face's layout.
//!
//! Layout plumbing (reshapes, transposes, squeezes, selects) between two matched
//! operations is not matched node by node: the chain is run on element indices
//! and its result compared with the layout the model needs there (heads split
//! out of the features, keys transposed, heads merged back), so any chain an
//! exporter writes is accepted if and only if it moves the elements where the
//! model would.

use std::sync::Arc;

use crate::fold::Folded;
use crate::value::{Dim, Tensor, Val, axis, concrete, slice_indices};

/// The batch the index checks run at when the model's batch is dynamic: any
/// value above 1 tells the batch axis apart from the ones beside it.
const CHECK_BATCH: usize = 3;

pub struct Lin {
    pub x: String,
    /// `[out, in]`, as `nn.Linear` stores it.
    pub w: Tensor<f32>,
    pub b: Vec<f32>,
}

pub struct Ln {
    pub x: String,
    pub gamma: Vec<f32>,
    pub beta: Vec<f32>,
    pub eps: f32,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Act {
    Tanh,
    Erf,
}

pub struct Mlp {
    pub x: String,
    pub fc1: Lin,
    pub fc2: Lin,
    pub act: Act,
}

/// Where a projection's input comes from.
#[derive(Clone, PartialEq, Debug)]
pub enum Source {
    Value(String),
    /// A constant token repeated over the batch (the pooling head's probe).
    Probe(Vec<f32>),
}

pub struct Proj {
    pub src: Source,
    pub w: Tensor<f32>,
    pub b: Vec<f32>,
}

pub struct Attn {
    pub q: Proj,
    pub k: Proj,
    pub v: Proj,
    pub o: Lin,
    pub heads: usize,
}

pub struct Layer {
    pub x: String,
    pub ln1: Ln,
    pub attn: Attn,
    pub ln2: Ln,
    pub mlp: Mlp,
}

pub struct Embed {
    pub w: Tensor<f32>,
    pub b: Vec<f32>,
    /// `[tokens, width]`.
    pub pos: Tensor<f32>,
    pub patch: usize,
}

pub struct Head {
    pub attn: Attn,
    pub ln: Ln,
    pub mlp: Mlp,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Ax {
    B,
    T,
    H,
    D,
    F,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Order {
    BatchFirst,
    SeqFirst,
}

pub struct Canon<'a> {
    g: &'a Folded,
    pub used: Vec<usize>,
    batch: usize,
}

fn mul_rows(t: &Tensor<f32>, r: f32) -> Tensor<f32> {
    t.map(|v| v * r)
}

impl<'a> Canon<'a> {
    pub fn new(g: &'a Folded, batch: Option<usize>) -> Self {
        Canon {
            g,
            used: Vec::new(),
            batch: batch.unwrap_or(CHECK_BATCH),
        }
    }

    /// Runs a match; on failure the nodes it took are given back.
    fn attempt<T>(&mut self, f: impl FnOnce(&mut Self) -> Option<T>) -> Option<T> {
        let mark = self.used.len();
        let r = f(self);
        if r.is_none() {
            self.used.truncate(mark);
        }
        r
    }

    /// The node computing runtime value `v`, if `v` is one.
    fn producer(&self, v: &str) -> Option<usize> {
        matches!(self.g.val(v), Some(Val::Dyn(_)))
            .then(|| self.g.producer.get(v).copied())
            .flatten()
    }
    fn node_if(&self, v: &str, op: &str) -> Option<usize> {
        self.producer(v).filter(|&n| self.g.nodes[n].op == op)
    }
    fn inp(&self, n: usize, i: usize) -> Option<String> {
        self.g.nodes[n].input(i).map(str::to_owned)
    }
    fn floats(&self, v: &str) -> Option<Arc<Tensor<f32>>> {
        self.g.val(v)?.floats().cloned()
    }
    fn scalar(&self, v: &str) -> Option<f32> {
        match self.g.val(v)? {
            Val::F(t) if t.data.len() == 1 => Some(t.data[0]),
            _ => None,
        }
    }
    fn dims(&self, v: &str) -> Option<Vec<Dim>> {
        match self.g.val(v)? {
            Val::Dyn(s) => Some(s.clone()),
            other => other.shape(),
        }
    }
    fn shape_at(&self, v: &str) -> Option<Vec<usize>> {
        self.dims(v)?.iter().map(|d| d.at(self.batch)).collect()
    }
    fn is_batch(&self, d: Dim) -> bool {
        d == Dim::BATCH
            || (self.g.input_shape[0].concrete().is_some() && d == self.g.input_shape[0])
    }
    fn readers(&self, v: &str) -> usize {
        self.g.readers.get(v).copied().unwrap_or(0)
    }

    /// Skips nodes that change nothing: `Identity`, and casts of floats to float.
    fn transparent(&mut self, v: &str) -> String {
        let mut v = v.to_owned();
        for _ in 0..self.g.nodes.len() {
            let Some(n) = self.producer(&v) else { break };
            let node = &self.g.nodes[n];
            let keep = node.op == "Identity"
                || (node.op == "Cast"
                    && node.int("to") == Some(crate::proto::tensor_proto::DataType::Float as i64));
            if !keep {
                break;
            }
            let Some(x) = self.inp(n, 0) else { break };
            self.used.push(n);
            v = x;
        }
        v
    }

    /// Walks back from `v` over layout changes and scalings by a constant; gives
    /// the value the chain starts from, the chain in dataflow order and the
    /// product of the scalings.
    fn walk(&mut self, v: &str) -> (String, Vec<usize>, f32) {
        let mut v = self.transparent(v);
        let mut chain = Vec::new();
        let mut factor = 1.0f32;
        for _ in 0..self.g.nodes.len() {
            let Some(n) = self.producer(&v) else { break };
            let op = self.g.nodes[n].op.as_str();
            let next = match op {
                "Reshape" | "Transpose" | "Squeeze" | "Unsqueeze" | "Flatten" | "Gather"
                | "Slice" => {
                    chain.push(n);
                    self.inp(n, 0)
                }
                "Mul" | "Div" => {
                    let (a, b) = (self.inp(n, 0), self.inp(n, 1));
                    let (Some(a), Some(b)) = (a, b) else { break };
                    let (x, c, divides) = match (self.scalar(&a), self.scalar(&b)) {
                        (None, Some(c)) => (a, c, op == "Div"),
                        (Some(c), None) if op == "Mul" => (b, c, false),
                        _ => break,
                    };
                    factor = if divides { factor / c } else { factor * c };
                    Some(x)
                }
                _ => break,
            };
            let Some(next) = next else { break };
            self.used.push(n);
            v = self.transparent(&next);
        }
        chain.reverse();
        (v, chain, factor)
    }

    /// Runs a layout chain on element indices of `src`.
    fn run_chain(&self, src: &str, chain: &[usize]) -> Option<Tensor<u32>> {
        let shape = self.shape_at(src)?;
        let n = crate::value::numel(&shape)?;
        if n > crate::value::MAX_ELEMENTS {
            return None;
        }
        let mut t = Tensor::new(shape, (0..n as u32).collect())?;
        for &k in chain {
            let node = &self.g.nodes[k];
            let out = self.shape_at(node.outputs.first()?)?;
            t = match node.op.as_str() {
                "Transpose" => {
                    let perm: Vec<usize> = match node.ints("perm") {
                        Some(p) => p
                            .iter()
                            .map(|&a| usize::try_from(a).ok())
                            .collect::<Option<_>>()?,
                        None => (0..t.shape.len()).rev().collect(),
                    };
                    t.transpose(&perm)?
                }
                "Gather" => {
                    let idx = self.g.val(node.input(1)?)?.plain_ints()?;
                    t.gather(axis(node.int("axis").unwrap_or(0), t.shape.len())?, &idx)?
                }
                "Slice" => {
                    let p = |i: usize| {
                        node.input(i)
                            .and_then(|v| self.g.val(v))
                            .and_then(|v| v.plain_ints())
                    };
                    let (starts, ends) = (p(1)?.data, p(2)?.data);
                    let axes = p(3)
                        .map(|t| t.data)
                        .unwrap_or_else(|| (0..starts.len() as i64).collect());
                    let steps = p(4)
                        .map(|t| t.data)
                        .unwrap_or_else(|| vec![1; starts.len()]);
                    let mut ranges = Vec::new();
                    for (j, &start) in starts.iter().enumerate() {
                        let a = axis(*axes.get(j)?, t.shape.len())?;
                        ranges.push((a, start, *ends.get(j)?, *steps.get(j)?));
                    }
                    // Reject before copying: a slice keeping nothing is no layout.
                    for &(a, s, e, st) in &ranges {
                        slice_indices(t.shape[a] as i64, s, e, st)?;
                    }
                    t.slice(&ranges)?
                }
                _ => Tensor::new(out.clone(), t.data)?,
            };
            if t.shape != out {
                return None;
            }
        }
        Some(t)
    }

    /// Checks that `chain` moves `src`'s elements, laid out as `from`, into the
    /// layout `to`. Features of `from` (`F`) are `off + h * hd + d` in `to`'s
    /// heads and head dimension; an axis `to` lacks is at index 0.
    fn check(
        &self,
        src: &str,
        chain: &[usize],
        from: &[(Ax, usize)],
        to: &[(Ax, usize)],
        off: usize,
        hd: usize,
    ) -> bool {
        let Some(got) = self.run_chain(src, chain) else {
            return false;
        };
        let total = to.iter().try_fold(1usize, |a, x| a.checked_mul(x.1));
        if total != Some(got.data.len()) || hd == 0 {
            return false;
        }
        let mut coord = vec![0usize; to.len()];
        for &id in &got.data {
            let (mut b, mut t, mut c, mut h, mut d, mut has_hd) = (0, 0, 0, 0, 0, false);
            for (k, &(a, _)) in to.iter().enumerate() {
                match a {
                    Ax::B => b = coord[k],
                    Ax::T => t = coord[k],
                    Ax::F => c = coord[k],
                    Ax::H => (h, has_hd) = (coord[k], true),
                    Ax::D => (d, has_hd) = (coord[k], true),
                }
            }
            if has_hd {
                c = h * hd + d;
            }
            let mut want = 0usize;
            for &(a, size) in from {
                let i = match a {
                    Ax::B => b,
                    Ax::T => t,
                    Ax::F => off + c,
                    Ax::H => c / hd,
                    Ax::D => c % hd,
                };
                if i >= size {
                    return false;
                }
                let Some(next) = want.checked_mul(size).and_then(|v| v.checked_add(i)) else {
                    return false;
                };
                want = next;
            }
            if want != id as usize {
                return false;
            }
            for k in (0..to.len()).rev() {
                coord[k] += 1;
                if coord[k] < to[k].1 {
                    break;
                }
                coord[k] = 0;
            }
        }
        true
    }

    /// `x W^T + b`: `MatMul` by a constant and `Add` of a constant, or `Gemm`.
    pub fn linear(&mut self, v: &str) -> Option<Lin> {
        self.attempt(|s| {
            let v = s.transparent(v);
            if let Some(n) = s.node_if(&v, "Gemm") {
                let node = &s.g.nodes[n];
                let plain = node.float("alpha").unwrap_or(1.0) == 1.0
                    && node.float("beta").unwrap_or(1.0) == 1.0
                    && node.int("transA").unwrap_or(0) == 0;
                if !plain {
                    return None;
                }
                let w = s.floats(&s.inp(n, 1)?)?;
                if w.shape.len() != 2 {
                    return None;
                }
                let w = if node.int("transB").unwrap_or(0) != 0 {
                    (*w).clone()
                } else {
                    w.transpose(&[1, 0])?
                };
                let b = s.floats(&s.inp(n, 2)?)?;
                if b.data.len() != w.shape[0] {
                    return None;
                }
                s.used.push(n);
                return Some(Lin {
                    x: s.inp(n, 0)?,
                    w,
                    b: b.data.clone(),
                });
            }
            let n = s.node_if(&v, "Add")?;
            let (a, b) = (s.inp(n, 0)?, s.inp(n, 1)?);
            let (mm, bias) = if s.floats(&b).is_some() {
                (a, b)
            } else {
                (b, a)
            };
            let bias = s.floats(&bias)?;
            let m = s.node_if(&mm, "MatMul")?;
            if s.readers(&mm) != 1 {
                return None;
            }
            let w = s.floats(&s.inp(m, 1)?)?;
            if w.shape.len() != 2
                || bias.data.len() != w.shape[1]
                || bias.shape.iter().rev().skip(1).any(|&d| d != 1)
            {
                return None;
            }
            s.used.extend([n, m]);
            Some(Lin {
                x: s.inp(m, 0)?,
                w: w.transpose(&[1, 0])?,
                b: bias.data.clone(),
            })
        })
    }

    /// `LayerNormalization` over the last axis, or its decomposition.
    pub fn layer_norm(&mut self, v: &str) -> Option<Ln> {
        self.attempt(|s| {
            let v = s.transparent(v);
            if let Some(n) = s.node_if(&v, "LayerNormalization") {
                let x = s.inp(n, 0)?;
                let rank = s.dims(&x)?.len();
                if axis(s.g.nodes[n].int("axis").unwrap_or(-1), rank)? != rank - 1 {
                    return None;
                }
                let g = s.floats(&s.inp(n, 1)?)?;
                let w = g.data.len();
                let beta = match s.inp(n, 2) {
                    Some(b) => s.floats(&b)?.data.clone(),
                    None => vec![0.0; w],
                };
                if beta.len() != w
                    || s.g.nodes[n]
                        .outputs
                        .iter()
                        .skip(1)
                        .any(|o| s.readers(o) > 0)
                {
                    return None;
                }
                s.used.push(n);
                let eps = s.g.nodes[n].float("epsilon").unwrap_or(1e-5);
                return Some(Ln {
                    x,
                    gamma: g.data.clone(),
                    beta,
                    eps,
                });
            }
            s.decomposed_ln(&v)
        })
    }

    fn commuted(&self, n: usize) -> Option<[(String, String); 2]> {
        let (a, b) = (self.inp(n, 0)?, self.inp(n, 1)?);
        Some([(a.clone(), b.clone()), (b, a)])
    }

    fn mean_last(&mut self, v: &str) -> Option<String> {
        let n = self.node_if(v, "ReduceMean")?;
        let x = self.inp(n, 0)?;
        let rank = self.dims(&x)?.len();
        let axes = match self.inp(n, 1) {
            Some(a) => self.g.val(&a)?.plain_ints()?.data,
            None => self.g.nodes[n].ints("axes")?,
        };
        if axes.len() != 1
            || axis(axes[0], rank)? != rank - 1
            || self.g.nodes[n].int("keepdims").unwrap_or(1) == 0
        {
            return None;
        }
        self.used.push(n);
        Some(x)
    }

    /// `x - mean(x)`: gives `x`.
    fn centred(&mut self, v: &str) -> Option<String> {
        let n = self.node_if(v, "Sub")?;
        let x = self.inp(n, 0)?;
        let m = self.mean_last(&self.inp(n, 1)?)?;
        (m == x).then(|| self.used.push(n))?;
        Some(x)
    }

    fn decomposed_ln(&mut self, v: &str) -> Option<Ln> {
        let add = self.node_if(v, "Add")?;
        for (scaled, beta) in self.commuted(add)? {
            let r = self.attempt(|s| {
                let beta = s.floats(&beta)?.data.clone();
                let mul = s.node_if(&scaled, "Mul")?;
                for (normed, gamma) in s.commuted(mul)? {
                    let r = s.attempt(|s| {
                        let gamma = s.floats(&gamma)?.data.clone();
                        let (x, eps) = s.normalised(&normed)?;
                        (gamma.len() == beta.len()).then_some(())?;
                        s.used.extend([add, mul]);
                        Some(Ln {
                            x,
                            gamma,
                            beta: beta.clone(),
                            eps,
                        })
                    });
                    if r.is_some() {
                        return r;
                    }
                }
                None
            });
            if r.is_some() {
                return r;
            }
        }
        None
    }

    /// `(x - mean) / sqrt(var + eps)` (or times the reciprocal): gives `x` and eps.
    fn normalised(&mut self, v: &str) -> Option<(String, f32)> {
        let n = self.producer(v)?;
        let op = self.g.nodes[n].op.clone();
        let (diff, denom) = match op.as_str() {
            "Div" => (self.inp(n, 0)?, self.inp(n, 1)?),
            "Mul" => {
                let [(a, b), _] = self.commuted(n)?;
                if self.node_if(&b, "Reciprocal").is_some() {
                    (a, b)
                } else {
                    (b, a)
                }
            }
            _ => return None,
        };
        let x = self.centred(&diff)?;
        let mut d = denom;
        if op == "Mul" {
            let r = self.node_if(&d, "Reciprocal")?;
            self.used.push(r);
            d = self.inp(r, 0)?;
        }
        let sq = self.node_if(&d, "Sqrt")?;
        let plus = self.node_if(&self.inp(sq, 0)?, "Add")?;
        let [(var, eps), (var2, eps2)] = self.commuted(plus)?;
        let (var, eps) = if self.scalar(&eps).is_some() {
            (var, eps)
        } else {
            (var2, eps2)
        };
        let eps = self.scalar(&eps)?;
        let sq_in = self.mean_last(&var)?;
        let pow = self.producer(&sq_in)?;
        let squared = match self.g.nodes[pow].op.as_str() {
            "Pow" if self.scalar(&self.inp(pow, 1)?) == Some(2.0) => self.inp(pow, 0)?,
            "Mul" if self.inp(pow, 0) == self.inp(pow, 1) => self.inp(pow, 0)?,
            _ => return None,
        };
        // The variance may reuse the centred value or recompute it.
        if squared != diff && self.centred(&squared)? != x {
            return None;
        }
        self.used.extend([n, sq, plus, pow]);
        Some((x, eps))
    }

    /// The factors of a product tree: constants multiplied together, and the
    /// runtime values with repeats (`Pow` by 2 or 3 repeats its base).
    fn factors(&mut self, v: &str, depth: usize) -> Option<(f32, Vec<String>)> {
        if depth > 16 {
            return None;
        }
        if let Some(c) = self.scalar(v) {
            return Some((c, vec![]));
        }
        let v = self.transparent(v);
        let single = self.readers(&v) == 1 && depth > 0;
        let Some(n) = self.producer(&v).filter(|_| single || depth == 0) else {
            return Some((1.0, vec![v]));
        };
        let op = self.g.nodes[n].op.clone();
        match op.as_str() {
            "Mul" => {
                let (a, b) = (self.inp(n, 0)?, self.inp(n, 1)?);
                let (ca, mut va) = self.factors(&a, depth + 1)?;
                let (cb, vb) = self.factors(&b, depth + 1)?;
                self.used.push(n);
                va.extend(vb);
                Some((ca * cb, va))
            }
            "Div" => {
                let c = self.scalar(&self.inp(n, 1)?)?;
                let (ca, va) = self.factors(&self.inp(n, 0)?, depth + 1)?;
                self.used.push(n);
                Some((ca / c, va))
            }
            "Pow" => {
                let e = self.scalar(&self.inp(n, 1)?)?;
                let reps = if e == 2.0 {
                    2
                } else if e == 3.0 {
                    3
                } else {
                    return Some((1.0, vec![v]));
                };
                let base = self.transparent(&self.inp(n, 0)?);
                self.used.push(n);
                Some((1.0, vec![base; reps]))
            }
            _ => Some((1.0, vec![v])),
        }
    }

    /// `1 + f(u)` for `f` = `Tanh` or `Erf`: gives `u`.
    fn one_plus(&mut self, v: &str, op: &str) -> Option<String> {
        let add = self.node_if(v, "Add")?;
        let [(a, b), (a2, b2)] = self.commuted(add)?;
        let (one, t) = if self.scalar(&a) == Some(1.0) {
            (a, b)
        } else {
            (a2, b2)
        };
        (self.scalar(&one) == Some(1.0)).then_some(())?;
        let f = self.node_if(&t, op)?;
        self.used.extend([add, f]);
        self.inp(f, 0)
    }

    fn close(a: f32, b: f32) -> bool {
        (a - b).abs() <= 1e-5 * b.abs()
    }

    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` or `0.5 x (1 + erf(x / sqrt 2))`.
    pub fn gelu(&mut self, v: &str) -> Option<(String, Act)> {
        self.attempt(|s| {
            let (c, vals) = s.factors(v, 0)?;
            if !Self::close(c, 0.5) || vals.len() != 2 {
                return None;
            }
            for (x, other) in [(&vals[0], &vals[1]), (&vals[1], &vals[0])] {
                let r = s.attempt(|s| {
                    if let Some(u) = s.one_plus(other, "Tanh") {
                        let (c, inner) = s.factors(&u, 1)?;
                        let [sum] = inner.as_slice() else { return None };
                        if !Self::close(c, (2.0f32 / std::f32::consts::PI).sqrt()) {
                            return None;
                        }
                        let add = s.node_if(sum, "Add")?;
                        for (lin, cubic) in s.commuted(add)? {
                            let ok = s.attempt(|s| {
                                let (c3, xs) = s.factors(&cubic, 1)?;
                                let lin = s.transparent(&lin);
                                (Self::close(c3, 0.044715)
                                    && lin == *x
                                    && xs.len() == 3
                                    && xs.iter().all(|y| y == x))
                                .then_some(())
                            });
                            if ok.is_some() {
                                s.used.push(add);
                                return Some(Act::Tanh);
                            }
                        }
                        return None;
                    }
                    let u = s.one_plus(other, "Erf")?;
                    let (c, inner) = s.factors(&u, 1)?;
                    (Self::close(c, std::f32::consts::FRAC_1_SQRT_2)
                        && inner.as_slice() == [x.clone()])
                    .then_some(Act::Erf)
                });
                if let Some(act) = r {
                    return Some((x.clone(), act));
                }
            }
            None
        })
    }

    pub fn mlp(&mut self, v: &str) -> Option<Mlp> {
        self.attempt(|s| {
            let fc2 = s.linear(v)?;
            let (h, act) = s.gelu(&fc2.x)?;
            let fc1 = s.linear(&h)?;
            Some(Mlp {
                x: fc1.x.clone(),
                fc1,
                fc2,
                act,
            })
        })
    }

    /// The order a projection's input is in, and where it comes from.
    fn input_of(&mut self, x: &str, w: usize) -> Option<(Source, Order, usize)> {
        let (src, chain, f) = self.walk(x);
        if f != 1.0 {
            return None;
        }
        let b = self.batch;
        // A constant: the probe already repeated over a fixed batch.
        if let Some(t) = self.floats(&src) {
            return self.probe(&t.data, w);
        }
        let n = self.producer(&src)?;
        if matches!(self.g.nodes[n].op.as_str(), "Tile" | "Expand") {
            let p = self.floats(&self.inp(n, 0)?)?;
            let out = self.shape_at(&src)?;
            let numel = out.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            if p.data.len() != w || numel != b.checked_mul(w) || out.last() != Some(&w) {
                return None;
            }
            self.used.push(n);
            return Some((Source::Probe(p.data.clone()), Order::BatchFirst, 1));
        }
        let d = self.dims(&src)?;
        let [bd, t, f] = d.as_slice() else {
            return None;
        };
        let (t, f) = (t.usize()?, f.usize()?);
        if !self.is_batch(*bd) || f != w {
            return None;
        }
        let from = [(Ax::B, b), (Ax::T, t), (Ax::F, f)];
        if self.check(&src, &chain, &from, &from, 0, f) {
            return Some((Source::Value(src), Order::BatchFirst, t));
        }
        if self.check(
            &src,
            &chain,
            &from,
            &[(Ax::T, t), (Ax::B, b), (Ax::F, f)],
            0,
            f,
        ) {
            return Some((Source::Value(src), Order::SeqFirst, t));
        }
        None
    }

    /// A constant holding one token per image, all the same: the probe.
    fn probe(&self, data: &[f32], w: usize) -> Option<(Source, Order, usize)> {
        if w == 0 || Some(data.len()) != self.batch.checked_mul(w) {
            return None;
        }
        let first = &data[..w];
        data.chunks_exact(w)
            .all(|c| c == first)
            .then(|| (Source::Probe(first.to_vec()), Order::BatchFirst, 1))
    }

    fn layout(order: Order, b: usize, t: usize, f: usize) -> [(Ax, usize); 3] {
        match order {
            Order::BatchFirst => [(Ax::B, b), (Ax::T, t), (Ax::F, f)],
            Order::SeqFirst => [(Ax::T, t), (Ax::B, b), (Ax::F, f)],
        }
    }

    /// One projection of an attention: the linear, where its input comes from,
    /// and which `w` of its output features the chain to `at` picks, laid out as
    /// `to`.
    fn projection(
        &mut self,
        at: &str,
        to: &[(Ax, usize)],
        hd: usize,
        w: usize,
    ) -> Option<(Proj, f32)> {
        let (src, chain, f) = self.walk(at);
        let lin = self.linear(&src)?;
        let (source, order, t) = self.input_of(&lin.x, lin.w.shape[1])?;
        let out = lin.w.shape[0];
        if out % w != 0 {
            return None;
        }
        let from = Self::layout(order, self.batch, t, out);
        let off = (0..out / w)
            .map(|k| k * w)
            .find(|&off| self.check(&src, &chain, &from, to, off, hd))?;
        let rows = lin.w.slice(&[(0, off as i64, (off + w) as i64, 1)])?;
        Some((
            Proj {
                src: source,
                w: rows,
                b: lin.b[off..off + w].to_vec(),
            },
            f,
        ))
    }

    /// Multi-head attention whose output projection computes `v`.
    pub fn attention(&mut self, v: &str) -> Option<Attn> {
        self.attempt(|s| {
            let o = s.linear(v)?;
            let w = o.w.shape[0];
            if w == 0 {
                return None;
            }
            let (ctx, merge, f) = s.walk(&o.x);
            if f != 1.0 {
                return None;
            }
            let pv = s.node_if(&ctx, "MatMul")?;
            let probs = s.transparent(&s.inp(pv, 0)?);
            let sm = s.node_if(&probs, "Softmax")?;
            let rank = s.dims(&probs)?.len();
            if axis(s.g.nodes[sm].int("axis").unwrap_or(-1), rank)? != rank - 1 {
                return None;
            }
            let (scores, chain, fs) = s.walk(&s.inp(sm, 0)?);
            let qk = s.node_if(&scores, "MatMul")?;
            if !chain.is_empty() {
                return None;
            }
            s.used.extend([pv, sm, qk]);
            // Heads: the scores' leading axes hold batch times heads.
            let sd = s.dims(&scores)?;
            let [lead @ .., tq, tk] = sd.as_slice() else {
                return None;
            };
            let lead = lead.iter().try_fold(Dim::int(1), |a, d| a.mul(*d))?;
            let batch = if s.g.input_shape[0].concrete().is_some() {
                s.g.input_shape[0]
            } else {
                Dim::BATCH
            };
            let heads = lead.div(batch)?.usize()?;
            let (tq, tk) = (tq.usize()?, tk.usize()?);
            if heads == 0 || w % heads != 0 {
                return None;
            }
            let hd = w / heads;
            let b = s.batch;
            let qs = [(Ax::B, b), (Ax::H, heads), (Ax::T, tq), (Ax::D, hd)];
            let ks = [(Ax::B, b), (Ax::H, heads), (Ax::D, hd), (Ax::T, tk)];
            let vs = [(Ax::B, b), (Ax::H, heads), (Ax::T, tk), (Ax::D, hd)];
            let (mut q, fq) = s.projection(&s.inp(qk, 0)?, &qs, hd, w)?;
            let (k, fk) = s.projection(&s.inp(qk, 1)?, &ks, hd, w)?;
            let (vp, fv) = s.projection(&s.inp(pv, 1)?, &vs, hd, w)?;
            if fv != 1.0 || k.src != vp.src {
                return None;
            }
            // The merged heads feed the output projection batch first; with one
            // query token (the head) that is also the sequence-first order.
            let merged = Self::layout(Order::BatchFirst, b, tq, w);
            if !s.check(&ctx, &merge, &qs, &merged, 0, hd) {
                return None;
            }
            // Where the exporter put the 1/sqrt(hd) scale (scores, query or key)
            // does not matter; a different scale is folded into the query.
            let scale = fs * fq * fk;
            let want = 1.0 / (hd as f32).sqrt();
            if !Self::close(scale, want) {
                let r = scale / want;
                q.w = mul_rows(&q.w, r);
                q.b.iter_mut().for_each(|x| *x *= r);
            }
            Some(Attn {
                q,
                k,
                v: vp,
                o,
                heads,
            })
        })
    }

    /// One encoder layer whose output is `v`.
    pub fn layer(&mut self, v: &str) -> Option<Layer> {
        self.attempt(|s| {
            let v = s.transparent(v);
            let add = s.node_if(&v, "Add")?;
            for (h, m) in s.commuted(add)? {
                let r = s.attempt(|s| {
                    let h = s.transparent(&h);
                    let mlp = s.mlp(&m)?;
                    let ln2 = s.layer_norm(&mlp.x)?;
                    (s.transparent(&ln2.x) == h).then_some(())?;
                    let add1 = s.node_if(&h, "Add")?;
                    for (x, a) in s.commuted(add1)? {
                        let r = s.attempt(|s| {
                            let x = s.transparent(&x);
                            let attn = s.attention(&a)?;
                            let Source::Value(src) = &attn.q.src else {
                                return None;
                            };
                            let src = src.clone();
                            if attn.k.src != attn.q.src {
                                return None;
                            }
                            let ln1 = s.layer_norm(&src)?;
                            (s.transparent(&ln1.x) == x).then_some(())?;
                            s.used.push(add1);
                            Some((x, ln1, attn))
                        });
                        if let Some((x, ln1, attn)) = r {
                            return Some(Layer {
                                x,
                                ln1,
                                attn,
                                ln2,
                                mlp,
                            });
                        }
                    }
                    None
                });
                if r.is_some() {
                    s.used.push(add);
                    return r;
                }
            }
            None
        })
    }

    /// Patch embedding plus position embedding, ending at `v`.
    pub fn embeddings(&mut self, v: &str) -> Option<Embed> {
        self.attempt(|s| {
            let v = s.transparent(v);
            let add = s.node_if(&v, "Add")?;
            for (e, pos) in s.commuted(add)? {
                let r = s.attempt(|s| {
                    let pos = s.floats(&pos)?;
                    let (src, chain, f) = s.walk(&e);
                    let conv = s.node_if(&src, "Conv")?;
                    let pixels = s.transparent(&s.inp(conv, 0)?);
                    let w = s.floats(&s.inp(conv, 1)?)?;
                    let b = s.floats(&s.inp(conv, 2)?)?;
                    let [width, _, p, p2] = w.shape.as_slice() else {
                        return None;
                    };
                    let node = &s.g.nodes[conv];
                    let strides = node.ints("strides").unwrap_or_default();
                    if pixels != s.g.input
                        || f != 1.0
                        || p != p2
                        || strides != [*p as i64, *p as i64]
                        || b.data.len() != *width
                    {
                        return None;
                    }
                    let cd = concrete(&s.dims(&src)?[1..])?;
                    let tokens = cd[1].checked_mul(cd[2])?;
                    let from = [(Ax::B, s.batch), (Ax::F, *width), (Ax::T, tokens)];
                    let to = [(Ax::B, s.batch), (Ax::T, tokens), (Ax::F, *width)];
                    if !s.check(&src, &chain, &from, &to, 0, *width) {
                        return None;
                    }
                    if Some(pos.data.len()) != tokens.checked_mul(*width)
                        || pos.shape.iter().rev().skip(2).any(|&d| d != 1)
                    {
                        return None;
                    }
                    s.used.extend([add, conv]);
                    Some(Embed {
                        w: (*w).clone(),
                        b: b.data.clone(),
                        pos: Tensor::new(vec![tokens, *width], pos.data.clone())?,
                        patch: *p,
                    })
                });
                if r.is_some() {
                    return r;
                }
            }
            None
        })
    }

    /// The attention-pooling head, whose first token is `v`; gives the head and
    /// the value its keys and values read.
    pub fn head(&mut self, v: &str) -> Option<(Head, String)> {
        self.attempt(|s| {
            let (y, chain, f) = s.walk(v);
            if f != 1.0 {
                return None;
            }
            let add = s.node_if(&y, "Add")?;
            for (a, m) in s.commuted(add)? {
                let r = s.attempt(|s| {
                    let a = s.transparent(&a);
                    let mlp = s.mlp(&m)?;
                    let ln = s.layer_norm(&mlp.x)?;
                    (s.transparent(&ln.x) == a).then_some(())?;
                    let (o, ochain, fo) = s.walk(&a);
                    let attn = s.attention(&o)?;
                    let w = attn.o.w.shape[0];
                    let b = s.batch;
                    let tok = [(Ax::B, b), (Ax::T, 1), (Ax::F, w)];
                    let first = [(Ax::B, b), (Ax::F, w)];
                    if fo != 1.0
                        || !matches!(attn.q.src, Source::Probe(_))
                        || !s.check(&o, &ochain, &tok, &tok, 0, w)
                        || !s.check(&y, &chain, &tok, &first, 0, w)
                    {
                        return None;
                    }
                    let Source::Value(kv) = attn.k.src.clone() else {
                        return None;
                    };
                    s.used.push(add);
                    Some((Head { attn, ln, mlp }, kv))
                });
                if r.is_some() {
                    return r;
                }
            }
            None
        })
    }
}
