//! The plan verifier on a real lowering (the tiny MLP on four tiles): clean as
//! built, and each rule broken once by editing the plan.

use tessera_graph::{MlpConfig, init_weights, mlp};
use tessera_kernels::MemClass;
use tessera_machine::Machine;
use tessera_plan::{BindingDir, LowerOptions, StepKind, TilePlan, VerifyError, lower, verify};

fn plan() -> TilePlan {
    let graph = mlp(&MlpConfig::tiny(2)).unwrap();
    let weights = init_weights(&graph, 1);
    lower(
        &Machine::small(),
        &graph,
        &weights,
        &LowerOptions::default(),
    )
    .unwrap()
}

fn only<T>(errors: Vec<VerifyError>, pick: impl Fn(&VerifyError) -> Option<T>) -> Vec<T> {
    assert!(!errors.is_empty(), "the broken plan passed");
    errors.iter().filter_map(pick).collect()
}

/// Repeats the first copy of the first exchange that has one; returns its id.
fn duplicate_a_copy(p: &mut TilePlan) -> u16 {
    let x = p
        .exchanges
        .iter_mut()
        .find(|x| !x.copies.is_empty())
        .unwrap();
    let dup = x.copies[0].clone();
    x.copies.push(dup);
    x.id
}

/// Makes the first call's first operand buffer 2-byte aligned.
fn under_align_first_operand(p: &mut TilePlan) {
    let buf = p.calls[0].operands.values().next().unwrap().buf;
    p.buffers[buf.0 as usize].align = 2;
}

#[test]
fn the_lowering_keeps_every_rule() {
    let p = plan();
    assert!(!p.calls.is_empty() && !p.exchanges.is_empty());
    assert_eq!(verify(&p), vec![]);
}

#[test]
fn a_slice_outside_its_buffer() {
    let mut p = plan();
    let buf = p.calls[0].operands.values().next().unwrap().buf;
    p.buffers[buf.0 as usize].bytes -= 2;
    let errors = verify(&p);
    let hits = only(errors, |e| match e {
        VerifyError::OutOfBounds { buf: b, .. } if *b == buf => Some(()),
        _ => None,
    });
    assert!(!hits.is_empty());
    let text = verify(&p)[0].to_string();
    assert!(
        text.contains("lie outside") && text.contains("bytes"),
        "{text}"
    );
}

#[test]
fn a_read_with_no_earlier_write() {
    let mut p = plan();
    // Run the last compute step's calls at the first compute step instead: their
    // inputs are not produced yet.
    let last = p.calls.iter().map(|c| c.step).max().unwrap();
    let first = p
        .steps
        .iter()
        .position(|&k| k == StepKind::Compute)
        .unwrap() as u32;
    for c in p.calls.iter_mut().filter(|c| c.step == last) {
        c.step = first;
    }
    let errors = verify(&p);
    let hits = only(errors, |e| match e {
        VerifyError::ReadBeforeWrite { step, .. } if *step == first => Some(()),
        _ => None,
    });
    assert!(!hits.is_empty());
}

#[test]
fn conflicting_contracts_on_one_buffer() {
    let mut p = plan();
    // Declare a buffer less aligned than a kernel's contract requires.
    under_align_first_operand(&mut p);
    let errors = verify(&p);
    let hits = only(errors, |e| match e {
        VerifyError::WeakerBuffer {
            what: "alignment",
            need,
            has: 2,
            ..
        } => Some(*need),
        _ => None,
    });
    assert!(hits.iter().all(|&n| n >= 8));
}

#[test]
fn a_buffer_class_that_breaks_a_contract() {
    let mut p = plan();
    // The matmul's weights must be interleaved (`ampw` loads 128 bits).
    let call = p
        .calls
        .iter()
        .position(|c| c.operands.contains_key("w"))
        .unwrap();
    let w = p.calls[call].operands["w"].buf;
    p.buffers[w.0 as usize].class = MemClass::NonInterleaved;
    let hits = only(verify(&p), |e| match e {
        VerifyError::ClassNotKept {
            need: MemClass::Interleaved,
            has: MemClass::NonInterleaved,
            ..
        } => Some(()),
        _ => None,
    });
    assert!(!hits.is_empty());
}

#[test]
fn two_copies_writing_the_same_bytes() {
    let mut p = plan();
    let id = duplicate_a_copy(&mut p);
    let errors = verify(&p);
    let hits = only(errors, |e| match e {
        VerifyError::OverlappingCopies { exchange, .. } if *exchange == id => Some(()),
        _ => None,
    });
    assert!(!hits.is_empty());
}

#[test]
fn an_output_not_covered_exactly_once() {
    let mut p = plan();
    let y = p
        .bindings
        .iter_mut()
        .find(|b| b.dir == BindingDir::Output)
        .unwrap();
    let dropped = y.slices.pop().unwrap();
    let name = y.name.clone();
    let errors = verify(&p);
    let gaps = only(errors, |e| match e {
        VerifyError::OutputCoverage {
            binding, times: 0, ..
        } if *binding == name => Some(()),
        _ => None,
    });
    assert_eq!(gaps.len(), 1);
    let y = p
        .bindings
        .iter_mut()
        .find(|b| b.dir == BindingDir::Output)
        .unwrap();
    y.slices.push(dropped);
    y.slices.push(dropped);
    let twice = only(verify(&p), |e| match e {
        VerifyError::OutputCoverage { times: 2, .. } => Some(()),
        _ => None,
    });
    assert_eq!(twice.len(), 1);
}

#[test]
fn every_error_is_reported_in_one_run() {
    let mut p = plan();
    under_align_first_operand(&mut p);
    duplicate_a_copy(&mut p);
    let errors = verify(&p);
    assert!(
        errors
            .iter()
            .any(|e| matches!(e, VerifyError::WeakerBuffer { .. }))
    );
    assert!(
        errors
            .iter()
            .any(|e| matches!(e, VerifyError::OverlappingCopies { .. }))
    );
}

/// The tiny tower of three layers, and its weights.
fn tower() -> (tessera_graph::Graph, tessera_graph::TensorMap) {
    let cfg = tessera_graph::EncoderLayerConfig {
        layers: 3,
        ..tessera_graph::EncoderLayerConfig::tiny(1)
    };
    let graph = tessera_graph::encoder_layer(&cfg).unwrap();
    let weights = init_weights(&graph, 1);
    (graph, weights)
}

/// The tiny tower lowered as a loop on the `small` machine.
fn looped() -> TilePlan {
    let (graph, weights) = tower();
    let opts = LowerOptions {
        loop_layers: true,
        ..LowerOptions::default()
    };
    lower(&Machine::small(), &graph, &weights, &opts).unwrap()
}

fn loop_errors(p: &TilePlan) -> Vec<String> {
    only(verify(p), |e| match e {
        VerifyError::Loop(m) => Some(m.clone()),
        _ => None,
    })
}

#[test]
fn a_layer_loop_keeps_every_rule() {
    let p = looped();
    let lp = p.layer_loop.as_ref().expect("three identical layers loop");
    assert_eq!(lp.count, 3);
    assert!(p.buffers.iter().any(|b| b.instances == 3));
    assert_eq!(verify(&p), vec![]);
}

#[test]
fn a_store_with_too_few_instances() {
    let mut p = looped();
    let b = p.buffers.iter_mut().find(|b| b.instances > 1).unwrap();
    b.instances = 2;
    let hits = loop_errors(&p);
    assert!(
        hits.iter()
            .any(|m| m.contains("2 instances for 3 iterations")),
        "{hits:?}"
    );
}

#[test]
fn a_binding_naming_an_instance_the_store_lacks() {
    let mut p = looped();
    let s = p
        .bindings
        .iter_mut()
        .flat_map(|b| b.slices.iter_mut())
        .find(|s| s.instance == 2)
        .unwrap();
    s.instance = 3;
    let hits = loop_errors(&p);
    assert!(hits.iter().any(|m| m.contains("instance 3")), "{hits:?}");
}

#[test]
fn a_buffer_from_before_the_body_freed_inside_it() {
    let mut p = looped();
    let lp = p.layer_loop.clone().unwrap();
    // The layer's input: live before the body and written by its carry.
    let carry = p.exchanges.iter().find(|x| x.step == lp.last).unwrap();
    let x = carry.copies[0].dsts[0].buf;
    p.buffers[x.0 as usize].last = lp.first + 1;
    let hits = loop_errors(&p);
    assert!(hits.iter().any(|m| m.contains("freed")), "{hits:?}");
}

/// The tiny tower of three layers as a loop with FP8 weights: the fit loop
/// keeps some linears' weights resident in their layout, an instance a layer.
fn looped_fp8() -> (TilePlan, LowerOptions) {
    let (graph, weights) = tower();
    let opts = LowerOptions {
        weight_dtype: tessera_plan::WeightDtype::Fp8,
        ..LowerOptions::default()
    };
    tessera_plan::lower_fitted(&Machine::small(), &graph, &weights, &opts).unwrap()
}

/// Calls widening resident weights: layered, reading a weight store.
fn layered_calls(p: &TilePlan) -> Vec<usize> {
    (0..p.calls.len())
        .filter(|&i| p.calls[i].kernel.reads_by_layer("src"))
        .collect()
}

#[test]
fn resident_weights_in_a_loop_keep_every_rule() {
    let (p, o) = looped_fp8();
    assert!(!o.resident.is_empty(), "no linear kept resident");
    let layered = layered_calls(&p);
    assert!(!layered.is_empty());
    for &i in &layered {
        let src = p.calls[i].operands["src"].buf;
        assert_eq!(p.buffer(src).instances, 3);
    }
    assert_eq!(verify(&p), vec![]);
}

#[test]
fn a_store_read_without_the_layers_offset() {
    let (mut p, _) = looped_fp8();
    let i = layered_calls(&p)[0];
    let tessera_plan::KernelKind::Fp8ToF16(k) = &mut p.calls[i].kernel else {
        unreachable!()
    };
    k.layered = false;
    let hits = loop_errors(&p);
    assert!(
        hits.iter()
            .any(|m| m.contains("does not read it at the layer's offset")),
        "{hits:?}"
    );
}

#[test]
fn a_layered_read_of_a_buffer_that_is_no_store() {
    let (mut p, _) = looped_fp8();
    let i = layered_calls(&p)[0];
    let dst = p.calls[i].operands["dst"];
    p.calls[i].operands.insert("src".to_string(), dst);
    let hits = loop_errors(&p);
    assert!(
        hits.iter().any(|m| m.contains("not a weight store")),
        "{hits:?}"
    );
}
