//! The fit loop's growth phase: a linear takes a strategy beyond the activation
//! budget (`transient_bytes`) when the plan still fits and the whole plan's
//! estimate falls.

use tessera_graph::{Graph, MlpConfig, TensorMap, init_weights, mlp};
use tessera_machine::Machine;
use tessera_plan::{
    LowerOptions, TilePlan, estimate, fit_limit, fit_limit_within, lower_exact, lower_fitted,
    max_live_bytes, verify,
};

/// An MLP block of 64 tokens, 64 -> 128 -> 64, on four tiles, with budgets small
/// enough that the activation budget binds: its defaults take row passes.
fn case() -> (Machine, Graph, TensorMap, LowerOptions) {
    let machine = Machine::small().with_tiles(4);
    let graph = mlp(&MlpConfig {
        tokens: 64,
        width: 64,
        hidden: 128,
        ..MlpConfig::tiny(1)
    })
    .unwrap();
    let weights = init_weights(&graph, 1);
    let opts = LowerOptions {
        weight_bytes: 8 * 1024,
        transient_bytes: 4 * 1024,
        ..LowerOptions::default()
    };
    (machine, graph, weights, opts)
}

/// The strategy a plan chose for `op`, as (bytes per tile, row passes), and the
/// default's.
fn chosen_and_default(plan: &TilePlan, op: &str) -> ((u64, u32), (u64, u32)) {
    let c = plan.candidates.iter().find(|c| c.op == op).unwrap();
    let at = |i: usize| (c.candidates[i].bytes_per_tile, c.candidates[i].passes);
    (at(c.chosen), at(0))
}

#[test]
fn linears_grow_past_the_activation_budget_when_the_plan_still_fits() {
    let (m, g, w, o) = case();
    // The defaults fit as they are, so the fit loop alone would keep them.
    let start = lower_exact(&m, &g, &w, &o).unwrap();
    assert!(max_live_bytes(&start) <= fit_limit(&m));
    let (plan, fitted) = lower_fitted(&m, &g, &w, &o).unwrap();
    assert_eq!(verify(&plan), vec![]);
    assert!(max_live_bytes(&plan) <= fit_limit(&m));
    let (grown, first) = (estimate(&m, &plan).cycles, estimate(&m, &start).cycles);
    assert!(grown < first, "grown {grown} cycles, defaults {first}");
    for op in ["mlp.fc1", "mlp.fc2"] {
        assert!(fitted.choices.contains_key(op), "{:?}", fitted.choices);
        let ((bytes, passes), (d_bytes, d_passes)) = chosen_and_default(&plan, op);
        assert!(
            bytes > d_bytes && passes < d_passes,
            "{op}: {bytes} bytes in {passes} passes, the default {d_bytes} in {d_passes}"
        );
    }
    // The kept choices lower to the same plan again.
    let again = lower_exact(&m, &g, &w, &fitted).unwrap();
    assert_eq!(again.to_string(), plan.to_string());
}

/// With an activation budget far above what any strategy needs, the defaults
/// are the cheapest, nothing is offered beyond the budget and nothing grows.
#[test]
fn nothing_grows_when_the_defaults_are_the_cheapest() {
    let (m, g, w, o) = case();
    let o = LowerOptions {
        transient_bytes: 1024 * 1024,
        ..o
    };
    let (plan, fitted) = lower_fitted(&m, &g, &w, &o).unwrap();
    assert!(fitted.choices.is_empty(), "{:?}", fitted.choices);
    assert!(
        plan.candidates
            .iter()
            .all(|c| c.candidates.iter().all(|x| !x.beyond_budget))
    );
}

/// A squeezed capacity (`LowerOptions::capacity`, the CLI's `--capacity`) is what
/// the fit loop and growth aim at: the plan's busiest tile stays within its share
/// of the capacity, which is below the machine's limit the unsqueezed plan uses.
#[test]
fn a_squeezed_capacity_bounds_the_fit_loop_and_growth() {
    let (m, g, w, o) = case();
    let (plan, _) = lower_fitted(&m, &g, &w, &o).unwrap();
    let live = max_live_bytes(&plan);
    // A capacity whose limit the grown plan exceeds and the defaults' plan keeps.
    let start = max_live_bytes(&lower_exact(&m, &g, &w, &o).unwrap());
    assert!(start < live, "{start} {live}");
    let capacity = (start + live) / 2 * 100 / 85;
    let limit = fit_limit_within(&m, Some(capacity));
    assert!(live > limit && limit < fit_limit(&m), "{live} {limit}");
    let squeezed = LowerOptions {
        capacity: Some(capacity),
        ..o.clone()
    };
    let (small, _) = lower_fitted(&m, &g, &w, &squeezed).unwrap();
    assert!(
        max_live_bytes(&small) <= limit,
        "{} {limit}",
        max_live_bytes(&small)
    );
    assert_eq!(verify(&small), vec![]);
    // Above the machine's SRAM the capacity changes nothing.
    assert_eq!(fit_limit_within(&m, Some(u64::MAX)), fit_limit(&m));
}
