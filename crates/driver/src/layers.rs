//! The encoder's layers as reports show them. The graph names every operation of
//! encoder layer `i` `layers.<i>.<op>`, and that prefix is the only thing that
//! says which layer an operation is in: [`layer_of`] reads it, and the JSON
//! report, the text tables, the HTML profile, the Chrome trace and the progress
//! all group by it, so that they cannot disagree on what a layer is.

use serde::Serialize;

use crate::OpRow;

/// The encoder layer of operation `name` and the operation's name within the
/// layer: `Some((2, "mlp.fc1"))` for `layers.2.mlp.fc1`. `None` for an
/// operation outside the layers (the patch embedding, the post-LayerNorm, the
/// head), and for a name that only looks like one: an index that is not a plain
/// decimal (`layers.x.fc1`, `layers.01.fc1`, which would otherwise be two
/// spellings of one layer) or nothing after it.
pub fn layer_of(name: &str) -> Option<(u32, &str)> {
    let (index, op) = name.strip_prefix("layers.")?.split_once('.')?;
    let plain = !index.is_empty()
        && index.bytes().all(|b| b.is_ascii_digit())
        && (index == "0" || !index.starts_with('0'));
    if !plain || op.is_empty() {
        return None;
    }
    Some((index.parse().ok()?, op))
}

/// The layers operations `names` belong to, in ascending order, each once.
pub fn layers_in<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<u32> {
    let mut layers: Vec<u32> = names
        .into_iter()
        .filter_map(|n| layer_of(n).map(|l| l.0))
        .collect();
    layers.sort_unstable();
    layers.dedup();
    layers
}

/// One encoder layer of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerRow {
    /// `i` of `layers.<i>.`.
    pub layer: u32,
    /// The cycles charged to the layer's operations, counted as the encoder
    /// interval counts them: the compute of every superstep whose compute is
    /// charged to one of them, the exchange of every superstep whose exchange
    /// is, and the sync after every superstep labelled with one of them. Every
    /// cycle of the encoder interval's count is in exactly one layer, so the
    /// layers add up to `encoder.cycles`.
    pub cycles: u64,
    /// The layer's FLOP (the sum of its operations').
    pub flop: u64,
    /// From the start of the first superstep charged to the layer to the end of
    /// the sync after its last (`start == end` when none was).
    pub start: u64,
    pub end: u64,
}

/// One row of the operation table summed over the layers: the operations
/// `layers.<i>.X` of every layer as the one row `layers.*.X`.
#[derive(Debug, Clone, Serialize)]
pub struct SummedOp {
    /// The operations' sums, named `layers.*.X` (an operation outside the layers
    /// keeps its own row and name). `peak_share` and `floor_share` are those of
    /// the sums; `bound` is the operations' common bound, `mixed` when they differ.
    pub row: OpRow,
    /// How many operations the row sums (1 outside the layers).
    pub count: usize,
}

/// `ops` summed over the layers, each row where its first operation is:
/// a model with one layer keeps its rows, renamed `layers.*.X`.
pub fn sum_over_layers(ops: &[OpRow], peak_flop_per_cycle: f64) -> Vec<SummedOp> {
    let mut out: Vec<SummedOp> = Vec::new();
    let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for o in ops {
        let Some((_, op)) = layer_of(&o.name) else {
            out.push(SummedOp {
                row: o.clone(),
                count: 1,
            });
            continue;
        };
        let name = format!("layers.*.{op}");
        match at.get(&name) {
            Some(&i) => {
                let s = &mut out[i];
                let r = &mut s.row;
                r.cycles += o.cycles;
                r.compute += o.compute;
                r.exchange += o.exchange;
                r.flop += o.flop;
                r.exchange_bytes += o.exchange_bytes;
                r.tiles = r.tiles.max(o.tiles);
                r.host += o.host;
                r.floor_cycles += o.floor_cycles;
                if r.bound != o.bound {
                    r.bound = "mixed";
                }
                if r.kind != o.kind {
                    r.kind = "mixed".to_string();
                }
                s.count += 1;
            }
            None => {
                at.insert(name.clone(), out.len());
                out.push(SummedOp {
                    row: OpRow { name, ..o.clone() },
                    count: 1,
                });
            }
        }
    }
    for s in out.iter_mut().filter(|s| s.count > 1) {
        let r = &mut s.row;
        r.peak_share = r.flop as f64 / (r.cycles.max(1) as f64 * peak_flop_per_cycle);
        r.floor_share = r.floor_cycles as f64 / (r.cycles + r.host).max(1) as f64;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layer_prefix_is_read_and_nothing_else() {
        assert_eq!(layer_of("layers.0.attn.qkv"), Some((0, "attn.qkv")));
        assert_eq!(layer_of("layers.26.mlp.fc2"), Some((26, "mlp.fc2")));
        assert_eq!(layer_of("layers.10.ln1"), Some((10, "ln1")));
        for not in [
            "patch_embed",
            "post_ln",
            "head.attn",
            "output.pooled",
            "layers",
            "layers.",
            "layers.3",
            "layers.3.",
            "layers..fc1",
            "layers.x.fc1",
            "layers.-1.fc1",
            "layers.01.fc1",
            "layers.1x.fc1",
            "layers.99999999999.fc1",
            "xlayers.0.fc1",
        ] {
            assert_eq!(layer_of(not), None, "{not}");
        }
    }

    #[test]
    fn layers_are_listed_in_numeric_order_once() {
        let names = [
            "patch_embed",
            "layers.10.fc1",
            "layers.2.fc1",
            "layers.2.fc2",
            "layers.0.ln1",
            "head.attn",
        ];
        assert_eq!(layers_in(names), vec![0, 2, 10]);
        assert_eq!(layers_in(["mlp.fc1", "output.y"]), Vec::<u32>::new());
    }

    fn row(name: &str, cycles: u64, flop: u64, bound: &'static str) -> OpRow {
        OpRow {
            name: name.to_string(),
            kind: "linear".to_string(),
            cycles,
            compute: cycles - 1,
            exchange: 1,
            flop,
            peak_share: 0.0,
            partials: None,
            exchange_bytes: 10,
            tiles: cycles as u32,
            host: 0,
            floor_cycles: cycles / 2,
            bound,
            floor_share: 0.5,
        }
    }

    #[test]
    fn layer_operations_are_summed_where_the_first_one_is() {
        let ops = [
            row("patch_embed", 10, 100, "amp"),
            row("layers.0.fc1", 20, 200, "amp"),
            row("layers.0.fc2", 30, 300, "amp"),
            row("layers.1.fc1", 40, 400, "exchange"),
            row("layers.1.fc2", 50, 500, "amp"),
            row("head.attn", 60, 600, "amp"),
        ];
        let s = sum_over_layers(&ops, 2.0);
        let names: Vec<(&str, usize)> = s.iter().map(|s| (s.row.name.as_str(), s.count)).collect();
        assert_eq!(
            names,
            [
                ("patch_embed", 1),
                ("layers.*.fc1", 2),
                ("layers.*.fc2", 2),
                ("head.attn", 1)
            ]
        );
        let fc1 = &s[1].row;
        assert_eq!(
            (fc1.cycles, fc1.compute, fc1.exchange, fc1.flop),
            (60, 58, 2, 600)
        );
        assert_eq!(
            (fc1.exchange_bytes, fc1.tiles, fc1.floor_cycles),
            (20, 40, 30)
        );
        assert_eq!(fc1.bound, "mixed");
        assert_eq!(s[2].row.bound, "amp");
        assert!((fc1.peak_share - 600.0 / (60.0 * 2.0)).abs() < 1e-12);
        assert!((fc1.floor_share - 0.5).abs() < 1e-12);
        // Nothing is lost or counted twice.
        let total: u64 = s.iter().map(|s| s.row.cycles).sum();
        assert_eq!(total, ops.iter().map(|o| o.cycles).sum::<u64>());
        // Outside the layers, rows are passed through untouched.
        assert_eq!(s[0].row.name, "patch_embed");
        assert_eq!(s[3].row.cycles, 60);
    }
}
