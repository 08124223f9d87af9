//! Properties every emitter must have, checked without the simulator.

use tessera_isa::{Inst, Word, validate_word};
use tessera_machine::Machine;

use crate::*;

fn kernels() -> Vec<Box<dyn Kernel>> {
    vec![
        Box::new(Rearrange::new(13, 48)),
        Box::new(SoftmaxCols::new(1, 736, 729, 0.125)),
        Box::new(SoftmaxCols::new(2, 40, 13, 0.5)),
        Box::new(SoftmaxCols::new(2, 40, 13, 1.0)),
        Box::new(SoftmaxCols::maxima(2, 40, 13)),
        Box::new(SoftmaxCols::shifted(1, 736, 729, 0.125, 2)),
        Box::new(SoftmaxCols::shifted(2, 40, 13, 1.0, 1)),
        Box::new(SoftmaxCols::shifted(3, 40, 13, 0.5, 6)),
        Box::new(AmpMatmul::new(1, 1, 1)),
        Box::new(AmpMatmul::new(29, 1, 3)),
        Box::new(AmpMatmul::new(29, 4, 2)),
        Box::new(AmpMatmul::new(24, 3, 2).continuing().unwrap()),
        Box::new(AmpMatmul::new(24, 1, 3).continuing().unwrap()),
        Box::new(AmpMatmul::new(24, 5, 2).row_major().continuing().unwrap()),
        Box::new(
            AmpMatmul::new(24, 4, 2)
                .with_own_rows(8, 8, 320)
                .unwrap()
                .continuing()
                .unwrap(),
        ),
        Box::new(AmpMatmul::new(24, 3, 2).with_bias().unwrap()),
        Box::new(AmpMatmul::new(24, 1, 3).row_major().with_bias().unwrap()),
        Box::new(LayerNorm::new(7, 1152, 1e-6)),
        Box::new(Gelu::new(4304)),
        Box::new(Add::new(1152)),
        Box::new(AddBias::new(3, 1152)),
        Box::new(AddBias::new(140, 16)),
        Box::new(AddBias::new(5, 8)),
        Box::new(ReduceAdd::new(4, 1152)),
        Box::new(ReduceAdd::new(4, 1148).with_addend()),
        Box::new(ReduceAdd::new(6, 5184).with_addend()),
        Box::new(ReduceAdd::new(17, 1684).with_addends()),
        Box::new(Softmax::new(5, 729, 0.125)),
        Box::new(Softmax::with_ld(13, 6, 16, 1.0)),
        Box::new(Softmax::with_ld(16, 729, 736, 0.125).with_recip()),
        Box::new(Softmax::with_ld(32, 729, 736, 0.125).with_blocked()),
        Box::new(ScaleRows::new(16, 5)),
        Box::new(ScaleCols::new(80, 2)),
        Box::new(ZeroFill::new(5, 224, 1472)),
        Box::new(ZeroFill::new(1, 8, 8)),
        Box::new(BlocksToRows::new(32, 46)),
        Box::new(TransposeBlocks::new(5, 46)),
        Box::new(ColMax::new(16)),
        Box::new(ColMax::new(1)),
        Box::new(RecipSum::new(80)),
        Box::new(RecipSum::new(7)),
        Box::new(ColExpShift::new(9, 16, 46, 1.0)),
        Box::new(ColExpShift::new(16, 16, 1, 0.5)),
        Box::new(Fp8ToF16::new(8, 0)),
        Box::new(Fp8ToF16::new(1152, -7)),
        Box::new(Fp8ToF16::layered(1152, -7)),
    ]
}

fn addrs_for(k: &dyn Kernel, base: u32) -> OperandAddrs {
    let mut a = OperandAddrs::new();
    for (i, op) in k.contract().operands.iter().enumerate() {
        a.insert(&op.name, base + 0x8000 * i as u32);
    }
    a
}

/// Branch targets differ with the base; nothing else may.
fn shape(words: &[Word]) -> Vec<Word> {
    words
        .iter()
        .map(|w| match w {
            Word::Single(Inst::Brz { c, .. }) => Word::Single(Inst::Brz { c: *c, target: 0 }),
            Word::Single(Inst::Brnz { c, .. }) => Word::Single(Inst::Brnz { c: *c, target: 0 }),
            other => *other,
        })
        .collect()
}

#[test]
fn code_does_not_depend_on_code_base_or_addresses() {
    for k in kernels() {
        let a = k.emit(0x4_C000).unwrap();
        let b = k.emit(0x7_F008).unwrap();
        assert_eq!(shape(&a.words), shape(&b.words), "{}", k.symbol());
        assert_eq!(a.bytes(), k.contract().code.bytes);
        let (x, y) = (
            addrs_for(k.as_ref(), 0x8_0000),
            addrs_for(k.as_ref(), 0x9_0008),
        );
        let call = |addrs| Call {
            entry: 0x4_C000,
            state: 0x7_C000,
            addrs,
        };
        let sa = k.supervisor(&call(&x), 0x5_0000).unwrap();
        let sb = k.supervisor(&call(&y), 0x5_1004).unwrap();
        assert_eq!(code_bytes(&sa), code_bytes(&sb));
        assert_eq!(
            code_bytes(&sa),
            k.contract().supervisor_bytes,
            "{}",
            k.symbol()
        );
    }
}

#[test]
fn every_word_encodes_and_bundles_are_aligned() {
    for k in kernels() {
        let code = k.emit(0x4_C000).unwrap();
        let mut at = code.code_base;
        for w in &code.words {
            validate_word(w).unwrap_or_else(|e| panic!("{}: {w}: {e}", k.symbol()));
            if matches!(w, Word::Bundle(..)) {
                assert_eq!(at % 8, 0, "{}: bundle at {at:#x}", k.symbol());
            }
            at += word_bytes(w);
        }
        assert_eq!(
            tessera_isa::encode(&code.words).unwrap().len() as u32,
            code.bytes()
        );
        let addrs = addrs_for(k.as_ref(), 0x8_0000);
        let sup = k
            .supervisor(
                &Call {
                    entry: 0x4_C000,
                    state: 0x7_C000,
                    addrs: &addrs,
                },
                0x5_0000,
            )
            .unwrap();
        for w in &sup {
            validate_word(w).unwrap();
            let Word::Single(i) = w else {
                panic!("the supervisor has no aux pipe: {w}")
            };
            assert!(
                !matches!(i, Inst::Exit),
                "snippets must not end the program"
            );
        }
    }
}

#[test]
fn misaligned_code_base_is_an_error() {
    assert!(matches!(
        Gelu::new(8).emit(0x4_C004),
        Err(KernelError::BadAddress { .. })
    ));
}

#[test]
fn contracts_are_consistent() {
    for k in kernels() {
        let c = k.contract();
        assert_eq!(c.code.align, 8);
        assert_eq!(c.code.mem_class, MemClass::Executable);
        assert!(c.operand("state").is_some());
        for op in &c.operands {
            assert!(op.align.is_power_of_two() && op.align >= 8, "{}", op.name);
            for other in &op.separate_from {
                let o = c.operand(other).expect("separation names an operand");
                assert!(o.separate_from.contains(&op.name), "asymmetric separation");
            }
        }
        let state = k.state(&addrs_for(k.as_ref(), 0x8_0000)).unwrap();
        assert_eq!(state.bytes.len() as u32, c.operand("state").unwrap().bytes);
        // Six worker records fit in the buffer.
        assert!(state.runall_offset as usize + 6 * usize::from(state.stride) <= state.bytes.len());
    }
}

/// What one issue streams together is kept apart, and nothing else: A from
/// every other stream, the two partial buffers from each other, and the output
/// from the partial buffer the last chunk reads (`p1` for five chunks: chunk 4
/// reads what chunk 3 wrote), not from the other one.
#[test]
fn matmul_streams_are_separated_as_streamed() {
    let c = AmpMatmul::new(10, 5, 2).contract();
    let sep = |name: &str| {
        let mut v = c.operand(name).unwrap().separate_from.clone();
        v.sort();
        v
    };
    assert_eq!(sep("a"), ["out", "p0", "p1"]);
    assert_eq!(sep("p0"), ["a", "p1"]);
    assert_eq!(sep("p1"), ["a", "out", "p0"]);
    assert_eq!(sep("out"), ["a", "p1"]);
    // Four chunks: the last reads `p0`.
    let c4 = AmpMatmul::new(10, 4, 2).contract();
    let mut out = c4.operand("out").unwrap().separate_from.clone();
    out.sort();
    assert_eq!(out, ["a", "p0"]);
    let w = c.operand("w").unwrap();
    assert_eq!((w.align, w.mem_class), (16, MemClass::Interleaved));
    assert!(w.separate_from.is_empty());
    // One chunk: no partial buffers at all.
    let c = AmpMatmul::new(10, 1, 2).contract();
    assert!(c.operand("p0").is_none());
    assert_eq!(
        c.operand("a").unwrap().separate_from,
        vec!["out".to_string()]
    );
}

#[test]
fn contract_check_finds_each_violation() {
    let m = Machine::c600();
    let c = AmpMatmul::new(24, 2, 1).contract();
    let good = OperandAddrs::new()
        .with("a", 0x8_0000)
        .with("w", 0x8_8000)
        .with("out", 0x9_0000)
        .with("p0", 0x9_8000)
        .with("state", 0x7_C000);
    assert_eq!(c.check(&m, &good), vec![]);
    let mut bad = good.clone();
    bad.insert("p0", 0x8_0600); // a's element pair
    bad.insert("w", 0x7_0000); // not interleaved
    bad.insert("out", 0x9_0004); // misaligned
    bad.0.remove("state");
    let v = c.check(&m, &bad);
    assert!(v.contains(&Violation::Missing("state".into())));
    assert!(
        v.iter()
            .any(|v| matches!(v, Violation::SharedElement { .. }))
    );
    assert!(
        v.iter()
            .any(|v| matches!(v, Violation::WrongClass { name, .. } if name == "w"))
    );
    assert!(
        v.iter()
            .any(|v| matches!(v, Violation::Misaligned { name, .. } if name == "out"))
    );
    let mut past_end = good;
    past_end.insert("a", 0xE_7FF0);
    assert!(
        c.check(&m, &past_end)
            .iter()
            .any(|v| matches!(v, Violation::OutOfRegion { .. }))
    );
}

#[test]
fn parameters_outside_the_isa_limits_are_rejected() {
    assert!(Rearrange::new(6, 24).validate().is_err());
    assert!(Rearrange::new(6 * 4096, 16).validate().is_err());
    assert!(AmpMatmul::new(0, 1, 1).validate().is_err());
    assert!(LayerNorm::new(2, 6, 1e-5).validate().is_err());
    assert!(LayerNorm::new(2, 8, f32::NAN).validate().is_err());
    assert!(Gelu::new(6).validate().is_err());
    assert!(ReduceAdd::new(1, 8).validate().is_err());
    assert!(AddBias::new(0, 8).validate().is_err());
    assert!(Softmax::with_ld(2, 5, 6, 1.0).validate().is_err());
    assert!(ZeroFill::new(0, 8, 8).validate().is_err());
    assert!(ZeroFill::new(2, 12, 16).validate().is_err());
    assert!(ZeroFill::new(2, 16, 20).validate().is_err());
    assert!(ZeroFill::new(2, 16, 8).validate().is_err());
    assert!(ZeroFill::new(1, 8 * 4096, 8 * 4096).validate().is_err());
    assert!(ZeroFill::new(1, 8 * 4095, 8 * 4095).validate().is_ok());
    assert!(ZeroFill::new(33, 8, 32 * 1024).validate().is_err());
    assert!(BlocksToRows::new(0, 1).validate().is_err());
    assert!(BlocksToRows::new(6 * 4096, 1).validate().is_err());
    assert!(BlocksToRows::new(6 * 4095, 1).validate().is_ok());
    assert!(BlocksToRows::new(1024, 32).validate().is_err());
    assert!(TransposeBlocks::new(0, 1).validate().is_err());
    assert!(TransposeBlocks::new(1, 2048).validate().is_err());
    assert!(TransposeBlocks::new(1, 2047).validate().is_ok());
}

#[test]
fn zero_fill_role_reflects_gaps() {
    let role = |k: ZeroFill| k.contract().operand("out").unwrap().role;
    assert_eq!(role(ZeroFill::new(4, 64, 64)), Role::Output);
    assert_eq!(role(ZeroFill::new(1, 64, 128)), Role::Output);
    assert_eq!(role(ZeroFill::new(4, 64, 128)), Role::InOut);
    assert_eq!(
        ZeroFill::new(4, 64, 128)
            .contract()
            .operand("out")
            .unwrap()
            .bytes,
        448
    );
}

#[test]
fn split_is_balanced_and_contiguous() {
    for total in [0, 1, 5, 6, 7, 100] {
        let s = split(total);
        assert_eq!(s.len(), 6);
        let mut next = 0;
        for &(start, n) in &s {
            assert_eq!(start, next);
            next += n;
        }
        assert_eq!(next, total);
        let (lo, hi) = (s.iter().map(|x| x.1).min(), s.iter().map(|x| x.1).max());
        assert!(hi.unwrap() - lo.unwrap() <= 1);
    }
}

#[test]
fn weight_packing_matches_amp_quads() {
    use half::f16;
    let (kc, nb) = (2, 3);
    let w: Vec<f16> = (0..kc * 16 * nb * 16)
        .map(|i| f16::from_f32(i as f32))
        .collect();
    let packed = pack_weights(kc, nb, &w);
    // Block (b, c), quad q = W[c*16 + q/2][b*16 + 8*(q%2) ..].
    let (b, c, q) = (2, 1, 7);
    let at = (b * kc + c) * 256 + q * 8;
    let want = (c * 16 + q / 2) * nb * 16 + b * 16 + 8 * (q % 2);
    assert_eq!(packed[at], w[want]);
}

/// Code laid out by `softmax::block` has no padding `nop` (each would cost an
/// issue), at either alignment of the code base.
pub(crate) fn assert_no_padding_nop(k: &dyn Kernel) {
    for base in [0x4_c000, 0x4_c008] {
        let code = k.emit(base).unwrap();
        assert!(
            !code.words.contains(&Word::Single(Inst::Nop)),
            "{}: padding nop at code base {base:#x}",
            k.symbol()
        );
    }
}

#[test]
fn block_transpose_needs_no_padding_nop() {
    for (kc, tb) in [(1, 1), (5, 1), (1, 5), (2, 3)] {
        assert_no_padding_nop(&TransposeBlocks::new(kc, tb));
    }
}

#[test]
fn gelu_needs_no_padding_nop() {
    for n in [4, 96, 4304] {
        assert_no_padding_nop(&Gelu::new(n));
    }
}
