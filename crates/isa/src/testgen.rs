//! Proptest strategies producing only valid instructions and words (every field in
//! range, pairs even, quads aligned, bundles main + aux), one generator per entry
//! of the instruction table. Shared by the encoding round-trip test, the
//! assembler's round-trip tests and the simulator's fuzzing.

use crate::inst::*;
use crate::table::GENERATORS;
use proptest::prelude::*;

pub fn mreg() -> impl Strategy<Value = MReg> {
    (0u8..16).prop_map(MReg)
}
pub fn areg() -> impl Strategy<Value = AReg> {
    (0u8..16).prop_map(AReg)
}
pub fn apair() -> impl Strategy<Value = AReg> {
    (0u8..8).prop_map(|r| AReg(r * 2))
}
pub fn aquad() -> impl Strategy<Value = AReg> {
    (0u8..4).prop_map(|r| AReg(r * 4))
}
pub fn int_op() -> impl Strategy<Value = IntOp> {
    proptest::sample::select(IntOp::ALL.to_vec())
}
pub fn fbin_op() -> impl Strategy<Value = FBinOp> {
    proptest::sample::select(FBinOp::ALL.to_vec())
}
pub fn fvec() -> impl Strategy<Value = FVec> {
    proptest::sample::select(FVec::ALL.to_vec())
}
pub fn fun_op() -> impl Strategy<Value = FUnOp> {
    proptest::sample::select(FUnOp::ALL.to_vec())
}

/// Valid instructions of one variant (by its name, `"Ld64Step"`): every field
/// in range, pairs even, quads aligned. `None` for a name that is not a variant.
pub fn of_variant(name: &str) -> Option<BoxedStrategy<Inst>> {
    let &(_, generate) = GENERATORS.iter().find(|(n, _)| *n == name)?;
    Some(any::<[u32; 8]>().prop_map(generate).boxed())
}

/// Every variant of one pipe, each as likely as the others.
fn of_pipe(pipe: Pipe) -> BoxedStrategy<Inst> {
    let all: Vec<_> = GENERATORS
        .iter()
        .filter(|(_, generate)| generate([0; 8]).pipe() == pipe)
        .map(|&(_, generate)| any::<[u32; 8]>().prop_map(generate).boxed())
        .collect();
    proptest::strategy::Union::new(all).boxed()
}

/// Any valid main-pipe instruction.
pub fn main_inst() -> BoxedStrategy<Inst> {
    of_pipe(Pipe::Main)
}

/// Any valid aux-pipe instruction.
pub fn aux_inst() -> BoxedStrategy<Inst> {
    of_pipe(Pipe::Aux)
}

/// Any valid instruction of either pipe.
pub fn inst() -> BoxedStrategy<Inst> {
    prop_oneof![main_inst(), aux_inst()].boxed()
}

/// Any valid word: a single instruction or a main + aux bundle.
pub fn word() -> BoxedStrategy<Word> {
    prop_oneof![
        3 => inst().prop_map(Word::Single),
        1 => (main_inst(), aux_inst()).prop_map(|(m, a)| Word::Bundle(m, a)),
    ]
    .boxed()
}
