//! `fp8_to_f16`: widens `n` FP8 bytes (F143, `tessera_machine::fp8`) of one scale
//! to `n` f16, the form the AMP and the vector units read. FP8 weights take half
//! the SRAM and host-link bytes of f16 ones; this is where they become f16 again.
//!
//! The elements are split over the workers in groups of eight (one 64-bit load,
//! two 64-bit stores). Each worker sets `$FP_SCL` to the tensor's scale, then runs
//! a rotated loop of two issues a group, the shape of poplibs' FP8 promotion loop:
//! a load of the next group beside the store of the current group's low half
//! (`ldst64pace`, so `src` and `dst` must be in different memory elements), then
//! the store of its high half; each issue's aux slot converts one half. The first
//! group's load and low half are peeled before the loop and the last group's high
//! half after it, so nothing is read past a worker's share.
//!
//! The layered form (`Fp8ToF16::layered`) reads `src` in a layer loop's weight
//! store, where each iteration's instance lies `$m13` (`exchange::LAYER`) bytes
//! past the first: the supervisor writes the register into every worker's
//! record before starting them, and each worker adds it to its `src`. That keeps
//! one vertex state and one snippet for every layer, as the loop needs, at six
//! supervisor stores and two worker issues a call.

use tessera_isa::{Inst, IntOp};
use tessera_machine::{Timing, fp8};

use crate::asm::{Asm, a, inti, ld32, ld32m, m};
use crate::contract::{Contract, Operand, Role, separate_all};
use crate::layernorm::simple_contract;
use crate::{
    Kernel, KernelCode, KernelError, OperandAddrs, RPT_MAX, StateBuf, VertexState, WORKERS,
    invalid, operand, split,
};

/// Parameters of one FP8 to f16 conversion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fp8ToF16 {
    /// Elements; a positive multiple of 8.
    pub n: u32,
    /// The tensor's scale exponent, as Poplar's metadata holds it: element `i` is
    /// `fp8::decode(src[i], scale)` (then rounded to f16). Within
    /// `fp8::SCALE_MIN..=fp8::SCALE_MAX`.
    pub scale: i8,
    /// `src` is in a layer loop's weight store, at the current layer's offset
    /// (`$m13`) past the address the state names.
    pub layered: bool,
}

/// A worker record: `src`, `dst`, groups of eight, the scale (sign-extended).
const STRIDE: u16 = 16;
/// The layered form's record: the same, then the layer offset the supervisor
/// writes, padded to keep records 8-byte aligned.
const LAYERED_STRIDE: u16 = 24;
/// The record word the layer offset goes to.
const LAYER_WORD: u16 = 4;
/// Supervisor bytes of the layered form: the two `setzi`, a store per worker,
/// `runall` and `sync local`.
const LAYERED_SNIPPET_BYTES: u32 = 4 * (4 + WORKERS);
/// Elements a group: one 64-bit load of FP8 bytes, two 64-bit stores of f16.
const GROUP: u32 = 8;
/// Issues of a worker with at least one group, beyond two a group: six singles
/// (the record, the loop count), the first load with `uput`, the first low half,
/// the `rpt`, the last group's two stores and the `exit`, less the two issues of
/// the group the loop does not run.
const FIXED_ISSUES: u64 = 10;
/// Issues of a worker without a group: the groups load, the branch, the `exit`.
const IDLE_ISSUES: u64 = 3;

impl Fp8ToF16 {
    pub const NAME: &'static str = "fp8_to_f16";

    pub fn new(n: u32, scale: i8) -> Fp8ToF16 {
        Fp8ToF16 {
            n,
            scale,
            layered: false,
        }
    }

    /// The layered form: `src` at the current layer's instance of a store.
    pub fn layered(n: u32, scale: i8) -> Fp8ToF16 {
        Fp8ToF16 {
            layered: true,
            ..Fp8ToF16::new(n, scale)
        }
    }

    fn stride(&self) -> u16 {
        if self.layered { LAYERED_STRIDE } else { STRIDE }
    }

    /// The layered form's snippet, for a state at `state`.
    fn layered_snippet(&self, entry: u32, state: u32) -> Vec<tessera_isa::Word> {
        use tessera_isa::Word;
        let mut w = vec![
            Word::Single(crate::asm::setzi(m(0), entry)),
            Word::Single(crate::asm::setzi(m(1), state)),
        ];
        let words = self.stride() / 4;
        for i in 0..WORKERS as u16 {
            w.push(Word::Single(crate::asm::st32m(
                crate::exchange::LAYER,
                m(1),
                i * words + LAYER_WORD,
            )));
        }
        w.push(Word::Single(Inst::RunAll {
            entry: m(0),
            state: m(1),
            stride: self.stride(),
        }));
        w.push(Word::Single(Inst::SyncLocal));
        w
    }

    /// Each worker's `(first group, groups)`.
    fn shares(&self) -> Vec<(u32, u32)> {
        split(self.n / GROUP)
    }

    fn worker_issues(&self, groups: u32) -> u64 {
        if groups == 0 {
            IDLE_ISSUES
        } else {
            // The layered form loads the offset and adds it.
            FIXED_ISSUES + 2 * u64::from(self.layered) + 2 * u64::from(groups)
        }
    }
}

impl Kernel for Fp8ToF16 {
    fn symbol(&self) -> String {
        let l = if self.layered { "_l" } else { "" };
        format!("{}_n{}_s{}{l}", Self::NAME, self.n, self.scale)
    }

    fn validate(&self) -> Result<(), KernelError> {
        let name = self.symbol();
        if self.n == 0 || !self.n.is_multiple_of(GROUP) {
            return Err(invalid(&name, "n must be a positive multiple of 8"));
        }
        if !(fp8::SCALE_MIN..=fp8::SCALE_MAX).contains(&self.scale) {
            return Err(invalid(
                &name,
                format!(
                    "scale {} outside the metadata range {}..={}",
                    self.scale,
                    fp8::SCALE_MIN,
                    fp8::SCALE_MAX
                ),
            ));
        }
        if u64::from(self.n) * 2 >= 1 << 20 {
            return Err(invalid(&name, "output larger than tile memory"));
        }
        // The loop runs a worker's groups less one.
        let most = (self.n / GROUP).div_ceil(WORKERS);
        if most - 1 > RPT_MAX {
            return Err(invalid(&name, "more than 4096 groups a worker"));
        }
        Ok(())
    }

    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        crate::single_entry(self, code_base, || {
            let mut s = Asm::new(code_base);
            let done = s.label();
            let half = |d: u8, src: u8| Inst::F8v4ToF16 { d: a(d), a: a(src) };
            // Six singles (eight layered), so that the first bundle needs no
            // padding.
            s.i(ld32m(m(3), m(0), 2)); // groups
            s.brz(m(3), done);
            s.i(ld32m(m(2), m(0), 0)); // src
            if self.layered {
                s.i(ld32m(m(5), m(0), LAYER_WORD));
                s.i(Inst::Int {
                    op: IntOp::Add,
                    d: m(2),
                    a: m(2),
                    b: m(5),
                });
            }
            s.i(ld32m(m(4), m(0), 1)); // dst
            s.i(ld32(a(6), m(0), 3)); // scale
            s.i(inti(IntOp::Sub, m(3), m(3), 1));
            s.b(
                Inst::Ld64Step {
                    d: a(0),
                    base: m(2),
                    inc: 1,
                },
                Inst::UputFpScl { a: a(6) },
            );
            s.i(half(2, 0));
            s.rpt(m(3), |b| {
                b.b(
                    Inst::Ldst64Pace {
                        d: a(0),
                        s: a(2),
                        pl: m(2),
                        ps: m(4),
                    },
                    half(2, 1),
                );
                b.b(
                    Inst::St64Step {
                        s: a(2),
                        base: m(4),
                        inc: 1,
                    },
                    half(2, 0),
                );
            });
            s.b(
                Inst::St64Step {
                    s: a(2),
                    base: m(4),
                    inc: 1,
                },
                half(2, 1),
            );
            s.i(Inst::St64Step {
                s: a(2),
                base: m(4),
                inc: 1,
            });
            s.bind(done);
            s.i(Inst::Exit);
            s.finish()
        })
    }

    fn contract(&self) -> Contract {
        let mut ops = vec![
            Operand::new("src", Role::Input, self.n, 8),
            Operand::new("dst", Role::Output, 2 * self.n, 8),
        ];
        // One issue loads `src` and stores `dst`.
        separate_all(&mut ops, &["src", "dst"]);
        let mut c = simple_contract(self, ops, u32::from(self.stride()) * WORKERS);
        if self.layered {
            c.supervisor_bytes = LAYERED_SNIPPET_BYTES;
        }
        c
    }

    fn supervisor(
        &self,
        call: &crate::Call<'_>,
        code_base: u32,
    ) -> Result<Vec<tessera_isa::Word>, KernelError> {
        let _ = code_base;
        let st = self.state(call.addrs)?;
        if !self.layered {
            return crate::runall_snippet(&self.symbol(), call, &st);
        }
        let state = crate::runall_state(&self.symbol(), call, &st)?;
        Ok(self.layered_snippet(call.entry, state))
    }

    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        let src = operand(addrs, &name, "src")?;
        let dst = operand(addrs, &name, "dst")?;
        let mut buf = StateBuf::default();
        for (i, (first, groups)) in self.shares().into_iter().enumerate() {
            buf.u32(src + first * GROUP)
                .u32(dst + first * GROUP * 2)
                .u32(groups)
                .u32(i32::from(self.scale) as u32)
                .pad_to((i + 1) * usize::from(self.stride()));
        }
        Ok(buf.finish(self.stride()))
    }

    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        let slots: Vec<u64> = self
            .shares()
            .into_iter()
            .map(|(_, groups)| self.worker_issues(groups))
            .collect();
        if self.layered {
            // Walked: the stores before `runall` issue one a cycle or wait.
            let words = self.layered_snippet(crate::ESTIMATE_CODE_BASE, 0);
            return crate::supervisor_cycles(t, &words, |_| slots.clone());
        }
        crate::single_shot_cycles(t, slots)
    }
}
