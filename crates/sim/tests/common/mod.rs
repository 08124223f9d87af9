//! Package building for the simulator's integration tests: tiles laid out from
//! `Word`s with symbols, data segments, exchanges and bindings.
#![allow(dead_code)]

use tessera_isa::{Inst, IntOp, MReg, Word};
use tessera_machine::Machine;
use tessera_package::*;
use tessera_sim::bench::CodeBuilder;

pub const CODE: u32 = 0x4_C000;
pub const R0: u32 = 0x6_0000;
pub const R1: u32 = 0x9_0000;

pub fn s(i: Inst) -> Word {
    Word::Single(i)
}
pub fn li(d: u8, imm: u32) -> Word {
    s(Inst::Setzi { d: MReg(d), imm })
}
pub fn addi(d: u8, a: u8, imm: u16) -> Word {
    s(Inst::IntImm {
        op: IntOp::Add,
        d: MReg(d),
        a: MReg(a),
        imm,
    })
}

/// One tile's part of exchange phase `id`, inline: each send as `setzi $m0, addr;
/// send $m0, bytes`, then, for each run of receives from one source tile, a `mux`
/// and each receive as `setzi $m0, addr; recv $m0, message`, then `exchange id`.
/// With no worker running and a 6-cycle result latency, each send and each
/// receive takes 7 cycles (the `setzi`, then the use waiting for it), a `mux` and
/// the `exchange` one each.
pub fn exchange_part(id: u16, sends: &[(u32, u16)], recvs: &[(u32, u16, u32)]) -> Vec<Word> {
    let mut w = Vec::new();
    for &(addr, bytes) in sends {
        w.push(li(0, addr));
        w.push(s(Inst::Send { a: MReg(0), bytes }));
    }
    let mut mux = None;
    for &(src, msg, addr) in recvs {
        if mux != Some(src) {
            w.push(s(Inst::Mux { tile: src }));
            mux = Some(src);
        }
        w.push(li(0, addr));
        w.push(s(Inst::Recv { a: MReg(0), msg }));
    }
    w.push(s(Inst::Exchange { id }));
    w
}

/// The name of exchange phase `id`.
pub fn phase(id: u16) -> ExchangeProgram {
    ExchangeProgram {
        id,
        name: format!("x{id}"),
    }
}

pub struct TileBuilder {
    pub tile: u32,
    pub code: CodeBuilder,
    labels: Vec<(String, u32)>,
    segments: Vec<Segment>,
}

impl TileBuilder {
    pub fn new(tile: u32) -> TileBuilder {
        let mut t = TileBuilder {
            tile,
            code: CodeBuilder::new(CODE),
            labels: Vec::new(),
            segments: Vec::new(),
        };
        t.label("main");
        t
    }
    /// A code symbol at the next word (8-byte aligned, so bundles may follow).
    pub fn label(&mut self, name: &str) -> u32 {
        self.code.align8();
        let at = self.code.here();
        self.labels.push((name.into(), at));
        at
    }
    pub fn push(&mut self, w: Word) -> u32 {
        self.code.push(w)
    }
    pub fn words(&mut self, ws: &[Word]) {
        for &w in ws {
            self.code.push(w);
        }
    }
    pub fn data(&mut self, name: &str, addr: u32, bytes: Vec<u8>) {
        let size = bytes.len() as u32;
        self.segments.push(Segment {
            name: name.into(),
            addr,
            size,
            bytes,
            perms: Perms {
                read: true,
                write: true,
                execute: false,
            },
        });
    }
    /// A supervisor that runs `entry` on all workers (state `state`, stride
    /// `stride`), waits, then exits. Returns the index of the entry `setzi` so the
    /// caller can patch it once the kernel is laid out.
    pub fn runall_then_exit(&mut self, state: u32, stride: u16) -> usize {
        let at = self.code.words.len();
        self.words(&[
            li(2, 0),
            li(3, state),
            s(Inst::RunAll {
                entry: MReg(2),
                state: MReg(3),
                stride,
            }),
            s(Inst::SyncLocal),
            s(Inst::Exit),
        ]);
        at
    }
    pub fn patch_entry(&mut self, at: usize, entry: u32) {
        self.code.words[at] = li(2, entry);
    }
    pub fn image(self) -> TileImage {
        let end = self.code.here();
        let code = self.code.bytes().expect("test code encodes");
        let mut symbols: Vec<Symbol> = Vec::new();
        for (i, (name, addr)) in self.labels.iter().enumerate() {
            let next = self.labels.get(i + 1).map_or(end, |l| l.1);
            symbols.push(Symbol {
                name: name.clone(),
                addr: *addr,
                size: next - addr,
                kind: SymbolKind::Code,
            });
        }
        let mut segments = vec![Segment {
            name: "code".into(),
            addr: CODE,
            size: code.len() as u32,
            bytes: code,
            perms: Perms {
                read: true,
                write: false,
                execute: true,
            },
        }];
        segments.extend(self.segments);
        TileImage {
            tile: self.tile,
            segments,
            entry: CODE,
            symbols,
        }
    }
}

pub fn package(
    machine: &Machine,
    tiles: Vec<TileImage>,
    exchanges: Vec<ExchangeProgram>,
    bindings: Vec<HostBinding>,
) -> Package {
    Package {
        machine_toml: machine.to_toml(),
        tiles,
        exchanges,
        bindings,
    }
}

pub fn words_le(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_le_bytes()).collect()
}
