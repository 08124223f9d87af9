//! Proptest strategies producing only valid instructions and words (every field in
//! range, pairs even, quads aligned, bundles main + aux). Shared by the encoding
//! round-trip test, the assembler's round-trip tests and the simulator's fuzzing.

use crate::inst::*;
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
fn avec(pair: bool) -> BoxedStrategy<AReg> {
    if pair {
        apair().boxed()
    } else {
        areg().boxed()
    }
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
fn imm12() -> impl Strategy<Value = u16> {
    0u16..4096
}
fn target() -> impl Strategy<Value = u32> {
    (0u32..(1 << 18)).prop_map(|t| t << 2)
}

/// Any valid main-pipe instruction.
pub fn main_inst() -> BoxedStrategy<Inst> {
    prop_oneof![
        Just(Inst::Nop),
        (mreg(), 0u32..(1 << 20)).prop_map(|(d, imm)| Inst::Setzi { d, imm }),
        (int_op(), mreg(), mreg(), mreg()).prop_map(|(op, d, a, b)| Inst::Int { op, d, a, b }),
        (int_op(), mreg(), mreg(), imm12()).prop_map(|(op, d, a, imm)| Inst::IntImm {
            op,
            d,
            a,
            imm
        }),
        (areg(), mreg()).prop_map(|(d, a)| Inst::MovAm { d, a }),
        (mreg(), areg()).prop_map(|(d, a)| Inst::MovMa { d, a }),
        (mreg(), mreg(), imm12()).prop_map(|(d, base, imm)| Inst::Ld32M { d, base, imm }),
        (areg(), mreg(), imm12()).prop_map(|(d, base, imm)| Inst::Ld32 { d, base, imm }),
        (mreg(), mreg(), imm12()).prop_map(|(s, base, imm)| Inst::St32M { s, base, imm }),
        (areg(), mreg(), imm12()).prop_map(|(s, base, imm)| Inst::St32 { s, base, imm }),
        (apair(), mreg(), imm12()).prop_map(|(d, base, imm)| Inst::Ld64 { d, base, imm }),
        (apair(), mreg(), imm12()).prop_map(|(s, base, imm)| Inst::St64 { s, base, imm }),
        (apair(), mreg(), any::<i8>()).prop_map(|(d, base, inc)| Inst::Ld64Step { d, base, inc }),
        (apair(), mreg(), any::<i8>()).prop_map(|(s, base, inc)| Inst::St64Step { s, base, inc }),
        (aquad(), mreg(), imm12()).prop_map(|(d, base, imm)| Inst::Ld128 { d, base, imm }),
        (apair(), apair(), mreg(), mreg()).prop_map(|(d0, d1, p0, p1)| Inst::Ld2x64Pace {
            d0,
            d1,
            p0,
            p1
        }),
        (apair(), apair(), mreg(), mreg()).prop_map(|(d, s, pl, ps)| Inst::Ldst64Pace {
            d,
            s,
            pl,
            ps
        }),
        (apair(), apair(), apair(), mreg(), mreg(), mreg()).prop_map(|(d0, d1, s, p0, p1, ps)| {
            Inst::Ld2xSt64Pace {
                d0,
                d1,
                s,
                p0,
                p1,
                ps,
            }
        }),
        (apair(), mreg(), mreg()).prop_map(|(d, base, stride)| Inst::Ld64Stride {
            d,
            base,
            stride
        }),
        (apair(), apair(), mreg(), mreg(), mreg()).prop_map(|(d0, d1, p0, p1, stride)| {
            Inst::Ld2x64PaceStride {
                d0,
                d1,
                p0,
                p1,
                stride,
            }
        }),
        (apair(), apair(), mreg(), mreg(), mreg()).prop_map(|(d, s, pl, ps, stride)| {
            Inst::Ldst64PaceStride {
                d,
                s,
                pl,
                ps,
                stride,
            }
        }),
        (aquad(), apair(), mreg(), mreg(), mreg(), mreg()).prop_map(
            |(d0, s, p0, p1, ps, stride)| Inst::Ld2xSt64PaceStride {
                d0,
                d1: AReg(d0.0 + 2),
                s,
                p0,
                p1,
                ps,
                stride,
            }
        ),
        (mreg(), 0u8..32).prop_map(|(base, quad)| Inst::AmpLoadW { base, quad }),
        mreg().prop_map(|a| Inst::Br { a }),
        target().prop_map(|target| Inst::Bri { target }),
        (mreg(), target()).prop_map(|(c, target)| Inst::Brz { c, target }),
        (mreg(), target()).prop_map(|(c, target)| Inst::Brnz { c, target }),
        (mreg(), target()).prop_map(|(link, target)| Inst::Call { link, target }),
        (mreg(), 1u8..=255).prop_map(|(count, body)| Inst::Rpt { count, body }),
        (0u16..4096, 1u8..=255).prop_map(|(count, body)| Inst::Rpti { count, body }),
        Just(Inst::Exit),
        (mreg(), mreg(), 0u8..6).prop_map(|(entry, state, worker)| Inst::Run {
            entry,
            state,
            worker
        }),
        (mreg(), mreg(), any::<u16>()).prop_map(|(entry, state, stride)| Inst::RunAll {
            entry,
            state,
            stride
        }),
        Just(Inst::SyncLocal),
        Just(Inst::SyncGlobal),
        any::<u16>().prop_map(|id| Inst::Exchange { id }),
        mreg().prop_map(|desc| Inst::HostXfer { desc }),
        (mreg(), any::<u16>()).prop_map(|(a, bytes)| Inst::Send { a, bytes }),
        (0u32..1 << 20).prop_map(|tile| Inst::Mux { tile }),
        (mreg(), any::<u16>()).prop_map(|(a, msg)| Inst::Recv { a, msg }),
        any::<u16>().prop_map(|tag| Inst::Mark { tag }),
    ]
    .boxed()
}

/// Any valid aux-pipe instruction.
pub fn aux_inst() -> BoxedStrategy<Inst> {
    prop_oneof![
        (fbin_op(), fvec()).prop_flat_map(|(op, vec)| {
            let p = vec.is_pair();
            (avec(p), avec(p), avec(p)).prop_map(move |(d, a, b)| Inst::FBin { op, vec, d, a, b })
        }),
        fvec().prop_flat_map(|vec| {
            let p = vec.is_pair();
            (avec(p), avec(p), avec(p)).prop_map(move |(d, a, b)| Inst::FMac { vec, d, a, b })
        }),
        (fun_op(), areg(), areg()).prop_map(|(op, d, a)| Inst::FUn { op, d, a }),
        (areg(), areg()).prop_map(|(d, a)| Inst::F16v2Tanh { d, a }),
        (areg(), areg()).prop_map(|(d, a)| Inst::F16v2Exp { d, a }),
        (apair(), areg()).prop_map(|(d, a)| Inst::F16v2ToF32 { d, a }),
        apair().prop_map(|a| Inst::F16Acc { a, quad: false }),
        aquad().prop_map(|a| Inst::F16Acc { a, quad: true }),
        apair().prop_map(|d| Inst::F32v2Gina { d }),
        areg().prop_map(|d| Inst::F16v2Gina { d }),
        (apair(), apair()).prop_map(|(a, b)| Inst::F16v4Cmac { a, b }),
        (areg(), apair()).prop_map(|(d, a)| Inst::F32v2ToF16 { d, a }),
        (any::<bool>(), areg(), areg(), areg()).prop_map(|(hi, d, a, b)| Inst::Sort4x16 {
            hi,
            d,
            a,
            b
        }),
        fvec().prop_flat_map(|vec| {
            (areg(), avec(vec.is_pair())).prop_map(move |(d, a)| Inst::FSum { vec, d, a })
        }),
        any::<bool>().prop_flat_map(|pair| {
            (avec(pair), avec(pair)).prop_map(move |(d, a)| Inst::FMov { d, a, pair })
        }),
        fvec().prop_flat_map(|vec| {
            (avec(vec.is_pair()), areg()).prop_map(move |(d, a)| Inst::FBcast { vec, d, a })
        }),
        (apair(), apair(), apair(), 0u8..4).prop_map(|(out, inp, pin, phase)| Inst::Amp {
            out,
            inp,
            pin,
            phase
        }),
    ]
    .boxed()
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
