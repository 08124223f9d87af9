//! Where each operation's results can be read back from a run
//! (`tessera_compile::probe`): every result that exists on the tiles is readable
//! before the next exchange, its parts cover the whole tensor, and one whose bytes
//! could be reused or rewritten before that boundary is refused with the reason.

use tessera_compile::probe::probes;
use tessera_graph::{EncoderLayerConfig, encoder_layer, init_weights};
use tessera_machine::Machine;
use tessera_plan::{LowerOptions, StepKind, TilePlan, lower};

fn tiny_layer() -> TilePlan {
    let graph = encoder_layer(&EncoderLayerConfig::tiny(2)).unwrap();
    let weights = init_weights(&graph, 1);
    lower(
        &Machine::small(),
        &graph,
        &weights,
        &LowerOptions::default(),
    )
    .unwrap()
}

#[test]
fn every_stored_result_is_readable_and_covered() {
    let plan = tiny_layer();
    let ps = probes(&plan, &|b| 0x1000 * b.0);
    assert_eq!(ps.len(), plan.results.len());
    let mut readable = 0;
    for (p, r) in ps.iter().zip(&plan.results) {
        assert_eq!(p.tensor, r.tensor);
        let (Some(at), Some(stored)) = (&p.at, &r.stored) else {
            assert!(
                p.at.is_none() && r.stored.is_none(),
                "{}: {:?}",
                p.tensor,
                p.note
            );
            assert!(p.note.is_some(), "{}", p.tensor);
            continue;
        };
        readable += 1;
        // Read before the first exchange after the operation's last step.
        let name = &plan.ops[r.op].name;
        let last = plan.step_ops.iter().rposition(|s| s == name).unwrap();
        let next = plan.steps[last + 1..].iter().find_map(|k| match k {
            StepKind::Exchange(id) => Some(*id),
            _ => None,
        });
        assert_eq!(at.exchange, next, "{}", p.tensor);
        // Every logical element sits in some part.
        let rows = stored.t.rows;
        for row in 0..rows {
            for c in 0..stored.logical_cols() {
                let col = stored.stored_col(c);
                assert!(
                    at.parts.iter().any(|q| q.offset_of(row, col).is_some()),
                    "{}: ({row}, {c}) in no part",
                    p.tensor
                );
            }
        }
        for (q, part) in at.parts.iter().zip(&stored.t.parts) {
            assert_eq!(q.tile, plan.buffer(part.at.buf).tile);
            assert_eq!(q.addr, 0x1000 * part.at.buf.0 + part.at.offset);
        }
    }
    // The layer's operations each leave at least one tensor; fc2's is readable.
    assert!(readable >= 12, "{readable}");
    assert!(
        ps.iter()
            .any(|p| p.tensor == "layers.0.mlp.add" && p.at.is_some())
    );
}

#[test]
fn a_result_whose_buffer_is_free_before_the_boundary_is_not_readable() {
    let mut plan = tiny_layer();
    let i = plan
        .results
        .iter()
        .position(|r| r.tensor == "layers.0.mlp.add")
        .unwrap();
    let buf = plan.results[i].stored.as_ref().unwrap().t.parts[0].at.buf;
    let name = &plan.ops[plan.results[i].op].name;
    let last = plan.step_ops.iter().rposition(|s| s == name).unwrap() as u32;
    // As if its last reader were a compute step right after the operation and the
    // next exchange further on.
    plan.buffers[buf.0 as usize].last = last;
    plan.steps.insert(last as usize + 1, StepKind::Compute);
    plan.step_ops.insert(last as usize + 1, "post_ln".into());
    let p = &probes(&plan, &|_| 0)[i];
    assert!(p.at.is_none());
    let note = p.note.as_deref().unwrap();
    assert!(
        note.contains("free after step") && note.contains("not readable"),
        "{note}"
    );
}

#[test]
fn a_result_written_before_the_boundary_is_not_readable() {
    let mut plan = tiny_layer();
    let i = plan
        .results
        .iter()
        .position(|r| r.tensor == "layers.0.mlp.add")
        .unwrap();
    let buf = plan.results[i].stored.as_ref().unwrap().t.parts[0].at.buf;
    let name = plan.ops[plan.results[i].op].name.clone();
    let last = plan.step_ops.iter().rposition(|s| *s == name).unwrap() as u32;
    // A compute step after the operation whose call writes the result in place
    // (its buffer otherwise lives on).
    plan.steps.insert(last as usize + 1, StepKind::Compute);
    plan.step_ops.insert(last as usize + 1, "post_ln".into());
    let mut call = plan
        .calls
        .iter()
        .find(|c| {
            c.kernel
                .contract()
                .operands
                .iter()
                .any(|o| o.name == "out" && o.role == tessera_kernels::Role::Output)
        })
        .unwrap()
        .clone();
    call.step = last + 1;
    call.operands
        .insert("out".into(), tessera_plan::Loc { buf, offset: 0 });
    plan.calls.push(call);
    let p = &probes(&plan, &|_| 0)[i];
    assert!(p.at.is_none());
    let note = p.note.as_deref().unwrap();
    assert!(
        note.contains("writes its buffer") && note.contains("not readable"),
        "{note}"
    );
}
