//! `zero_fill`: zeros `runs` runs of `run_bytes` bytes, `stride` bytes apart, in one
//! operand of `(runs − 1)·stride + run_bytes` bytes, leaving the gaps between runs
//! untouched (typically padding rows or columns of a buffer whose other bytes an
//! exchange fills).
//!
//! The runs' 8-byte words are split evenly over the workers as one flat sequence, so
//! a worker's share may start and end inside a run: a first segment (the rest of the
//! run it starts in), whole runs, and a last segment. Each segment is one repeat of
//! `st64step` from `$a0:1`, which is never written and so still holds the zeros the
//! worker started with; the pointer skips the gap after every segment.

use tessera_isa::{Inst, IntOp};
use tessera_machine::Timing;

use crate::asm::{Asm, a, int, inti, ld32m, m};
use crate::contract::{CodeRequirement, Contract, MemClass, Operand, Role};
use crate::{
    Kernel, KernelCode, KernelError, OperandAddrs, RPT_MAX, StateBuf, VertexState, invalid,
    operand, split,
};

/// Parameters of one zero fill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZeroFill {
    pub runs: u32,
    /// Bytes zeroed per run; a positive multiple of 8.
    pub run_bytes: u32,
    /// Distance between run starts; a multiple of 8, at least `run_bytes`.
    pub stride: u32,
}

const STRIDE: u16 = 32;

/// One worker's share: start address offset, first-segment words, whole runs, and
/// last-segment words.
struct Share {
    offset: u32,
    first: u32,
    whole: u32,
    last: u32,
}

impl ZeroFill {
    pub const NAME: &'static str = "zero_fill";

    pub fn new(runs: u32, run_bytes: u32, stride: u32) -> ZeroFill {
        ZeroFill {
            runs,
            run_bytes,
            stride,
        }
    }

    /// Bytes of the `out` operand.
    pub fn bytes(&self) -> u32 {
        (self.runs - 1) * self.stride + self.run_bytes
    }

    /// Whether the runs cover the whole operand (no gaps to preserve).
    fn contiguous(&self) -> bool {
        self.runs == 1 || self.stride == self.run_bytes
    }

    fn shares(&self) -> Vec<Share> {
        let w = self.run_bytes / 8;
        split(self.runs * w)
            .into_iter()
            .map(|(s, n)| {
                if n == 0 {
                    return Share {
                        offset: 0,
                        first: 0,
                        whole: 0,
                        last: 0,
                    };
                }
                let (i0, o0) = (s / w, s % w);
                let (i1, o1) = ((s + n) / w, (s + n) % w);
                let offset = i0 * self.stride + o0 * 8;
                if i0 == i1 {
                    Share {
                        offset,
                        first: n,
                        whole: 0,
                        last: 0,
                    }
                } else {
                    Share {
                        offset,
                        first: w - o0,
                        whole: i1 - i0 - 1,
                        last: o1,
                    }
                }
            })
            .collect()
    }

    fn worker_issues(&self, sh: &Share) -> u64 {
        if sh.first == 0 {
            return 3;
        }
        let w = u64::from(self.run_bytes / 8);
        12 + u64::from(sh.first) + u64::from(sh.last) + u64::from(sh.whole) * (w + 4)
    }
}

fn zero_store(b: &mut Asm) {
    b.i(Inst::St64Step {
        s: a(0),
        base: m(2),
        inc: 1,
    });
}

impl Kernel for ZeroFill {
    fn symbol(&self) -> String {
        format!(
            "{}_n{}_b{}_s{}",
            Self::NAME,
            self.runs,
            self.run_bytes,
            self.stride
        )
    }

    fn validate(&self) -> Result<(), KernelError> {
        let name = self.symbol();
        if self.runs == 0 || self.run_bytes == 0 {
            return Err(invalid(&name, "runs and run_bytes must be positive"));
        }
        if !self.run_bytes.is_multiple_of(8) || !self.stride.is_multiple_of(8) {
            return Err(invalid(
                &name,
                "run_bytes and stride must be multiples of 8",
            ));
        }
        if self.stride < self.run_bytes {
            return Err(invalid(&name, "stride must be at least run_bytes"));
        }
        if self.run_bytes / 8 > RPT_MAX {
            return Err(invalid(&name, "more than 4095 8-byte words per run"));
        }
        let bytes = u64::from(self.runs - 1) * u64::from(self.stride) + u64::from(self.run_bytes);
        if bytes >= 1 << 20 {
            return Err(invalid(&name, "operand larger than tile memory"));
        }
        Ok(())
    }

    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        self.validate()?;
        crate::check_code_base(&self.symbol(), code_base, 8)?;
        let mut s = Asm::new(code_base);
        let done = s.label();
        let whole = s.label();
        let last = s.label();
        // A worker with work always has a first segment, so its size doubles as the
        // has-work flag.
        s.i(ld32m(m(3), m(0), 1)); // first-segment words
        s.brz(m(3), done);
        s.i(ld32m(m(2), m(0), 0)); // pointer
        s.i(ld32m(m(4), m(0), 2)); // whole runs
        s.i(ld32m(m(5), m(0), 3)); // last-segment words
        s.i(ld32m(m(6), m(0), 4)); // words per run
        s.i(ld32m(m(7), m(0), 5)); // gap bytes
        s.rpt(m(3), zero_store);
        s.i(int(IntOp::Add, m(2), m(2), m(7)));
        s.brz(m(4), last);
        s.bind(whole);
        s.rpt(m(6), zero_store);
        s.i(int(IntOp::Add, m(2), m(2), m(7)));
        s.i(inti(IntOp::Sub, m(4), m(4), 1));
        s.brnz(m(4), whole);
        s.bind(last);
        s.rpt(m(5), zero_store);
        s.bind(done);
        s.i(Inst::Exit);
        Ok(KernelCode {
            symbol: self.symbol(),
            code_base,
            entry: code_base,
            words: s.finish(),
        })
    }

    fn contract(&self) -> Contract {
        // With gaps, bytes outside the runs keep their contents: not a full write.
        let role = if self.contiguous() {
            Role::Output
        } else {
            Role::InOut
        };
        Contract {
            kernel: self.symbol(),
            code: CodeRequirement {
                bytes: self.code_bytes().unwrap_or(0),
                align: 8,
                mem_class: MemClass::Executable,
            },
            supervisor_bytes: crate::RUNALL_SNIPPET_BYTES,
            operands: vec![
                Operand::new("out", role, self.bytes(), 8),
                Operand::new("state", Role::State, u32::from(STRIDE) * crate::WORKERS, 8),
            ],
        }
    }

    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        let out = operand(addrs, &name, "out")?;
        let mut buf = StateBuf::default();
        for (i, sh) in self.shares().into_iter().enumerate() {
            buf.u32(out + sh.offset)
                .u32(sh.first)
                .u32(sh.whole)
                .u32(sh.last)
                .u32(self.run_bytes / 8)
                .u32(self.stride - self.run_bytes)
                .pad_to((i + 1) * usize::from(STRIDE));
        }
        Ok(buf.finish(STRIDE))
    }

    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        crate::single_shot_cycles(t, self.shares().iter().map(|sh| self.worker_issues(sh)))
    }
}
