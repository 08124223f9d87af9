//! Finding a model's identical layers, which the lowering lowers once and the
//! program runs in a loop ([`crate::LayerLoop`]).
//!
//! Layers are recognised by structure, not trusted from names alone: the
//! operations named `layers.<i>.` must form consecutive runs, run `i` the same
//! operations as run 0 (kind, shape, name after the prefix) on the same operands
//! (an operation of the same run at the same place, a parameter of the same
//! shape and name after the prefix, or the run's one input from outside, which
//! for run `i > 0` is the last output of run `i - 1`), and nothing after run `i`
//! may read a tensor of run `i` but run `i + 1`'s input. Anything else lowers
//! unrolled, as before.

use std::collections::HashMap;
use std::ops::Range;

use tessera_graph::{Graph, OpKind, TensorId};

/// The name prefix of a layer's operations, before its index.
pub(crate) const PREFIX: &str = "layers.";

/// A model's identical layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layers {
    /// Indices into `graph.ops()` of each layer's operations other than
    /// parameters, in order.
    pub runs: Vec<Range<usize>>,
    /// The tensor layer 0 reads from before it.
    pub input: TensorId,
    /// Each layer's output: the next layer's input.
    pub outputs: Vec<TensorId>,
    /// For each layer, the parameter it reads where the first layer reads
    /// each of its own (operand for operand), or `None` where one of the
    /// first layer's parameters stands for two of this layer's.
    pub params: Vec<Option<HashMap<TensorId, TensorId>>>,
}

impl Layers {
    pub fn count(&self) -> u32 {
        self.runs.len() as u32
    }
}

/// The name of a layer's operation after its `layers.<i>.` prefix.
pub(crate) fn tail(name: &str) -> Option<&str> {
    layer_index(name).map(|t| t.1)
}

/// Every layer's parameters by their name after the layer's prefix.
pub(crate) fn params_by_tail(g: &Graph) -> HashMap<String, Vec<TensorId>> {
    let mut m: HashMap<String, Vec<TensorId>> = HashMap::new();
    for op in g.ops().iter().filter(|o| is_param(o)) {
        if let Some(t) = tail(&op.name) {
            m.entry(t.to_string()).or_default().push(op.output);
        }
    }
    m
}

fn layer_index(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix(PREFIX)?;
    let (i, tail) = rest.split_once('.')?;
    Some((i.parse().ok()?, tail))
}

/// The graph's layers, when it has at least two identical ones.
pub(crate) fn find(g: &Graph) -> Option<Layers> {
    let ops = g.ops();
    let mut runs: Vec<Range<usize>> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        if matches!(op.kind, OpKind::Parameter { .. }) {
            continue;
        }
        let Some((l, _)) = layer_index(&op.name) else {
            continue;
        };
        let n = runs.len();
        match runs.get_mut(l) {
            Some(r) if r.end == i || ops[r.end..i].iter().all(is_param) => r.end = i + 1,
            Some(_) => return None,
            None if l == n => runs.push(i..i + 1),
            None => return None,
        }
    }
    if runs.len() < 2 || runs.windows(2).any(|w| w[0].end > w[1].start) {
        return None;
    }
    let outputs: Vec<TensorId> = runs.iter().map(|r| ops[r.end - 1].output).collect();
    let input = single_input(g, &runs[0])?;
    let mut params = vec![None];
    for (l, r) in runs.iter().enumerate().skip(1) {
        if single_input(g, r)? != outputs[l - 1] {
            return None;
        }
        params.push(same_structure(g, &runs[0], r, (input, outputs[l - 1]))?);
    }
    // Only the next layer (or, for the last, what follows) reads a layer's
    // tensors: the loop keeps nothing of an iteration but its output.
    let owner: HashMap<TensorId, usize> = runs
        .iter()
        .enumerate()
        .flat_map(|(l, r)| r.clone().map(move |i| (ops[i].output, l)))
        .collect();
    for (i, op) in ops.iter().enumerate() {
        let here = runs.iter().position(|r| r.contains(&i));
        for t in op.kind.inputs() {
            let Some(&l) = owner.get(&t) else { continue };
            let ok = here == Some(l) || (t == outputs[l] && here.is_none_or(|h| h == l + 1));
            if !ok {
                return None;
            }
        }
    }
    if g.outputs().iter().any(|o| owner.contains_key(&o.tensor)) {
        return None;
    }
    Some(Layers {
        runs,
        input,
        outputs,
        params,
    })
}

fn is_param(op: &tessera_graph::Op) -> bool {
    matches!(op.kind, OpKind::Parameter { .. })
}

/// The one tensor from outside the run (not a parameter) that the run reads.
fn single_input(g: &Graph, r: &Range<usize>) -> Option<TensorId> {
    let ops = g.ops();
    let inside: std::collections::HashSet<TensorId> = r.clone().map(|i| ops[i].output).collect();
    let mut input = None;
    for i in r.clone() {
        for t in ops[i].kind.inputs() {
            if inside.contains(&t) || is_param(g.producer(t)) {
                continue;
            }
            match input {
                None => input = Some(t),
                Some(x) if x == t => {}
                Some(_) => return None,
            }
        }
    }
    input
}

/// Run `b` does what run `a` does: same operations in the same order on
/// corresponding operands (`inputs`: run `a`'s outside input, run `b`'s).
/// `None` where it does not; else run `b`'s parameter for each of run `a`'s,
/// or `None` inside where one of `a`'s stands for two of `b`'s.
fn same_structure(
    g: &Graph,
    a: &Range<usize>,
    b: &Range<usize>,
    inputs: (TensorId, TensorId),
) -> Option<Option<HashMap<TensorId, TensorId>>> {
    let mut params: Option<HashMap<TensorId, TensorId>> = Some(HashMap::new());
    let ops = g.ops();
    let mut map: HashMap<TensorId, TensorId> = HashMap::from([(inputs.0, inputs.1)]);
    let own = |r: &Range<usize>| {
        r.clone()
            .filter(|&i| !is_param(&ops[i]))
            .collect::<Vec<_>>()
    };
    let (a, b) = (own(a), own(b));
    if a.len() != b.len() {
        return None;
    }
    for (&i, &j) in a.iter().zip(&b) {
        let (x, y) = (&ops[i], &ops[j]);
        let tails = layer_index(&x.name).map(|t| t.1) == layer_index(&y.name).map(|t| t.1);
        if !tails
            || std::mem::discriminant(&x.kind) != std::mem::discriminant(&y.kind)
            || g.shape(x.output) != g.shape(y.output)
            || x.kind.mnemonic() != y.kind.mnemonic()
            || !same_attributes(&x.kind, &y.kind)
        {
            return None;
        }
        let (xs, ys) = (x.kind.inputs(), y.kind.inputs());
        if xs.len() != ys.len() {
            return None;
        }
        for (&s, &t) in xs.iter().zip(&ys) {
            let ok = match map.get(&s) {
                Some(&m) => m == t,
                None => {
                    let (ps, pt) = (g.producer(s), g.producer(t));
                    let ok = is_param(ps)
                        && is_param(pt)
                        && g.shape(s) == g.shape(t)
                        && layer_index(&ps.name).map(|t| t.1) == layer_index(&pt.name).map(|t| t.1);
                    if ok
                        && let Some(p) = &mut params
                        && *p.entry(s).or_insert(t) != t
                    {
                        params = None;
                    }
                    ok
                }
            };
            if !ok {
                return None;
            }
        }
        map.insert(x.output, y.output);
    }
    Some(params)
}

/// The attributes of two operations of one kind agree (operands aside): the
/// kinds printed with their operands' ids blanked.
fn same_attributes(a: &OpKind, b: &OpKind) -> bool {
    let blank = |k: &OpKind| {
        let mut s = format!("{k:?}");
        for t in k.inputs() {
            s = s.replace(&format!("{t:?}"), "_");
        }
        s
    };
    blank(a) == blank(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_graph::{EncoderLayerConfig, encoder_layer};

    fn tower(layers: usize) -> Graph {
        let cfg = EncoderLayerConfig {
            layers,
            ..EncoderLayerConfig::tiny(1)
        };
        encoder_layer(&cfg).expect("graph")
    }

    #[test]
    fn a_tower_of_three_layers_is_found() {
        let g = tower(3);
        let l = find(&g).expect("three identical layers");
        assert_eq!(l.count(), 3);
        assert!(g.ops()[l.runs[0].start].name.starts_with("layers.0."));
        assert!(g.ops()[l.runs[2].end - 1].name.starts_with("layers.2."));
        assert_eq!(l.outputs[2], g.ops()[l.runs[2].end - 1].output);
        // Each later layer's parameters, operand for operand: its own, named
        // as the first layer's after the prefix.
        for layer in 1..3 {
            let params = l.params[layer].as_ref().expect("one for one");
            assert!(!params.is_empty());
            for (&a, &b) in params {
                let (na, nb) = (&g.producer(a).name, &g.producer(b).name);
                assert_eq!(tail(na), tail(nb), "{na} {nb}");
                assert!(nb.starts_with(&format!("layers.{layer}.")), "{nb}");
            }
        }
    }

    /// A parameter the first layer reads in two places where a later layer
    /// reads two: the layers still loop (a replay makes the weights), but
    /// there is no parameter for parameter correspondence.
    #[test]
    fn a_parameter_standing_for_two_gives_no_correspondence() {
        let text = include_str!("../../tests/graphs/shared_param.graph");
        let g = Graph::parse(text).expect("graph");
        let l = find(&g).expect("two layers");
        assert_eq!(l.params[1], None);
    }

    #[test]
    fn one_layer_is_no_loop() {
        assert_eq!(find(&tower(1)), None);
    }
}
