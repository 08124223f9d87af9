//! The timing model's sensitivity: a model's cycles with each assumption of the
//! machine's timing (a figure that is ours rather than public, or public and held
//! with little confidence: docs/machine.md) halved and doubled, everything else as
//! is; then the model at the two ends of the shared-bus exchange rule, and with
//! exchange code and bytes fully overlapped.

use std::collections::BTreeMap;

use serde::Serialize;
use tessera_machine::{Machine, Timing};
use tessera_sim::Status;

use crate::simulate::simulate_plain;
use crate::{Error, Model, ModelSpec, NoProgress, Options, compile};

/// A timing figure of the machine model that is ours rather than a public figure
/// (or a public figure we hold with little confidence): docs/machine.md says why.
pub struct Assumption {
    pub field: &'static str,
    pub get: fn(&mut Timing) -> &mut u32,
}

/// One [`Assumption`] per named `Timing` field.
macro_rules! assumptions {
    ($($field:ident),* $(,)?) => {
        &[$(Assumption {
            field: stringify!($field),
            get: |t| &mut t.$field,
        }),*]
    };
}

pub const ASSUMPTIONS: &[Assumption] = assumptions!(
    supervisor_result_latency,
    f32_transcendental_issues,
    f32_tanh_issues,
    f16_exp_issues,
    host_transfer_overhead_cycles,
    sync_cycles,
    exchange_overhead_cycles,
    exchange_bytes_per_cycle,
    tiles_per_shared_exchange_bus,
);

/// Assumptions about a rule rather than a figure, measured only at the bounds
/// below: halving or doubling a percentage that is 0 moves nothing.
pub const RULE_ASSUMPTIONS: &[Assumption] = assumptions!(exchange_code_overlap_percent);

/// The two ends of the shared-bus rule (two tiles of a bus pair receiving the same
/// data both get it at twice the port rate): poplibs' estimators state it, no
/// measurement we have confirms it, so the model's answer is reported at both
/// readings of it. Field, value, and the reading it stands for.
pub const EXCHANGE_RULE_BOUNDS: &[(&str, u32, &str)] = &[
    (
        "tiles_per_shared_exchange_bus",
        1,
        "the rule off: data both tiles of a pair receive comes no faster than other data",
    ),
    (
        "exchange_bytes_per_cycle",
        2,
        "the rule kept, the port at half the 4 B/cycle poplibs charges: a pair receiving \
         the same data gets 4 B/cycle each, a tile alone 2",
    ),
];

/// The other end of the exchange code's overlap with its bytes (docs/machine.md,
/// "Exchange code"): the machine charges their sum, an upper bound; fully
/// overlapped, a tile's part of a phase takes the longer of the two.
pub const EXCHANGE_CODE_BOUNDS: &[(&str, u32, &str)] = &[(
    "exchange_code_overlap_percent",
    100,
    "exchange code and bytes fully overlapped: each tile takes the longer of the two, \
     not their sum",
)];

/// The model on a machine with one assumption changed.
#[derive(Debug, Serialize, Clone)]
pub struct Variant {
    pub value: u32,
    /// Cycles of one inference; `None` when the machine refuses the value.
    pub cycles: Option<u64>,
    /// Relative to the baseline.
    pub change: Option<f64>,
    /// Why the machine refused the value.
    pub note: Option<String>,
}

/// One assumption, halved and doubled.
#[derive(Debug, Serialize)]
pub struct SensitivityRow {
    pub field: &'static str,
    pub value: u32,
    pub halved: Variant,
    pub doubled: Variant,
}

/// The model at one end of an exchange rule ([`EXCHANGE_RULE_BOUNDS`],
/// [`EXCHANGE_CODE_BOUNDS`]).
#[derive(Debug, Serialize)]
pub struct BoundRow {
    pub field: &'static str,
    pub reading: &'static str,
    #[serde(flatten)]
    pub variant: Variant,
}

/// The whole sweep.
#[derive(Debug)]
pub struct Sensitivity {
    /// Cycles of one inference on the machine as described.
    pub baseline_cycles: u64,
    /// One per [`ASSUMPTIONS`] entry, in its order.
    pub rows: Vec<SensitivityRow>,
    /// One per [`EXCHANGE_RULE_BOUNDS`] entry, in its order.
    pub exchange_rule_bounds: Vec<BoundRow>,
    /// One per [`EXCHANGE_CODE_BOUNDS`] entry, in its order.
    pub exchange_code_bounds: Vec<BoundRow>,
}

/// Cycles of one inference of `spec` on `machine`, compiled for it with the
/// rules' defaults (no finalist search), so that only the machine moves.
fn inference_cycles(spec: &ModelSpec, machine: &Machine) -> Result<u64, Error> {
    let model = Model::build(spec, machine)?;
    let opts = Options {
        finalists: 1,
        ..Options::default()
    };
    let c = compile(machine, &model, &opts, &NoProgress)?;
    let run = simulate_plain(&model, &c, &NoProgress)?;
    if run.report.status != Status::Ok {
        return Err(Error::Faulted(run.report.faults.len()));
    }
    Ok(run.run_cycles)
}

/// Measures `spec` on `base` and on each variant of it: every assumption of
/// [`ASSUMPTIONS`] halved and doubled, then [`EXCHANGE_RULE_BOUNDS`] and
/// [`EXCHANGE_CODE_BOUNDS`]. Each
/// distinct machine is compiled and simulated once; `step(k, total, what)` is
/// called before each measurement.
pub fn sensitivity(
    base: &Machine,
    spec: &ModelSpec,
    step: &dyn Fn(usize, usize, &str),
) -> Result<Sensitivity, Error> {
    let value_of = |asm: &Assumption| *(asm.get)(&mut base.timing.clone());
    // Every (field, value) measured, in order, each once: a bound that is also a
    // halved or doubled value is not compiled twice.
    let mut wanted: Vec<(&Assumption, u32)> = Vec::new();
    for asm in ASSUMPTIONS {
        let value = value_of(asm);
        for v in [value / 2, value.saturating_mul(2)] {
            wanted.push((asm, v));
        }
    }
    for &(field, v, _) in EXCHANGE_RULE_BOUNDS.iter().chain(EXCHANGE_CODE_BOUNDS) {
        if let Some(asm) = ASSUMPTIONS
            .iter()
            .chain(RULE_ASSUMPTIONS)
            .find(|asm| asm.field == field)
        {
            wanted.push((asm, v));
        }
    }
    let mut distinct: Vec<(&str, u32)> = wanted.iter().map(|(asm, v)| (asm.field, *v)).collect();
    distinct.sort();
    distinct.dedup();
    let total = 1 + distinct.len();
    step(1, total, "baseline");
    let baseline = inference_cycles(spec, base)?;
    let mut measured: BTreeMap<(&str, u32), Variant> = BTreeMap::new();
    for &(asm, v) in &wanted {
        if measured.contains_key(&(asm.field, v)) {
            continue;
        }
        step(measured.len() + 2, total, &format!("{} = {v}", asm.field));
        let mut m = base.clone();
        *(asm.get)(&mut m.timing) = v;
        let variant = match m.validate() {
            Err(e) => Variant {
                value: v,
                cycles: None,
                change: None,
                note: Some(e.to_string()),
            },
            Ok(()) => {
                let c = inference_cycles(spec, &m)?;
                Variant {
                    value: v,
                    cycles: Some(c),
                    change: Some(c as f64 / baseline as f64 - 1.0),
                    note: None,
                }
            }
        };
        measured.insert((asm.field, v), variant);
    }
    // Every (field, value) asked for below was measured above.
    let get = |field: &'static str, value: u32| {
        measured
            .get(&(field, value))
            .cloned()
            .unwrap_or_else(|| Variant {
                value,
                cycles: None,
                change: None,
                note: Some("not measured".to_string()),
            })
    };
    let rows = ASSUMPTIONS
        .iter()
        .map(|asm| {
            let value = value_of(asm);
            SensitivityRow {
                field: asm.field,
                value,
                halved: get(asm.field, value / 2),
                doubled: get(asm.field, value.saturating_mul(2)),
            }
        })
        .collect();
    let bounds = |table: &[(&'static str, u32, &'static str)]| {
        table
            .iter()
            .map(|&(field, v, reading)| BoundRow {
                field,
                reading,
                variant: get(field, v),
            })
            .collect()
    };
    Ok(Sensitivity {
        baseline_cycles: baseline,
        rows,
        exchange_rule_bounds: bounds(EXCHANGE_RULE_BOUNDS),
        exchange_code_bounds: bounds(EXCHANGE_CODE_BOUNDS),
    })
}
