//! Instruction semantics, one context at a time: each test runs a few words on a
//! worker (or the supervisor) and checks registers, memory and faults.

use crate::fault::FaultKind;
use crate::interp::{self, Amp, Ctx, Env, Shared, Stop};
use crate::mem::Layout;
use crate::program::Program;
use half::f16;
use std::sync::Arc;
use tessera_isa::*;
use tessera_machine::Machine;
use tessera_package::{Perms, Segment, TileImage};

const CODE: u32 = 0x4_C000;
const R0: u32 = 0x6_0000;
const R1: u32 = 0x9_0000;

struct Run {
    ctx: Ctx,
    sh: Shared,
    stop: Stop,
    layout: Layout,
}

impl Run {
    fn m(&self, r: u8) -> u32 {
        self.ctx.m[r as usize]
    }
    fn a(&self, r: u8) -> u32 {
        self.ctx.a[r as usize]
    }
    fn f(&self, r: u8) -> f32 {
        f32::from_bits(self.a(r))
    }
    fn h(&self, r: u8, lane: u32) -> f32 {
        let v = (u64::from(self.a(r)) | (u64::from(self.a(r + 1)) << 32)) >> (16 * lane);
        f16::from_bits(v as u16).to_f32()
    }
    fn mem(&self, addr: u32, len: usize) -> &[u8] {
        let off = (addr - self.layout.start) as usize;
        &self.sh.mem[off..off + len]
    }
    fn fault(&self) -> (FaultKind, String, u32) {
        match &self.stop {
            Stop::Fault { trap, pc, .. } => (trap.kind, trap.cause.clone(), *pc),
            other => panic!("expected a fault, got {other:?}"),
        }
    }
    fn ok(&self) {
        assert!(
            matches!(
                self.stop,
                Stop::Super {
                    inst: Inst::Exit,
                    ..
                }
            ),
            "{:?}",
            self.stop
        );
    }
}

fn exec_with<const SUP: bool>(
    words: &[Word],
    init: impl FnOnce(&mut Ctx, &mut Shared, &Layout),
) -> Run {
    exec_env::<SUP>(words, init, |_| {})
}

/// [`exec_with`] with the timing of the run changed by `tweak`.
fn exec_env<const SUP: bool>(
    words: &[Word],
    init: impl FnOnce(&mut Ctx, &mut Shared, &Layout),
    tweak: impl FnOnce(&mut Env),
) -> Run {
    exec_at::<SUP>(CODE, words, init, tweak)
}

/// [`exec_env`] with the code at `code` rather than at `CODE`.
fn exec_at<const SUP: bool>(
    code_at: u32,
    words: &[Word],
    init: impl FnOnce(&mut Ctx, &mut Shared, &Layout),
    tweak: impl FnOnce(&mut Env),
) -> Run {
    let machine = Machine::c600();
    let layout = Layout::new(&machine);
    let mut code: Vec<Word> = words.to_vec();
    code.push(Word::Single(Inst::Exit));
    // Bundles must be 8-byte aligned: pad as the assembler would.
    let mut laid = Vec::new();
    let mut at = code_at;
    for w in code {
        if matches!(w, Word::Bundle(..)) && !at.is_multiple_of(8) {
            laid.push(Word::Single(Inst::Nop));
            at += 4;
        }
        at += w.byte_len() as u32;
        laid.push(w);
    }
    let bytes = encode(&laid).unwrap();
    let image = TileImage {
        tile: 0,
        entry: code_at,
        symbols: vec![],
        segments: vec![Segment {
            name: "code".into(),
            addr: code_at,
            size: bytes.len() as u32,
            bytes: bytes.clone(),
            perms: Perms {
                read: true,
                write: false,
                execute: true,
            },
        }],
    };
    let mut mem = vec![0u8; layout.bytes()];
    crate::tile::load_segments(&mut mem, layout.start, &image.segments);
    let mut sh = Shared {
        mem,
        prog: Arc::new(Program::build(&image)),
        weights: [[0.0; 16]; 16],
        code_dirty: false,
        barrel: crate::barrel::Barrel::new(6, 6),
        xlog: Default::default(),
        hz: Default::default(),
    };
    let mut ctx = Ctx {
        pc: code_at,
        ..Ctx::default()
    };
    init(&mut ctx, &mut sh, &layout);
    let mut env = Env {
        layout: layout.clone(),
        interval: 6,
        latency: 6,
        amp_extra: 0,
        transcendental_issues: 2,
        tanh_issues: 5,
        f16_exp_issues: 1,
        rpt_max: machine.rpt_max_count,
        budget: 1_000_000,
        feed_fast: true,
    };
    tweak(&mut env);
    let mut amp = Amp::default();
    // The loop as compiled for the host's vector features (with F16C conversions)
    // and as compiled for any x86-64 (with written-out ones) must agree on
    // everything (`interp::run` picks one at run time).
    let (mut sh2, mut ctx2, mut amp2) = (sh.clone(), ctx.clone(), amp.clone());
    // And the general path alone is the oracle for the AMP feeder's fast paths.
    let (mut sh3, mut ctx3, mut amp3) = (sh.clone(), ctx.clone(), amp.clone());
    let general = Env {
        feed_fast: false,
        ..env.clone()
    };
    let stop = loop {
        match interp::run::<SUP>(&mut sh, &mut ctx, &mut amp, &env) {
            Stop::Mark { .. } => continue,
            s => break s,
        }
    };
    let stop2 = loop {
        match interp::run_portable::<SUP, false>(&mut sh2, &mut ctx2, &mut amp2, &env) {
            Stop::Mark { .. } => continue,
            s => break s,
        }
    };
    let stop3 = loop {
        match interp::run_portable::<SUP, false>(&mut sh3, &mut ctx3, &mut amp3, &general) {
            Stop::Mark { .. } => continue,
            s => break s,
        }
    };
    // A fast path records a run of feeder issues as one batch, which the next
    // other issue closes; a run that stops on a feeder (a fault, the budget)
    // leaves it open. Closed, it must be the general path's spans.
    for (sh, ctx) in [(&mut sh, &ctx), (&mut sh2, &ctx2), (&mut sh3, &ctx3)] {
        if sh.hz.feeding() {
            sh.hz.close_feed(&ctx.m, ctx.last_issue);
        }
    }
    for (what, stop2, ctx2, amp2, sh2) in [
        ("the portable loop", &stop2, &ctx2, &amp2, &sh2),
        ("the general path", &stop3, &ctx3, &amp3, &sh3),
    ] {
        assert_eq!(format!("{stop:?}"), format!("{stop2:?}"), "stop, {what}");
        assert_eq!(format!("{ctx:?}"), format!("{ctx2:?}"), "context, {what}");
        assert_eq!(format!("{amp:?}"), format!("{amp2:?}"), "AMP, {what}");
        assert!(sh.mem == sh2.mem, "memory differs from {what}");
        assert_eq!(
            format!("{:?}", sh.hz),
            format!("{:?}", sh2.hz),
            "hazards, {what}"
        );
    }
    Run {
        ctx,
        sh,
        stop,
        layout,
    }
}

fn exec(words: &[Word]) -> Run {
    exec_with::<false>(words, |_, _, _| {})
}

fn s(i: Inst) -> Word {
    Word::Single(i)
}
fn li(d: u8, imm: u32) -> Word {
    s(Inst::Setzi { d: MReg(d), imm })
}
fn to_a(d: u8, m: u8) -> Word {
    s(Inst::MovAm {
        d: AReg(d),
        a: MReg(m),
    })
}
fn poke(sh: &mut Shared, layout: &Layout, addr: u32, bytes: &[u8]) {
    let off = (addr - layout.start) as usize;
    sh.mem[off..off + bytes.len()].copy_from_slice(bytes);
}
fn hbits(v: f32) -> u32 {
    u32::from(f16::from_f32(v).to_bits())
}
fn set_f(ctx: &mut Ctx, r: usize, v: f32) {
    ctx.a[r] = v.to_bits();
}
fn set_h4(ctx: &mut Ctx, r: usize, v: [f32; 4]) {
    ctx.a[r] = hbits(v[0]) | (hbits(v[1]) << 16);
    ctx.a[r + 1] = hbits(v[2]) | (hbits(v[3]) << 16);
}

#[test]
fn integer_ops() {
    let cases: [(IntOp, u32, u32, u32); 17] = [
        (IntOp::Add, 0xffff_ffff, 2, 1),
        (IntOp::Sub, 1, 2, 0xffff_ffff),
        (IntOp::Mul, 0x1_0001, 0x1_0001, 0x2_0001),
        (IntOp::And, 0b1100, 0b1010, 0b1000),
        (IntOp::Or, 0b1100, 0b1010, 0b1110),
        (IntOp::Xor, 0b1100, 0b1010, 0b0110),
        (IntOp::Shl, 1, 31, 0x8000_0000),
        (IntOp::Shl, 1, 32, 0),
        (IntOp::Shr, 0x8000_0000, 31, 1),
        (IntOp::Sar, 0x8000_0000, 31, 0xffff_ffff),
        (IntOp::Sar, 0x8000_0000, 40, 0xffff_ffff),
        (IntOp::CmpEq, 5, 5, 1),
        (IntOp::CmpUlt, 1, 0xffff_ffff, 1),
        (IntOp::CmpSlt, 1, 0xffff_ffff, 0),
        (IntOp::Min, 0xffff_ffff, 3, 0xffff_ffff),
        (IntOp::Max, 0xffff_ffff, 3, 3),
        (IntOp::Sub, 0, 0, 0),
    ];
    for (op, x, y, want) in cases {
        let r = exec_with::<false>(
            &[s(Inst::Int {
                op,
                d: MReg(3),
                a: MReg(1),
                b: MReg(2),
            })],
            |c, _, _| {
                c.m[1] = x;
                c.m[2] = y;
            },
        );
        r.ok();
        assert_eq!(r.m(3), want, "{op:?} {x:#x} {y:#x}");
    }
    let r = exec(&[
        li(1, 0xfffff),
        s(Inst::IntImm {
            op: IntOp::Add,
            d: MReg(2),
            a: MReg(1),
            imm: 0xfff,
        }),
        // $mzero ignores writes.
        li(15, 7),
        s(Inst::IntImm {
            op: IntOp::Add,
            d: MReg(4),
            a: MReg::ZERO,
            imm: 1,
        }),
    ]);
    r.ok();
    assert_eq!(r.m(2), 0xfffff + 0xfff);
    assert_eq!(r.m(15), 0);
    assert_eq!(r.m(4), 1);
}

#[test]
fn loads_and_stores() {
    let r = exec_with::<false>(
        &[
            li(1, R1),
            s(Inst::Ld32M {
                d: MReg(2),
                base: MReg(1),
                imm: 1,
            }),
            s(Inst::Ld64 {
                d: AReg(0),
                base: MReg(1),
                imm: 1,
            }),
            s(Inst::Ld128 {
                d: AReg(4),
                base: MReg(1),
                imm: 1,
            }),
            s(Inst::St64 {
                s: AReg(0),
                base: MReg(1),
                imm: 8,
            }),
            s(Inst::St32M {
                s: MReg(2),
                base: MReg(1),
                imm: 20,
            }),
            to_a(9, 2),
            s(Inst::St32 {
                s: AReg(9),
                base: MReg(1),
                imm: 21,
            }),
            s(Inst::Ld32 {
                d: AReg(10),
                base: MReg(1),
                imm: 20,
            }),
            s(Inst::MovMa {
                d: MReg(5),
                a: AReg(10),
            }),
        ],
        |_, sh, l| {
            let words: Vec<u8> = (0u32..8).flat_map(|i| (0x1000 + i).to_le_bytes()).collect();
            poke(sh, l, R1, &words);
        },
    );
    r.ok();
    assert_eq!(r.m(2), 0x1001);
    assert_eq!((r.a(0), r.a(1)), (0x1002, 0x1003));
    assert_eq!(
        [r.a(4), r.a(5), r.a(6), r.a(7)],
        [0x1004, 0x1005, 0x1006, 0x1007]
    );
    assert_eq!(r.mem(R1 + 64, 8), &[2, 0x10, 0, 0, 3, 0x10, 0, 0]);
    assert_eq!(r.mem(R1 + 80, 4), &0x1001u32.to_le_bytes());
    assert_eq!(r.mem(R1 + 84, 4), &0x1001u32.to_le_bytes());
    assert_eq!(r.m(5), 0x1001);
}

#[test]
fn stepping_and_paced_accesses() {
    let r = exec_with::<false>(
        &[
            li(1, R1 + 16),
            s(Inst::Ld64Step {
                d: AReg(0),
                base: MReg(1),
                inc: -2,
            }),
            li(2, R0),
            s(Inst::St64Step {
                s: AReg(0),
                base: MReg(2),
                inc: 3,
            }),
            // Region 1: adjacent 64-bit words are in different elements.
            li(3, R1),
            li(4, R1 + 8),
            s(Inst::Ld2x64Pace {
                d0: AReg(2),
                d1: AReg(4),
                p0: MReg(3),
                p1: MReg(4),
            }),
            // A load and a store in region 0 elements 5 and 0 of region 1.
            li(5, R0 + 0x4000),
            s(Inst::Ldst64Pace {
                d: AReg(6),
                s: AReg(2),
                pl: MReg(3),
                ps: MReg(5),
            }),
        ],
        |_, sh, l| {
            let words: Vec<u8> = (0u64..4).flat_map(|i| (100 + i).to_le_bytes()).collect();
            poke(sh, l, R1, &words);
        },
    );
    r.ok();
    assert_eq!(r.a(0), 102);
    assert_eq!(r.m(1), R1);
    assert_eq!(r.mem(R0, 8), &102u64.to_le_bytes());
    assert_eq!(r.m(2), R0 + 24);
    assert_eq!((r.a(2), r.a(4)), (100, 101));
    // $m3 advanced once by each paced instruction, $m4 once.
    assert_eq!((r.m(3), r.m(4)), (R1 + 16, R1 + 16));
    assert_eq!(r.a(6), 101);
    assert_eq!(r.mem(R0 + 0x4000, 8), &100u64.to_le_bytes());
    assert_eq!(r.m(5), R0 + 0x4008);
}

#[test]
fn bundle_reads_before_writes() {
    // The load writes $a0:1 and the aux copy reads it in the same issue: the copy
    // sees the old value. The store reads $a2 which the aux writes: old value too.
    let r = exec_with::<false>(
        &[
            li(1, R1),
            Word::Bundle(
                Inst::Ld64 {
                    d: AReg(0),
                    base: MReg(1),
                    imm: 0,
                },
                Inst::FMov {
                    d: AReg(2),
                    a: AReg(0),
                    pair: true,
                },
            ),
            Word::Bundle(
                Inst::St32 {
                    s: AReg(2),
                    base: MReg(1),
                    imm: 4,
                },
                Inst::FMov {
                    d: AReg(2),
                    a: AReg(0),
                    pair: false,
                },
            ),
        ],
        |c, sh, l| {
            c.a[0] = 11;
            c.a[1] = 12;
            poke(sh, l, R1, &[7, 0, 0, 0, 8, 0, 0, 0]);
        },
    );
    r.ok();
    assert_eq!((r.a(0), r.a(1)), (7, 8));
    assert_eq!(r.a(3), 12);
    assert_eq!(r.mem(R1 + 16, 4), &11u32.to_le_bytes());
    assert_eq!(r.a(2), 7);
    // One issue per bundle, two instructions.
    assert_eq!(r.ctx.instructions, r.ctx.issues + 2);
}

#[test]
fn f32_arithmetic() {
    let ops = [
        (FBinOp::Add, 1.5f32, 2.25f32, 3.75f32),
        (FBinOp::Sub, 1.5, 2.25, -0.75),
        (FBinOp::Mul, 1.5, -2.0, -3.0),
        (FBinOp::Max, 1.5, -2.0, 1.5),
        (FBinOp::Min, 1.5, -2.0, -2.0),
    ];
    for (op, x, y, want) in ops {
        let r = exec_with::<false>(
            &[
                s(Inst::FBin {
                    op,
                    vec: FVec::F32,
                    d: AReg(2),
                    a: AReg(0),
                    b: AReg(1),
                }),
                s(Inst::FBin {
                    op,
                    vec: FVec::F32V2,
                    d: AReg(4),
                    a: AReg(6),
                    b: AReg(8),
                }),
            ],
            |c, _, _| {
                set_f(c, 0, x);
                set_f(c, 1, y);
                set_f(c, 6, x);
                set_f(c, 7, y);
                set_f(c, 8, y);
                set_f(c, 9, x);
            },
        );
        r.ok();
        assert_eq!(r.f(2), want, "{op:?}");
        assert_eq!(r.f(4), want, "{op:?} v2 lane 0");
    }
    // Fused multiply-add, one rounding: (1 + e)(1 - e) - 1 = -e^2 exactly, where a
    // rounded product would give 0.
    let e = f32::EPSILON;
    let r = exec_with::<false>(
        &[s(Inst::FMac {
            vec: FVec::F32,
            d: AReg(2),
            a: AReg(0),
            b: AReg(1),
        })],
        |c, _, _| {
            set_f(c, 0, 1.0 + e);
            set_f(c, 1, 1.0 - e);
            set_f(c, 2, -1.0);
        },
    );
    assert_eq!(r.f(2), -(e * e));
    let un = [
        (FUnOp::Exp, 1.0f32, 1.0f32.exp()),
        (FUnOp::Recip, 4.0, 0.25),
        (FUnOp::Rsqrt, 16.0, 0.25),
        (FUnOp::Sqrt, 16.0, 4.0),
        (FUnOp::Neg, 2.0, -2.0),
        (FUnOp::Abs, -2.0, 2.0),
    ];
    for (op, x, want) in un {
        let r = exec_with::<false>(
            &[s(Inst::FUn {
                op,
                d: AReg(1),
                a: AReg(0),
            })],
            |c, _, _| set_f(c, 0, x),
        );
        r.ok();
        assert_eq!(r.f(1), want, "{op:?}");
        // exp, recip, rsqrt, sqrt hold the slot for two issues (12 cycles).
        let slow = matches!(op, FUnOp::Exp | FUnOp::Recip | FUnOp::Rsqrt | FUnOp::Sqrt);
        assert_eq!(r.ctx.clock, if slow { 18 } else { 12 }, "{op:?}");
    }
}

#[test]
fn tanh_f32_and_f16v2() {
    // Expected bits are the correctly rounded tanh: tanh(0.5) = 0.4621171572...,
    // tanh(-3) = -0.9950547536..., tanh(10) = 1 - 4.1e-9 (1.0 in f32).
    let f32_cases = [
        (0.5f32, 0x3eec_9a9fu32),
        (-3.0, 0xbf7e_bbe9),
        (10.0, 0x3f80_0000),
        (-0.0, 0x8000_0000),
    ];
    for (x, want) in f32_cases {
        let r = exec_with::<false>(
            &[s(Inst::FUn {
                op: FUnOp::Tanh,
                d: AReg(1),
                a: AReg(0),
            })],
            |c, _, _| set_f(c, 0, x),
        );
        r.ok();
        assert_eq!(r.a(1), want, "f32tanh {x}");
        // Five issues for the tanh and one for the exit, six cycles apart.
        assert_eq!(r.ctx.clock, 36, "f32tanh {x}");
    }
    // f16 lanes from the f32 tanh, rounded to nearest: 0.46211716 * 2^12 =
    // 1892.83 -> 1893 * 2^-12 (0x3765); -0.99505478 * 2^11 = -2037.87 -> -2038 *
    // 2^-11 (0xbbf6); tanh(1) = 0.76159418 * 2^11 = 1559.75 -> 1560 (0x3a18);
    // tanh(10) rounds to 1.0 (0x3c00).
    let r = exec_with::<false>(
        &[
            s(Inst::F16v2Tanh {
                d: AReg(2),
                a: AReg(0),
            }),
            s(Inst::F16v2Tanh {
                d: AReg(3),
                a: AReg(1),
            }),
        ],
        |c, _, _| {
            c.a[0] = hbits(0.5) | (hbits(-3.0) << 16);
            c.a[1] = hbits(1.0) | (hbits(10.0) << 16);
        },
    );
    r.ok();
    assert_eq!(r.a(2), 0xbbf6_3765);
    assert_eq!(r.a(3), 0x3c00_3a18);
    // One issue each, like every other f16 vector instruction: three issues.
    assert_eq!(r.ctx.clock, 18);
}

#[test]
fn exp_f16v2() {
    // f16 lanes from the f32 exp, rounded to nearest: exp(-1) = 0.36787944 ->
    // 0x35e3, exp(-8) = 3.3546e-4 -> 0x0d7f; exp(-20) is below half the smallest
    // subnormal (+0) and exp(12) = 162,755 above the f16 range (+inf).
    let r = exec_with::<false>(
        &[
            s(Inst::F16v2Exp {
                d: AReg(2),
                a: AReg(0),
            }),
            s(Inst::F16v2Exp {
                d: AReg(3),
                a: AReg(1),
            }),
        ],
        |c, _, _| {
            c.a[0] = hbits(0.0) | (hbits(-1.0) << 16);
            c.a[1] = hbits(-8.0) | (hbits(-20.0) << 16);
        },
    );
    r.ok();
    assert_eq!(r.a(2), 0x35e3_3c00);
    assert_eq!(r.a(3), 0x0000_0d7f);
    // One issue each, as f16v2tanh: three issues with the exit.
    assert_eq!(r.ctx.clock, 18);
    let r = exec_with::<false>(
        &[s(Inst::F16v2Exp {
            d: AReg(1),
            a: AReg(0),
        })],
        |c, _, _| c.a[0] = hbits(12.0) | (hbits(2.5) << 16),
    );
    r.ok();
    assert_eq!(r.a(1), 0x4a17_7c00);
    // `f16_exp_issues` holds the slot: three issues and the exit.
    let r = exec_env::<false>(
        &[s(Inst::F16v2Exp {
            d: AReg(1),
            a: AReg(0),
        })],
        |_, _, _| {},
        |e| e.f16_exp_issues = 3,
    );
    r.ok();
    assert_eq!(r.ctx.clock, 24);
}

#[test]
fn f16_rounding() {
    let tiny = 2f32.powi(-11);
    // (a, b, op, expected) per lane.
    let cases = [
        // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: to even, 1.
        (1.0f32, tiny, FBinOp::Add, 1.0f32),
        // 1 + 3 * 2^-11 is a tie between 1 + 2^-10 and 1 + 2^-9: to even, 1 + 2^-9.
        (1.0, 3.0 * tiny, FBinOp::Add, 1.0 + 4.0 * tiny),
        // Overflow to infinity.
        (60000.0, 60000.0, FBinOp::Add, f32::INFINITY),
        (65504.0, 16.0, FBinOp::Add, f32::INFINITY),
        (65504.0, 15.0, FBinOp::Add, 65504.0),
        (3.0, 0.5, FBinOp::Mul, 1.5),
        (-2.0, 5.0, FBinOp::Max, 5.0),
        (-2.0, 5.0, FBinOp::Min, -2.0),
        (1.0, 0.25, FBinOp::Sub, 0.75),
    ];
    for (x, y, op, want) in cases {
        let r = exec_with::<false>(
            &[
                s(Inst::FBin {
                    op,
                    vec: FVec::F16V4,
                    d: AReg(4),
                    a: AReg(0),
                    b: AReg(2),
                }),
                s(Inst::FBin {
                    op,
                    vec: FVec::F16V2,
                    d: AReg(6),
                    a: AReg(0),
                    b: AReg(2),
                }),
            ],
            |c, _, _| {
                set_h4(c, 0, [x, y, x, x]);
                // y is exactly representable in f16 in every case above except
                // 3 * 2^-11, whose f16 value is exact too.
                set_h4(c, 2, [y, x, y, y]);
            },
        );
        r.ok();
        assert_eq!(r.h(4, 0), want, "{x} {op:?} {y}");
        assert_eq!(r.h(4, 3), want, "{x} {op:?} {y} lane 3");
        assert_eq!(r.h(6, 0), want, "{x} {op:?} {y} v2");
    }
    // f16 multiply-accumulate rounds once: 1 + 2^-11 * 1 + ... as a tie to even.
    let r = exec_with::<false>(
        &[s(Inst::FMac {
            vec: FVec::F16V4,
            d: AReg(4),
            a: AReg(0),
            b: AReg(2),
        })],
        |c, _, _| {
            set_h4(c, 0, [tiny, 3.0 * tiny, 2.0, 300.0]);
            set_h4(c, 2, [1.0, 1.0, 3.0, 300.0]);
            set_h4(c, 4, [1.0, 1.0, 1.0, 0.0]);
        },
    );
    assert_eq!(
        [r.h(4, 0), r.h(4, 1), r.h(4, 2), r.h(4, 3)],
        [1.0, 1.0 + 4.0 * tiny, 7.0, f32::INFINITY]
    );
}

/// `sort4x16lo/hi` move 16-bit halves as bits (a NaN payload included), `$aA`'s
/// into the low half; with `$aD` one of the sources, both are read first.
#[test]
fn sort4x16_interleaves_halves() {
    let r = exec_with::<false>(
        &[
            s(Inst::Sort4x16 {
                hi: false,
                d: AReg(4),
                a: AReg(0),
                b: AReg(1),
            }),
            s(Inst::Sort4x16 {
                hi: true,
                d: AReg(5),
                a: AReg(0),
                b: AReg(1),
            }),
            s(Inst::Sort4x16 {
                hi: true,
                d: AReg(0),
                a: AReg(0),
                b: AReg(1),
            }),
        ],
        |c, _, _| {
            c.a[0] = 0x7e01_1234;
            c.a[1] = 0xabcd_fc00;
        },
    );
    r.ok();
    assert_eq!(r.a(4), 0xfc00_1234);
    assert_eq!(r.a(5), 0xabcd_7e01);
    assert_eq!(r.a(0), 0xabcd_7e01);
}

#[test]
fn conversions_sums_moves_broadcasts() {
    let r = exec_with::<false>(
        &[
            s(Inst::F16v2ToF32 {
                d: AReg(2),
                a: AReg(0),
            }),
            s(Inst::F32v2ToF16 {
                d: AReg(4),
                a: AReg(6),
            }),
            s(Inst::FSum {
                vec: FVec::F16V4,
                d: AReg(5),
                a: AReg(8),
            }),
            s(Inst::FSum {
                vec: FVec::F32V2,
                d: AReg(10),
                a: AReg(6),
            }),
            s(Inst::FBcast {
                vec: FVec::F16V4,
                d: AReg(12),
                a: AReg(0),
            }),
            s(Inst::FMov {
                d: AReg(14),
                a: AReg(6),
                pair: true,
            }),
        ],
        |c, _, _| {
            c.a[0] = hbits(1.5) | (hbits(-2.0) << 16);
            set_f(c, 6, 1.0 + 2f32.powi(-11));
            set_f(c, 7, 70000.0);
            set_h4(c, 8, [1.0, 2.0, 3.0, 4.5]);
        },
    );
    r.ok();
    assert_eq!((r.f(2), r.f(3)), (1.5, -2.0));
    assert_eq!(r.a(4), hbits(1.0) | (0x7c00 << 16));
    assert_eq!(r.f(5), 10.5);
    assert_eq!(r.f(10), 70001.0);
    assert_eq!(
        (r.a(12), r.a(13)),
        (hbits(1.5) * 0x10001, hbits(1.5) * 0x10001)
    );
    // $a15 is $azero: the pair copy's high half is dropped.
    assert_eq!((r.f(14), r.a(15)), (1.0 + 2f32.powi(-11), 0));
}

#[test]
fn branches_calls_and_repeats() {
    // Code addresses: each single word is 4 bytes from CODE.
    let at = |i: u32| CODE + 4 * i;
    let r = exec(&[
        li(1, 0), // 0
        s(Inst::Brz {
            c: MReg(1),
            target: at(3),
        }), // 1
        li(2, 99), // 2 (skipped)
        s(Inst::Call {
            link: MReg(3),
            target: at(7),
        }), // 3
        s(Inst::Rpti { count: 5, body: 1 }), // 4
        s(Inst::IntImm {
            op: IntOp::Add,
            d: MReg(4),
            a: MReg(4),
            imm: 3,
        }), // 5
        s(Inst::Bri { target: at(9) }), // 6
        li(5, 42), // 7: subroutine
        s(Inst::Br { a: MReg(3) }), // 8
        s(Inst::Rpti { count: 0, body: 1 }), // 9: zero count skips
        li(6, 1), // 10 (skipped)
        li(7, 1), // 11
    ]);
    r.ok();
    assert_eq!(r.m(2), 0);
    assert_eq!(r.m(3), at(4));
    assert_eq!(r.m(4), 15);
    assert_eq!(r.m(5), 42);
    assert_eq!(r.m(6), 0);
    assert_eq!(r.m(7), 1);
}

#[test]
fn repeat_limits() {
    let body = s(Inst::IntImm {
        op: IntOp::Add,
        d: MReg(2),
        a: MReg(2),
        imm: 1,
    });
    let rpt = |n| {
        exec_with::<false>(
            &[
                s(Inst::Rpt {
                    count: MReg(1),
                    body: 1,
                }),
                body,
            ],
            move |c, _, _| c.m[1] = n,
        )
    };
    let ok = rpt(4095);
    ok.ok();
    assert_eq!(ok.m(2), 4095);
    let bad = rpt(4096);
    let (kind, cause, pc) = bad.fault();
    assert_eq!(kind, FaultKind::InvalidOperand);
    assert!(cause.contains("4096"), "{cause}");
    assert_eq!(pc, CODE);
    let immediate = exec(&[
        s(Inst::Rpti {
            count: 4095,
            body: 1,
        }),
        body,
    ]);
    immediate.ok();
    // A control instruction in the body faults when it is reached.
    let ctl = exec(&[
        s(Inst::Rpti { count: 3, body: 2 }),
        body,
        s(Inst::Bri { target: CODE }),
    ]);
    let (kind, cause, pc) = ctl.fault();
    assert_eq!(kind, FaultKind::InvalidInstruction);
    assert!(cause.contains("repeat"), "{cause}");
    assert_eq!(pc, CODE + 8);
    assert_eq!(ctl.m(2), 1);
    // So does exit.
    let (kind, _, _) = exec(&[s(Inst::Rpti { count: 2, body: 1 })]).fault();
    assert_eq!(kind, FaultKind::InvalidInstruction);
}

#[test]
fn memory_address_faults() {
    let cases: Vec<(Vec<Word>, &str)> = vec![
        (
            vec![
                li(1, R1 + 2),
                s(Inst::Ld64Step {
                    d: AReg(0),
                    base: MReg(1),
                    inc: 1,
                }),
            ],
            "not 8-byte aligned",
        ),
        (
            vec![
                li(1, 0x4_0000),
                s(Inst::Ld32M {
                    d: MReg(2),
                    base: MReg(1),
                    imm: 0,
                }),
            ],
            "outside SRAM",
        ),
        (
            vec![
                li(1, 0xE_7FFC),
                s(Inst::Ld64 {
                    d: AReg(0),
                    base: MReg(1),
                    imm: 1,
                }),
            ],
            "outside SRAM",
        ),
        (
            vec![
                li(1, R0),
                s(Inst::Ld128 {
                    d: AReg(0),
                    base: MReg(1),
                    imm: 0,
                }),
            ],
            "interleaved",
        ),
        (
            vec![
                li(1, R0),
                s(Inst::AmpLoadW {
                    base: MReg(1),
                    quad: 0,
                }),
            ],
            "interleaved",
        ),
        (
            vec![
                li(1, R1 + 8),
                s(Inst::Ld128 {
                    d: AReg(0),
                    base: MReg(1),
                    imm: 0,
                }),
            ],
            "not 16-byte aligned",
        ),
        (
            vec![
                li(1, R1 + 4),
                s(Inst::St64 {
                    s: AReg(0),
                    base: MReg(1),
                    imm: 0,
                }),
            ],
            "not 8-byte aligned",
        ),
    ];
    for (words, want) in cases {
        let r = exec(&words);
        let (kind, cause, pc) = r.fault();
        assert_eq!(kind, FaultKind::InvalidMemoryAddress, "{words:?}");
        assert!(cause.contains(want), "{cause} / {want}");
        assert_eq!(pc, CODE + 4);
    }
    // Address arithmetic never wraps: 0xffff_f000 + 4095 * 8 is past 2^32.
    let r = exec_with::<false>(
        &[s(Inst::Ld64 {
            d: AReg(0),
            base: MReg(1),
            imm: 4095,
        })],
        |c, _, _| c.m[1] = 0xffff_f000,
    );
    assert_eq!(r.fault().0, FaultKind::InvalidMemoryAddress);
}

#[test]
fn element_conflicts_in_both_regions() {
    let pace = s(Inst::Ld2x64Pace {
        d0: AReg(0),
        d1: AReg(2),
        p0: MReg(1),
        p1: MReg(2),
    });
    let run = |p0: u32, p1: u32| {
        exec_with::<false>(&[pace], move |c, _, _| {
            c.m[1] = p0;
            c.m[2] = p1;
        })
    };
    // Region 0: 16 KiB elements.
    assert_eq!(run(R0, R0 + 0x3ff8).fault().0, FaultKind::MemoryConflict);
    run(R0, R0 + 0x4000).ok();
    // Region 1: even/odd 64-bit words of a 32 KiB pair alternate elements.
    run(R1, R1 + 8).ok();
    assert_eq!(run(R1, R1 + 16).fault().0, FaultKind::MemoryConflict);
    run(R1, R1 + 0x8000).ok();
    run(R0, R1).ok();
    // Three accesses of ld2xst64pace: the store conflicting with either load.
    let three = s(Inst::Ld2xSt64Pace {
        d0: AReg(0),
        d1: AReg(2),
        s: AReg(4),
        p0: MReg(1),
        p1: MReg(2),
        ps: MReg(3),
    });
    let run3 = |ps: u32| {
        exec_with::<false>(&[three], move |c, _, _| {
            c.m[1] = R1;
            c.m[2] = R1 + 8;
            c.m[3] = ps;
        })
    };
    let (kind, cause, _) = run3(R1 + 24).fault();
    assert_eq!(kind, FaultKind::MemoryConflict);
    assert!(cause.contains("element"), "{cause}");
    run3(R0).ok();
    // ldst64pace in region 0.
    let ldst = s(Inst::Ldst64Pace {
        d: AReg(0),
        s: AReg(2),
        pl: MReg(1),
        ps: MReg(2),
    });
    let r = exec_with::<false>(&[ldst], |c, _, _| {
        c.m[1] = R0;
        c.m[2] = R0 + 8;
    });
    assert_eq!(r.fault().0, FaultKind::MemoryConflict);
}

/// The strided forms advance their first pointer by `8 * m[stride]` (signed) and
/// the others by 8, after the same element checks as the plain forms.
#[test]
fn strided_pace_loads() {
    // ld2xst64pace with a stride of 5 atoms: loads at p0 and p1, the store at ps.
    let w = s(Inst::Ld2xSt64PaceStride {
        d0: AReg(0),
        d1: AReg(2),
        s: AReg(4),
        p0: MReg(1),
        p1: MReg(2),
        ps: MReg(3),
        stride: MReg(9),
    });
    let r = exec_with::<false>(&[w], |c, sh, l| {
        c.m[1] = R1;
        c.m[2] = R1 + 0x8000;
        c.m[3] = R0;
        c.m[9] = 5;
        c.a[4] = 0x1111_2222;
        c.a[5] = 0x3333_4444;
        poke(sh, l, R1, &0x0102_0304_0506_0708u64.to_le_bytes());
        poke(sh, l, R1 + 0x8000, &0x1112_1314_1516_1718u64.to_le_bytes());
    });
    r.ok();
    assert_eq!(r.m(1), R1 + 40);
    assert_eq!(r.m(2), R1 + 0x8008);
    assert_eq!(r.m(3), R0 + 8);
    assert_eq!((r.a(0), r.a(1)), (0x0506_0708, 0x0102_0304));
    assert_eq!((r.a(2), r.a(3)), (0x1516_1718, 0x1112_1314));
    assert_eq!(r.mem(R0, 8), &0x3333_4444_1111_2222u64.to_le_bytes());

    // A negative stride walks back; one past the address space faults.
    let with_m = |w: Word, regs: &[(usize, u32)]| {
        let regs = regs.to_vec();
        exec_with::<false>(&[w], move |c, _, _| {
            for (r, v) in regs {
                c.m[r] = v;
            }
        })
    };
    let back = s(Inst::Ld64Stride {
        d: AReg(0),
        base: MReg(1),
        stride: MReg(9),
    });
    let r = with_m(back, &[(1, R1 + 64), (9, (-3i32) as u32)]);
    r.ok();
    assert_eq!(r.m(1), R1 + 40);
    let r = with_m(back, &[(1, R0), (9, (-(R0 as i32 / 8) - 1) as u32)]);
    assert_eq!(r.fault().0, FaultKind::InvalidMemoryAddress);

    // The strided forms check elements like the plain ones.
    let two = s(Inst::Ld2x64PaceStride {
        d0: AReg(0),
        d1: AReg(2),
        p0: MReg(1),
        p1: MReg(2),
        stride: MReg(9),
    });
    let r = with_m(two, &[(1, R1), (2, R1 + 16), (9, 4)]);
    assert_eq!(r.fault().0, FaultKind::MemoryConflict);
    let ldst = s(Inst::Ldst64PaceStride {
        d: AReg(0),
        s: AReg(2),
        pl: MReg(1),
        ps: MReg(2),
        stride: MReg(9),
    });
    let r = with_m(ldst, &[(1, R1), (2, R1 + 8), (9, 4)]);
    r.ok();
    assert_eq!((r.m(1), r.m(2)), (R1 + 32, R1 + 16));
}

#[test]
fn context_rules() {
    // A worker may not run supervisor instructions.
    let (kind, cause, _) = exec(&[s(Inst::SyncGlobal)]).fault();
    assert_eq!(kind, FaultKind::InvalidInstruction);
    assert!(cause.contains("supervisor-only"), "{cause}");
    // The supervisor has no $a registers and no aux pipe.
    let sup = |w: Word| exec_with::<true>(&[w], |_, _, _| {}).fault().0;
    assert_eq!(
        sup(s(Inst::FMov {
            d: AReg(0),
            a: AReg(1),
            pair: false
        })),
        FaultKind::InvalidInstruction
    );
    assert_eq!(sup(to_a(0, 1)), FaultKind::InvalidInstruction);
    // Undecodable bytes fault only when executed.
    let r = exec_with::<false>(&[li(1, 0), s(Inst::Nop), s(Inst::Nop)], |_, sh, l| {
        poke(sh, l, CODE + 4, &[0, 0, 0, 0]);
        let image_like = sh.mem.clone();
        Arc::make_mut(&mut sh.prog).redecode(&image_like, l.start, CODE + 4, 4);
    });
    let (kind, cause, pc) = r.fault();
    assert_eq!((kind, pc), (FaultKind::InvalidInstruction, CODE + 4));
    assert!(cause.contains("decode"), "{cause}");
}

#[test]
fn program_counter_faults() {
    // Jump into data.
    let (kind, cause, pc) = exec(&[li(1, R1), s(Inst::Br { a: MReg(1) })]).fault();
    assert_eq!((kind, pc), (FaultKind::InvalidProgramCounter, R1));
    assert!(cause.contains("executable region"), "{cause}");
    // Misaligned register target.
    let (kind, _, pc) = exec(&[li(1, CODE + 2), s(Inst::Br { a: MReg(1) })]).fault();
    assert_eq!((kind, pc), (FaultKind::InvalidProgramCounter, CODE + 4));
    // Falling off the end of the code segment (region 0 but not code).
    let (kind, cause, _) = exec(&[s(Inst::Bri { target: 0x7_0000 })]).fault();
    assert_eq!(kind, FaultKind::InvalidProgramCounter);
    assert!(cause.contains("segment"), "{cause}");
}

#[test]
fn self_modifying_code_is_redecoded() {
    // Overwrite the word at +16 (a `setzi $m5, 1`) with `setzi $m5, 2`.
    let patch = encode(&[li(5, 2)]).unwrap();
    let word = u32::from_le_bytes([patch[0], patch[1], patch[2], patch[3]]);
    let r = exec(&[
        li(1, CODE + 20),
        li(2, word >> 12),
        s(Inst::IntImm {
            op: IntOp::Shl,
            d: MReg(2),
            a: MReg(2),
            imm: 12,
        }),
        s(Inst::IntImm {
            op: IntOp::Or,
            d: MReg(2),
            a: MReg(2),
            imm: (word & 0xfff) as u16,
        }),
        s(Inst::St32M {
            s: MReg(2),
            base: MReg(1),
            imm: 0,
        }),
        li(5, 1),
    ]);
    r.ok();
    assert_eq!(r.m(5), 2);
}

#[test]
fn amp_step_semantics() {
    // Weights W[k][j] = k + j/16, loaded by amploadw; one row x = (1, 0.5, ...).
    let mut w = Vec::new();
    for k in 0..16 {
        for j in 0..16 {
            w.extend_from_slice(&f16::from_f32(k as f32 + j as f32 / 16.0).to_le_bytes());
        }
    }
    let mut words = vec![li(1, R1)];
    for q in 0..32 {
        words.push(s(Inst::AmpLoadW {
            base: MReg(1),
            quad: q,
        }));
    }
    // The lead row: its inputs (zeros) make a row nobody reads; its partials
    // (ones) are the next row's.
    for phase in 0..4 {
        words.push(s(Inst::Amp {
            out: AReg(4),
            inp: AReg(6),
            pin: AReg(2),
            phase,
        }));
    }
    // The row x, with zero partials: they go to the row after it.
    for phase in 0..4 {
        words.push(s(Inst::Amp {
            out: AReg(4),
            inp: AReg(0),
            pin: AReg(6),
            phase,
        }));
    }
    // A row of zeros: outputs row x, quarter by quarter.
    let outs = [8u8, 10, 12, 0];
    for (phase, &o) in outs.iter().enumerate() {
        words.push(Word::Bundle(
            Inst::Nop,
            Inst::Amp {
                out: AReg(o),
                inp: AReg(6),
                pin: AReg(6),
                phase: phase as u8,
            },
        ));
    }
    let r = exec_with::<false>(&words, |c, sh, l| {
        poke(sh, l, R1, &w);
        set_h4(c, 0, [1.0, 0.5, 0.25, 2.0]);
        set_h4(c, 2, [1.0, 1.0, 1.0, 1.0]);
    });
    r.ok();
    assert_eq!(r.m(1), R1 + 512);
    let x: [f32; 16] = std::array::from_fn(|k| [1.0, 0.5, 0.25, 2.0][k % 4]);
    for j in 0..16 {
        // Every accumulator starts from its partial of 1.0, then the products.
        let mut acc = 1f32;
        for (k, xk) in x.iter().enumerate() {
            acc += xk * (k as f32 + j as f32 / 16.0);
        }
        let reg = [8u8, 10, 12, 0][j / 4];
        let got = r.h(reg, (j % 4) as u32);
        assert_eq!(got, f16::from_f32(acc).to_f32(), "column {j}");
    }
}

#[test]
fn accumulators_sum_f16_lanes_and_shift_out_in_pairs() {
    let acc = |a, quad| s(Inst::F16Acc { a: AReg(a), quad });
    let gina = |d| s(Inst::F32v2Gina { d: AReg(d) });
    // Lanes 0..7 of $a0:3 are 1..8; $a4:5 holds 0.5 in every lane. Two f16v8acc and
    // one f16v4acc: accumulators 0..4 = 2*(1..4) + 0.5, 4..8 = 2*(5..8), then four
    // gina read them out two by two, and the fifth reads the zeros shifted in.
    let r = exec_with::<false>(
        &[
            acc(0, true),
            acc(0, true),
            acc(4, false),
            gina(6),
            gina(8),
            gina(10),
            gina(12),
            gina(14),
        ],
        |c, _, _| {
            for (i, w) in c.a[..4].iter_mut().enumerate() {
                let lo = 2 * i as u32 + 1;
                *w = hbits(lo as f32) | (hbits((lo + 1) as f32) << 16);
            }
            c.a[4] = hbits(0.5) | (hbits(0.5) << 16);
            c.a[5] = c.a[4];
        },
    );
    r.ok();
    let f = |i: u8| f32::from_bits(r.a(i));
    let got: Vec<f32> = (6..14).map(f).collect();
    assert_eq!(got, [2.5, 4.5, 6.5, 8.5, 10.0, 12.0, 14.0, 16.0]);
    // ($a15 is the zero register.)
    assert_eq!(r.a(14), 0);
    // One issue each, plus the exit.
    assert_eq!(r.ctx.clock, 54);
}

#[test]
fn f16_gina_rounds_each_accumulator_to_f16_and_shifts_like_f32_gina() {
    let acc = |a| {
        s(Inst::F16Acc {
            a: AReg(a),
            quad: false,
        })
    };
    let gina16 = |d| s(Inst::F16v2Gina { d: AReg(d) });
    let gina32 = |d| s(Inst::F32v2Gina { d: AReg(d) });
    // $a0:1 holds 1, 2^-11, 3, 65504: summed twice, accumulators 0..4 are 2, 2^-10,
    // 6 and 131008 (above f16's largest). f16v2gina reads 0 and 1, f32v2gina then
    // reads what moved down (2 and 3), and the next f16v2gina reads zeros.
    let r = exec_with::<false>(
        &[acc(0), acc(0), gina16(4), gina32(6), gina16(8)],
        |c, _, _| {
            c.a[0] = hbits(1.0) | (hbits(2f32.powi(-11)) << 16);
            c.a[1] = hbits(3.0) | (hbits(65504.0) << 16);
        },
    );
    r.ok();
    assert_eq!(r.h(4, 0), 2.0);
    assert_eq!(r.h(4, 1), 2f32.powi(-10));
    assert_eq!(f32::from_bits(r.a(6)), 6.0);
    assert_eq!(f32::from_bits(r.a(7)), 131008.0);
    assert_eq!(r.a(8), 0);
    // One issue each, plus the exit.
    assert_eq!(r.ctx.clock, 36);
}

#[test]
fn f16_cmac_adds_exact_lane_products_into_the_accumulators() {
    let cmac = |a, b| {
        s(Inst::F16v4Cmac {
            a: AReg(a),
            b: AReg(b),
        })
    };
    let gina = |d| s(Inst::F32v2Gina { d: AReg(d) });
    // $a0:1 = (1 + 2^-10, 3, -2, 65504), $a2:3 = (1 + 2^-10, 0.5, 0.25, 65504): the
    // products 1 + 2^-9 + 2^-20 (exact in f32, not in f16), 1.5, -0.5 and 65504^2
    // (above f16's range), added twice.
    let r = exec_with::<false>(&[cmac(0, 2), cmac(0, 2), gina(4), gina(6)], |c, _, _| {
        let x = 1.0 + 2f32.powi(-10);
        c.a[0] = hbits(x) | (hbits(3.0) << 16);
        c.a[1] = hbits(-2.0) | (hbits(65504.0) << 16);
        c.a[2] = hbits(x) | (hbits(0.5) << 16);
        c.a[3] = hbits(0.25) | (hbits(65504.0) << 16);
    });
    r.ok();
    let f = |i: u8| f32::from_bits(r.a(i));
    let x = 1.0 + 2f32.powi(-10);
    assert_eq!(f(4), 2.0 * (x * x));
    assert_eq!(f(5), 3.0);
    assert_eq!(f(6), -1.0);
    assert_eq!(f(7), 2.0 * 65504.0 * 65504.0);
    // One issue each, plus the exit.
    assert_eq!(r.ctx.clock, 30);
}

#[test]
fn parallel_concatenation_is_the_concatenation() {
    // Fixed-seed parts, some empty, in a pool of one and of several threads.
    use crate::{TraceEvent, TraceKind, concat_parallel};
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut next = |n: u64| rng.random_range(0..n);
    let mut tag = 0u16;
    let parts: Vec<Vec<TraceEvent>> = (0..40)
        .map(|p| {
            (0..next(50) * u64::from(p % 5 != 0))
                .map(|_| {
                    tag += 1;
                    TraceEvent {
                        cycle: next(1000),
                        tile: Some(p),
                        context: None,
                        kind: TraceKind::Mark { tag },
                    }
                })
                .collect()
        })
        .collect();
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        let out = pool.install(|| concat_parallel(parts.clone()));
        assert_eq!(out, parts.concat(), "{threads} threads");
    }
    assert!(concat_parallel(Vec::new()).is_empty());
}

/// `f8v4tof16` on every FP8 code, at several scales, against
/// `tessera_machine::fp8::decode` rounded to f16: the simulator's own decoding
/// (`fp8.rs`) and the machine's agree bit for bit, NaN apart (any f16 NaN).
#[test]
fn f8v4tof16_decodes_every_code_as_the_machine_does() {
    use tessera_machine::fp8;
    for scale in [0i8, 1, -1, 5, -9, 17, -24, 31, -31, 127, -128] {
        for group in 0..64u8 {
            let codes = [4 * group, 4 * group + 1, 4 * group + 2, 4 * group + 3];
            let r = exec_with::<false>(
                &[
                    s(Inst::UputFpScl { a: AReg(1) }),
                    s(Inst::F8v4ToF16 {
                        d: AReg(2),
                        a: AReg(0),
                    }),
                ],
                |c, _, _| {
                    c.a[0] = u32::from_le_bytes(codes);
                    // Only the low byte is the scale.
                    c.a[1] = u32::from(scale as u8) | 0x5a5a_5a00;
                },
            );
            r.ok();
            let out = u64::from(r.a(2)) | (u64::from(r.a(3)) << 32);
            for (lane, &code) in codes.iter().enumerate() {
                let got = (out >> (16 * lane)) as u16;
                let want = fp8::decode(code, scale);
                if want.is_nan() {
                    assert!(f16::from_bits(got).is_nan(), "code {code:#04x}: {got:#06x}");
                } else {
                    assert_eq!(
                        got,
                        f16::from_f32(want).to_bits(),
                        "code {code:#04x} scale {scale}: {want}"
                    );
                }
            }
        }
    }
    // A worker starts at scale 0: 0x38 is 0.5 there, 0xc0 is -1, 0x80 NaN.
    let r = exec_with::<false>(
        &[s(Inst::F8v4ToF16 {
            d: AReg(4),
            a: AReg(0),
        })],
        |c, _, _| c.a[0] = 0x0080_c038,
    );
    r.ok();
    assert_eq!(r.a(4), 0xbc00_3800);
    assert!(f16::from_bits(r.a(5) as u16).is_nan());
    assert_eq!(r.a(5) >> 16, 0);
    // One issue each.
    assert_eq!(r.ctx.clock, 12);
}

/// `f16v8tof8` on every f16 bit pattern, at several register scales, against
/// `tessera_machine::fp8::encode`: the register multiplies by `2^$FP_SCL`, so a
/// tensor of metadata scale `s` is encoded at register scale `-s`.
#[test]
fn f16v8tof8_encodes_every_f16_as_the_machine_does() {
    use tessera_machine::fp8;
    const IN: u32 = 0x8_0000;
    const OUT: u32 = 0xA_0000;
    const CHUNK: u32 = 4096;
    // Per group of eight: a 128-bit load, the pointer step, the conversion and
    // the store.
    let body = [
        s(Inst::Ld128 {
            d: AReg(0),
            base: MReg(1),
            imm: 0,
        }),
        s(Inst::IntImm {
            op: IntOp::Add,
            d: MReg(1),
            a: MReg(1),
            imm: 16,
        }),
        s(Inst::F16v8ToF8 {
            d: AReg(4),
            a: AReg(0),
        }),
        s(Inst::St64Step {
            s: AReg(4),
            base: MReg(2),
            inc: 1,
        }),
    ];
    let mut words = vec![
        li(1, IN),
        li(2, OUT),
        li(3, CHUNK / 8),
        s(Inst::UputFpScl { a: AReg(8) }),
        s(Inst::Rpt {
            count: MReg(3),
            body: 4,
        }),
    ];
    words.extend(body);
    for scale in [0i8, 3, -3, 12, -12, 20, -20, 31, -31] {
        for chunk in 0..(65536 / CHUNK) {
            let halves: Vec<u16> = (0..CHUNK).map(|i| (chunk * CHUNK + i) as u16).collect();
            let bytes: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
            let r = exec_with::<false>(&words, |c, sh, layout| {
                poke(sh, layout, IN, &bytes);
                c.a[8] = u32::from(scale as u8);
            });
            r.ok();
            let got = r.mem(OUT, CHUNK as usize);
            for (i, &h) in halves.iter().enumerate() {
                let want = fp8::encode(f16::from_bits(h).to_f32(), -scale);
                assert_eq!(
                    got[i],
                    want,
                    "f16 {h:#06x} ({}) at register scale {scale}",
                    f16::from_bits(h)
                );
            }
        }
    }
}

/// A repeat body of AMP feeder bundles (one row: three plain issues and a
/// strided one) after `lead` filler words, on pointers `$m1`, `$m2`, `$m3`,
/// stride `$m9`, count `$m10`. `exec_env` runs it through the fast paths and
/// through the general path alone, and they must agree on everything: how the
/// repeat ends, where, at what clock, with what in registers and memory.
fn feeder_rows(lead: usize) -> Vec<Word> {
    // `lead` is even, and the nop puts the body on an 8-byte boundary.
    let mut words = vec![s(Inst::Nop); lead + 1];
    words.push(s(Inst::Rpt {
        count: MReg(10),
        body: 4,
    }));
    for phase in 0..4u8 {
        let (d0, d1, sv, p0, p1, ps) = (AReg(0), AReg(2), AReg(4), MReg(1), MReg(2), MReg(3));
        let main = if phase == 3 {
            Inst::Ld2xSt64PaceStride {
                d0,
                d1,
                s: sv,
                p0,
                p1,
                ps,
                stride: MReg(9),
            }
        } else {
            Inst::Ld2xSt64Pace {
                d0,
                d1,
                s: sv,
                p0,
                p1,
                ps,
            }
        };
        let aux = Inst::Amp {
            out: AReg(4),
            inp: AReg(0),
            pin: AReg(2),
            phase,
        };
        words.push(Word::Bundle(main, aux));
    }
    words
}

/// Fills memory from `R0` and `R1` (64 KiB each) with small f16 values and the
/// weights with others, so every row's products differ.
fn feeder_data(sh: &mut Shared, l: &Layout) {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        f16::from_f32(((x >> 40) % 512) as f32 / 256.0 - 1.0)
    };
    for base in [R0, R1] {
        let bytes: Vec<u8> = (0..0x8000).flat_map(|_| next().to_le_bytes()).collect();
        poke(sh, l, base, &bytes);
    }
    for row in sh.weights.iter_mut() {
        for w in row.iter_mut() {
            *w = next().to_f32();
        }
    }
}

#[test]
fn feeder_repeat_bodies_agree_with_the_general_path() {
    let end = Machine::c600().sram_end();
    let run = |lead: usize, regs: [u32; 5], tweak: &dyn Fn(&mut Env)| {
        exec_env::<false>(
            &feeder_rows(lead),
            |c, sh, l| {
                feeder_data(sh, l);
                [c.m[1], c.m[2], c.m[3], c.m[9], c.m[10]] = regs;
            },
            tweak,
        )
    };
    let rows = CODE + 8;
    // Whole repeats, with and without AMP cycles beyond the issue.
    for extra in [0, 3] {
        let r = run(0, [R1, R1 + 0x8000, R0, 5, 300], &|e| e.amp_extra = extra);
        r.ok();
        assert_eq!(r.m(1), R1 + 300 * 64);
        assert_eq!(r.m(3), R0 + 300 * 32);
    }
    // The second load runs off the end of memory at the 39th issue (row 9, bundle 2).
    let r = run(0, [R1, end - 8 * 38, R0, 5, 100], &|_| {});
    assert_eq!(r.fault().0, FaultKind::InvalidMemoryAddress);
    assert_eq!((r.fault().2, r.m(2)), (rows + 16, end));
    // The strided load enters the other's 16 KiB element at row 255, bundle 1.
    let r = run(0, [R0 + 0x38, R0 + 0x4400, R1, 5, 300], &|_| {});
    assert_eq!(r.fault().0, FaultKind::MemoryConflict);
    assert_eq!((r.fault().2, r.m(1)), (rows + 8, R0 + 0x4000));
    // A negative stride whose next pointer would fall below address zero.
    let r = run(
        0,
        [R0 + 0x100, R1, R1 + 0x8000, (-(R0 as i32) / 8) as u32, 4],
        &|_| {},
    );
    assert_eq!(r.fault().0, FaultKind::InvalidMemoryAddress);
    // The budget running out at every point of a few rows.
    for budget in 150..200 {
        let r = run(0, [R1, R1 + 0x8000, R0, 5, 50], &|e| e.budget = budget);
        assert_eq!(r.fault().0, FaultKind::Timeout, "budget {budget}");
    }
    // Stores that run from data into code (placed after the data here), each
    // redecoded: into the filler before the repeat from row 8, bundle 2 (the
    // run of rows must stop there), then into the repeat instruction, then into
    // the body itself, which row 11 runs. Whatever that makes, all paths agree.
    let code = R0 + 0x1000;
    for count in [10, 11, 12] {
        let r = exec_at::<false>(
            code,
            &feeder_rows(16),
            |c, sh, l| {
                feeder_data(sh, l);
                [c.m[1], c.m[2], c.m[3], c.m[9], c.m[10]] =
                    [R1, R1 + 0x8000, code - 8 * 34, 5, count];
            },
            |_| {},
        );
        match count {
            10 => r.ok(),
            12 => assert_eq!(r.fault().0, FaultKind::InvalidInstruction),
            _ => {}
        }
    }
}
