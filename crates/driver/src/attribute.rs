//! Attribution of a run's cycles to the plan's operations: each superstep's
//! compute to the operation of the compute steps it ran, its exchange to the
//! operation of the exchange program, the inference's host transfers to the
//! operations that read the input and write the outputs; with each operation's
//! FLOP, its floor on this machine, the encoder interval and its layers.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use tessera_compile::Compiled;
use tessera_graph::{Graph, OpKind};
use tessera_machine::Machine;
use tessera_profile::Profile;

use crate::Run;
use crate::layers::{LayerRow, SummedOp, layer_of, layers_in, sum_over_layers};

/// Cycles charged to one lowered operation.
#[derive(Debug, Clone, Serialize)]
pub struct OpRow {
    pub name: String,
    pub kind: String,
    /// Compute plus exchange cycles charged to it.
    pub cycles: u64,
    pub compute: u64,
    pub exchange: u64,
    pub flop: u64,
    pub peak_share: f64,
    /// A linear's partial sums between chunks of K: the AMP mode whose rate the
    /// f16 peak is (absent for other operations).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partials: Option<&'static str>,
    /// Bytes its exchanges deliver (once per destination tile).
    pub exchange_bytes: u64,
    /// Tiles that run its kernels.
    pub tiles: u32,
    /// Host-transfer cycles of the inference charged to it (its supersteps' host
    /// phases after the weights are streamed): the input to the first operation,
    /// the outputs to the output operations. Not part of `cycles`.
    pub host: u64,
    /// This machine's floor for the operation: the most of its AMP-bound cycles
    /// (its FLOP at the whole chip's f16 peak), exchange-bound cycles (its
    /// exchange bytes over every tile's receive port at once) and host-bound
    /// cycles (its host input or output over the link).
    pub floor_cycles: u64,
    /// Which of the three sets the floor: `amp`, `exchange`, `host` (`none`
    /// when all are 0).
    pub bound: &'static str,
    /// `floor_cycles / (cycles + host)`: how close the operation comes to its floor.
    pub floor_share: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Interval {
    pub cycles: u64,
    pub flop: u64,
    pub peak_share: f64,
    /// From the start of the first operation charged to it (a superstep's
    /// exchange, or its compute, which follows the exchange) to the end of the
    /// sync after the last.
    pub start: u64,
    pub end: u64,
}

/// What a run's cycles went to, operation by operation.
#[derive(Debug, Clone)]
pub struct Attribution {
    /// One row per plan operation, in program order.
    pub ops: Vec<OpRow>,
    /// The encoder layers' operations (`layers.<i>.*`), when the model has them.
    pub encoder: Option<Interval>,
    /// Per encoder layer, in layer order: what `encoder` counts, split by the
    /// layer of the operation each cycle is charged to (they add up to
    /// `encoder.cycles`). Empty without layers.
    pub layers: Vec<LayerRow>,
    /// `ops` summed over the layers (`layers.*.X`), in program order.
    pub summed: Vec<SummedOp>,
    /// Per superstep of the profile, the operation it is charged to (its
    /// compute's, else its exchange's): the trace's and the profile's labels.
    pub labels: Vec<Option<String>>,
    /// What the tiles execute, the rows' sum: the graph's products would also
    /// credit projections a rule absorbed, which no tile runs.
    pub flop: u64,
    /// `flop` over the inference's cycles.
    pub flop_per_cycle: f64,
    /// `flop_per_cycle` over the machine's f16 peak.
    pub peak_share: f64,
}

/// Charges `run`'s cycles (a run of `compiled`, compiled from `graph` for
/// `machine`) to the plan's operations.
pub fn attribute(machine: &Machine, graph: &Graph, compiled: &Compiled, run: &Run) -> Attribution {
    let peak = machine.peak_f16_flop_per_cycle() as f64;
    let (ops, encoder, layers, labels) = op_table(
        machine,
        graph,
        compiled,
        &run.profile,
        peak,
        run.init_cycles,
    );
    let flop: u64 = ops.iter().map(|o| o.flop).sum();
    let flop_per_cycle = flop as f64 / run.run_cycles.max(1) as f64;
    let summed = sum_over_layers(&ops, peak);
    Attribution {
        ops,
        encoder,
        layers,
        summed,
        labels,
        flop,
        flop_per_cycle,
        peak_share: flop_per_cycle / peak,
    }
}

/// Each operation's position in `c.plan_ops`, by name.
fn op_index(c: &Compiled) -> HashMap<&str, usize> {
    c.plan_ops
        .iter()
        .enumerate()
        .map(|(i, o)| (o.name.as_str(), i))
        .collect()
}

/// FLOP of one graph operation (matrix products only: two per multiply-add).
pub fn op_flop(g: &Graph, op: &tessera_graph::Op) -> u64 {
    match &op.kind {
        OpKind::MatMul { a, .. } => {
            2 * g.shape(op.output).numel() as u64 * g.shape(*a).last() as u64
        }
        _ => 0,
    }
}

/// Charges each superstep's compute to the operation of the compute steps it ran
/// and its exchange to the operation of the exchange program, then sums per
/// operation. A superstep ends at a sync before an exchange, so its compute is
/// the plan's compute steps since the previous exchange. Each encoder layer gets
/// every cycle charged to one of its operations and the syncs after the
/// supersteps labelled with one; the encoder interval is the layers together, so
/// that the layers' cycles add up to the encoder's by construction.
fn op_table(
    machine: &Machine,
    g: &Graph,
    c: &Compiled,
    profile: &Profile,
    peak: f64,
    init_cycles: u64,
) -> (
    Vec<OpRow>,
    Option<Interval>,
    Vec<LayerRow>,
    Vec<Option<String>>,
) {
    let index = op_index(c);
    let mut rows: Vec<OpRow> = c
        .plan_ops
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let stats = c.op_stats.get(i).cloned().unwrap_or_default();
            OpRow {
                name: o.name.clone(),
                kind: o.kind.clone(),
                cycles: 0,
                compute: 0,
                exchange: 0,
                flop: 0,
                peak_share: 0.0,
                partials: (o.kind == "linear").then_some(tessera_kernels::AmpMatmul::PARTIALS),
                exchange_bytes: stats.exchange_bytes,
                tiles: stats.tiles,
                host: 0,
                floor_cycles: 0,
                bound: "none",
                floor_share: 0.0,
            }
        })
        .collect();
    for op in g.ops() {
        let owner = index.get(op.name.as_str()).copied().or_else(|| {
            c.plan_ops
                .iter()
                .position(|o| o.fused.iter().any(|f| f == &op.name))
        });
        if let Some(i) = owner
            && c.plan_ops[i].flop.is_none()
        {
            rows[i].flop += op_flop(g, op);
        }
    }
    for (row, o) in rows.iter_mut().zip(&c.plan_ops) {
        if let Some(f) = o.flop {
            row.flop = f;
        }
    }
    let charges = Charges::new(c, &index);
    let op_layer: Vec<Option<u32>> = c
        .plan_ops
        .iter()
        .map(|o| layer_of(&o.name).map(|l| l.0))
        .collect();
    let layer = |i: Option<usize>| i.and_then(|i| op_layer[i]);
    // Every layer of the plan has a row, even one no superstep was charged to.
    let mut layers: BTreeMap<u32, LayerRow> = layers_in(c.plan_ops.iter().map(|o| o.name.as_str()))
        .into_iter()
        .map(|l| {
            let row = LayerRow {
                layer: l,
                cycles: 0,
                flop: 0,
                start: 0,
                end: 0,
            };
            (l, row)
        })
        .collect();
    let mut spans: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    // `cycles` of layer `l`, spent in `from..to`.
    let mut charge = |l: u32, cycles: u64, from: u64, to: u64| {
        if let Some(row) = layers.get_mut(&l) {
            row.cycles += cycles;
        }
        let s = spans.entry(l).or_insert((from, to));
        *s = (s.0.min(from), s.1.max(to));
    };
    let mut seen_exchange = false;
    let mut last_owner: Option<usize> = None;
    let mut reached = 0usize;
    // Per superstep, the operation its compute (else its exchange) is charged to.
    let mut labels = Vec::with_capacity(profile.supersteps.len());
    for (k, ss) in profile.supersteps.iter().enumerate() {
        // A superstep runs an exchange, then compute until the next sync: the
        // plan's compute steps up to the next exchange.
        // Exchanges are counted as the run reaches them: a layer loop runs its
        // body's ids once a layer, and `exchange_steps` lists them as run.
        let nth = reached;
        reached += ss.exchanges.len();
        let (cop, xop) = match ss.exchanges.first() {
            Some(_) => {
                seen_exchange = true;
                charges.of_exchange(nth as u32)
            }
            None if !seen_exchange && ss.compute > 0 => (charges.before_exchanges(), None),
            None => (None, None),
        };
        labels.push(cop.or(xop).map(|i| c.plan_ops[i].name.clone()));
        if let Some(i) = cop {
            rows[i].compute += ss.compute;
        }
        if let Some(i) = xop {
            rows[i].exchange += ss.exchange;
        }
        // A superstep that only moves host bytes belongs to the operation before
        // it (the outputs, after their gathering exchange), or to the first
        // operation when none came before (the inputs, which it reads).
        let owner = cop
            .or(xop)
            .or(last_owner)
            .or((!rows.is_empty()).then_some(0));
        last_owner = owner;
        if ss.start >= init_cycles
            && let Some(i) = owner
        {
            rows[i].host += ss.host;
        }
        // The phases come first in a superstep, its compute after them; the sync
        // after it goes to the operation it is labelled with.
        let compute_start = (ss.start + ss.exchange + ss.host).min(ss.end);
        let next = profile.supersteps.get(k + 1).map_or(ss.end, |n| n.start);
        if let Some(l) = layer(xop) {
            charge(l, ss.exchange, ss.start, ss.start + ss.exchange);
        }
        if let Some(l) = layer(cop) {
            charge(l, ss.compute, compute_start, ss.end);
        }
        if let Some(l) = layer(cop).or(layer(xop)) {
            charge(l, next.saturating_sub(ss.end), ss.end, next);
        }
    }
    // Host I/O: the inputs (sent in f16) to the first operation, which reads
    // them; each output to its output operation.
    let mut host_bytes = vec![0u64; rows.len()];
    if let Some(first) = host_bytes.first_mut() {
        *first += g
            .input_specs()
            .map(|(_, shape, _)| shape.numel() as u64 * 2)
            .sum::<u64>();
    }
    // Outputs bound straight to a tensor's buffers have no operation of their
    // own; their transfer shares the last output operation's host phase.
    let last_output = rows.iter().rposition(|r| r.kind == "output");
    for out in g.outputs() {
        let own = index.get(format!("output.{}", out.name).as_str()).copied();
        if let Some(i) = own.or(last_output) {
            host_bytes[i] += g.shape(out.tensor).numel() as u64 * 2;
        }
    }
    let m = machine;
    // Every tile receiving at once, at the shared-bus rate (a transfer all tiles
    // of a bus group receive arrives at group-size times the port rate).
    let lanes = u64::from(m.tiles)
        * u64::from(m.timing.exchange_bytes_per_cycle.max(1))
        * u64::from(m.timing.tiles_per_shared_exchange_bus.max(1));
    for (r, host) in rows.iter_mut().zip(host_bytes) {
        r.cycles = r.compute + r.exchange;
        r.peak_share = r.flop as f64 / (r.cycles.max(1) as f64 * peak);
        let amp = (r.flop as f64 / peak).ceil() as u64;
        let exchange = r.exchange_bytes.div_ceil(lanes);
        let link = if r.kind == "output" {
            m.chip_to_host_bytes_per_cycle()
        } else {
            m.host_to_chip_bytes_per_cycle()
        };
        let host = (host as f64 / link.max(1e-9)).ceil() as u64;
        (r.floor_cycles, r.bound) = [(amp, "amp"), (exchange, "exchange"), (host, "host")]
            .into_iter()
            .filter(|b| b.0 > 0)
            .max_by_key(|b| b.0)
            .unwrap_or((0, "none"));
        r.floor_share = r.floor_cycles as f64 / (r.cycles + r.host).max(1) as f64;
    }
    for (r, l) in rows.iter().zip(&op_layer) {
        if let Some(row) = l.and_then(|l| layers.get_mut(&l)) {
            row.flop += r.flop;
        }
    }
    for (l, (start, end)) in spans {
        if let Some(row) = layers.get_mut(&l) {
            (row.start, row.end) = (start, end);
        }
    }
    let layers: Vec<LayerRow> = layers.into_values().collect();
    // The encoder is its layers: from the first one's start to the last one's end.
    let enc: u64 = layers.iter().map(|l| l.cycles).sum();
    let enc_flop: u64 = layers.iter().map(|l| l.flop).sum();
    let charged = layers.iter().filter(|l| l.end > l.start);
    let start = charged.clone().map(|l| l.start).min().unwrap_or(0);
    let end = charged.map(|l| l.end).max().unwrap_or(0);
    let encoder = (enc > 0).then(|| Interval {
        cycles: enc,
        flop: enc_flop,
        peak_share: enc_flop as f64 / (enc as f64 * peak),
        start,
        end,
    });
    (rows, encoder, layers, labels)
}

/// Which plan operations a superstep's compute and exchange are charged to.
struct Charges<'a> {
    c: &'a Compiled,
    index: &'a HashMap<&'a str, usize>,
    last_step: u32,
}

impl<'a> Charges<'a> {
    fn new(c: &'a Compiled, index: &'a HashMap<&'a str, usize>) -> Charges<'a> {
        Charges {
            c,
            index,
            last_step: c.step_ops.len() as u32,
        }
    }

    /// The operation of the first compute step in `from..to`.
    fn compute_op(&self, from: u32, to: u32) -> Option<usize> {
        (from..to)
            .filter_map(|s| self.c.step_ops.get(s as usize))
            .find(|n| !n.is_empty())
            .and_then(|n| self.index.get(n.as_str()).copied())
    }

    /// (compute, exchange) of a superstep that runs the `id`-th exchange the run
    /// reaches (a layer loop's body runs its exchanges once a layer, and
    /// `exchange_steps` lists them as run): its compute is the steps up to the
    /// next exchange.
    fn of_exchange(&self, id: u32) -> (Option<usize>, Option<usize>) {
        let c = self.c;
        let step = |i: usize| c.exchange_steps.get(i).copied().unwrap_or(self.last_step);
        let (xs, next) = (step(id as usize), step(id as usize + 1));
        let xop = c
            .step_ops
            .get(xs as usize)
            .and_then(|n| self.index.get(n.as_str()).copied());
        (self.compute_op(xs + 1, next), xop)
    }

    /// The compute of a superstep before the first exchange.
    fn before_exchanges(&self) -> Option<usize> {
        let first = self.c.exchange_steps.first().copied();
        self.compute_op(1, first.unwrap_or(self.last_step))
    }
}

/// The encoder layer each superstep of a run of `c` will be in, predicted from
/// the program's shape before it runs, for progress: every host phase (weights
/// and inputs first, outputs last) and every exchange begins with a sync, so
/// superstep `n` (counting from 0) follows the `n`-th of those. A superstep's
/// layer is that of the operation [`attribute`] charges it to.
pub fn superstep_layers(c: &Compiled) -> Vec<Option<u32>> {
    let index = op_index(c);
    let charges = Charges::new(c, &index);
    let h = &c.report.host;
    let layer = |i: Option<usize>| i.and_then(|i| layer_of(&c.plan_ops[i].name).map(|l| l.0));
    let before = layer(charges.before_exchanges());
    let mut out = vec![before; 1 + h.weight_phases + h.input_phases];
    out.extend((0..c.exchange_steps.len() as u32).map(|id| {
        let (cop, xop) = charges.of_exchange(id);
        layer(cop.or(xop))
    }));
    out.extend(std::iter::repeat_n(None, h.output_phases));
    out
}
