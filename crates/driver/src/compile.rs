//! Compiling a model: one lowering with the rules' defaults, or the finalist
//! search (several whole-model plans built, the best estimated feasible one
//! selected, optionally re-selected by simulating the best few).

use std::sync::Arc;
use tessera_compile::finalists::{FinalistReport, Selection};

use tessera_compile::{CompileOptions, Compiled, Stage, StageHook, compile_model};
use tessera_machine::Machine;
use tessera_plan::Experimental;
use tessera_sim::Status;

use crate::progress::forwarded;
use crate::simulate::simulate_plain;
use crate::{Error, Model, Progress, Step};

/// The most finalists a compile builds: each is a whole compile, so a larger
/// count runs for hours without a word.
pub const MAX_FINALISTS: usize = 64;

/// How to compile.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Whole-model plans to build completely before selecting one (1: the rules'
    /// defaults, no search); at most [`MAX_FINALISTS`].
    pub finalists: usize,
    /// Simulate this many of the best-estimated feasible finalists and select
    /// the fewest simulated cycles among them (with `finalists` above 1).
    pub simulate_finalists: usize,
    /// Usable SRAM bytes per tile from the first SRAM address, for placement (at
    /// most the machine's).
    pub capacity: Option<u64>,
    /// Keep every tile's placement in the result, for the HTML profile's SRAM
    /// viewer (costs memory on a whole chip).
    pub keep_layouts: bool,
    /// One copy of every weight resident, staged into each operation's layout
    /// while it runs (`LowerOptions::stage_weights`), instead of every replica
    /// resident.
    pub stage_weights: bool,
    /// Lower a model's identical layers once and run them in a loop
    /// (`LowerOptions::loop_layers`; stages the weights). On by default.
    pub loop_layers: bool,
    /// How linears' weights are stored (`LowerOptions::weight_dtype`).
    pub weight_dtype: tessera_plan::WeightDtype,
    /// Let the planner keep a layer loop's FP8 weights resident in their
    /// layout where the whole model's memory allows (`LowerOptions::reside`);
    /// off, every weight is staged each iteration. On by default.
    pub resident_weights: bool,
    /// Knobs for tests and demonstrations (a kernel mutation among them); all
    /// off by default.
    pub experimental: Experimental,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            finalists: 8,
            simulate_finalists: 0,
            capacity: None,
            keep_layouts: false,
            stage_weights: false,
            loop_layers: true,
            weight_dtype: tessera_plan::WeightDtype::F16,
            resident_weights: true,
            experimental: Experimental::default(),
        }
    }
}

impl Options {
    /// Refuses options `machine` cannot honour (a capacity beyond its SRAM):
    /// [`compile`] does too, but a caller can ask before building the model.
    pub fn check(&self, machine: &Machine) -> Result<(), Error> {
        self.compile_options(machine).map(|_| ())
    }

    /// The compiler's options these stand for, checked against `machine`.
    fn compile_options(&self, machine: &Machine) -> Result<CompileOptions, Error> {
        let mut opts = CompileOptions::default();
        opts.place.capacity = self.capacity;
        opts.place.check_capacity(machine)?;
        opts.lower.experimental = self.experimental.clone();
        opts.lower.stage_weights = self.stage_weights;
        opts.lower.loop_layers = self.loop_layers;
        opts.lower.weight_dtype = self.weight_dtype;
        opts.lower.reside = self.resident_weights;
        opts.keep_layouts = self.keep_layouts;
        Ok(opts)
    }
}

/// Compiles `model` for `machine`. With `opts.finalists` above 1, builds that
/// many whole-model plans and selects the best estimated feasible one (or, with
/// `simulate_finalists`, the fewest simulated cycles among the best few); the
/// result's report lists every finalist. A model that fits no way is
/// [`Error::does_not_fit`].
pub fn compile(
    machine: &Machine,
    model: &Model,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<Compiled, Error> {
    let copts = opts.compile_options(machine)?;
    if opts.finalists <= 1 {
        progress.start(Step::Compile, None);
        let r = forwarded(
            |stage: Stage| progress.detail(&stage.to_string()),
            |tx| {
                let copts = CompileOptions {
                    on_stage: Some(StageHook(Arc::new(move |stage| {
                        let _ = tx.send(stage);
                    }))),
                    ..copts
                };
                compile_model(machine, &model.graph, &model.weights, &copts)
            },
        );
        progress.finish();
        return Ok(r?);
    }
    progress.start(Step::Finalists, Some(opts.finalists as u64));
    let r = tessera_compile::finalists::select(
        machine,
        &model.graph,
        &model.weights,
        &copts,
        opts.finalists,
        opts.simulate_finalists,
        &|done, total| progress.advance(done as u64, Some(total as u64)),
    );
    progress.finish();
    let mut sel = r?;
    simulate_finalists(model, &mut sel, opts.simulate_finalists, progress)?;
    let i = sel.selected;
    let mut c = sel.take(i);
    // Finalists are built for their shape; the selected one gets every layer's
    // weights.
    if c.layer_weights_pending.is_some() {
        // The later layers, told one by one as the threads make them.
        let later = c.report.loop_count.unwrap_or(1).saturating_sub(1);
        progress.start(Step::LayerWeights, Some(u64::from(later)));
        let made = std::sync::atomic::AtomicU64::new(0);
        let on_layer = || {
            let n = made.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            progress.advance(n, Some(u64::from(later)));
        };
        let r = tessera_compile::complete_layer_weights(
            machine,
            &model.graph,
            &model.weights,
            &mut c,
            &on_layer,
        );
        progress.finish();
        r?;
    }
    Ok(c)
}

/// Simulates the `n` best-estimated feasible finalists, records each one's
/// simulated cycles (tile work, as the estimate counts them) and selects the
/// fewest among those that ran without a fault.
fn simulate_finalists(
    model: &Model,
    sel: &mut Selection,
    n: usize,
    progress: &dyn Progress,
) -> Result<(), Error> {
    let order: Vec<usize> = sel.feasible_by_estimate().into_iter().take(n).collect();
    let mut best: Option<(u64, usize)> = None;
    for (j, &i) in order.iter().enumerate() {
        let Some(c) = sel.built[i].as_ref() else {
            continue;
        };
        let s = simulate_plain(model, c, progress)?;
        let cycles = s.run_cycles.saturating_sub(s.host_cycles);
        let f = &mut sel.finalists[i];
        f.simulated_cycles = Some(cycles);
        f.simulate_ms = Some(s.simulate_ms);
        progress.finalist_simulated(j + 1, order.len(), f.rank, cycles);
        if s.report.status == Status::Ok && best.is_none_or(|(b, _)| cycles < b) {
            best = Some((cycles, i));
        }
    }
    if let Some((_, i)) = best {
        sel.selected = i;
    }
    Ok(())
}

/// Median over the simulated finalists of |estimated - simulated| / simulated:
/// how well the plan estimate ranks plans.
pub fn median_estimate_error(finalists: &[FinalistReport]) -> Option<f64> {
    let mut errors: Vec<f64> = finalists
        .iter()
        .filter_map(|f| match (f.estimated_cycles, f.simulated_cycles) {
            (Some(e), Some(s)) if s > 0 => Some((e as f64 - s as f64).abs() / s as f64),
            _ => None,
        })
        .collect();
    errors.sort_by(f64::total_cmp);
    (!errors.is_empty()).then(|| {
        let n = errors.len();
        if n % 2 == 1 {
            errors[n / 2]
        } else {
            (errors[n / 2 - 1] + errors[n / 2]) / 2.0
        }
    })
}
