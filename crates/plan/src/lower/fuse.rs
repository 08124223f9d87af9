//! The canonicalisation pass: before the walk, the graph's fused operations are
//! recognised from its structure alone (who reads what), never from the order in
//! which a builder or an importer emitted the operations. Each recognition is a
//! small function over [`Uses`] with its own tests; [`fuse`] runs them and returns
//! the fused operations the walker lowers, one rule each:
//! - an attention with a constant query, its projections absorbed
//!   ([`pooling::Absorbed`], recognised by `Uses::absorbable`);
//! - an attention: its scores product `q k^T`, the scale, the softmax and the
//!   product by the values ([`FusedAttention`]), with the query projection that
//!   may carry the scale and the projections that may store their heads packed.
//!
//! Its invariant: what it records is a fact about the graph (and, for packing,
//! the machine's attention geometry), so the walker decides nothing from what it
//! has already lowered when it picks a rule for an attention.

use tessera_graph::{Graph, Op, OpId, OpKind, TensorId, TensorMap};
use tessera_machine::Machine;

use super::{LowerOptions, attention, pooling, unsupported};
use crate::PlanError;

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

/// The fused operations of one graph.
pub(super) struct Fusion<'g> {
    pub pooled: Vec<pooling::Absorbed<'g>>,
    pub attentions: Vec<FusedAttention<'g>>,
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

    /// Operations lowered inside another fused operation's rule, never on their
    /// own: the absorbed attentions' projections and splits.
    pub fn folded(&self) -> impl Iterator<Item = &'g Op> + '_ {
        self.pooled.iter().flat_map(|ab| ab.folded())
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
    Fusion { pooled, attentions }
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
