//! A one-tile package built by hand around one kernel call: worker code and the
//! supervisor (the kernel's own call snippet, then `exit`) in region 0, operands
//! where the test says, and the simulator as the oracle.

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_isa::{Inst, Word};
use tessera_kernels::{Call, Kernel, MemClass, OperandAddrs, Violation};
use tessera_machine::Machine;
use tessera_package::{Package, Perms, Segment, Symbol, SymbolKind, TileImage};
use tessera_sim::{SimOptions, SimReport, Simulator, Status};

pub const CODE_BASE: u32 = 0x4_C000;
/// Region 0's last element: state buffers, away from the code.
pub const STATE_ADDR: u32 = 0x7_C000;
/// Start of the interleaved region.
pub const R1: u32 = 0x8_0000;
/// One placement element (element pair) of region 1.
pub const PAIR: u32 = 0x8000;

pub fn machine() -> Machine {
    Machine::c600().with_tiles(1)
}

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

pub fn random_f16(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f32(rng.random_range(-1.0f32..1.0) * scale))
        .collect()
}

pub fn f16_bytes(v: &[f16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn bytes_f16(b: &[u8]) -> Vec<f16> {
    b.chunks_exact(2)
        .map(|c| f16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// A test layout: every operand on its own element pair of region 1, in contract
/// order, so every separation requirement holds; `state` in region 0.
pub fn layout(k: &dyn Kernel) -> OperandAddrs {
    let contract = k.contract();
    let mut addrs = OperandAddrs::new();
    let mut next = R1;
    for op in &contract.operands {
        if op.name == "state" {
            addrs.insert("state", STATE_ADDR);
            continue;
        }
        assert_ne!(op.mem_class, MemClass::NonInterleaved);
        addrs.insert(&op.name, next);
        next += (op.bytes + op.tail_bytes).div_ceil(PAIR).max(1) * PAIR;
    }
    assert!(next <= 0xE_0000, "test layout does not fit");
    addrs
}

pub struct Outcome {
    pub sim: Simulator,
    pub report: SimReport,
    pub addrs: OperandAddrs,
    pub violations: Vec<Violation>,
}

impl Outcome {
    pub fn read(&self, name: &str, len: u32) -> Vec<u8> {
        let addr = self.addrs.get(name).expect("operand placed");
        self.sim
            .read_memory(0, addr, len)
            .expect("operand inside SRAM")
            .to_vec()
    }
    pub fn read_f16(&self, name: &str, n: usize) -> Vec<f16> {
        bytes_f16(&self.read(name, n as u32 * 2))
    }
    pub fn assert_ok(&self) {
        assert_eq!(
            self.report.status,
            Status::Ok,
            "faults: {:#?}",
            self.report.faults
        );
    }
}

fn segment(name: &str, addr: u32, size: u32, bytes: Vec<u8>, perms: Perms) -> Segment {
    Segment {
        name: name.to_string(),
        addr,
        size,
        bytes,
        perms,
    }
}

/// Runs one call of `k` with operands at `addrs` (which must include `state`) and
/// initial contents `inputs`; operands not in `inputs` start zeroed.
pub fn run(k: &dyn Kernel, addrs: &OperandAddrs, inputs: &[(&str, Vec<u8>)]) -> Outcome {
    run_at_layer(k, addrs, inputs, 0, &[])
}

/// [`run`] as an iteration of a layer loop whose offset (`$m13`) is `layer`, the
/// supervisor setting it before the kernel's snippet, with `extra` bytes at
/// their addresses (what the iteration's instance of a store holds).
pub fn run_at_layer(
    k: &dyn Kernel,
    addrs: &OperandAddrs,
    inputs: &[(&str, Vec<u8>)],
    layer: u32,
    extra: &[(u32, Vec<u8>)],
) -> Outcome {
    let machine = machine();
    let contract = k.contract();
    let violations = contract.check(&machine, addrs);
    let code = k.emit(CODE_BASE).expect("kernel emits");
    assert_eq!(code.bytes(), contract.code.bytes);
    let code_bytes = tessera_isa::encode(&code.words).expect("kernel code encodes");
    let sup_base = CODE_BASE + (code_bytes.len() as u32).next_multiple_of(8);
    let state_addr = addrs.get("state").expect("state placed");
    let mut sup = k
        .supervisor(
            &Call {
                entry: code.entry,
                state: state_addr,
                addrs,
            },
            sup_base,
        )
        .expect("supervisor snippet");
    assert_eq!(tessera_kernels::code_bytes(&sup), contract.supervisor_bytes);
    if layer != 0 {
        sup.insert(
            0,
            Word::Single(Inst::Setzi {
                d: tessera_kernels::exchange::LAYER,
                imm: layer,
            }),
        );
    }
    sup.push(Word::Single(Inst::Exit));
    let sup_bytes = tessera_isa::encode(&sup).expect("supervisor encodes");
    let state = k.state(addrs).expect("state builds");

    let rx = Perms {
        read: true,
        write: false,
        execute: true,
    };
    let rw = Perms {
        read: true,
        write: true,
        execute: false,
    };
    let mut segments = vec![
        segment(
            &code.symbol,
            CODE_BASE,
            code_bytes.len() as u32,
            code_bytes.clone(),
            rx,
        ),
        segment(
            "supervisor",
            sup_base,
            sup_bytes.len() as u32,
            sup_bytes.clone(),
            rx,
        ),
        segment(
            "state",
            state_addr,
            state.bytes.len() as u32,
            state.bytes,
            rw,
        ),
    ];
    // Operands at one address (an in-place output) share a segment.
    let mut data: Vec<Segment> = Vec::new();
    for op in &contract.operands {
        if op.name == "state" {
            continue;
        }
        let addr = addrs.get(&op.name).expect("operand placed");
        let bytes = inputs
            .iter()
            .find(|(n, _)| *n == op.name)
            .map(|(_, b)| b.clone())
            .unwrap_or_default();
        assert!(
            bytes.len() as u32 <= op.bytes,
            "input `{}` too long",
            op.name
        );
        match data.iter_mut().find(|s| s.addr == addr) {
            Some(s) => {
                s.size = s.size.max(op.bytes);
                if !bytes.is_empty() {
                    s.bytes = bytes;
                }
            }
            None => data.push(segment(&op.name, addr, op.bytes, bytes, rw)),
        }
    }
    segments.extend(data);
    for (i, (addr, bytes)) in extra.iter().enumerate() {
        segments.push(segment(
            &format!("extra{i}"),
            *addr,
            bytes.len() as u32,
            bytes.clone(),
            rw,
        ));
    }
    let symbols = vec![
        Symbol {
            name: code.symbol.clone(),
            addr: CODE_BASE,
            size: code_bytes.len() as u32,
            kind: SymbolKind::Code,
        },
        Symbol {
            name: "supervisor".into(),
            addr: sup_base,
            size: sup_bytes.len() as u32,
            kind: SymbolKind::Code,
        },
    ];
    let package = Package {
        machine_toml: machine.to_toml(),
        tiles: vec![TileImage {
            tile: 0,
            segments,
            entry: sup_base,
            symbols,
        }],
        exchanges: vec![],
        bindings: vec![],
    };
    let mut sim = Simulator::new(&package).expect("package loads");
    let report = sim.run(&SimOptions {
        trace: false,
        ..SimOptions::default()
    });
    Outcome {
        sim,
        report,
        addrs: addrs.clone(),
        violations,
    }
}

/// Asserts `got` matches `want` within `tol(i)` per element, reporting the worst.
pub fn assert_close(what: &str, got: &[f16], want: &[f64], tol: impl Fn(usize) -> f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst: Option<(usize, f64)> = None;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g.to_f64() - w).abs();
        let t = tol(i);
        if err.is_nan() || err > t {
            let excess = if err.is_nan() { f64::INFINITY } else { err / t };
            if worst.is_none_or(|(_, e)| excess > e) {
                worst = Some((i, excess));
            }
        }
    }
    if let Some((i, _)) = worst {
        panic!(
            "{what}: element {i}: got {} want {} (tolerance {})",
            got[i],
            want[i],
            tol(i)
        );
    }
}
