//! What the importer knows about each value of the graph: a constant (float, or
//! integer that may involve the batch), or a runtime tensor of known shape.
//!
//! The batch is the one symbol. A dimension or an integer is `k * batch^p`: shape
//! arithmetic in the exporters' graphs multiplies and divides the batch by
//! constants (`batch * heads`), never adds it to another term, so one monomial
//! is enough, and anything else is refused as a fold that cannot be done.

use std::fmt;
use std::sync::Arc;

/// The most elements a folded constant or an index check may hold: far above the
/// largest SigLIP weight (So400m's MLP, 5M), far below what would exhaust memory,
/// so a corrupt shape constant is refused instead of allocated.
pub const MAX_ELEMENTS: usize = 1 << 26;

/// `k * batch^p`; zero is always `p == 0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dim {
    pub k: i64,
    pub p: u32,
}

impl Dim {
    pub const fn int(k: i64) -> Self {
        Dim { k, p: 0 }
    }
    pub const BATCH: Dim = Dim { k: 1, p: 1 };

    fn norm(k: i64, p: u32) -> Self {
        if k == 0 {
            Dim { k: 0, p: 0 }
        } else {
            Dim { k, p }
        }
    }
    pub fn concrete(self) -> Option<i64> {
        (self.p == 0).then_some(self.k)
    }
    pub fn usize(self) -> Option<usize> {
        self.concrete().and_then(|k| usize::try_from(k).ok())
    }
    pub fn mul(self, o: Dim) -> Option<Dim> {
        Some(Dim::norm(
            self.k.checked_mul(o.k)?,
            self.p.checked_add(o.p)?,
        ))
    }
    pub fn add(self, o: Dim) -> Option<Dim> {
        if self.k == 0 {
            return Some(o);
        }
        if o.k == 0 {
            return Some(self);
        }
        (self.p == o.p).then_some(())?;
        Some(Dim::norm(self.k.checked_add(o.k)?, self.p))
    }
    pub fn neg(self) -> Option<Dim> {
        Some(Dim::norm(self.k.checked_neg()?, self.p))
    }
    pub fn sub(self, o: Dim) -> Option<Dim> {
        self.add(o.neg()?)
    }
    /// Exact division only when the batch is involved; integer division (as
    /// ONNX's integer `Div` truncates) between plain numbers.
    pub fn div(self, o: Dim) -> Option<Dim> {
        if o.k == 0 {
            return None;
        }
        if self.p == 0 && o.p == 0 {
            return Some(Dim::int(self.k.checked_div(o.k)?));
        }
        if self.k == 0 {
            return Some(self);
        }
        (self.p >= o.p && self.k.checked_rem(o.k)? == 0).then_some(())?;
        Some(Dim::norm(self.k.checked_div(o.k)?, self.p - o.p))
    }
    /// ONNX `Mod` with `fmod = 0`: the result takes the divisor's sign.
    pub fn rem(self, o: Dim) -> Option<Dim> {
        let (a, b) = (self.concrete()?, o.concrete()?);
        let r = a.checked_rem(b)?;
        Some(Dim::int(if r != 0 && (r < 0) != (b < 0) {
            r + b
        } else {
            r
        }))
    }
    /// Equal for every batch, unequal for every batch, or unknown (`None`).
    pub fn equal(self, o: Dim) -> Option<bool> {
        if self == o {
            Some(true)
        } else if self.p == o.p {
            Some(false)
        } else {
            None
        }
    }
    /// The value at a given batch.
    pub fn at(self, batch: usize) -> Option<usize> {
        let b = i64::try_from(batch).ok()?;
        let mut v = self.k;
        for _ in 0..self.p {
            v = v.checked_mul(b)?;
        }
        usize::try_from(v).ok()
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.k, self.p) {
            (k, 0) => write!(f, "{k}"),
            (1, 1) => write!(f, "batch"),
            (k, 1) => write!(f, "{k}*batch"),
            (k, p) => write!(f, "{k}*batch^{p}"),
        }
    }
}

pub fn show(shape: &[Dim]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// A constant tensor, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor<T> {
    pub shape: Vec<usize>,
    pub data: Vec<T>,
}

pub fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Axis `a` of a rank-`rank` tensor, ONNX's negative axes counting from the end.
pub fn axis(a: i64, rank: usize) -> Option<usize> {
    let r = i64::try_from(rank).ok()?;
    let a = if a < 0 { a + r } else { a };
    (0..r).contains(&a).then_some(a as usize)
}

/// Broadcast of two shapes as ONNX's multidirectional broadcasting.
pub fn broadcast_shapes(a: &[Dim], b: &[Dim]) -> Option<Vec<Dim>> {
    let n = a.len().max(b.len());
    let one = Dim::int(1);
    (0..n)
        .map(|i| {
            let x = if i + a.len() >= n {
                a[i + a.len() - n]
            } else {
                one
            };
            let y = if i + b.len() >= n {
                b[i + b.len() - n]
            } else {
                one
            };
            if x == y || y == one {
                Some(x)
            } else if x == one {
                Some(y)
            } else {
                None
            }
        })
        .collect()
}

pub fn dims(shape: &[usize]) -> Vec<Dim> {
    shape.iter().map(|&d| Dim::int(d as i64)).collect()
}

pub fn concrete(shape: &[Dim]) -> Option<Vec<usize>> {
    shape.iter().map(|d| d.usize()).collect()
}

impl<T: Clone> Tensor<T> {
    pub fn new(shape: Vec<usize>, data: Vec<T>) -> Option<Self> {
        (numel(&shape)? == data.len()).then_some(Tensor { shape, data })
    }
    pub fn scalar(v: T) -> Self {
        Tensor {
            shape: vec![],
            data: vec![v],
        }
    }

    pub fn transpose(&self, perm: &[usize]) -> Option<Self> {
        let rank = self.shape.len();
        let mut seen = vec![false; rank];
        for &p in perm {
            if p >= rank || std::mem::replace(&mut seen[p], true) {
                return None;
            }
        }
        if perm.len() != rank {
            return None;
        }
        let shape: Vec<usize> = perm.iter().map(|&p| self.shape[p]).collect();
        let src = strides(&self.shape);
        let st: Vec<usize> = perm.iter().map(|&p| src[p]).collect();
        let mut data = Vec::with_capacity(self.data.len());
        let mut idx = vec![0usize; rank];
        for _ in 0..self.data.len() {
            let off: usize = idx.iter().zip(&st).map(|(i, s)| i * s).sum();
            data.push(self.data[off].clone());
            for a in (0..rank).rev() {
                idx[a] += 1;
                if idx[a] < shape[a] {
                    break;
                }
                idx[a] = 0;
            }
        }
        Some(Tensor { shape, data })
    }

    /// Index `indices` along `axis` (already normalised, indices may be negative).
    pub fn gather(&self, axis: usize, indices: &Tensor<i64>) -> Option<Self> {
        let n = *self.shape.get(axis)?;
        let outer = numel(&self.shape[..axis])?;
        let inner = numel(&self.shape[axis + 1..])?;
        let mut shape = self.shape[..axis].to_vec();
        shape.extend_from_slice(&indices.shape);
        shape.extend_from_slice(&self.shape[axis + 1..]);
        if numel(&shape)? > MAX_ELEMENTS {
            return None;
        }
        let mut data = Vec::with_capacity(numel(&shape)?);
        for o in 0..outer {
            for &i in &indices.data {
                let i = if i < 0 { i + n as i64 } else { i };
                let i = usize::try_from(i).ok().filter(|&i| i < n)?;
                let start = (o * n + i) * inner;
                data.extend_from_slice(&self.data[start..start + inner]);
            }
        }
        Some(Tensor { shape, data })
    }

    /// `Slice` with starts, ends and steps already clamped per axis.
    pub fn slice(&self, ranges: &[(usize, i64, i64, i64)]) -> Option<Self> {
        // Each axis: the indices it keeps.
        let mut keep: Vec<Vec<usize>> = self.shape.iter().map(|&d| (0..d).collect()).collect();
        for &(a, start, end, step) in ranges {
            let d = *self.shape.get(a)? as i64;
            keep[a] = slice_indices(d, start, end, step)?;
        }
        let shape: Vec<usize> = keep.iter().map(|k| k.len()).collect();
        let st = strides(&self.shape);
        let total = numel(&shape)?;
        let mut data = Vec::with_capacity(total);
        let rank = shape.len();
        let mut idx = vec![0usize; rank];
        for _ in 0..total {
            let off: usize = (0..rank).map(|a| keep[a][idx[a]] * st[a]).sum();
            data.push(self.data[off].clone());
            for a in (0..rank).rev() {
                idx[a] += 1;
                if idx[a] < shape[a] {
                    break;
                }
                idx[a] = 0;
            }
        }
        Some(Tensor { shape, data })
    }

    pub fn concat(parts: &[&Tensor<T>], axis: usize) -> Option<Self> {
        let first = parts.first()?;
        let rank = first.shape.len();
        if axis >= rank {
            return None;
        }
        let mut shape = first.shape.clone();
        shape[axis] = 0;
        for p in parts {
            if p.shape.len() != rank || (0..rank).any(|a| a != axis && p.shape[a] != first.shape[a])
            {
                return None;
            }
            shape[axis] = shape[axis].checked_add(p.shape[axis])?;
        }
        if numel(&shape)? > MAX_ELEMENTS {
            return None;
        }
        let outer = numel(&shape[..axis])?;
        let mut data = Vec::with_capacity(numel(&shape)?);
        for o in 0..outer {
            for p in parts {
                let chunk = numel(&p.shape[axis..])?;
                data.extend_from_slice(&p.data[o * chunk..(o + 1) * chunk]);
            }
        }
        Some(Tensor { shape, data })
    }

    /// Broadcast to `shape` (ONNX `Expand` semantics: the result is the
    /// broadcast of both shapes).
    pub fn expand(&self, to: &[usize]) -> Option<Self> {
        let shape = concrete(&broadcast_shapes(&dims(&self.shape), &dims(to))?)?;
        let total = numel(&shape)?;
        if total > MAX_ELEMENTS {
            return None;
        }
        let rank = shape.len();
        let pad = rank - self.shape.len();
        let st = strides(&self.shape);
        let mut data = Vec::with_capacity(total);
        let mut idx = vec![0usize; rank];
        for _ in 0..total {
            let mut off = 0;
            for a in pad..rank {
                let d = self.shape[a - pad];
                off += if d == 1 { 0 } else { idx[a] * st[a - pad] };
            }
            data.push(self.data[off].clone());
            for a in (0..rank).rev() {
                idx[a] += 1;
                if idx[a] < shape[a] {
                    break;
                }
                idx[a] = 0;
            }
        }
        Some(Tensor { shape, data })
    }

    pub fn tile(&self, reps: &[usize]) -> Option<Self> {
        if reps.len() != self.shape.len() {
            return None;
        }
        let mut t = self.clone();
        for (a, &r) in reps.iter().enumerate() {
            let parts: Vec<&Tensor<T>> = std::iter::repeat_n(&t, r).collect();
            t = if r == 0 {
                let mut shape = t.shape.clone();
                shape[a] = 0;
                Tensor {
                    shape,
                    data: vec![],
                }
            } else {
                Tensor::concat(&parts, a)?
            };
        }
        Some(t)
    }

    pub fn map<U>(&self, f: impl Fn(&T) -> U) -> Tensor<U> {
        Tensor {
            shape: self.shape.clone(),
            data: self.data.iter().map(f).collect(),
        }
    }
}

/// The indices `Slice` keeps on an axis of length `d`, ONNX's clamping rules.
pub fn slice_indices(d: i64, start: i64, end: i64, step: i64) -> Option<Vec<usize>> {
    if step == 0 {
        return None;
    }
    let clamp = |v: i64, lo: i64, hi: i64| v.clamp(lo, hi);
    let norm = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
    let (s, e) = if step > 0 {
        (clamp(norm(start), 0, d), clamp(norm(end), 0, d))
    } else {
        (clamp(norm(start), -1, d - 1), clamp(norm(end), -1, d - 1))
    };
    let mut out = Vec::new();
    let mut i = s;
    while (step > 0 && i < e) || (step < 0 && i > e) {
        out.push(usize::try_from(i).ok()?);
        i = i.checked_add(step)?;
    }
    Some(out)
}

/// Elementwise binary operation with broadcasting.
pub fn binary<A: Clone, B: Clone, C>(
    a: &Tensor<A>,
    b: &Tensor<B>,
    f: impl Fn(&A, &B) -> Option<C>,
) -> Option<Tensor<C>> {
    let shape = concrete(&broadcast_shapes(&dims(&a.shape), &dims(&b.shape))?)?;
    let a = a.expand(&shape)?;
    let b = b.expand(&shape)?;
    let data = a
        .data
        .iter()
        .zip(&b.data)
        .map(|(x, y)| f(x, y))
        .collect::<Option<Vec<C>>>()?;
    Some(Tensor { shape, data })
}

/// A value of the graph, once folding has run.
#[derive(Clone, Debug)]
pub enum Val {
    /// A float constant (initializers, `Constant`, anything folded).
    F(Arc<Tensor<f32>>),
    /// An integer or boolean constant; its elements may involve the batch.
    I(Arc<Tensor<Dim>>),
    /// Computed at run time from the image; only its shape is known.
    Dyn(Vec<Dim>),
    /// Produced by a node the importer does not know; nothing follows from it.
    Unknown,
}

impl Val {
    pub fn shape(&self) -> Option<Vec<Dim>> {
        match self {
            Val::F(t) => Some(dims(&t.shape)),
            Val::I(t) => Some(dims(&t.shape)),
            Val::Dyn(s) => Some(s.clone()),
            Val::Unknown => None,
        }
    }
    pub fn ints(&self) -> Option<&Tensor<Dim>> {
        match self {
            Val::I(t) => Some(t),
            _ => None,
        }
    }
    pub fn floats(&self) -> Option<&Arc<Tensor<f32>>> {
        match self {
            Val::F(t) => Some(t),
            _ => None,
        }
    }
    /// The integers as plain numbers, when none involves the batch.
    pub fn plain_ints(&self) -> Option<Tensor<i64>> {
        let t = self.ints()?;
        Some(Tensor {
            shape: t.shape.clone(),
            data: t.data.iter().map(|d| d.concrete()).collect::<Option<_>>()?,
        })
    }
    pub fn is_const(&self) -> bool {
        matches!(self, Val::F(_) | Val::I(_))
    }
}

/// How many elements `Slice` keeps on an axis of length `d`, without listing them.
pub fn slice_len(d: i64, start: i64, end: i64, step: i64) -> Option<usize> {
    if step == 0 {
        return None;
    }
    let norm = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
    let (s, e) = if step > 0 {
        (norm(start).clamp(0, d), norm(end).clamp(0, d))
    } else {
        (norm(start).clamp(-1, d - 1), norm(end).clamp(-1, d - 1))
    };
    let span = if step > 0 {
        e.checked_sub(s)?
    } else {
        s.checked_sub(e)?
    };
    if span <= 0 {
        return Some(0);
    }
    let step = step.checked_abs()?;
    usize::try_from((span - 1) / step + 1).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_gather_slice_concat() {
        let t = Tensor::new(vec![2, 3], vec![0, 1, 2, 3, 4, 5]).unwrap();
        assert_eq!(t.transpose(&[1, 0]).unwrap().data, vec![0, 3, 1, 4, 2, 5]);
        let idx = Tensor::new(vec![2], vec![2i64, -3]).unwrap();
        let g = t.gather(1, &idx).unwrap();
        assert_eq!((g.shape.clone(), g.data), (vec![2, 2], vec![2, 0, 5, 3]));
        let s = t.slice(&[(1, 1, i64::MAX, 1)]).unwrap();
        assert_eq!(s.data, vec![1, 2, 4, 5]);
        let r = t.slice(&[(1, -1, i64::MIN, -1)]).unwrap();
        assert_eq!(r.data, vec![2, 1, 0, 5, 4, 3]);
        let c = Tensor::concat(&[&t, &t], 1).unwrap();
        assert_eq!(c.data, vec![0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5]);
        let e = Tensor::new(vec![1, 3], vec![7, 8, 9])
            .unwrap()
            .expand(&[2, 1])
            .unwrap();
        assert_eq!(e.data, vec![7, 8, 9, 7, 8, 9]);
        let tl = Tensor::new(vec![1, 2], vec![1, 2])
            .unwrap()
            .tile(&[2, 2])
            .unwrap();
        assert_eq!(tl.data, vec![1, 2, 1, 2, 1, 2, 1, 2]);
    }

    #[test]
    fn batch_monomials() {
        let b4 = Dim::BATCH.mul(Dim::int(4)).unwrap();
        assert_eq!(b4.div(Dim::BATCH), Some(Dim::int(4)));
        assert_eq!(b4.div(Dim::int(3)), None);
        assert_eq!(b4.add(Dim::int(1)), None);
        assert_eq!(Dim::int(-7).rem(Dim::int(3)), Some(Dim::int(2)));
        assert_eq!(b4.at(3), Some(12));
        assert_eq!(b4.equal(Dim::int(8)), None);
    }
}
