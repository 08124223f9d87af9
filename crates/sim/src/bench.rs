//! The AMP benchmark and calibration kernel: every tile computes an f16 [N,16] x
//! [16,16] product with f32 accumulation, its six workers each taking a block of
//! rows and feeding the AMP one quarter row per issue from `ld2xst64pace` bundles.
//! Built from `Word`s so that kernel emitters can reuse the layout helpers.

use crate::{SimOptions, Simulator};
use half::f16;
use serde::Serialize;
use tessera_isa::{AReg, EncodeError, Inst, IntOp, MReg, Word, encode};
use tessera_machine::Machine;
use tessera_package::{Package, Perms, Segment, Symbol, SymbolKind, TileImage};

/// Words laid out from a base address, keeping bundles 8-byte aligned.
#[derive(Debug, Clone)]
pub struct CodeBuilder {
    pub base: u32,
    pub words: Vec<Word>,
    len: u32,
}

impl CodeBuilder {
    pub fn new(base: u32) -> CodeBuilder {
        CodeBuilder {
            base,
            words: Vec::new(),
            len: 0,
        }
    }

    /// Address of the next word.
    pub fn here(&self) -> u32 {
        self.base + self.len
    }

    /// Appends a word; a bundle at a 4-mod-8 address gets a `nop` first.
    pub fn push(&mut self, w: Word) -> u32 {
        if matches!(w, Word::Bundle(..)) && !self.here().is_multiple_of(8) {
            self.single(Inst::Nop);
        }
        let at = self.here();
        self.len += w.byte_len() as u32;
        self.words.push(w);
        at
    }

    pub fn single(&mut self, i: Inst) -> u32 {
        self.push(Word::Single(i))
    }

    pub fn bundle(&mut self, main: Inst, aux: Inst) -> u32 {
        self.push(Word::Bundle(main, aux))
    }

    /// Pads with a `nop` so that the next single word sits at 4 mod 8 (a repeat
    /// whose body is bundles then needs no padding inside the body).
    pub fn align_before_bundle_body(&mut self) {
        if self.here().is_multiple_of(8) {
            self.single(Inst::Nop);
        }
    }

    /// Pads to an 8-byte boundary.
    pub fn align8(&mut self) {
        if !self.here().is_multiple_of(8) {
            self.single(Inst::Nop);
        }
    }

    pub fn bytes(&self) -> Result<Vec<u8>, EncodeError> {
        encode(&self.words)
    }
}

const fn m(r: u8) -> MReg {
    MReg(r)
}
const fn a(r: u8) -> AReg {
    AReg(r)
}

/// Addresses of the kernel's data on every tile.
#[derive(Debug, Clone, Copy)]
pub struct AmpLayout {
    pub code: u32,
    pub state: u32,
    pub y: u32,
    pub weights: u32,
    pub x: u32,
    pub partials: u32,
    pub rows: u32,
}

impl AmpLayout {
    /// Inputs, weights and partials in the interleaved region (partials at 8 mod 16
    /// so that their stream never shares an element with the input stream); outputs
    /// in region 0, away from both.
    pub fn new(rows: u32) -> AmpLayout {
        let bytes = rows * 32;
        let x = 0x8_0200;
        AmpLayout {
            code: 0x4_C000,
            state: 0x5_0000,
            y: 0x5_4000,
            weights: 0x8_0000,
            x,
            partials: x + bytes + 64 + 8,
            rows,
        }
    }
}

/// Largest N the layout holds (outputs must fit region 0 after 0x54000).
pub const MAX_ROWS: u32 = (0x8_0000 - 0x5_4000 - 64) / 32;

/// The worker kernel: rows `[m0]..` per its state `{x, partials, y, rows}`.
pub fn amp_worker_code(b: &mut CodeBuilder) -> u32 {
    let entry = b.here();
    let (x, p, y, n) = (m(2), m(3), m(4), m(5));
    let (inp, pin, out) = (a(0), a(2), a(4));
    b.single(Inst::Ld32M {
        d: x,
        base: m(0),
        imm: 0,
    });
    b.single(Inst::Ld32M {
        d: p,
        base: m(0),
        imm: 1,
    });
    b.single(Inst::Ld32M {
        d: y,
        base: m(0),
        imm: 2,
    });
    b.single(Inst::Ld32M {
        d: n,
        base: m(0),
        imm: 3,
    });
    let exit_fixup = b.words.len();
    b.single(Inst::Brz { c: n, target: 0 });
    b.single(Inst::IntImm {
        op: IntOp::Sub,
        d: n,
        a: n,
        imm: 1,
    });
    let load = Inst::Ld2x64Pace {
        d0: inp,
        d1: pin,
        p0: x,
        p1: p,
    };
    let load_store = Inst::Ld2xSt64Pace {
        d0: inp,
        d1: pin,
        s: out,
        p0: x,
        p1: p,
        ps: y,
    };
    let amp = |phase| Inst::Amp {
        out,
        inp,
        pin,
        phase,
    };
    // The AMP reads the input loaded by the previous issue (a bundle reads its
    // operands before either pipe writes), and the store writes the output of the
    // previous issue, so the streams run one issue apart.
    b.single(load);
    for i in 0..5 {
        b.bundle(load, amp(i % 4));
    }
    b.align_before_bundle_body();
    b.single(Inst::Rpt { count: n, body: 4 });
    for ph in [1, 2, 3, 0] {
        b.bundle(load_store, amp(ph));
    }
    let store = Inst::St64Step {
        s: out,
        base: y,
        inc: 1,
    };
    for ph in 1..4 {
        b.bundle(store, amp(ph));
    }
    b.single(store);
    let exit = b.single(Inst::Exit);
    b.words[exit_fixup] = Word::Single(Inst::Brz { c: n, target: exit });
    entry
}

/// The supervisor: load the weights, then run the kernel on all workers `repeats`
/// times.
pub fn amp_supervisor_code(b: &mut CodeBuilder, l: &AmpLayout, worker_entry: u32, repeats: u32) {
    b.single(Inst::Setzi {
        d: m(1),
        imm: l.weights,
    });
    for quad in 0..32 {
        b.single(Inst::AmpLoadW { base: m(1), quad });
    }
    b.single(Inst::Setzi {
        d: m(2),
        imm: worker_entry,
    });
    b.single(Inst::Setzi {
        d: m(3),
        imm: l.state,
    });
    b.single(Inst::Setzi {
        d: m(4),
        imm: repeats,
    });
    let top = b.single(Inst::RunAll {
        entry: m(2),
        state: m(3),
        stride: 16,
    });
    b.single(Inst::SyncLocal);
    b.single(Inst::IntImm {
        op: IntOp::Sub,
        d: m(4),
        a: m(4),
        imm: 1,
    });
    b.single(Inst::Brnz {
        c: m(4),
        target: top,
    });
    b.single(Inst::Exit);
}

/// Deterministic f16 test data in [-1, 1) (a fixed LCG).
pub fn test_values(count: usize, seed: u64) -> Vec<u16> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..count)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let u = ((s >> 40) as f32) / (1u64 << 24) as f32;
            f16::from_f32(u * 2.0 - 1.0).to_bits()
        })
        .collect()
}

fn le_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|h| h.to_le_bytes()).collect()
}

/// A package running the AMP kernel on `tiles` tiles of `machine`, `rows` rows per
/// tile (at most [`MAX_ROWS`]), the whole kernel `repeats` times (at most 2^20 - 1).
pub fn amp_package(
    machine: &Machine,
    tiles: u32,
    rows: u32,
    repeats: u32,
) -> Result<Package, EncodeError> {
    let rows = rows.clamp(1, MAX_ROWS);
    let l = AmpLayout::new(rows);
    let mut b = CodeBuilder::new(l.code);
    let sup_entry = b.here();
    // The supervisor needs the worker's entry before the worker is laid out: lay
    // out once to learn it, then again with the right address.
    amp_supervisor_code(&mut b, &l, 0, repeats);
    let sup_len = b.here() - sup_entry;
    b.align8();
    let worker_entry = amp_worker_code(&mut b);
    let mut b2 = CodeBuilder::new(l.code);
    amp_supervisor_code(&mut b2, &l, worker_entry, repeats);
    b2.align8();
    amp_worker_code(&mut b2);
    let code = b2.bytes()?;
    let workers = machine.workers;
    let mut state = Vec::new();
    let mut start = 0;
    for w in 0..workers {
        let n = rows / workers + u32::from(w < rows % workers);
        for v in [
            l.x + start * 32,
            l.partials + start * 32,
            l.y + start * 32,
            n,
        ] {
            state.extend_from_slice(&v.to_le_bytes());
        }
        start += n;
    }
    let weights = le_bytes(&test_values(256, 1));
    let x = le_bytes(&test_values(rows as usize * 16, 2));
    let rw = Perms {
        read: true,
        write: true,
        execute: false,
    };
    let seg = |name: &str, addr, size, bytes: Vec<u8>, perms| Segment {
        name: name.into(),
        addr,
        size,
        bytes,
        perms,
    };
    let code_len = code.len() as u32;
    let image = |tile| TileImage {
        tile,
        entry: sup_entry,
        segments: vec![
            seg(
                "code",
                l.code,
                code_len,
                code.clone(),
                Perms {
                    read: true,
                    write: false,
                    execute: true,
                },
            ),
            seg("state", l.state, state.len() as u32, state.clone(), rw),
            seg("y", l.y, rows * 32 + 64, Vec::new(), rw),
            seg("weights", l.weights, 512, weights.clone(), rw),
            seg("x", l.x, rows * 32 + 64, x.clone(), rw),
            seg("partials", l.partials, rows * 32 + 64, Vec::new(), rw),
        ],
        symbols: vec![
            Symbol {
                name: "amp_supervisor".into(),
                addr: sup_entry,
                size: sup_len,
                kind: SymbolKind::Code,
            },
            Symbol {
                name: "amp_rows_f16".into(),
                addr: worker_entry,
                size: l.code + code_len - worker_entry,
                kind: SymbolKind::Code,
            },
        ],
    };
    Ok(Package {
        machine_toml: machine.to_toml(),
        tiles: (0..tiles.min(machine.tiles)).map(image).collect(),
        exchanges: Vec::new(),
        bindings: Vec::new(),
    })
}

/// The product the kernel computes, in the AMP's order of operations (the row's
/// partials first, then f32 accumulation over k in order, f16 result).
pub fn amp_reference(rows: u32) -> Vec<u16> {
    let w: Vec<f32> = test_values(256, 1)
        .iter()
        .map(|&h| f16::from_bits(h).to_f32())
        .collect();
    let x: Vec<f32> = test_values(rows as usize * 16, 2)
        .iter()
        .map(|&h| f16::from_bits(h).to_f32())
        .collect();
    let mut out = Vec::with_capacity(rows as usize * 16);
    for r in 0..rows as usize {
        // The partials, all zero, entered during the row before (`lead`).
        let mut acc = [0f32; 16];
        for phase in 0..4 {
            for k in 0..4 {
                let xv = x[r * 16 + phase * 4 + k];
                for (j, a) in acc.iter_mut().enumerate() {
                    *a += xv * w[(phase * 4 + k) * 16 + j];
                }
            }
        }
        out.extend(acc.iter().map(|&v| f16::from_f32(v).to_bits()));
    }
    out
}

/// The Bow measurement's fit (tessellate-ipu): cycles per call and per row of an
/// f16 `[N,16] x [16,16]` product on one tile.
pub const MEASURED_INTERCEPT: u64 = 340;
pub const MEASURED_CYCLES_PER_ROW: u64 = 4;

/// One calibration point.
#[derive(Debug, Clone, Serialize)]
pub struct CalibrationPoint {
    pub n: u32,
    /// Simulated cycles per tile.
    pub cycles: u64,
    /// The Bow measurement's fit, 340 + 4N.
    pub reference_cycles: u64,
    /// (cycles - reference) / reference, in percent.
    pub deviation_percent: f64,
}

/// The AMP calibration: cycles of one kernel run per tile for each N.
pub fn calibration(machine: &Machine, tiles: u32, ns: &[u32]) -> Vec<CalibrationPoint> {
    ns.iter()
        .map(|&n| {
            let cycles = amp_package(machine, tiles, n, 1)
                .ok()
                .and_then(|pkg| Simulator::new(&pkg).ok())
                .map(|mut s| {
                    s.run(&SimOptions {
                        trace: false,
                        ..SimOptions::default()
                    })
                    .cycles
                })
                .unwrap_or(0);
            let reference = MEASURED_INTERCEPT + MEASURED_CYCLES_PER_ROW * u64::from(n);
            CalibrationPoint {
                n,
                cycles,
                reference_cycles: reference,
                deviation_percent: (cycles as f64 - reference as f64) / reference as f64 * 100.0,
            }
        })
        .collect()
}

/// A straight line through the calibration's two largest N: cycles per row and the
/// fixed cost of a call, against the measurement's 4 and 340.
#[derive(Debug, Clone, Serialize)]
pub struct CalibrationFit {
    pub slope: f64,
    pub intercept: f64,
    pub reference_slope: f64,
    pub reference_intercept: f64,
    /// (slope - 4) / 4, in percent: the part of the calibration that compares like
    /// with like (docs/sim.md).
    pub slope_deviation_percent: f64,
}

/// The fit of `points` (at least two, by increasing N); `None` with fewer.
pub fn calibration_fit(points: &[CalibrationPoint]) -> Option<CalibrationFit> {
    let [.., p, q] = points else {
        return None;
    };
    if q.n <= p.n {
        return None;
    }
    let slope = (q.cycles as f64 - p.cycles as f64) / f64::from(q.n - p.n);
    let per_row = MEASURED_CYCLES_PER_ROW as f64;
    Some(CalibrationFit {
        slope,
        intercept: q.cycles as f64 - slope * f64::from(q.n),
        reference_slope: per_row,
        reference_intercept: MEASURED_INTERCEPT as f64,
        slope_deviation_percent: (slope - per_row) / per_row * 100.0,
    })
}
