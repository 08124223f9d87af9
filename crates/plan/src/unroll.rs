//! The program as it runs: a plan with a layer loop seen with its body repeated,
//! one copy a layer, each named for its layer. Profiles charge cycles to these
//! operations and validation reads each layer's tensors in its iteration; a plan
//! without a loop is its own unrolled form.

use crate::ir::{PlanOp, StepKind, TilePlan};

/// A plan's operations and steps in execution order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Unrolled {
    /// The operations, a body's once a layer (renamed).
    pub ops: Vec<PlanOp>,
    /// For each of `ops`: the plan operation it repeats and the iteration (0
    /// outside the loop).
    pub origin: Vec<(usize, u32)>,
    /// The operation of each executed step.
    pub step_ops: Vec<String>,
    /// The executed step of each exchange the program runs, in the order it runs
    /// them (the `k`-th exchange a run reaches is entry `k`).
    pub exchange_steps: Vec<u32>,
}

/// Whether plan operation `name` is in the loop's body.
pub fn in_body(plan: &TilePlan, name: &str) -> bool {
    plan.layer_loop
        .as_ref()
        .is_some_and(|lp| name.starts_with(&format!("{}0.", lp.prefix)))
}

pub fn unroll(plan: &TilePlan) -> Unrolled {
    let mut u = Unrolled::default();
    let Some(lp) = &plan.layer_loop else {
        u.ops = plan.ops.clone();
        u.origin = (0..plan.ops.len()).map(|i| (i, 0)).collect();
        u.step_ops = plan.step_ops.clone();
        u.exchange_steps = exchange_steps(&plan.steps);
        return u;
    };
    let body: Vec<usize> = (0..plan.ops.len())
        .filter(|&i| in_body(plan, &plan.ops[i].name))
        .collect();
    for (i, op) in plan.ops.iter().enumerate() {
        if body.first() == Some(&i) {
            for layer in 0..lp.count {
                for &b in &body {
                    let o = &plan.ops[b];
                    u.ops.push(PlanOp {
                        name: lp.rename(&o.name, layer),
                        fused: o.fused.iter().map(|f| lp.rename(f, layer)).collect(),
                        ..o.clone()
                    });
                    u.origin.push((b, layer));
                }
            }
        } else if !body.contains(&i) {
            u.ops.push(op.clone());
            u.origin.push((i, 0));
        }
    }
    let (first, last) = (lp.first as usize, lp.last as usize);
    let mut steps: Vec<StepKind> = plan.steps[..first].to_vec();
    u.step_ops = plan.step_ops[..first].to_vec();
    for layer in 0..lp.count {
        steps.extend_from_slice(&plan.steps[first..=last]);
        u.step_ops.extend(
            plan.step_ops[first..=last]
                .iter()
                .map(|n| lp.rename(n, layer)),
        );
    }
    steps.extend_from_slice(&plan.steps[last + 1..]);
    u.step_ops.extend_from_slice(&plan.step_ops[last + 1..]);
    u.exchange_steps = exchange_steps(&steps);
    u
}

fn exchange_steps(steps: &[StepKind]) -> Vec<u32> {
    steps
        .iter()
        .enumerate()
        .filter(|(_, k)| matches!(k, StepKind::Exchange(_)))
        .map(|(s, _)| s as u32)
        .collect()
}
