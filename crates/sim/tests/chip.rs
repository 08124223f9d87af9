//! Whole-chip behaviour: fault reporting across tiles and contexts, supersteps,
//! exchanges, host transfers, bindings, load errors and determinism.

mod common;

use common::*;
use tessera_isa::{AReg, Inst, IntOp, MReg};
use tessera_machine::Machine;
use tessera_package::*;
use tessera_sim::bench::amp_package;
use tessera_sim::{Context, FaultKind, LoadError, SimOptions, Simulator, Status, TraceKind};

fn run(p: &Package) -> (Simulator, tessera_sim::SimReport) {
    let mut sim = Simulator::new(p).unwrap();
    let r = sim.run(&SimOptions::default());
    (sim, r)
}

/// A tile whose six workers each `ld64step` from `R1 + offset + 64 * i`.
fn stepping_tile(tile: u32, offset: u32) -> TileImage {
    let mut t = TileBuilder::new(tile);
    let fix = t.runall_then_exit(R0, 4);
    let k = t.label("walk_rows");
    t.words(&[
        s(Inst::Ld32M {
            d: MReg(2),
            base: MReg(0),
            imm: 0,
        }),
        s(Inst::Ld64Step {
            d: AReg(0),
            base: MReg(2),
            inc: 1,
        }),
        s(Inst::Exit),
    ]);
    t.patch_entry(fix, k);
    let ptrs: Vec<u32> = (0..6).map(|i| R1 + offset + 64 * i).collect();
    t.data("state", R0, words_le(&ptrs));
    t.data("rows", R1, vec![0; 512]);
    t.image()
}

#[test]
fn every_faulting_tile_and_context_is_reported() {
    let m = Machine::small();
    let p = package(
        &m,
        vec![
            stepping_tile(0, 2),
            stepping_tile(1, 0),
            stepping_tile(3, 4),
        ],
        vec![],
        vec![],
    );
    let (_, r) = run(&p);
    assert_eq!(r.status, Status::Fault);
    assert_eq!(r.faults.len(), 12);
    for (i, f) in r.faults.iter().enumerate() {
        assert_eq!(f.tile, if i < 6 { 0 } else { 3 });
        assert_eq!(f.context, Context::Worker((i % 6) as u8));
        assert_eq!(f.kind, FaultKind::InvalidMemoryAddress);
        assert_eq!(f.symbol.as_deref(), Some("walk_rows"));
        assert_eq!(f.offset, 4);
        assert_eq!(f.instruction, "ld64step $a0:1, $m2+=, 1");
    }
    let text = r.faults[0].to_string();
    assert_eq!(
        text,
        "tile 0 worker 0: InvalidMemoryAddress at walk_rows+0x4 `ld64step $a0:1, $m2+=, 1`: address 0x90002 is not 8-byte aligned"
    );
    // The JSON form carries every field the CLI prints.
    let json = serde_json::to_value(&r.faults[0]).unwrap();
    for key in [
        "tile",
        "context",
        "kind",
        "cause",
        "symbol",
        "offset",
        "instruction",
        "address",
    ] {
        assert!(json.get(key).is_some(), "{key}");
    }
    assert_eq!(json["context"], "worker 0");
    assert_eq!(json["kind"], "InvalidMemoryAddress");
}

#[test]
fn timeout_is_a_deterministic_fault() {
    let mut t = TileBuilder::new(0);
    let fix = t.runall_then_exit(R0, 0);
    let k = t.label("spin");
    t.words(&[s(Inst::Bri { target: k })]);
    t.patch_entry(fix, k);
    let p = package(&Machine::small(), vec![t.image()], vec![], vec![]);
    let mut sim = Simulator::new(&p).unwrap();
    let opts = SimOptions {
        cycle_budget: 20_000,
        ..SimOptions::default()
    };
    let a = sim.run(&opts);
    let b = sim.run(&opts);
    assert_eq!(a, b);
    // Every worker times out, and so does the supervisor waiting for them.
    assert_eq!(a.faults.len(), 7);
    assert!(a.faults.iter().all(|f| f.kind == FaultKind::Timeout));
    assert_eq!(a.faults[0].context, Context::Supervisor);
    assert!(
        a.faults[1..]
            .iter()
            .all(|f| f.symbol.as_deref() == Some("spin"))
    );
}

#[test]
fn run_entry_must_be_executable() {
    let mut t = TileBuilder::new(0);
    let fix = t.runall_then_exit(R0, 0);
    t.patch_entry(fix, R1);
    let p = package(&Machine::small(), vec![t.image()], vec![], vec![]);
    let (_, r) = run(&p);
    assert_eq!(r.faults.len(), 1);
    let f = &r.faults[0];
    assert_eq!(
        (f.context, f.kind),
        (Context::Supervisor, FaultKind::InvalidProgramCounter)
    );
    assert!(f.instruction.starts_with("runall"), "{}", f.instruction);
    assert_eq!(f.address, Some(R1));
}

/// One tile's part of one phase: its sends ((address, bytes)) and receives
/// ((source tile, message, address)).
type Part<'a> = (u16, &'a [(u32, u16)], &'a [(u32, u16, u32)]);

/// A tile that stores `value` at `R1`, syncs, runs its parts of exchange phases
/// as inline exchange code, syncs, exits.
fn exchange_tile(tile: u32, value: u32, parts: &[Part<'_>]) -> TileImage {
    let mut t = TileBuilder::new(tile);
    t.words(&[
        li(1, R1),
        li(2, value),
        s(Inst::St32M {
            s: MReg(2),
            base: MReg(1),
            imm: 0,
        }),
        s(Inst::SyncGlobal),
    ]);
    for &(id, sends, recvs) in parts {
        t.words(&exchange_part(id, sends, recvs));
    }
    t.words(&[s(Inst::SyncGlobal), s(Inst::Exit)]);
    t.data("buf", R1, vec![0; 64]);
    t.image()
}

#[test]
fn exchange_copies_with_bsp_semantics() {
    // Tiles 0 and 1 swap their first word; tile 0's word also goes to 2 and 3.
    let tiles = vec![
        exchange_tile(0, 100, &[(7, &[(R1, 4)], &[(1, 0, R1)])]),
        exchange_tile(1, 101, &[(7, &[(R1, 4)], &[(0, 0, R1)])]),
        exchange_tile(2, 102, &[(7, &[], &[(0, 0, R1 + 8)])]),
        exchange_tile(3, 103, &[(7, &[], &[(0, 0, R1 + 8)])]),
    ];
    let p = package(&Machine::small(), tiles, vec![phase(7)], vec![]);
    let (sim, r) = run(&p);
    assert_eq!(r.status, Status::Ok, "{:#?}", r.faults);
    let word = |t, a| {
        let b = sim.read_memory(t, a, 4).unwrap();
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    };
    assert_eq!(word(0, R1), 101);
    assert_eq!(word(1, R1), 100);
    assert_eq!(word(2, R1 + 8), 100);
    assert_eq!(word(3, R1 + 8), 100);
    // Two syncs: three supersteps, the last ending with the run.
    assert_eq!(r.supersteps, 3);
    let kinds: Vec<&TraceKind> = r.trace.iter().map(|e| &e.kind).collect();
    assert!(kinds.contains(&&TraceKind::ExchangeStart { id: 7 }));
    assert!(kinds.contains(&&TraceKind::SuperstepEnd { index: 1 }));
    // All tiles finish together after the last sync.
    assert!(r.per_tile.iter().all(|t| t.cycles == r.cycles));
}

#[test]
fn a_receive_from_a_tile_in_another_phase_is_an_invalid_configuration() {
    // Tile 0 sends in phase 1; tile 1 ends phase 2 and wants tile 0's message.
    let tiles = vec![
        exchange_tile(0, 1, &[(1, &[(R1, 4)], &[])]),
        exchange_tile(1, 2, &[(2, &[], &[(0, 0, R1 + 8)])]),
    ];
    let p = package(&Machine::small(), tiles, vec![phase(1), phase(2)], vec![]);
    let (_, r) = run(&p);
    assert_eq!(r.faults.len(), 1, "{:#?}", r.faults);
    let f = &r.faults[0];
    assert_eq!(
        (f.tile, f.kind, f.context),
        (
            1,
            FaultKind::InvalidExchangeConfiguration,
            Context::Supervisor
        )
    );
    assert!(f.instruction.starts_with("exchange"), "{}", f.instruction);
    assert!(
        f.cause
            .contains("receives message 0 of tile 0, which did not end exchange #2"),
        "{}",
        f.cause
    );
    // A phase the package does not name.
    let tiles = vec![exchange_tile(0, 1, &[(9, &[], &[])])];
    let (_, r) = run(&package(&Machine::small(), tiles, vec![], vec![]));
    assert_eq!(r.faults[0].kind, FaultKind::InvalidExchangeConfiguration);
    assert!(r.faults[0].cause.contains("no exchange program #9"));
}

#[test]
fn a_receive_from_a_tile_past_the_machine_or_of_an_unsent_message_faults() {
    let m = Machine::small();
    let far = m.tiles + 100;
    let tiles = vec![
        exchange_tile(0, 0, &[(1, &[(R1, 8)], &[])]),
        exchange_tile(1, 1, &[(1, &[], &[(0, 1, R1 + 16)])]),
        exchange_tile(2, 2, &[(1, &[], &[(far, 0, R1 + 16)])]),
    ];
    let (_, r) = run(&package(&m, tiles, vec![phase(1)], vec![]));
    assert_eq!(r.faults.len(), 2, "{:#?}", r.faults);
    assert!(
        r.faults[0]
            .cause
            .contains("message 1 of tile 0, which sent 1")
    );
    assert!(
        r.faults[1]
            .cause
            .contains(&format!("message 0 of tile {far}, which did not end")),
        "{}",
        r.faults[1].cause
    );
}

#[test]
fn overlapping_landings_conflict() {
    let tiles = |second: u32| {
        vec![
            exchange_tile(0, 0, &[(1, &[(R1, 8)], &[])]),
            exchange_tile(1, 1, &[(1, &[(R1, 8)], &[])]),
            exchange_tile(2, 2, &[(1, &[], &[(0, 0, R1 + 16), (1, 0, second)])]),
        ]
    };
    let (_, r) = run(&package(
        &Machine::small(),
        tiles(R1 + 20),
        vec![phase(1)],
        vec![],
    ));
    assert_eq!(r.faults.len(), 1, "{:#?}", r.faults);
    assert_eq!(r.faults[0].tile, 2);
    assert_eq!(r.faults[0].kind, FaultKind::InvalidExchangeConfiguration);
    assert!(
        r.faults[0].cause.contains("conflict"),
        "{}",
        r.faults[0].cause
    );
    // Adjacent, non-overlapping landings are fine.
    let (_, r) = run(&package(
        &Machine::small(),
        tiles(R1 + 24),
        vec![phase(1)],
        vec![],
    ));
    assert_eq!(r.status, Status::Ok, "{:#?}", r.faults);
}

#[test]
fn exchange_code_faults_where_it_goes_wrong() {
    let m = Machine::small();
    // A receive with no mux set faults at the `recv`.
    let mut t = TileBuilder::new(0);
    t.words(&[
        s(Inst::SyncGlobal),
        li(0, R1),
        s(Inst::Recv { a: MReg(0), msg: 0 }),
        s(Inst::Exchange { id: 1 }),
        s(Inst::Exit),
    ]);
    t.data("buf", R1, vec![0; 64]);
    let (_, r) = run(&package(&m, vec![t.image()], vec![phase(1)], vec![]));
    assert_eq!(r.faults.len(), 1, "{:#?}", r.faults);
    assert!(r.faults[0].instruction.starts_with("recv"));
    assert!(r.faults[0].cause.contains("no incoming mux"));
    // A send reaching past SRAM faults at the `send`.
    let end = m.sram_end() - 8;
    let mut t = TileBuilder::new(0);
    t.words(&[
        s(Inst::SyncGlobal),
        li(0, end),
        s(Inst::Send {
            a: MReg(0),
            bytes: 16,
        }),
        s(Inst::Exchange { id: 1 }),
        s(Inst::Exit),
    ]);
    let (_, r) = run(&package(&m, vec![t.image()], vec![phase(1)], vec![]));
    assert_eq!(r.faults.len(), 1, "{:#?}", r.faults);
    assert!(r.faults[0].instruction.starts_with("send"));
    assert_eq!(r.faults[0].address, Some(end));
    // Exchange code not ended by `exchange` before the next sync.
    let mut t = TileBuilder::new(0);
    t.words(&[
        s(Inst::SyncGlobal),
        li(0, R1),
        s(Inst::Send {
            a: MReg(0),
            bytes: 4,
        }),
        s(Inst::SyncGlobal),
        s(Inst::Exit),
    ]);
    t.data("buf", R1, vec![0; 64]);
    let (_, r) = run(&package(&m, vec![t.image()], vec![], vec![]));
    assert_eq!(r.faults.len(), 1, "{:#?}", r.faults);
    assert_eq!(r.faults[0].kind, FaultKind::InvalidExchangeConfiguration);
    assert!(r.faults[0].cause.contains("not ended by `exchange`"));
}

/// The bytes that move are the ones the decoded exchange code says: a receive
/// word whose message field is corrupted in the package lands another message,
/// or faults when there is none.
#[test]
fn a_corrupted_exchange_instruction_moves_other_data_or_faults() {
    let tiles = || {
        vec![
            exchange_tile(0, 0x1111, &[(1, &[(R1, 4), (R1 + 4, 4)], &[])]),
            exchange_tile(1, 0, &[(1, &[], &[(0, 0, R1 + 8)])]),
        ]
    };
    let clean = package(&Machine::small(), tiles(), vec![phase(1)], vec![]);
    let (sim, r) = run(&clean);
    assert_eq!(r.status, Status::Ok, "{:#?}", r.faults);
    assert_eq!(
        sim.read_memory(1, R1 + 8, 4).unwrap(),
        &0x1111u32.to_le_bytes()
    );
    // Find tile 1's `recv $m0, 0` in its code and rewrite its message field.
    let corrupt = |msg: u16| {
        let mut p = clean.clone();
        let want = tessera_isa::encode_inst(&Inst::Recv { a: MReg(0), msg: 0 }).unwrap();
        let seg = p.tiles[1]
            .segments
            .iter_mut()
            .find(|s| s.name == "code")
            .expect("code segment");
        let at = seg
            .bytes
            .chunks_exact(4)
            .position(|w| w == want.to_le_bytes())
            .expect("the recv word");
        let w = tessera_isa::encode_inst(&Inst::Recv { a: MReg(0), msg }).unwrap();
        seg.bytes[4 * at..4 * at + 4].copy_from_slice(&w.to_le_bytes());
        p
    };
    // Message 1 is the zeroed word after tile 0's value: other data lands.
    let (sim, r) = run(&corrupt(1));
    assert_eq!(r.status, Status::Ok, "{:#?}", r.faults);
    assert_eq!(sim.read_memory(1, R1 + 8, 4).unwrap(), &[0, 0, 0, 0]);
    // Message 2 was never sent: a fault naming it.
    let (_, r) = run(&corrupt(2));
    assert_eq!(r.faults.len(), 1, "{:#?}", r.faults);
    assert!(
        r.faults[0]
            .cause
            .contains("message 2 of tile 0, which sent 2")
    );
}

#[test]
fn exchange_needs_a_sync_after_compute() {
    let mut t = TileBuilder::new(0);
    // Run workers, then exchange without a sync in between.
    t.words(&[
        li(2, CODE + 24),
        li(3, R0),
        s(Inst::RunAll {
            entry: MReg(2),
            state: MReg(3),
            stride: 0,
        }),
        s(Inst::SyncLocal),
        s(Inst::Exchange { id: 1 }),
        s(Inst::Exit),
    ]);
    assert_eq!(t.label("nothing"), CODE + 24);
    t.push(s(Inst::Exit));
    let x = phase(1);
    let mut img = t.image();
    img.segments.push(Segment {
        name: "buf".into(),
        addr: R1,
        size: 64,
        bytes: vec![],
        perms: Perms::default(),
    });
    let (_, r) = run(&package(&Machine::small(), vec![img], vec![x], vec![]));
    assert_eq!(r.faults.len(), 1);
    assert!(
        r.faults[0].cause.contains("without a global sync"),
        "{}",
        r.faults[0].cause
    );
}

fn binding(
    name: &str,
    kind: BindingKind,
    bytes: u32,
    slices: &[(u32, u32, u32, u32)],
) -> HostBinding {
    HostBinding {
        data: Vec::new(),
        name: name.into(),
        kind,
        bytes,
        slices: slices
            .iter()
            .map(|&(tile, tile_addr, offset, bytes)| BindingSlice {
                tile,
                tile_addr,
                offset,
                bytes,
            })
            .collect(),
    }
}

/// Descriptor list: count, then {binding u16, flags u16, host offset, tile address,
/// length} records.
fn descriptors(records: &[(u16, u16, u32, u32, u32)]) -> Vec<u8> {
    let mut out = (records.len() as u32).to_le_bytes().to_vec();
    for &(b, flags, off, addr, len) in records {
        out.extend_from_slice(&b.to_le_bytes());
        out.extend_from_slice(&flags.to_le_bytes());
        for v in [off, addr, len] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// Tile: hostxfer in (descriptors at R0), add 1 to the word, hostxfer out
/// (descriptors at R0 + 0x100), exit.
fn host_tile(tile: u32, input_desc: Vec<u8>, output_desc: Vec<u8>) -> TileImage {
    let mut t = TileBuilder::new(tile);
    t.words(&[
        li(1, R0),
        s(Inst::HostXfer { desc: MReg(1) }),
        li(2, R1),
        s(Inst::Ld32M {
            d: MReg(3),
            base: MReg(2),
            imm: 0,
        }),
        addi(3, 3, 1),
        s(Inst::St32M {
            s: MReg(3),
            base: MReg(2),
            imm: 1,
        }),
        li(1, R0 + 0x100),
        s(Inst::HostXfer { desc: MReg(1) }),
        s(Inst::Exit),
    ]);
    t.data("in_desc", R0, input_desc);
    t.data("out_desc", R0 + 0x100, output_desc);
    t.data("buf", R1, vec![0; 16]);
    t.image()
}

#[test]
fn host_descriptors_move_bytes_both_ways() {
    let bindings = vec![
        binding("x", BindingKind::Input, 8, &[]),
        binding("y", BindingKind::Output, 8, &[]),
    ];
    let tiles = (0..2u32)
        .map(|t| {
            host_tile(
                t,
                descriptors(&[(0, 0, 4 * t, R1, 4)]),
                descriptors(&[(1, 1, 4 * t, R1 + 4, 4)]),
            )
        })
        .collect();
    let p = package(&Machine::small(), tiles, vec![], bindings);
    let mut sim = Simulator::new(&p).unwrap();
    sim.set_binding("x", &words_le(&[41, 99])).unwrap();
    let r = sim.run(&SimOptions::default());
    assert_eq!(r.status, Status::Ok, "{:#?}", r.faults);
    assert_eq!(sim.binding("y").unwrap(), &words_le(&[42, 100])[..]);
    assert!(
        r.trace
            .iter()
            .any(|e| e.kind == TraceKind::HostTransferEnd { bytes: 8 })
    );
    assert!(sim.set_binding("x", &[0; 3]).is_err());
    assert!(sim.set_binding("nope", &[]).is_err());
}

#[test]
fn bad_host_descriptors_fault() {
    let bindings = vec![
        binding("x", BindingKind::Input, 8, &[]),
        binding("y", BindingKind::Output, 8, &[]),
    ];
    let cases: Vec<(Vec<u8>, FaultKind, &str)> = vec![
        // Output direction on an input binding.
        (
            descriptors(&[(0, 1, 0, R1, 4)]),
            FaultKind::InvalidOperand,
            "Input",
        ),
        (
            descriptors(&[(5, 0, 0, R1, 4)]),
            FaultKind::InvalidOperand,
            "no binding",
        ),
        (
            descriptors(&[(0, 0, 6, R1, 4)]),
            FaultKind::InvalidOperand,
            "exceed",
        ),
        (
            descriptors(&[(0, 2, 0, R1, 4)]),
            FaultKind::InvalidOperand,
            "flags",
        ),
        (
            descriptors(&[(0, 0, 0, 0xE_7FFE, 4)]),
            FaultKind::InvalidMemoryAddress,
            "outside SRAM",
        ),
    ];
    for (desc, kind, want) in cases {
        let tiles = vec![host_tile(0, desc, descriptors(&[]))];
        let p = package(&Machine::small(), tiles, vec![], bindings.clone());
        let (_, r) = run(&p);
        assert_eq!(r.faults.len(), 1);
        assert_eq!(r.faults[0].kind, kind);
        assert!(
            r.faults[0].cause.contains(want),
            "{} / {want}",
            r.faults[0].cause
        );
        assert!(r.faults[0].instruction.starts_with("hostxfer"));
    }
}

#[test]
fn preloaded_bindings_shortcut() {
    let mut t = TileBuilder::new(1);
    t.words(&[
        li(2, R1),
        s(Inst::Ld32M {
            d: MReg(3),
            base: MReg(2),
            imm: 0,
        }),
        s(Inst::Int {
            op: IntOp::Mul,
            d: MReg(3),
            a: MReg(3),
            b: MReg(3),
        }),
        s(Inst::St32M {
            s: MReg(3),
            base: MReg(2),
            imm: 1,
        }),
        s(Inst::Exit),
    ]);
    t.data("buf", R1, vec![0; 8]);
    let bindings = vec![
        binding("x", BindingKind::Input, 4, &[(1, R1, 0, 4)]),
        binding("y", BindingKind::Output, 4, &[(1, R1 + 4, 0, 4)]),
    ];
    let p = package(&Machine::small(), vec![t.image()], vec![], bindings);
    let mut sim = Simulator::new(&p).unwrap();
    sim.set_binding("x", &7u32.to_le_bytes()).unwrap();
    let r = sim.run(&SimOptions {
        preload_bindings: true,
        ..SimOptions::default()
    });
    assert_eq!(r.status, Status::Ok);
    assert_eq!(sim.binding("y").unwrap(), &49u32.to_le_bytes());
}

#[test]
fn sync_waits_for_the_slowest_tile() {
    let tile = |id: u32, spin: u16| {
        let mut t = TileBuilder::new(id);
        t.words(&[
            s(Inst::Rpti {
                count: spin,
                body: 1,
            }),
            s(Inst::Nop),
            s(Inst::SyncGlobal),
            s(Inst::Exit),
        ]);
        t.image()
    };
    let p = package(
        &Machine::small(),
        vec![tile(0, 10), tile(1, 1000)],
        vec![],
        vec![],
    );
    let (_, r) = run(&p);
    assert_eq!(r.status, Status::Ok);
    assert_eq!(r.per_tile[0].cycles, r.per_tile[1].cycles);
    assert_eq!(r.per_tile[0].supervisor.issues, 13);
    assert_eq!(r.per_tile[1].supervisor.issues, 1003);
    let m = Machine::small();
    // With no worker running the supervisor holds every slot, and `nop`s read
    // nothing: one issue per cycle. The slow tile arrives after 1,002 issues; then
    // the sync, then one issue (exit).
    assert_eq!(r.cycles, 1002 + u64::from(m.timing.sync_cycles) + 1);
}

#[test]
fn load_errors_are_typed() {
    let m = Machine::small();
    let mut img = TileBuilder::new(0).image();
    img.segments[0].addr = R1;
    assert!(matches!(
        Simulator::new(&package(&m, vec![img], vec![], vec![])),
        Err(LoadError::Segment { .. })
    ));
    let mut t = TileBuilder::new(0);
    t.data("a", 0xE_7FF0, vec![0; 32]);
    assert!(Simulator::new(&package(&m, vec![t.image()], vec![], vec![])).is_err());
    let mut t = TileBuilder::new(0);
    t.push(s(Inst::Exit));
    t.data("a", CODE, vec![0; 4]);
    assert!(Simulator::new(&package(&m, vec![t.image()], vec![], vec![])).is_err());
    let img = TileBuilder::new(9).image();
    assert!(matches!(
        Simulator::new(&package(&m, vec![img], vec![], vec![])),
        Err(LoadError::TileOutOfRange { .. })
    ));
    let mut p = package(&m, vec![], vec![], vec![]);
    p.machine_toml = "not toml".into();
    assert!(matches!(Simulator::new(&p), Err(LoadError::Machine(_))));
}

#[test]
fn runs_are_deterministic() {
    let m = Machine::small();
    let p = amp_package(&m, 4, 40, 2).unwrap();
    let (sa, a) = run(&p);
    let (sb, b) = run(&p);
    assert_eq!(a.status, Status::Ok);
    assert_eq!(a, b);
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap()
    );
    for t in 0..4 {
        assert_eq!(sa.read_memory(t, R0, 0x8000), sb.read_memory(t, R0, 0x8000));
    }
    // The trace has a kernel start and end per run on every tile.
    let starts = a
        .trace
        .iter()
        .filter(|e| matches!(e.kind, TraceKind::KernelStart { .. }))
        .count();
    assert_eq!(starts, 8);
}
