//! The canonicalisation pass: before the walk, the graph's fused operations are
//! recognised from its structure alone (who reads what), never from the order in
//! which a builder or an importer emitted the operations. Each recognition is a
//! small function over [`Uses`] with its own tests; [`fuse`] runs them and returns
//! the fused operations the walker lowers, one rule each:
//! - an attention with a constant query, its projections absorbed
//!   ([`pooling::Absorbed`], recognised by `Uses::absorbable`);
//! - an attention: its scores product `q k^T`, the scale, the softmax and the
//!   product by the values ([`FusedAttention`]), with the query projection that
//!   may carry the scale and the projections that may store their heads packed;
//! - a linear `x W (+ b)` with the epilogue that follows it alone (views, GELU, a
//!   per-row constant, a residual add) and the sibling projections computed with
//!   it ([`FusedLinear`]).
//!
//! Its invariant: what it records is a fact about the graph (and, for packing,
//! the machine's attention geometry), so the walker decides nothing from what it
//! has already lowered when it picks a rule.

use tessera_graph::{Graph, Op, OpId, OpKind, TensorId, TensorMap};
use tessera_machine::Machine;

use super::{Cols, LowerOptions, attention, pooling, unsupported};
use crate::PlanError;
use crate::matmul::AMP_WIDTH;

/// The graph with its readers and weights: what every recognition reads.
pub(super) struct Uses<'g> {
    pub graph: &'g Graph,
    pub weights: &'g TensorMap,
    pub consumers: Vec<Vec<OpId>>,
}

/// An attention: `softmax(q k^T * scale) v` from its scores product.
pub(super) struct FusedAttention<'g> {
    pub scores: &'g Op,
    pub q: TensorId,
    pub k: TensorId,
    pub v: TensorId,
    pub scale: f32,
    /// The operations after the scores product, the product by `v` last.
    pub chain: Vec<&'g Op>,
    /// The tensor the queries are split from, when its projection may carry the
    /// scale instead of the softmax (`softmax((s q) k^T)` is the same function).
    pub query_scale: Option<TensorId>,
    /// The tensors the queries, keys and values are split from, when their
    /// projections may store the heads packed (no padding columns).
    pub packs: Option<[TensorId; 3]>,
}

/// A linear `x W (+ b)`, `W` a 2-D parameter, with its epilogue and siblings.
#[derive(Clone)]
pub(super) struct FusedLinear<'g> {
    pub matmul: &'g Op,
    pub x: TensorId,
    pub w: TensorId,
    pub bias: Option<TensorId>,
    /// The operations after the product, each the only reader of the one
    /// before: views, a GELU, a per-row constant add, a residual add.
    pub epilogue: Vec<&'g Op>,
    pub gelu: bool,
    /// A parameter added per row, its rows repeating down the output.
    pub row_const: Option<TensorId>,
    /// The other operand of the residual add; the walker lowers the linear once
    /// it has a value, wherever its producer was emitted.
    pub residual: Option<TensorId>,
    /// The tensor the epilogue leaves.
    pub end: TensorId,
    /// How `end` stores its columns: in heads when head splits alone read it.
    pub cols: Cols,
    /// Projections of the same input into heads alike, computed as one matmul
    /// with this one (attention's q, k and v): one input exchange, a wider output.
    pub siblings: Vec<&'g Op>,
    /// The attention scale each member's output carries, this one first (1 for
    /// none; never through a GELU or a residual).
    pub scales: Vec<f32>,
}

impl FusedLinear<'_> {
    /// Each member's output as its head split reads it, this one first.
    pub fn outputs(&self) -> impl Iterator<Item = TensorId> + '_ {
        std::iter::once(self.end).chain(self.siblings.iter().map(|s| s.output))
    }
}

/// The fused operations of one graph.
pub(super) struct Fusion<'g> {
    pub pooled: Vec<pooling::Absorbed<'g>>,
    pub attentions: Vec<FusedAttention<'g>>,
    pub linears: Vec<FusedLinear<'g>>,
    /// By op index: lowered inside another operation's rule, never on its own.
    inside: Vec<bool>,
}

impl<'g> Fusion<'g> {
    /// The absorbed attention whose scores product is `op`.
    pub fn pooled_at(&self, op: &Op) -> Option<usize> {
        self.pooled
            .iter()
            .position(|ab| std::ptr::eq(ab.scores_op, op))
    }

    /// The attention whose scores product is `op`.
    pub fn attention(&self, op: &Op) -> Option<&FusedAttention<'g>> {
        self.attentions.iter().find(|a| std::ptr::eq(a.scores, op))
    }

    /// The scale the projection of `t` (the tensor a query split reads) carries
    /// for its attention.
    pub fn query_scale(&self, t: TensorId) -> Option<f32> {
        self.attentions
            .iter()
            .find(|a| a.query_scale == Some(t))
            .map(|a| a.scale)
    }

    /// Whether the projection of `t` stores its heads packed.
    pub fn packs(&self, t: TensorId) -> bool {
        self.attentions
            .iter()
            .any(|a| a.packs.is_some_and(|xs| xs.contains(&t)))
    }

    /// The fused linear whose product is `op`.
    pub fn linear(&self, op: &Op) -> Option<usize> {
        self.linears.iter().position(|l| std::ptr::eq(l.matmul, op))
    }

    /// Whether operation `i` is lowered inside another's rule.
    pub fn inside(&self, i: usize) -> bool {
        self.inside[i]
    }

    /// The attention scale `t` is stored times, when its projection folded it.
    pub fn folded_scale(&self, t: TensorId) -> Option<f32> {
        self.linears.iter().find_map(|l| {
            l.outputs()
                .zip(&l.scales)
                .find(|&(o, &f)| o == t && f != 1.0)
                .map(|(_, &f)| f)
        })
    }

    /// How a projection split into `heads` heads of `d` columns stores them:
    /// packed where its attention reads them so, padded otherwise.
    pub fn head_cols(&self, t: TensorId, heads: u32, d: u32) -> Cols {
        let dp = d.next_multiple_of(AMP_WIDTH);
        Cols::Heads {
            heads,
            d,
            dp: if self.packs(t) { d } else { dp },
        }
    }
}

/// Recognises every fused operation of `uses.graph`.
pub(super) fn fuse<'g>(uses: &Uses<'g>, machine: &Machine, opts: &LowerOptions) -> Fusion<'g> {
    let pooled: Vec<_> = if opts.experimental.unabsorbed {
        Vec::new()
    } else {
        uses.graph
            .ops()
            .iter()
            .filter_map(|op| uses.absorbable(op))
            .collect()
    };
    let attentions = uses
        .graph
        .ops()
        .iter()
        .filter(|op| !pooled.iter().any(|ab| std::ptr::eq(ab.scores_op, *op)))
        .filter_map(|op| uses.attention(op, machine, opts))
        .collect();
    let mut fusion = Fusion {
        pooled,
        attentions,
        linears: Vec::new(),
        inside: vec![false; uses.graph.ops().len()],
    };
    let folded: Vec<&Op> = fusion.pooled.iter().flat_map(|ab| ab.folded()).collect();
    fusion.linears = uses.linears(&fusion, &folded);
    // An absorbed attention's chain is the one `softmax_chain` found for it.
    let pooled_chains = (fusion.pooled.iter())
        .filter_map(|ab| uses.softmax_chain(ab.scores_op).ok())
        .flat_map(|(_, chain, _)| chain);
    let inner = pooled_chains
        .chain(folded)
        .chain(
            fusion
                .attentions
                .iter()
                .flat_map(|a| a.chain.iter().copied()),
        )
        .chain((fusion.linears.iter()).flat_map(|l| l.epilogue.iter().chain(&l.siblings).copied()));
    let index = |op: &Op| {
        (uses.graph.ops().iter())
            .position(|o| std::ptr::eq(o, op))
            .expect("op of this graph")
    };
    for op in inner.collect::<Vec<_>>() {
        fusion.inside[index(op)] = true;
    }
    fusion
}

/// What follows a linear's product alone, and the tensor it leaves.
struct Epilogue<'g> {
    ops: Vec<&'g Op>,
    gelu: bool,
    row_const: Option<TensorId>,
    residual: Option<TensorId>,
    end: TensorId,
}

impl<'g> Uses<'g> {
    pub(super) fn new(graph: &'g Graph, weights: &'g TensorMap) -> Uses<'g> {
        Uses {
            graph,
            weights,
            consumers: graph.consumers(),
        }
    }

    pub(super) fn param(&self, t: TensorId) -> Option<(&'g str, &'g [f32])> {
        match &self.graph.producer(t).kind {
            OpKind::Parameter { name, .. } => {
                self.weights.get(name).map(|w| (name.as_str(), w.data()))
            }
            _ => None,
        }
    }

    pub(super) fn param_data(&self, t: TensorId, len: usize) -> Result<&'g [f32], PlanError> {
        let name = match &self.graph.producer(t).kind {
            OpKind::Parameter { name, .. } => name.clone(),
            other => {
                return Err(unsupported(format!(
                    "expected a parameter, found `{}`",
                    other.mnemonic()
                )));
            }
        };
        let (_, data) = self
            .param(t)
            .ok_or_else(|| PlanError::MissingWeight(name.clone()))?;
        if data.len() != len {
            return Err(PlanError::MissingWeight(format!(
                "{name} has {} values, expected {len}",
                data.len()
            )));
        }
        Ok(data)
    }

    pub(super) fn is_param(&self, t: TensorId) -> bool {
        matches!(self.graph.producer(t).kind, OpKind::Parameter { .. })
    }

    /// The only consumer of `t`, if it has exactly one.
    pub(super) fn sole(&self, t: TensorId) -> Option<&'g Op> {
        match self.consumers[t.index()][..] {
            [op] => Some(self.graph.op(op)),
            _ => None,
        }
    }

    /// What follows an attention's scores product: an optional scale, the softmax,
    /// and the probabilities (left) times the values. Returns the scale, those
    /// operations (the product last) and the values' tensor, or what is missing.
    pub(super) fn softmax_chain(
        &self,
        scores: &Op,
    ) -> Result<(f32, Vec<&'g Op>, TensorId), &'static str> {
        let mut scale = 1.0f32;
        let mut chain = Vec::new();
        let mut next = self
            .sole(scores.output)
            .ok_or("scores must have one consumer")?;
        if let OpKind::Scale { factor, .. } = next.kind {
            scale = factor;
            chain.push(next);
            next = self
                .sole(next.output)
                .ok_or("scaled scores must have one consumer")?;
        }
        let OpKind::Softmax { .. } = next.kind else {
            return Err("scores must feed a softmax");
        };
        chain.push(next);
        let pv = self
            .sole(next.output)
            .ok_or("probabilities must have one consumer")?;
        let OpKind::MatMul {
            a,
            b: v,
            transpose_b: false,
            bias: None,
        } = pv.kind
        else {
            return Err("probabilities must feed a matmul by the values");
        };
        if a != next.output {
            return Err("probabilities must be the left operand");
        }
        chain.push(pv);
        Ok((scale, chain, v))
    }

    /// `scores` as an attention's scores product `q k^T` with its softmax chain.
    /// The scale folds into the query projection when it scales down (`0 < s <
    /// 1`: the weights times it cannot overflow f16) and the queries' tensor has
    /// no other reader; the heads pack where the attention takes the transposed
    /// path, its heads fit ([`attention::packs_heads`]) and each of q, k and v is
    /// read by its split alone, each split by this attention alone. Neither
    /// applies to `q q^T`.
    pub(super) fn attention(
        &self,
        scores: &'g Op,
        machine: &Machine,
        opts: &LowerOptions,
    ) -> Option<FusedAttention<'g>> {
        let OpKind::MatMul {
            a: q,
            b: k,
            transpose_b: true,
            bias: None,
        } = scores.kind
        else {
            return None;
        };
        let (scale, chain, v) = self.softmax_chain(scores).ok()?;
        let mut fa = FusedAttention {
            scores,
            q,
            k,
            v,
            scale,
            chain,
            query_scale: None,
            packs: None,
        };
        if q != k {
            fa.query_scale = self
                .sole_split(q, scores)
                .filter(|_| scale > 0.0 && scale < 1.0);
            fa.packs = self.packs(&fa, machine, opts);
        }
        Some(fa)
    }

    fn packs(
        &self,
        fa: &FusedAttention<'g>,
        machine: &Machine,
        opts: &LowerOptions,
    ) -> Option<[TensorId; 3]> {
        let pv = *fa.chain.last()?;
        let xs = [
            self.sole_split(fa.q, fa.scores)?,
            self.sole_split(fa.k, fa.scores)?,
            self.sole_split(fa.v, pv)?,
        ];
        let (qd, kd) = (self.graph.shape(fa.q).dims(), self.graph.shape(fa.k).dims());
        let (&[_, heads, tq, d], &[b, _, t, _]) = (qd, kd) else {
            return None;
        };
        let n = |x: usize| u32::try_from(x).ok();
        let (heads, d) = (n(heads)?, n(d)?);
        let (path, ..) = attention::geometry(
            machine.tiles,
            opts.experimental.row_attention,
            (n(b)?, heads, n(tq)?, n(t)?),
            fa.scale,
        );
        (path == attention::Path::Transposed && attention::packs_heads(heads, d)).then_some(xs)
    }

    /// Every linear by a 2-D parameter outside the absorbed attentions, in
    /// emission order: a projection taken as an earlier one's sibling is not
    /// one of its own.
    fn linears(&self, fusion: &Fusion<'g>, folded: &[&'g Op]) -> Vec<FusedLinear<'g>> {
        let ops = self.graph.ops();
        let is_folded = |op: &Op| folded.iter().any(|f| std::ptr::eq(*f, op));
        let mut taken = vec![false; ops.len()];
        let mut out = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            if taken[i] || is_folded(op) || fusion.pooled_at(op).is_some() {
                continue;
            }
            let OpKind::MatMul {
                a: x,
                b: w,
                transpose_b: false,
                bias,
            } = op.kind
            else {
                continue;
            };
            if !self.is_param(w) || self.graph.shape(w).rank() != 2 {
                continue;
            }
            let wdims = self.graph.shape(w).dims();
            let n = wdims[1];
            let ep = self.epilogue(op, n);
            let cols = self.split_cols(fusion, ep.end, n);
            let mut siblings = Vec::new();
            if cols != Cols::Dense && ep.residual.is_none() && !ep.gelu && ep.row_const.is_none() {
                for (j, sib) in ops.iter().enumerate() {
                    if j == i || taken[j] || is_folded(sib) {
                        continue;
                    }
                    let OpKind::MatMul {
                        a: sa,
                        b: sb,
                        transpose_b: false,
                        ..
                    } = sib.kind
                    else {
                        continue;
                    };
                    let cons = &self.consumers[sib.output.index()];
                    let splits_alike = !cons.is_empty()
                        && cons.iter().all(|c| {
                            matches!(&self.graph.op(*c).kind,
                                OpKind::SplitHeads { heads: h, .. } if fusion.head_cols(sib.output, *h as u32, n as u32 / (*h as u32).max(1)) == cols)
                        });
                    if sa == x
                        && self.is_param(sb)
                        && self.graph.shape(sb).dims() == wdims
                        && splits_alike
                    {
                        taken[j] = true;
                        siblings.push(sib);
                    }
                }
            }
            let mut fl = FusedLinear {
                matmul: op,
                x,
                w,
                bias,
                epilogue: ep.ops,
                gelu: ep.gelu,
                row_const: ep.row_const,
                residual: ep.residual,
                end: ep.end,
                cols,
                siblings,
                scales: Vec::new(),
            };
            fl.scales = (fl.outputs())
                .map(|t| match fusion.query_scale(t) {
                    Some(f) if !fl.gelu && fl.residual.is_none() => f,
                    _ => 1.0,
                })
                .collect();
            out.push(fl);
        }
        out
    }

    /// The epilogue of the product `op` of `n` columns: views, at most one GELU
    /// (the kernel's, before any add), at most one constant add of `n` columns
    /// per row (not after the GELU), and a residual add, which ends it.
    fn epilogue(&self, op: &'g Op, n: usize) -> Epilogue<'g> {
        let mut ep = Epilogue {
            ops: Vec::new(),
            gelu: false,
            row_const: None,
            residual: None,
            end: op.output,
        };
        while let Some(next) = self.sole(ep.end) {
            match next.kind {
                OpKind::Reshape { .. } => {}
                OpKind::Gelu { .. } if !ep.gelu && ep.row_const.is_none() => ep.gelu = true,
                OpKind::Add { a, b } => {
                    let other = if a == ep.end { b } else { a };
                    if other == ep.end {
                        break;
                    }
                    if self.is_param(other) {
                        let cols = self.graph.shape(other).dims().last().copied();
                        if ep.row_const.is_some() || ep.gelu || cols != Some(n) {
                            break;
                        }
                        ep.row_const = Some(other);
                    } else {
                        ep.residual = Some(other);
                    }
                }
                _ => break,
            }
            ep.ops.push(next);
            ep.end = next.output;
            if ep.residual.is_some() {
                break;
            }
        }
        ep
    }

    /// `t`'s columns stored in heads when every reader splits it into the same
    /// number of heads.
    fn split_cols(&self, fusion: &Fusion<'g>, t: TensorId, n: usize) -> Cols {
        let consumers = &self.consumers[t.index()];
        let heads = |c: &OpId| match self.graph.op(*c).kind {
            OpKind::SplitHeads { heads, .. } => u32::try_from(heads).ok(),
            _ => None,
        };
        match consumers.first().and_then(heads) {
            Some(h) if consumers.iter().all(|c| heads(c) == Some(h)) => {
                fusion.head_cols(t, h, n as u32 / h)
            }
            _ => Cols::Dense,
        }
    }

    /// The tensor head split `t` reads, when `t`'s only reader is `reader` and
    /// the split is that tensor's only reader: then its producer may change how
    /// it stores the heads for `reader` alone.
    pub(super) fn sole_split(&self, t: TensorId, reader: &Op) -> Option<TensorId> {
        let OpKind::SplitHeads { x, .. } = self.graph.producer(t).kind else {
            return None;
        };
        (std::ptr::eq(self.sole(t)?, reader) && self.sole(x).is_some()).then_some(x)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use tessera_graph::{EncoderLayerConfig, encoder_layer, init_weights};

    use super::*;

    /// The text form's lines in another topological order: each step emits the
    /// last line whose operands are all defined, so independent operations come
    /// out in the reverse of the builder's order.
    fn reordered(text: &str) -> String {
        let (mut ops, outputs): (Vec<&str>, Vec<&str>) =
            text.lines().partition(|l| !l.starts_with("output "));
        let label = |l: &str| l.split(':').next().unwrap().trim().to_string();
        let labels: HashSet<String> = ops.iter().map(|l| label(l)).collect();
        let reads = |l: &str| -> Vec<String> {
            let body = l.split('=').skip(1).collect::<Vec<_>>().join("=");
            let body = body.split('#').next().unwrap().to_string();
            body.split(|c: char| !c.is_alphanumeric() && c != '_')
                .filter(|w| labels.contains(*w))
                .map(str::to_string)
                .collect()
        };
        let mut defined = HashSet::new();
        let mut out = Vec::new();
        while !ops.is_empty() {
            let i = (0..ops.len())
                .rev()
                .find(|&i| reads(ops[i]).iter().all(|r| defined.contains(r)))
                .expect("a topological order exists");
            let line = ops.remove(i);
            defined.insert(label(line));
            out.push(line);
        }
        out.extend(outputs);
        out.join("\n") + "\n"
    }

    /// What `fuse` recognised, by operation names.
    fn recognised(graph: &Graph) -> (Vec<String>, Vec<(String, bool, bool)>) {
        let weights = init_weights(graph, 1);
        let uses = Uses::new(graph, &weights);
        let f = fuse(&uses, &Machine::small(), &LowerOptions::default());
        let mut pooled: Vec<String> = f.pooled.iter().map(|p| p.scores_op.name.clone()).collect();
        let mut attn: Vec<_> = (f.attentions.iter())
            .map(|a| {
                let name = |t: TensorId| graph.producer(t).name.clone();
                (
                    a.scores.name.clone(),
                    a.query_scale.map(name).is_some(),
                    a.packs.is_some(),
                )
            })
            .collect();
        pooled.sort();
        attn.sort();
        (pooled, attn)
    }

    #[test]
    fn the_layer_has_one_attention_and_one_pooled_head() {
        let graph = encoder_layer(&EncoderLayerConfig::tiny(2)).unwrap();
        let (pooled, attn) = recognised(&graph);
        assert_eq!(pooled.len(), 1, "{pooled:?}");
        assert_eq!(attn.len(), 1, "{attn:?}");
        assert!(attn[0].1, "the scale folds into the query projection");
    }

    /// An importer may emit the operations in any topological order; the fused
    /// operations are the same.
    #[test]
    fn recognition_does_not_depend_on_the_emission_order() {
        let graph = encoder_layer(&EncoderLayerConfig::tiny(2)).unwrap();
        let text = graph.to_string();
        let other = Graph::parse(&reordered(&text)).unwrap();
        assert_ne!(other.to_string(), text, "the premise: another order");
        assert_eq!(recognised(&other), recognised(&graph));
    }

    /// A fused linear by names: its members (sorted: which one leads follows
    /// the emission order), its epilogue, the GELU, the per-row constant and
    /// the residual operand's producer.
    type Linear = (
        Vec<String>,
        Vec<String>,
        bool,
        Option<String>,
        Option<String>,
    );

    fn linears(graph: &Graph) -> Vec<Linear> {
        let weights = init_weights(graph, 1);
        let uses = Uses::new(graph, &weights);
        let f = fuse(&uses, &Machine::small(), &LowerOptions::default());
        let name = |t: TensorId| graph.producer(t).name.clone();
        let mut out: Vec<Linear> = (f.linears.iter())
            .map(|l| {
                let mut members: Vec<String> = std::iter::once(l.matmul)
                    .chain(l.siblings.iter().copied())
                    .map(|o| o.name.clone())
                    .collect();
                members.sort();
                (
                    members,
                    l.epilogue.iter().map(|o| o.name.clone()).collect(),
                    l.gelu,
                    l.row_const.map(name),
                    l.residual.map(name),
                )
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn the_layers_linears_carry_their_epilogues() {
        let graph = encoder_layer(&EncoderLayerConfig::tiny(2)).unwrap();
        let ls = linears(&graph);
        assert!(
            ls.iter().any(|l| l.0.len() == 3 && l.1.is_empty()),
            "q, k and v as one product: {ls:?}"
        );
        assert!(ls.iter().any(|l| l.2), "a GELU: {ls:?}");
        assert!(
            ls.iter().filter(|l| l.4.is_some()).count() >= 2,
            "the residuals: {ls:?}"
        );
    }

    #[test]
    fn linear_recognition_does_not_depend_on_the_emission_order() {
        let graph = encoder_layer(&EncoderLayerConfig::tiny(2)).unwrap();
        let other = Graph::parse(&reordered(&graph.to_string())).unwrap();
        assert_eq!(linears(&other), linears(&graph));
    }

    /// The layer emitted in another order lowers to the same fused operations:
    /// the same rules, each fusing as many operations.
    #[test]
    fn the_layer_in_another_order_lowers_to_the_same_rules() {
        let graph = encoder_layer(&EncoderLayerConfig::tiny(2)).unwrap();
        let other = Graph::parse(&reordered(&graph.to_string())).unwrap();
        let rules = |g: &Graph| {
            let plan = crate::lower(
                &Machine::small(),
                g,
                &init_weights(g, 1),
                &LowerOptions::default(),
            )
            .unwrap();
            let mut rules: Vec<(String, usize)> = (plan.ops.iter())
                .map(|o| (o.kind.clone(), o.fused.len()))
                .collect();
            rules.sort();
            rules
        };
        assert_eq!(rules(&other), rules(&graph));
    }

    /// The residual operand emitted after the product is still the residual:
    /// recognition does not ask what is lowered yet, and the walk lowers the
    /// linear once its operand is.
    #[test]
    fn a_residual_emitted_after_the_product_fuses() {
        let text = "\
x: f16[32, 16] = input \"x\"
w: f16[16, 16] = param \"proj.w\" normal(mean=0, std=0.25)
y: f16[32, 16] = matmul x, w  # proj
g: f16[32, 16] = gelu y  # proj.gelu
z: f16[32, 16] = gelu x  # other
r: f16[32, 16] = add z, g  # proj.residual
output \"r\" = r
";
        let graph = Graph::parse(text).unwrap();
        let expect = vec![(
            vec!["proj".to_string()],
            vec!["proj.gelu".to_string(), "proj.residual".to_string()],
            true,
            None,
            Some("other".to_string()),
        )];
        assert_eq!(linears(&graph), expect);
        let plan = crate::lower(
            &Machine::small().with_tiles(4),
            &graph,
            &init_weights(&graph, 1),
            &LowerOptions::default(),
        )
        .unwrap();
        let op = plan.ops.iter().find(|o| o.name == "proj").unwrap();
        assert_eq!(op.fused, ["proj.gelu", "proj.residual"]);
        let at = |n: &str| plan.ops.iter().position(|o| o.name == n).unwrap();
        assert!(at("other") < at("proj"), "the operand is lowered first");
    }

    /// A constant of the output's width added per row is the linear's; one of
    /// another width, or one after the GELU, is not.
    #[test]
    fn a_row_constant_fuses_before_the_gelu_only() {
        let graph = Graph::parse(
            "\
x: f16[2, 16, 16] = input \"x\"
w: f16[16, 16] = param \"a.w\" normal(mean=0, std=0.25)
c: f16[16, 16] = param \"pos\" normal(mean=0, std=0.25)
y: f16[2, 16, 16] = matmul x, w  # a
p: f16[2, 16, 16] = add y, c  # a.pos
u: f16[16, 16] = param \"b.w\" normal(mean=0, std=0.25)
v: f16[2, 16, 16] = matmul p, u  # b
g: f16[2, 16, 16] = gelu v  # b.gelu
q: f16[2, 16, 16] = add g, c  # b.pos
output \"q\" = q
",
        )
        .unwrap();
        let ls = linears(&graph);
        assert_eq!(ls[0].1, ["a.pos"]);
        assert_eq!(ls[0].3.as_deref(), Some("c"));
        assert_eq!(ls[1].1, ["b.gelu"]);
        assert_eq!(ls[1].3, None);
    }

    /// `q q^T` is an attention, but its one operand can neither carry the scale
    /// nor be stored packed for two readers.
    #[test]
    fn self_attention_of_one_tensor_folds_nothing() {
        let graph = Graph::parse(
            "\
x: f16[1, 16, 32] = input \"x\"
w: f16[32, 32] = param \"q.w\" normal(mean=0, std=0.1)
q: f16[1, 16, 32] = matmul x, w  # q
h: f16[1, 2, 16, 16] = split_heads q, heads=2  # q.split
s: f16[1, 2, 16, 16] = matmul h, h, transpose_b  # scores
c: f16[1, 2, 16, 16] = scale s, 0.25  # scale
p: f16[1, 2, 16, 16] = softmax c  # softmax
o: f16[1, 2, 16, 16] = matmul p, h  # pv
output \"o\" = o
",
        )
        .unwrap();
        let (pooled, attn) = recognised(&graph);
        assert!(pooled.is_empty());
        assert_eq!(attn, vec![("scores".to_string(), false, false)]);
    }

    /// A transposed product not followed by a softmax is no attention.
    #[test]
    fn a_transposed_product_alone_is_no_attention() {
        let graph = Graph::parse(
            "\
x: f16[16, 32] = input \"x\"
y: f16[16, 32] = input \"y\"
s: f16[16, 16] = matmul x, y, transpose_b  # s
output \"s\" = s
",
        )
        .unwrap();
        assert_eq!(recognised(&graph), (vec![], vec![]));
    }
}
