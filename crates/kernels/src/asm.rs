//! A small code builder for the emitters: it tracks byte offsets so bundles land on
//! 8-byte boundaries, resolves labels to absolute branch targets, and lays out
//! repeat bodies. Padding is computed relative to the start, which is why every
//! kernel requires an 8-byte aligned code base: code size then never depends on where
//! placement puts the code.

use tessera_isa::{Inst, IntOp, MReg, Word};

/// Encoded size of a word: 4 bytes for a single instruction, 8 for a bundle.
pub fn word_bytes(w: &Word) -> u32 {
    match w {
        Word::Single(_) => 4,
        Word::Bundle(..) => 8,
    }
}

/// Total encoded size of a word sequence.
pub fn code_bytes(words: &[Word]) -> u32 {
    words.iter().map(word_bytes).sum()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Label(usize);

#[derive(Debug, Clone, Copy)]
enum Branch {
    Brz(MReg),
    Brnz(MReg),
}

pub(crate) struct Asm {
    base: u32,
    words: Vec<Word>,
    offset: u32,
    labels: Vec<Option<u32>>,
    fixups: Vec<(usize, Label, Branch)>,
}

impl Asm {
    pub(crate) fn new(base: u32) -> Asm {
        assert!(
            base.is_multiple_of(4),
            "code base {base:#x} must be 4-byte aligned"
        );
        Asm {
            base,
            words: Vec::new(),
            offset: 0,
            labels: Vec::new(),
            fixups: Vec::new(),
        }
    }

    fn push(&mut self, w: Word) {
        self.offset += word_bytes(&w);
        self.words.push(w);
    }

    pub(crate) fn i(&mut self, inst: Inst) {
        self.push(Word::Single(inst));
    }

    /// A main-pipe and an aux-pipe instruction in one issue, padded to 8 bytes.
    pub(crate) fn b(&mut self, main: Inst, aux: Inst) {
        debug_assert_eq!(main.pipe(), tessera_isa::Pipe::Main);
        debug_assert_eq!(aux.pipe(), tessera_isa::Pipe::Aux);
        if !(self.base + self.offset).is_multiple_of(8) {
            self.push(Word::Single(Inst::Nop));
        }
        self.push(Word::Bundle(main, aux));
    }

    /// A main-pipe instruction that bundles follow: a single word where that leaves
    /// the next word 8-byte aligned, else paired with an aux no-op (same one issue,
    /// where a padding `nop` would cost a second).
    pub(crate) fn single_or_bundle(&mut self, main: Inst) {
        if (self.base + self.offset) % 8 == 4 {
            self.i(main);
        } else {
            self.b(main, AUX_NOP);
        }
    }

    /// Absolute address of the next word.
    pub(crate) fn at(&self) -> u32 {
        self.base + self.offset
    }

    /// Words emitted so far (each one issue when executed).
    pub(crate) fn len(&self) -> usize {
        self.words.len()
    }

    pub(crate) fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    pub(crate) fn bind(&mut self, l: Label) {
        assert!(self.labels[l.0].is_none(), "label bound twice");
        self.labels[l.0] = Some(self.offset);
    }

    fn branch(&mut self, l: Label, kind: Branch) {
        self.fixups.push((self.words.len(), l, kind));
        self.push(Word::Single(Inst::Nop));
    }

    pub(crate) fn brz(&mut self, c: MReg, l: Label) {
        self.branch(l, Branch::Brz(c));
    }
    pub(crate) fn brnz(&mut self, c: MReg, l: Label) {
        self.branch(l, Branch::Brnz(c));
    }

    /// Repeats the words `body` emits `count` times (register count). The body is
    /// laid out as if it started 8-byte aligned, and the `rpt` word is placed so that
    /// it does.
    pub(crate) fn rpt(&mut self, count: MReg, body: impl FnOnce(&mut Asm)) {
        self.repeat(Inst::Rpt { count, body: 0 }, body);
    }

    /// [`Asm::rpt`] with an immediate count (below 4096).
    pub(crate) fn rpti(&mut self, count: u16, body: impl FnOnce(&mut Asm)) {
        assert!(count < 4096, "rpt count {count} out of range");
        self.repeat(Inst::Rpti { count, body: 0 }, body);
    }

    /// `rpt` is `Rpt` or `Rpti` with a placeholder body length.
    fn repeat(&mut self, rpt: Inst, body: impl FnOnce(&mut Asm)) {
        let mut inner = Asm::new(0);
        body(&mut inner);
        assert!(inner.fixups.is_empty() && inner.labels.is_empty());
        let n = inner.words.len();
        assert!((1..=255).contains(&n), "repeat body of {n} words");
        assert!(
            inner
                .words
                .iter()
                .all(|w| !matches!(w, Word::Single(i) | Word::Bundle(i, _) if i.is_control())),
            "control instruction inside a repeat body"
        );
        let has_bundle = inner.words.iter().any(|w| matches!(w, Word::Bundle(..)));
        if has_bundle && (self.base + self.offset) % 8 != 4 {
            self.push(Word::Single(Inst::Nop));
        }
        let body_words = n as u8;
        self.push(Word::Single(match rpt {
            Inst::Rpt { count, .. } => Inst::Rpt {
                count,
                body: body_words,
            },
            Inst::Rpti { count, .. } => Inst::Rpti {
                count,
                body: body_words,
            },
            other => unreachable!("not a repeat: {other:?}"),
        }));
        for w in inner.words {
            self.push(w);
        }
    }

    /// Resolves branch targets; returns the words.
    pub(crate) fn finish(mut self) -> Vec<Word> {
        for (idx, l, kind) in std::mem::take(&mut self.fixups) {
            let off = self.labels[l.0].expect("branch to an unbound label");
            let target = self.base + off;
            self.words[idx] = Word::Single(match kind {
                Branch::Brz(c) => Inst::Brz { c, target },
                Branch::Brnz(c) => Inst::Brnz { c, target },
            });
        }
        self.words
    }
}

/// An aux-pipe no-op: a move into `$azero`, whose writes are ignored.
pub(crate) const AUX_NOP: Inst = Inst::FMov {
    d: tessera_isa::AReg::ZERO,
    a: tessera_isa::AReg::ZERO,
    pair: false,
};

// Short constructors keep the emitters readable as assembly listings.

pub(crate) const MZ: MReg = MReg::ZERO;

pub(crate) fn m(i: u8) -> MReg {
    MReg(i)
}
pub(crate) fn a(i: u8) -> tessera_isa::AReg {
    tessera_isa::AReg(i)
}
pub(crate) fn ld32m(d: MReg, base: MReg, word: u16) -> Inst {
    Inst::Ld32M { d, base, imm: word }
}
pub(crate) fn ld32(d: tessera_isa::AReg, base: MReg, word: u16) -> Inst {
    Inst::Ld32 { d, base, imm: word }
}
pub(crate) fn st32m(s: MReg, base: MReg, word: u16) -> Inst {
    Inst::St32M { s, base, imm: word }
}
pub(crate) fn setzi(d: MReg, imm: u32) -> Inst {
    assert!(imm < (1 << 20), "setzi immediate {imm:#x} out of range");
    Inst::Setzi { d, imm }
}
pub(crate) fn int(op: IntOp, d: MReg, a: MReg, b: MReg) -> Inst {
    Inst::Int { op, d, a, b }
}
pub(crate) fn inti(op: IntOp, d: MReg, a: MReg, imm: u16) -> Inst {
    assert!(imm < (1 << 12), "12-bit immediate {imm} out of range");
    Inst::IntImm { op, d, a, imm }
}
pub(crate) fn mov(d: MReg, s: MReg) -> Inst {
    int(IntOp::Or, d, s, MZ)
}
