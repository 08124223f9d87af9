//! Running a compiled model on the simulator: the weights streamed once, then one
//! inference on the model's input, with the tile memory validation reads copied
//! out where each operation ends.

use std::sync::Arc;
use std::time::Instant;

use half::f16;
use tessera_compile::Compiled;
use tessera_profile::Profile;
use tessera_sim::{
    Capture, CaptureHook, Perturb, SimOptions, SimReport, Simulator, Status, SuperstepHook,
};

use crate::progress::forwarded;
use crate::validate::{Captured, Perturbed, Requests, Streamed, requests, stream};
use crate::{Error, Model, Progress, Step};

/// What to record besides the run.
#[derive(Debug, Clone, PartialEq)]
pub struct SimulateOptions {
    /// Copy out every tensor an operation leaves on the tiles where the
    /// operation ends, for [`crate::validate`]'s per-operation checks.
    pub probes: bool,
    /// Test hook: scale one tile's part of this plan operation's output by
    /// [`SimulateOptions::PERTURB_FACTOR`] in tile memory where the operation
    /// ends; validation must then report a mismatch at that operation.
    pub perturb: Option<String>,
}

impl SimulateOptions {
    /// What a perturbation multiplies by: a 1% error, which validation must catch.
    pub const PERTURB_FACTOR: f32 = 1.01;
}

impl Default for SimulateOptions {
    fn default() -> Self {
        SimulateOptions {
            probes: true,
            perturb: None,
        }
    }
}

/// The simulator's cycle budget for `c`: four times what its plan estimates
/// and its host phases take (a whole So400m tower at batch 4 streams its
/// weights for 20.6 M cycles and runs for 30 M, beyond the simulator's default
/// budget), and never below that default. A runaway loop still times out.
fn cycle_budget(c: &Compiled) -> u64 {
    let expected = c.report.estimated.cycles + c.report.host.link_cycles;
    tessera_sim::DEFAULT_CYCLE_BUDGET.max(expected.saturating_mul(4))
}

/// Captures copied out and not yet taken by the checks, at most: a few
/// operations' parts at So400m sizes.
const CAPTURES_IN_FLIGHT: usize = 1024;

/// A simulated run of a compiled model, split into weight streaming and one
/// inference.
pub struct Run {
    pub report: SimReport,
    pub profile: Profile,
    /// Cycles streaming the weights, once, before the inference.
    pub init_cycles: u64,
    /// One inference: from the end of weight streaming to the end of the run.
    pub run_cycles: u64,
    /// Host transfers of the inference (inputs and outputs).
    pub host_cycles: u64,
    pub simulate_ms: f64,
    /// Of `simulate_ms`, the part outside the simulator's parallel per-tile work
    /// (matching and timing exchanges, host transfers, syncs, the report).
    pub simulate_serial_ms: f64,
    pub(crate) sim: Simulator,
    /// What was copied out for validation, when asked for.
    pub(crate) requests: Option<Requests>,
    /// With probes, the f16-storage references and each result's check, made
    /// beside the simulation from the captures as they were copied out.
    pub(crate) streamed: Option<Streamed>,
    /// Of those checks, the time they took after the simulation ended, which
    /// validation's `reference_ms` counts.
    pub(crate) checks_after_ms: f64,
}

impl Run {
    /// Whether the run completed.
    pub fn status(&self) -> Status {
        self.report.status
    }

    /// Output `name` as the host received it, when the run produced it.
    pub fn output(&self, name: &str) -> Option<Vec<f32>> {
        self.sim.binding(name).map(f16_values)
    }

    /// The perturbation the run applied (the test hook), if any.
    pub fn perturbed(&self) -> Option<&Perturbed> {
        self.requests.as_ref().and_then(|r| r.perturbed.as_ref())
    }
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| f16::from_f32(*x).to_le_bytes())
        .collect()
}

fn f16_values(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(2)
        .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect()
}

/// Simulates `compiled` on `model`'s input.
pub fn simulate(
    model: &Model,
    compiled: &Compiled,
    opts: &SimulateOptions,
    progress: &dyn Progress,
) -> Result<Run, Error> {
    let req = if opts.probes || opts.perturb.is_some() {
        Some(requests(
            compiled,
            opts.perturb.as_deref(),
            SimulateOptions::PERTURB_FACTOR,
        )?)
    } else {
        None
    };
    let perturb = req.as_ref().map_or_else(Vec::new, |r| r.perturb.clone());
    let Some(req) = req.filter(|_| opts.probes) else {
        return simulate_with(model, compiled, Vec::new(), perturb, None, progress);
    };
    // The checks run beside the simulation, each capture checked and dropped as
    // the run copies it out: a whole So400m tower's captures at batch 4 do not
    // fit in memory together. The channel is bounded: where the checks fall
    // behind (they share the threads with the simulation's per-tile work), the
    // run waits for them rather than queueing its captures.
    let (tx, rx) = std::sync::mpsc::sync_channel::<(usize, Vec<u8>)>(CAPTURES_IN_FLIGHT);
    let hook = CaptureHook(Arc::new(move |k, bytes| {
        // A checker that stopped (on an error it reports) takes no more.
        let _ = tx.send((k, bytes));
    }));
    let (run, streamed) = std::thread::scope(|s| {
        let checker = s.spawn(|| {
            let mut captured = Captured::new(rx);
            let probes = Some((&req, &mut captured));
            stream(&model.graph, compiled, model, probes, &|_| {})
        });
        // The hook, and with it the sender, goes with the run's options, so the
        // checker learns the run has ended however it ends.
        let run = simulate_with(
            model,
            compiled,
            req.captures.clone(),
            perturb,
            Some(hook),
            progress,
        );
        let waited = Instant::now();
        let streamed = checker
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (run, (streamed, waited.elapsed().as_secs_f64() * 1e3))
    });
    let mut run = run?;
    run.streamed = Some(streamed.0?);
    run.checks_after_ms = streamed.1;
    run.requests = Some(req);
    Ok(run)
}

/// A run without probes: what the finalist search compares.
pub(crate) fn simulate_plain(
    model: &Model,
    compiled: &Compiled,
    progress: &dyn Progress,
) -> Result<Run, Error> {
    simulate_with(model, compiled, Vec::new(), Vec::new(), None, progress)
}

fn simulate_with(
    model: &Model,
    c: &Compiled,
    captures: Vec<Capture>,
    perturb: Vec<Perturb>,
    on_capture: Option<CaptureHook>,
    progress: &dyn Progress,
) -> Result<Run, Error> {
    progress.start(Step::Simulate, None);
    let t = Instant::now();
    let mut sim = Simulator::new(&c.package).map_err(Error::Load)?;
    let x = model
        .inputs
        .iter()
        .next()
        .map(|(_, t)| t.data())
        .ok_or(Error::NoInput)?;
    let input_name = model
        .graph
        .input_specs()
        .next()
        .map(|s| s.0.to_string())
        .ok_or(Error::NoInput)?;
    sim.set_binding(&input_name, &f16_bytes(x))?;
    // Which layer superstep `n` is in, known before the run from the program's
    // shape; a model with fewer than two layers has nothing to say.
    let layer_at = crate::superstep_layers(c);
    let layers = crate::layers_in(c.plan_ops.iter().map(|o| o.name.as_str())).len() as u32;
    let shown = std::cell::Cell::new(None);
    let report = forwarded(
        move |n: u32| {
            let l = layer_at.get(n as usize).copied().flatten();
            if layers > 1 && shown.get() != Some(l) {
                shown.set(Some(l));
                progress.layer(l, layers);
            }
            progress.detail(&format!("superstep {n}"))
        },
        |tx| {
            // The options own the sender, so that it goes with them however the
            // run ends, and the forwarding thread with it.
            let opts = SimOptions {
                cycle_budget: cycle_budget(c),
                preload_bindings: false,
                trace: true,
                captures,
                perturb,
                on_capture,
                on_superstep: Some(SuperstepHook(Arc::new(move |n| {
                    let _ = tx.send(n);
                }))),
            };
            sim.run(&opts)
        },
    );
    // The first host phases stream the weights once; what follows is one inference.
    let profile = tessera_profile::profile(&report.trace);
    let weight_phases = c.report.host.weight_phases;
    let init_cycles = weight_phases
        .checked_sub(1)
        .and_then(|last| profile.host_phases.get(last))
        .map_or(0, |p| p.1);
    let run_cycles = report.cycles.saturating_sub(init_cycles);
    let host_cycles: u64 = profile
        .host_phases
        .iter()
        .skip(weight_phases)
        .map(|(s, e)| e - s)
        .sum();
    let simulate_ms = t.elapsed().as_secs_f64() * 1e3;
    progress.finish();
    Ok(Run {
        report,
        profile,
        init_cycles,
        run_cycles,
        host_cycles,
        simulate_ms,
        simulate_serial_ms: (simulate_ms - sim.parallel_ms()).max(0.0),
        sim,
        requests: None,
        streamed: None,
        checks_after_ms: 0.0,
    })
}
