//! The graph as values: nodes put in dataflow order, then every node either
//! folded to a constant (shape arithmetic, weight slicing) or given the shape of
//! the runtime tensor it makes, the batch kept as a symbol when it is dynamic.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use crate::error::OnnxError;
use crate::load::tensor_val;
use crate::proto::{AttributeProto, GraphProto, NodeProto, tensor_proto::DataType};
use crate::value::{
    Dim, MAX_ELEMENTS, Tensor, Val, axis, binary, broadcast_shapes, concrete, dims, numel, show,
    slice_len,
};

pub struct Node {
    pub op: String,
    pub name: String,
    pub domain: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    attrs: Vec<AttributeProto>,
}

impl Node {
    fn from_proto(n: &NodeProto, index: usize) -> Self {
        // Exporters name nearly every node; an unnamed one is named after its
        // first output so that errors can still point at it.
        let name = if !n.name.is_empty() {
            n.name.clone()
        } else if let Some(o) = n.output.first() {
            format!("<{o}>")
        } else {
            format!("<node {index}>")
        };
        Node {
            op: n.op_type.clone(),
            name,
            domain: n.domain.clone(),
            inputs: n.input.clone(),
            outputs: n.output.clone(),
            attrs: n.attribute.clone(),
        }
    }
    fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.attrs.iter().find(|a| a.name == name)
    }
    pub fn int(&self, name: &str) -> Option<i64> {
        self.attr(name).map(|a| a.i)
    }
    pub fn float(&self, name: &str) -> Option<f32> {
        self.attr(name).map(|a| a.f)
    }
    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.attr(name).map(|a| a.ints.clone())
    }
    pub fn string(&self, name: &str) -> Option<String> {
        self.attr(name)
            .map(|a| String::from_utf8_lossy(&a.s).into_owned())
    }
    /// The `i`-th input's name, `None` when absent or left empty (optional).
    pub fn input(&self, i: usize) -> Option<&str> {
        self.inputs
            .get(i)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }
}

pub struct Folded {
    pub nodes: Vec<Node>,
    pub vals: HashMap<String, Val>,
    /// Which node makes each value.
    pub producer: HashMap<String, usize>,
    /// How many node inputs and graph outputs read each value.
    pub readers: HashMap<String, usize>,
    /// Nodes whose op the importer does not know, in node order.
    pub unknown: Vec<usize>,
    pub input: String,
    pub input_shape: Vec<Dim>,
    pub outputs: Vec<String>,
}

impl Folded {
    pub fn val(&self, name: &str) -> Option<&Val> {
        self.vals.get(name)
    }
    /// A node that made no runtime value: shape arithmetic or weight preparation.
    pub fn is_folded(&self, n: usize) -> bool {
        self.nodes[n]
            .outputs
            .iter()
            .all(|o| o.is_empty() || self.vals.get(o).is_some_and(Val::is_const))
    }
}

const KNOWN: &[&str] = &[
    "Constant",
    "Identity",
    "Cast",
    "Shape",
    "Gather",
    "Slice",
    "Concat",
    "Unsqueeze",
    "Squeeze",
    "Reshape",
    "Transpose",
    "Flatten",
    "Expand",
    "Tile",
    "ConstantOfShape",
    "Range",
    "Equal",
    "Where",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Mod",
    "Neg",
    "Sqrt",
    "Reciprocal",
    "Tanh",
    "Erf",
    "Softmax",
    "MatMul",
    "Gemm",
    "Conv",
    "LayerNormalization",
    "ReduceMean",
    "Split",
];

pub fn fold(graph: &GraphProto, dir: &Path) -> Result<Folded, OnnxError> {
    let mut vals: HashMap<String, Val> = HashMap::new();
    for t in &graph.initializer {
        vals.insert(t.name.clone(), tensor_val(t, dir)?);
    }
    let inputs: Vec<_> = graph
        .input
        .iter()
        .filter(|i| !vals.contains_key(&i.name))
        .collect();
    let [input] = inputs.as_slice() else {
        return Err(OnnxError::Graph {
            reason: format!(
                "expected one image input, found {} runtime inputs",
                inputs.len()
            ),
        });
    };
    let input_shape = image_shape(input)?;
    vals.insert(input.name.clone(), Val::Dyn(input_shape.clone()));

    let nodes: Vec<Node> = graph
        .node
        .iter()
        .enumerate()
        .map(|(i, n)| Node::from_proto(n, i))
        .collect();
    let mut producer = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        for o in n.outputs.iter().filter(|o| !o.is_empty()) {
            if vals.contains_key(o) || producer.insert(o.clone(), i).is_some() {
                return Err(OnnxError::Graph {
                    reason: format!("value `{o}` is defined twice"),
                });
            }
        }
    }
    let mut readers: HashMap<String, usize> = HashMap::new();
    for n in &nodes {
        for i in n.inputs.iter().filter(|i| !i.is_empty()) {
            if !vals.contains_key(i) && !producer.contains_key(i) {
                return Err(OnnxError::Node {
                    op: n.op.clone(),
                    node: n.name.clone(),
                    reason: format!("reads `{i}`, which nothing defines"),
                });
            }
            *readers.entry(i.clone()).or_default() += 1;
        }
    }
    let outputs: Vec<String> = graph.output.iter().map(|o| o.name.clone()).collect();
    for o in &outputs {
        if !vals.contains_key(o) && !producer.contains_key(o) {
            return Err(OnnxError::Graph {
                reason: format!("output `{o}` is not computed by the graph"),
            });
        }
        *readers.entry(o.clone()).or_default() += 1;
    }

    let order = topo_order(&nodes, &producer)?;
    let mut unknown = Vec::new();
    for &i in &order {
        let n = &nodes[i];
        let known =
            (n.domain.is_empty() || n.domain == "ai.onnx") && KNOWN.contains(&n.op.as_str());
        let ins: Vec<Option<&Val>> = n.inputs.iter().map(|s| vals.get(s)).collect();
        let outs = if !known {
            unknown.push(i);
            vec![Val::Unknown; n.outputs.len()]
        } else if ins.iter().any(|v| matches!(v, Some(Val::Unknown))) {
            vec![Val::Unknown; n.outputs.len()]
        } else {
            eval(n, &ins, dir).map_err(|reason| OnnxError::Node {
                op: n.op.clone(),
                node: n.name.clone(),
                reason,
            })?
        };
        for (o, v) in n.outputs.iter().zip(outs) {
            if !o.is_empty() {
                vals.insert(o.clone(), v);
            }
        }
    }
    unknown.sort_unstable();
    Ok(Folded {
        nodes,
        vals,
        producer,
        readers,
        unknown,
        input: input.name.clone(),
        input_shape,
        outputs,
    })
}

fn image_shape(input: &crate::proto::ValueInfoProto) -> Result<Vec<Dim>, OnnxError> {
    use crate::proto::{tensor_shape_proto::dimension::Value as D, type_proto::Value as T};
    let bad = |reason: String| OnnxError::Graph {
        reason: format!("input `{}`: {reason}", input.name),
    };
    let Some(T::TensorType(tt)) = input.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return Err(bad("not a tensor".into()));
    };
    if tt.elem_type != DataType::Float as i32 {
        return Err(OnnxError::Dtype {
            tensor: input.name.clone(),
            dtype: tt.elem_type,
        });
    }
    let dims = tt
        .shape
        .as_ref()
        .map(|s| s.dim.as_slice())
        .unwrap_or_default();
    if dims.len() != 4 {
        return Err(bad(format!(
            "rank {} where images are [batch, channels, height, width]",
            dims.len()
        )));
    }
    let mut shape = Vec::new();
    for (a, d) in dims.iter().enumerate() {
        shape.push(match d.value {
            Some(D::DimValue(v)) if v > 0 => Dim::int(v),
            Some(D::DimParam(_)) | None if a == 0 => Dim::BATCH,
            _ => return Err(bad(format!("dimension {a} must be a positive number"))),
        });
    }
    Ok(shape)
}

/// Kahn's algorithm, ties broken by node index: any order the exporter wrote
/// gives the same values.
fn topo_order(nodes: &[Node], producer: &HashMap<String, usize>) -> Result<Vec<usize>, OnnxError> {
    let mut pending = vec![0usize; nodes.len()];
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        for inp in &n.inputs {
            if let Some(&p) = producer.get(inp) {
                pending[i] += 1;
                users[p].push(i);
            }
        }
    }
    let mut ready: std::collections::BTreeSet<usize> =
        (0..nodes.len()).filter(|&i| pending[i] == 0).collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &u in &users[i] {
            pending[u] -= 1;
            if pending[u] == 0 {
                ready.insert(u);
            }
        }
    }
    if order.len() != nodes.len() {
        let stuck = (0..nodes.len())
            .find(|&i| pending[i] > 0)
            .map(|i| nodes[i].name.clone())
            .unwrap_or_default();
        return Err(OnnxError::Graph {
            reason: format!("the graph has a cycle through node `{stuck}`"),
        });
    }
    Ok(order)
}

type R<T> = Result<T, String>;

fn need<'a>(ins: &[Option<&'a Val>], i: usize) -> R<&'a Val> {
    ins.get(i)
        .copied()
        .flatten()
        .ok_or_else(|| format!("input {i} is missing"))
}
fn opt<'a>(n: &Node, ins: &[Option<&'a Val>], i: usize) -> Option<&'a Val> {
    n.input(i).and(ins.get(i).copied().flatten())
}
fn plain(v: &Val, what: &str) -> R<Vec<i64>> {
    v.plain_ints()
        .map(|t| t.data)
        .ok_or_else(|| format!("{what} is not a constant integer list"))
}
fn sym(v: &Val, what: &str) -> R<Vec<Dim>> {
    v.ints()
        .map(|t| t.data.clone())
        .ok_or_else(|| format!("{what} is not a constant integer list"))
}
fn shape_of(v: &Val) -> R<Vec<Dim>> {
    v.shape()
        .ok_or_else(|| "input of unknown shape".to_string())
}
fn ax(a: i64, rank: usize) -> R<usize> {
    axis(a, rank).ok_or_else(|| format!("axis {a} out of range for rank {rank}"))
}
fn bounded(shape: &[usize]) -> R<()> {
    match numel(shape) {
        Some(n) if n <= MAX_ELEMENTS => Ok(()),
        _ => Err(format!("folded constant of shape {shape:?} is too large")),
    }
}
fn f(t: Tensor<f32>) -> Val {
    Val::F(Arc::new(t))
}
fn i(t: Tensor<Dim>) -> Val {
    Val::I(Arc::new(t))
}
fn fail<T>(what: &str) -> R<T> {
    Err(what.to_string())
}

/// Applies a data-movement operation to whichever kind of constant `v` is.
fn movement(
    v: &Val,
    op: impl Fn(&Tensor<f32>) -> Option<Tensor<f32>>,
    op_i: impl Fn(&Tensor<Dim>) -> Option<Tensor<Dim>>,
) -> R<Val> {
    match v {
        Val::F(t) => op(t)
            .map(f)
            .ok_or_else(|| "invalid indices or shape".to_string()),
        Val::I(t) => op_i(t)
            .map(i)
            .ok_or_else(|| "invalid indices or shape".to_string()),
        _ => fail("not a constant"),
    }
}

fn reshape_const(v: &Val, shape: Vec<usize>) -> R<Val> {
    let n = numel(&shape).ok_or("shape overflows")?;
    let ok = match v {
        Val::F(t) => t.data.len() == n,
        Val::I(t) => t.data.len() == n,
        _ => false,
    };
    if !ok {
        return fail("element count changes");
    }
    movement(
        v,
        |t| {
            Some(Tensor {
                shape: shape.clone(),
                data: t.data.clone(),
            })
        },
        |t| {
            Some(Tensor {
                shape: shape.clone(),
                data: t.data.clone(),
            })
        },
    )
}

fn product(shape: &[Dim]) -> Option<Dim> {
    shape.iter().try_fold(Dim::int(1), |a, &d| a.mul(d))
}

fn eval(n: &Node, ins: &[Option<&Val>], dir: &Path) -> R<Vec<Val>> {
    let one = |v: Val| Ok(vec![v]);
    match n.op.as_str() {
        "Constant" => {
            if let Some(a) = n.attr("value") {
                let t = a.t.as_ref().ok_or("`value` holds no tensor")?;
                return one(tensor_val(t, dir).map_err(|e| e.to_string())?);
            }
            if let Some(v) = n.float("value_float") {
                return one(f(Tensor::scalar(v)));
            }
            if let Some(v) = n.int("value_int") {
                return one(i(Tensor::scalar(Dim::int(v))));
            }
            if let Some(v) = n.attr("value_floats") {
                return one(f(Tensor {
                    shape: vec![v.floats.len()],
                    data: v.floats.clone(),
                }));
            }
            if let Some(v) = n.ints("value_ints") {
                return one(i(Tensor {
                    shape: vec![v.len()],
                    data: v.into_iter().map(Dim::int).collect(),
                }));
            }
            fail("no value attribute the importer reads")
        }
        "Identity" => one(need(ins, 0)?.clone()),
        "Cast" => {
            let to = n.int("to").ok_or("no `to`")?;
            let x = need(ins, 0)?;
            let float = to == DataType::Float as i64;
            let int = to == DataType::Int64 as i64 || to == DataType::Int32 as i64;
            let bool_ = to == DataType::Bool as i64;
            match x {
                Val::F(t) if float => one(Val::F(t.clone())),
                Val::F(t) if int => one(i(t.map(|&v| Dim::int(v as i64)))),
                Val::F(t) if bool_ => one(i(t.map(|&v| Dim::int((v != 0.0) as i64)))),
                Val::I(t) if float => one(f(Tensor {
                    shape: t.shape.clone(),
                    data: t
                        .data
                        .iter()
                        .map(|d| d.concrete().map(|v| v as f32))
                        .collect::<Option<_>>()
                        .ok_or("casts the batch to float")?,
                })),
                Val::I(t) if int => one(Val::I(t.clone())),
                Val::I(t) if bool_ => one(i(t.map(|d| Dim::int((d.k != 0) as i64)))),
                Val::Dyn(s) if float => one(Val::Dyn(s.clone())),
                _ => fail("cast the importer does not fold"),
            }
        }
        "Shape" => {
            let s = shape_of(need(ins, 0)?)?;
            let r = s.len() as i64;
            let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
            let start = clampi(n.int("start").unwrap_or(0));
            let end = clampi(n.int("end").unwrap_or(r));
            let s = if start < end {
                s[start..end].to_vec()
            } else {
                vec![]
            };
            one(i(Tensor {
                shape: vec![s.len()],
                data: s,
            }))
        }
        "Gather" => {
            let x = need(ins, 0)?;
            let idx = need(ins, 1)?
                .plain_ints()
                .ok_or("indices are not constant")?;
            let s = shape_of(x)?;
            let a = ax(n.int("axis").unwrap_or(0), s.len())?;
            if x.is_const() {
                return one(movement(x, |t| t.gather(a, &idx), |t| t.gather(a, &idx))?);
            }
            let mut out = s[..a].to_vec();
            out.extend(dims(&idx.shape));
            out.extend_from_slice(&s[a + 1..]);
            one(Val::Dyn(out))
        }
        "Slice" => {
            let x = need(ins, 0)?;
            let s = shape_of(x)?;
            let starts = plain(need(ins, 1)?, "starts")?;
            let ends = plain(need(ins, 2)?, "ends")?;
            let axes = match opt(n, ins, 3) {
                Some(v) => plain(v, "axes")?,
                None => (0..starts.len() as i64).collect(),
            };
            let steps = match opt(n, ins, 4) {
                Some(v) => plain(v, "steps")?,
                None => vec![1; starts.len()],
            };
            if ends.len() != starts.len()
                || axes.len() != starts.len()
                || steps.len() != starts.len()
            {
                return fail("starts, ends, axes and steps differ in length");
            }
            let mut ranges = Vec::new();
            for k in 0..starts.len() {
                ranges.push((ax(axes[k], s.len())?, starts[k], ends[k], steps[k]));
            }
            if x.is_const() {
                return one(movement(x, |t| t.slice(&ranges), |t| t.slice(&ranges))?);
            }
            let mut out = s.clone();
            for &(a, st, en, sp) in &ranges {
                out[a] = match s[a].concrete() {
                    Some(d) => Dim::int(slice_len(d, st, en, sp).ok_or("step 0")? as i64),
                    None if st == 0 && en >= i32::MAX as i64 && sp == 1 => s[a],
                    None => return fail("slices the batch axis"),
                };
            }
            one(Val::Dyn(out))
        }
        "Concat" => {
            let vs: Vec<&Val> = (0..n.inputs.len())
                .map(|k| need(ins, k))
                .collect::<R<_>>()?;
            let first = shape_of(vs.first().ok_or("no inputs")?)?;
            let a = ax(n.int("axis").ok_or("no axis")?, first.len())?;
            if vs.iter().all(|v| matches!(v, Val::I(_))) {
                let ts: Vec<&Tensor<Dim>> = vs.iter().filter_map(|v| v.ints()).collect();
                return one(i(Tensor::concat(&ts, a).ok_or("shapes do not concatenate")?));
            }
            if vs.iter().all(|v| matches!(v, Val::F(_))) {
                let ts: Vec<&Tensor<f32>> = vs
                    .iter()
                    .filter_map(|v| v.floats().map(|t| t.as_ref()))
                    .collect();
                return one(f(Tensor::concat(&ts, a).ok_or("shapes do not concatenate")?));
            }
            let mut out = first.clone();
            out[a] = Dim::int(0);
            for v in &vs {
                let s = shape_of(v)?;
                if s.len() != first.len() {
                    return fail("ranks differ");
                }
                out[a] = out[a].add(s[a]).ok_or("axis length not representable")?;
            }
            one(Val::Dyn(out))
        }
        "Unsqueeze" | "Squeeze" => {
            let x = need(ins, 0)?;
            let s = shape_of(x)?;
            let axes = match opt(n, ins, 1) {
                Some(v) => Some(plain(v, "axes")?),
                None => n.ints("axes"),
            };
            let out: Vec<Dim> = if n.op == "Unsqueeze" {
                let axes = axes.ok_or("no axes")?;
                let rank = s.len() + axes.len();
                let mut at: Vec<usize> = axes.iter().map(|&a| ax(a, rank)).collect::<R<_>>()?;
                at.sort_unstable();
                at.dedup();
                if at.len() != axes.len() {
                    return fail("repeated axis");
                }
                let mut rest = s.iter();
                (0..rank)
                    .map(|k| {
                        if at.contains(&k) {
                            Some(Dim::int(1))
                        } else {
                            rest.next().copied()
                        }
                    })
                    .collect::<Option<_>>()
                    .ok_or("bad axes")?
            } else {
                let drop: Vec<usize> = match axes {
                    Some(a) => a.iter().map(|&a| ax(a, s.len())).collect::<R<_>>()?,
                    None => (0..s.len()).filter(|&k| s[k] == Dim::int(1)).collect(),
                };
                if drop.iter().any(|&k| s[k] != Dim::int(1)) {
                    return fail("squeezes an axis that is not 1");
                }
                s.iter()
                    .enumerate()
                    .filter(|(k, _)| !drop.contains(k))
                    .map(|(_, d)| *d)
                    .collect()
            };
            if x.is_const() {
                return one(reshape_const(x, concrete(&out).ok_or("shape")?)?);
            }
            one(Val::Dyn(out))
        }
        "Reshape" => {
            let x = need(ins, 0)?;
            let s = shape_of(x)?;
            let target = sym(need(ins, 1)?, "shape")?;
            let allowzero = n.int("allowzero").unwrap_or(0) != 0;
            let mut out = Vec::with_capacity(target.len());
            let mut infer = None;
            for (k, &d) in target.iter().enumerate() {
                if d == Dim::int(0) && !allowzero {
                    out.push(*s.get(k).ok_or("0 copies a dimension the input lacks")?);
                } else if d == Dim::int(-1) {
                    if infer.replace(k).is_some() {
                        return fail("two -1 dimensions");
                    }
                    out.push(Dim::int(1));
                } else if d.k < 0 {
                    return fail("negative dimension");
                } else {
                    out.push(d);
                }
            }
            let total = product(&s).ok_or("input size")?;
            let known = product(&out).ok_or("target size")?;
            if let Some(k) = infer {
                out[k] = total.div(known).ok_or_else(|| {
                    format!("cannot infer -1 from {} over {}", show(&s), show(&target))
                })?;
            }
            if product(&out) != Some(total) {
                return Err(format!("reshape of {} into {}", show(&s), show(&out)));
            }
            if x.is_const() {
                return one(reshape_const(x, concrete(&out).ok_or("shape")?)?);
            }
            one(Val::Dyn(out))
        }
        "Flatten" => {
            let x = need(ins, 0)?;
            let s = shape_of(x)?;
            let a = n.int("axis").unwrap_or(1);
            let a = if a < 0 { a + s.len() as i64 } else { a };
            let a = usize::try_from(a)
                .ok()
                .filter(|&a| a <= s.len())
                .ok_or("axis out of range")?;
            let out = vec![
                product(&s[..a]).ok_or("size")?,
                product(&s[a..]).ok_or("size")?,
            ];
            if x.is_const() {
                return one(reshape_const(x, concrete(&out).ok_or("shape")?)?);
            }
            one(Val::Dyn(out))
        }
        "Transpose" => {
            let x = need(ins, 0)?;
            let s = shape_of(x)?;
            let perm: Vec<usize> = match n.ints("perm") {
                Some(p) => p
                    .iter()
                    .map(|&a| usize::try_from(a).map_err(|_| "negative perm".to_string()))
                    .collect::<R<_>>()?,
                None => (0..s.len()).rev().collect(),
            };
            let mut sorted = perm.clone();
            sorted.sort_unstable();
            if sorted != (0..s.len()).collect::<Vec<_>>() {
                return fail("perm is not a permutation of the axes");
            }
            if x.is_const() {
                return one(movement(x, |t| t.transpose(&perm), |t| t.transpose(&perm))?);
            }
            one(Val::Dyn(perm.iter().map(|&p| s[p]).collect()))
        }
        "Expand" => {
            let x = need(ins, 0)?;
            let to = sym(need(ins, 1)?, "shape")?;
            let s = shape_of(x)?;
            let out = broadcast_shapes(&s, &to).ok_or("shapes do not broadcast")?;
            if let (true, Some(c)) = (x.is_const(), concrete(&out)) {
                bounded(&c)?;
                return one(movement(x, |t| t.expand(&c), |t| t.expand(&c))?);
            }
            one(Val::Dyn(out))
        }
        "Tile" => {
            let x = need(ins, 0)?;
            let reps = sym(need(ins, 1)?, "repeats")?;
            let s = shape_of(x)?;
            if reps.len() != s.len() {
                return fail("repeats and rank differ");
            }
            let out: Vec<Dim> = s
                .iter()
                .zip(&reps)
                .map(|(a, b)| a.mul(*b))
                .collect::<Option<_>>()
                .ok_or("size")?;
            if let (true, Some(c), Some(r)) = (x.is_const(), concrete(&out), concrete(&reps)) {
                bounded(&c)?;
                return one(movement(x, |t| t.tile(&r), |t| t.tile(&r))?);
            }
            one(Val::Dyn(out))
        }
        "ConstantOfShape" => {
            let to = sym(need(ins, 0)?, "shape")?;
            let Some(c) = concrete(&to) else {
                return one(Val::Dyn(to));
            };
            bounded(&c)?;
            let count = numel(&c).ok_or("size")?;
            let value = match n.attr("value").and_then(|a| a.t.as_ref()) {
                Some(t) => tensor_val(t, dir).map_err(|e| e.to_string())?,
                None => f(Tensor::scalar(0.0)),
            };
            match value {
                Val::F(t) if t.data.len() == 1 => one(f(Tensor {
                    shape: c,
                    data: vec![t.data[0]; count],
                })),
                Val::I(t) if t.data.len() == 1 => one(i(Tensor {
                    shape: c,
                    data: vec![t.data[0]; count],
                })),
                _ => fail("value is not one element"),
            }
        }
        "Range" => {
            let (a, b, d) = (need(ins, 0)?, need(ins, 1)?, need(ins, 2)?);
            if let (Some(a), Some(b), Some(d)) = (a.plain_ints(), b.plain_ints(), d.plain_ints()) {
                let (a, b, d) = (
                    a.data.first().copied(),
                    b.data.first().copied(),
                    d.data.first().copied(),
                );
                let (a, b, d) = (a.ok_or("empty")?, b.ok_or("empty")?, d.ok_or("empty")?);
                if d == 0 {
                    return fail("delta 0");
                }
                // ONNX: max(ceil((limit - start) / delta), 0) elements.
                let (span, step) = (b as i128 - a as i128, d as i128);
                let len = usize::try_from(((span + step - step.signum()) / step).max(0))
                    .map_err(|_| "too long")?;
                bounded(&[len])?;
                let data = (0..len as i64)
                    .map(|k| Dim::int(a.saturating_add(k.saturating_mul(d))))
                    .collect();
                return one(i(Tensor {
                    shape: vec![len],
                    data,
                }));
            }
            fail("bounds are not constant integers")
        }
        "Equal" | "Where" | "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" => arith(n, ins),
        "Neg" | "Sqrt" | "Reciprocal" | "Tanh" | "Erf" | "Softmax" => {
            let x = need(ins, 0)?;
            let g: Option<fn(f32) -> f32> = match n.op.as_str() {
                "Neg" => Some(|v| -v),
                "Sqrt" => Some(f32::sqrt),
                "Reciprocal" => Some(|v| 1.0 / v),
                "Tanh" => Some(f32::tanh),
                _ => None,
            };
            match (x, g) {
                (Val::F(t), Some(g)) => one(f(t.map(|&v| g(v)))),
                (Val::I(t), _) if n.op == "Neg" => one(i(Tensor {
                    shape: t.shape.clone(),
                    data: t
                        .data
                        .iter()
                        .map(|d| d.neg())
                        .collect::<Option<_>>()
                        .ok_or("overflow")?,
                })),
                _ => one(Val::Dyn(shape_of(x)?)),
            }
        }
        "MatMul" => {
            let (a, b) = (shape_of(need(ins, 0)?)?, shape_of(need(ins, 1)?)?);
            if a.len() < 2 || b.len() < 2 {
                return fail("operands of rank below 2");
            }
            let (ra, rb) = (a.len(), b.len());
            if a[ra - 1] != b[rb - 2] {
                return Err(format!("{} times {}", show(&a), show(&b)));
            }
            let mut out = broadcast_shapes(&a[..ra - 2], &b[..rb - 2])
                .ok_or("batch dimensions do not broadcast")?;
            out.extend([a[ra - 2], b[rb - 1]]);
            one(Val::Dyn(out))
        }
        "Gemm" => {
            let (a, b) = (shape_of(need(ins, 0)?)?, shape_of(need(ins, 1)?)?);
            if a.len() != 2 || b.len() != 2 {
                return fail("operands are not matrices");
            }
            let ta = n.int("transA").unwrap_or(0) != 0;
            let tb = n.int("transB").unwrap_or(0) != 0;
            let (m, k) = if ta { (a[1], a[0]) } else { (a[0], a[1]) };
            let (k2, nn) = if tb { (b[1], b[0]) } else { (b[0], b[1]) };
            if k != k2 {
                return Err(format!("{} times {}", show(&a), show(&b)));
            }
            one(Val::Dyn(vec![m, nn]))
        }
        "Conv" => conv_shape(n, ins).map(|s| vec![Val::Dyn(s)]),
        "LayerNormalization" => {
            let s = shape_of(need(ins, 0)?)?;
            let a = ax(n.int("axis").unwrap_or(-1), s.len())?;
            let mut stat = s.clone();
            for d in &mut stat[a..] {
                *d = Dim::int(1);
            }
            let mut outs = vec![Val::Dyn(s)];
            outs.extend(std::iter::repeat_n(
                Val::Dyn(stat),
                n.outputs.len().saturating_sub(1),
            ));
            Ok(outs)
        }
        "ReduceMean" => {
            let s = shape_of(need(ins, 0)?)?;
            let axes = match opt(n, ins, 1) {
                Some(v) => plain(v, "axes")?,
                None => n
                    .ints("axes")
                    .unwrap_or_else(|| (0..s.len() as i64).collect()),
            };
            let axes: Vec<usize> = axes.iter().map(|&a| ax(a, s.len())).collect::<R<_>>()?;
            let keep = n.int("keepdims").unwrap_or(1) != 0;
            let out = s
                .iter()
                .enumerate()
                .filter_map(|(k, &d)| {
                    if axes.contains(&k) {
                        keep.then_some(Dim::int(1))
                    } else {
                        Some(d)
                    }
                })
                .collect();
            one(Val::Dyn(out))
        }
        "Split" => split(n, ins),
        _ => fail("unsupported"),
    }
}

fn conv_shape(n: &Node, ins: &[Option<&Val>]) -> R<Vec<Dim>> {
    let x = shape_of(need(ins, 0)?)?;
    let w = shape_of(need(ins, 1)?)?;
    if x.len() != 4 || w.len() != 4 {
        return fail("only 2-D convolutions");
    }
    let group = n.int("group").unwrap_or(1);
    if group != 1 || w[1] != x[1] {
        return Err(format!(
            "weight {} does not match input {}",
            show(&w),
            show(&x)
        ));
    }
    let pad = n.string("auto_pad").unwrap_or_default();
    if !(pad.is_empty() || pad == "NOTSET" || pad == "VALID") {
        return fail("padded convolution");
    }
    let pads = n.ints("pads").unwrap_or_default();
    if pads.iter().any(|&p| p != 0) {
        return fail("padded convolution");
    }
    let strides = n.ints("strides").unwrap_or_else(|| vec![1, 1]);
    let dil = n.ints("dilations").unwrap_or_else(|| vec![1, 1]);
    if strides.len() != 2 || dil.iter().any(|&d| d != 1) {
        return fail("dilated convolution");
    }
    let mut out = vec![x[0], w[0]];
    for k in 0..2 {
        let (len, ker) = (
            x[2 + k].concrete().ok_or("image size")?,
            w[2 + k].concrete().ok_or("kernel")?,
        );
        let s = strides[k];
        if s <= 0 || ker > len {
            return fail("kernel larger than the image or bad stride");
        }
        out.push(Dim::int((len - ker) / s + 1));
    }
    Ok(out)
}

fn split(n: &Node, ins: &[Option<&Val>]) -> R<Vec<Val>> {
    let x = need(ins, 0)?;
    let s = shape_of(x)?;
    let a = ax(n.int("axis").unwrap_or(0), s.len())?;
    let len = s[a].concrete().ok_or("splits the batch axis")?;
    let parts = match opt(n, ins, 1) {
        Some(v) => plain(v, "split")?,
        None => match n.ints("split") {
            Some(p) => p,
            None => {
                let k = n.int("num_outputs").unwrap_or(n.outputs.len() as i64);
                if k <= 0 {
                    return fail("no outputs");
                }
                let each = len / k + i64::from(len % k != 0);
                (0..k)
                    .map(|j| len.saturating_sub(j.saturating_mul(each)).clamp(0, each))
                    .collect()
            }
        },
    };
    let sum = parts
        .iter()
        .try_fold(0i64, |a, &p| if p < 0 { None } else { a.checked_add(p) });
    if parts.len() != n.outputs.len() || sum != Some(len) {
        return fail("split sizes do not add up to the axis");
    }
    let mut outs = Vec::new();
    let mut at = 0;
    for &p in &parts {
        let r = [(a, at, at + p, 1)];
        outs.push(if x.is_const() {
            movement(x, |t| t.slice(&r), |t| t.slice(&r))?
        } else {
            let mut o = s.clone();
            o[a] = Dim::int(p);
            Val::Dyn(o)
        });
        at += p;
    }
    Ok(outs)
}

fn arith(n: &Node, ins: &[Option<&Val>]) -> R<Vec<Val>> {
    let op = n.op.as_str();
    if op == "Where" {
        let (c, x, y) = (need(ins, 0)?, need(ins, 1)?, need(ins, 2)?);
        if let (Some(c), Some(x), Some(y)) = (c.plain_ints(), x.ints(), y.ints()) {
            let cx = binary(&c, x, |c, x| Some((*c, *x))).ok_or("shapes do not broadcast")?;
            let r = binary(&cx, y, |(c, x), y| Some(if *c != 0 { *x } else { *y }))
                .ok_or("shapes do not broadcast")?;
            return Ok(vec![i(r)]);
        }
        if let (Some(c), Some(x), Some(y)) = (c.plain_ints(), x.floats(), y.floats()) {
            let cx = binary(&c, x, |c, x| Some((*c, *x))).ok_or("shapes do not broadcast")?;
            let r = binary(&cx, y, |(c, x), y| Some(if *c != 0 { *x } else { *y }))
                .ok_or("shapes do not broadcast")?;
            return Ok(vec![f(r)]);
        }
        let s = broadcast_shapes(&shape_of(c)?, &shape_of(x)?).ok_or("shapes do not broadcast")?;
        let s = broadcast_shapes(&s, &shape_of(y)?).ok_or("shapes do not broadcast")?;
        return Ok(vec![Val::Dyn(s)]);
    }
    let (a, b) = (need(ins, 0)?, need(ins, 1)?);
    let folded = match (a, b) {
        (Val::I(x), Val::I(y)) => {
            let g = |p: &Dim, q: &Dim| -> Option<Dim> {
                match op {
                    "Add" => p.add(*q),
                    "Sub" => p.sub(*q),
                    "Mul" => p.mul(*q),
                    "Div" => p.div(*q),
                    "Mod" => p.rem(*q),
                    "Equal" => p.equal(*q).map(|e| Dim::int(e as i64)),
                    _ => {
                        let (p, q) = (p.concrete()?, u32::try_from(q.concrete()?).ok()?);
                        p.checked_pow(q).map(Dim::int)
                    }
                }
            };
            binary(x, y, g).map(i)
        }
        (Val::F(x), Val::F(y)) => {
            if op == "Equal" {
                binary(x, y, |p, q| Some(Dim::int((p == q) as i64))).map(i)
            } else {
                binary(x, y, |p, q| {
                    Some(match op {
                        "Add" => p + q,
                        "Sub" => p - q,
                        "Mul" => p * q,
                        "Div" => p / q,
                        "Pow" => p.powf(*q),
                        _ => return None,
                    })
                })
                .map(f)
            }
        }
        (Val::F(x), Val::I(y)) if op == "Pow" => binary(x, y, |p, q| {
            Some(p.powi(i32::try_from(q.concrete()?).ok()?))
        })
        .map(f),
        _ => None,
    };
    if let Some(v) = folded {
        if let Some(t) = v.shape().and_then(|s| concrete(&s)) {
            bounded(&t)?;
        }
        return Ok(vec![v]);
    }
    let s = broadcast_shapes(&shape_of(a)?, &shape_of(b)?).ok_or_else(|| {
        format!(
            "{} and {} do not broadcast",
            show(&shape_of(a).unwrap_or_default()),
            show(&shape_of(b).unwrap_or_default())
        )
    })?;
    Ok(vec![Val::Dyn(s)])
}

/// For tests and errors: each node's op type and name, in node order.
pub fn describe(nodes: &[Node], which: impl IntoIterator<Item = usize>) -> Vec<(String, String)> {
    let mut set: BTreeMap<usize, ()> = BTreeMap::new();
    for k in which {
        set.insert(k, ());
    }
    set.keys()
        .map(|&k| (nodes[k].op.clone(), nodes[k].name.clone()))
        .collect()
}
