//! The timing rules, each with cycles computed by hand from the machine's figures:
//! exchange receive rates, host link directions, supervisor issue against the
//! barrel, the AMP rate, and the agreement of the run's totals.

mod common;

use common::*;
use tessera_isa::{Inst, MReg};
use tessera_machine::Machine;
use tessera_package::*;
use tessera_sim::{SimOptions, SimReport, Simulator, Status, TraceEvent, TraceKind};

fn run(p: &Package) -> (Simulator, SimReport) {
    let mut sim = Simulator::new(p).unwrap();
    let r = sim.run(&SimOptions::default());
    assert_eq!(r.status, Status::Ok, "{:#?}", r.faults);
    (sim, r)
}

/// Cycles from each chip-wide `start` event to the matching `end` event.
fn phases(
    trace: &[TraceEvent],
    start: fn(&TraceKind) -> bool,
    end: fn(&TraceKind) -> bool,
) -> Vec<u64> {
    let mut open = None;
    let mut out = Vec::new();
    for e in trace.iter().filter(|e| e.tile.is_none()) {
        if start(&e.kind) {
            open = Some(e.cycle);
        } else if end(&e.kind) {
            out.push(e.cycle - open.take().expect("an end follows a start"));
        }
    }
    out
}

fn exchange_phases(r: &SimReport) -> Vec<u64> {
    phases(
        &r.trace,
        |k| matches!(k, TraceKind::ExchangeStart { .. }),
        |k| matches!(k, TraceKind::ExchangeEnd { .. }),
    )
}

fn host_phases(r: &SimReport) -> Vec<u64> {
    phases(
        &r.trace,
        |k| matches!(k, TraceKind::HostTransferStart { .. }),
        |k| matches!(k, TraceKind::HostTransferEnd { .. }),
    )
}

/// A tile that syncs, runs exchange 1, syncs and exits, with 16 KiB at R1.
/// The exchange phase's cycles for `transfers` (src tile, bytes, destination tiles),
/// on the four tiles of `small`, each tile running its part as inline exchange
/// code (`common::exchange_part`). Each source sends from R1 (+4 KiB per message
/// it sends); each destination receives at R1 + 8 KiB (+4 KiB per message it
/// receives).
fn exchange(transfers: &[(u32, u16, &[u32])]) -> u64 {
    exchange_on(&Machine::small(), transfers)
}

/// [`exchange`] on `m`, a machine of four tiles.
fn exchange_on(m: &Machine, transfers: &[(u32, u16, &[u32])]) -> u64 {
    let mut sends: Vec<Vec<(u32, u16)>> = vec![Vec::new(); 4];
    let mut recvs: Vec<Vec<(u32, u16, u32)>> = vec![Vec::new(); 4];
    for &(src, bytes, dsts) in transfers {
        let msg = sends[src as usize].len() as u16;
        sends[src as usize].push((R1 + 4096 * u32::from(msg), bytes));
        for &d in dsts {
            let k = recvs[d as usize].len() as u32;
            recvs[d as usize].push((src, msg, R1 + 8192 + 4096 * k));
        }
    }
    let tiles = (0..4)
        .map(|t| {
            let mut b = TileBuilder::new(t);
            b.push(s(Inst::SyncGlobal));
            recvs[t as usize].sort_by_key(|r| (r.0, r.1));
            b.words(&exchange_part(1, &sends[t as usize], &recvs[t as usize]));
            b.words(&[s(Inst::SyncGlobal), s(Inst::Exit)]);
            b.data("buf", R1, vec![0; 32768]);
            b.image()
        })
        .collect();
    let (_, r) = run(&package(m, tiles, vec![phase(1)], vec![]));
    assert_eq!(r.status, tessera_sim::Status::Ok, "{:#?}", r.faults);
    let p = exchange_phases(&r);
    assert_eq!(p.len(), 1);
    p[0]
}

#[test]
fn exchange_receive_rates() {
    let m = Machine::small();
    let (o, rate) = (
        u64::from(m.timing.exchange_overhead_cycles),
        u64::from(m.timing.exchange_bytes_per_cycle),
    );
    assert_eq!((o, rate), (100, 4));
    // The code of `exchange_part`: 7 cycles a send or receive, 1 a mux, 1 the
    // `exchange`. So a tile sending one message runs 8 cycles of code, a tile
    // receiving one 9, from two sources 17; a tile with no part 1.
    // One sender, one receiver: 4096 bytes at 4 B/cycle, after the receiver's 9.
    assert_eq!(exchange(&[(2, 4096, &[0])]), 100 + 9 + 1024);
    // Two tiles of one bus pair receiving different data: each at its own
    // 4 B/cycle, no penalty for sharing the pair.
    assert_eq!(
        exchange(&[(2, 4096, &[0]), (3, 4096, &[1])]),
        100 + 9 + 1024
    );
    // One tile receiving from two senders: 8192 bytes through its 4 B/cycle.
    assert_eq!(
        exchange(&[(2, 4096, &[0]), (3, 4096, &[0])]),
        100 + 17 + 2048
    );
    // Both tiles of a pair receiving the same two streams: each receives 8192
    // bytes at double width (8 B/cycle); each sender sends 4096 at 4 B/cycle.
    assert_eq!(
        exchange(&[(2, 4096, &[0, 1]), (3, 4096, &[0, 1])]),
        100 + 17 + 1024
    );
    // The same two streams to tiles of different pairs: no double width.
    assert_eq!(
        exchange(&[(0, 4096, &[1, 2]), (3, 4096, &[1, 2])]),
        100 + 17 + 2048
    );
    // A sender is never faster than 4 B/cycle, whoever receives: its 8 cycles
    // of code, then 8192 bytes.
    assert_eq!(exchange(&[(2, 8192, &[0, 1])]), 100 + 8 + 2048);
}

#[test]
fn every_message_costs_its_code_on_both_sides() {
    // Three 4-byte messages from tile 0 to tile 1: the sender runs 3 x 7 + 1 = 22
    // cycles of code, then 12 bytes (3 cycles); the receiver 1 + 3 x 7 + 1 = 23,
    // then 3. The phase is the receiver's 26 after the overhead.
    assert_eq!(
        exchange(&[(0, 4, &[1]), (0, 4, &[1]), (0, 4, &[1])]),
        100 + 23 + 3
    );
    // The same 12 bytes as one message: 8 and 9 cycles of code.
    assert_eq!(exchange(&[(0, 12, &[1])]), 100 + 9 + 3);
    // A tile that lands one message from each of three sources switches its mux
    // three times: 3 x (1 + 7) + 1 = 25, then 12 bytes.
    assert_eq!(
        exchange(&[(0, 4, &[3]), (1, 4, &[3]), (2, 4, &[3])]),
        100 + 25 + 3
    );
}

/// The overlap of exchange code and bytes (`exchange_code_overlap_percent`, p)
/// reaches the simulator: each tile takes code + data - p/100 x min(code, data),
/// rounded up.
#[test]
fn exchange_code_overlaps_its_bytes_as_described() {
    let at = |percent: u32, transfers: &[(u32, u16, &[u32])]| {
        let mut m = Machine::small();
        m.timing.exchange_code_overlap_percent = percent;
        exchange_on(&m, transfers)
    };
    // Bytes longer than code: the receiver's 9 cycles of code beside its 1024 of
    // bytes (the sender's 8 beside its 1024 is shorter at every p): 9 + 1024,
    // 1033 - 4.5 rounded up to 1029, 1024.
    let one: &[(u32, u16, &[u32])] = &[(2, 4096, &[0])];
    assert_eq!(at(0, one), 100 + 9 + 1024);
    assert_eq!(at(50, one), 100 + 1029);
    assert_eq!(at(100, one), 100 + 1024);
    // Code longer than bytes: three 4-byte messages, the receiver's 23 cycles of
    // code beside its 3 of bytes: 26, 26 - 1.5 rounded up to 25, 23.
    let three: &[(u32, u16, &[u32])] = &[(0, 4, &[1]), (0, 4, &[1]), (0, 4, &[1])];
    assert_eq!(at(0, three), 100 + 23 + 3);
    assert_eq!(at(50, three), 100 + 25);
    assert_eq!(at(100, three), 100 + 23);
}

/// A tile that moves `inward` bytes in and `outward` bytes out in one `hostxfer`.
fn host_package(inward: u32, outward: u32) -> Package {
    let mut records = Vec::new();
    if inward > 0 {
        records.push((0u16, 0u16, 0u32, R1, inward));
    }
    if outward > 0 {
        records.push((1, 1, 0, R1 + 0x20000, outward));
    }
    let mut desc = (records.len() as u32).to_le_bytes().to_vec();
    for &(b, flags, off, addr, len) in &records {
        desc.extend_from_slice(&b.to_le_bytes());
        desc.extend_from_slice(&flags.to_le_bytes());
        for v in [off, addr, len] {
            desc.extend_from_slice(&v.to_le_bytes());
        }
    }
    let mut t = TileBuilder::new(0);
    t.words(&[
        li(1, R0),
        s(Inst::HostXfer { desc: MReg(1) }),
        s(Inst::Exit),
    ]);
    t.data("desc", R0, desc);
    let binding = |name: &str, kind, bytes: u32| HostBinding {
        data: Vec::new(),
        name: name.into(),
        kind,
        bytes: bytes.max(1),
        slices: Vec::new(),
    };
    package(
        &Machine::small(),
        vec![t.image()],
        vec![],
        vec![
            binding("x", BindingKind::Input, inward),
            binding("y", BindingKind::Output, outward),
        ],
    )
}

#[test]
fn host_link_directions() {
    let m = Machine::small();
    // 31.5 GB/s each way at 1.5 GHz: 21.0051 bytes per cycle; overhead 1,500.
    let o = u64::from(m.timing.host_transfer_overhead_cycles);
    assert_eq!(o, 1500);
    let host = |inward, outward| {
        let (_, r) = run(&host_package(inward, outward));
        let p = host_phases(&r);
        assert_eq!(p.len(), 1);
        p[0]
    };
    // 21,006 bytes take 1,000.0 link cycles, rounded up to 1,001.
    assert_eq!(host(21_006, 0), 1500 + 1001);
    assert_eq!(host(0, 21_006), 1500 + 1001);
    // In and out in one phase use both directions at once: no slower than the
    // longer of the two, and not their sum over one shared link.
    assert_eq!(host(21_006, 21_006), 1500 + 1001);
    assert_eq!(host(42_011, 21_006), 1500 + 2001);
}

/// The issue cycle of every supervisor `mark`, by tag.
fn marks(r: &SimReport) -> Vec<(u16, u64)> {
    r.trace
        .iter()
        .filter_map(|e| match e.kind {
            TraceKind::Mark { tag } => Some((tag, e.cycle)),
            _ => None,
        })
        .collect()
}

/// A tile: `sup` words for the supervisor (state pointer in `$m1`, worker entry in
/// `$m0` when `worker_nops` is given), then `exit`; workers run `worker_nops` nops
/// in a repeat and exit (12 issues for 10 nops).
fn supervisor_tile(sup: &[tessera_isa::Word], worker_nops: Option<u16>) -> Package {
    let mut t = TileBuilder::new(0);
    let fix = t.code.words.len();
    t.words(&[li(0, 0), li(1, R0)]);
    t.words(sup);
    t.push(s(Inst::Exit));
    if let Some(n) = worker_nops {
        let entry = t.label("worker");
        t.words(&[
            s(Inst::Rpti { count: n, body: 1 }),
            s(Inst::Nop),
            s(Inst::Exit),
        ]);
        t.code.words[fix] = li(0, entry);
    }
    t.data("state", R0, vec![0; 64]);
    package(&Machine::small(), vec![t.image()], vec![], vec![])
}

fn mark(tag: u16) -> tessera_isa::Word {
    s(Inst::Mark { tag })
}

#[test]
fn supervisor_alone_issues_every_cycle_but_waits_for_results() {
    // `setzi $m0` at 0 and `setzi $m1` at 1; independent `setzi`s then issue one a
    // cycle: 2..=9, the mark at 10, exit at 11.
    let sup: Vec<_> = (2..10).map(|r| li(r, 7)).chain([mark(1)]).collect();
    let (_, r) = run(&supervisor_tile(&sup, None));
    assert_eq!(marks(&r), vec![(1, 10)]);
    assert_eq!(r.cycles, 12);
    // A chain of dependent adds waits the pipeline's depth (6) for each result:
    // `setzi $m2` at 2, adds at 8, 14, 20; the mark (reading nothing) at 9.
    let sup = vec![
        li(2, 1),
        addi(2, 2, 1),
        mark(1),
        addi(2, 2, 1),
        addi(2, 2, 1),
        mark(2),
    ];
    let (_, r) = run(&supervisor_tile(&sup, None));
    assert_eq!(marks(&r), vec![(1, 9), (2, 21)]);
    // A taken branch refills the pipeline: `bri` at 2, its target at 8.
    let mut t = TileBuilder::new(0);
    let target = tessera_isa::Word::Single(Inst::Bri { target: 0 });
    t.words(&[li(0, 0), li(1, 0), target]);
    let at = t.label("target");
    t.words(&[mark(1), s(Inst::Exit)]);
    t.code.words[2] = s(Inst::Bri { target: at });
    let (_, r) = run(&package(&Machine::small(), vec![t.image()], vec![], vec![]));
    assert_eq!(marks(&r), vec![(1, 8)]);
}

#[test]
fn supervisor_gets_no_slot_while_six_workers_run() {
    // `runall` reads $m1 (written at 1): it issues at 7 and hands every slot to the
    // workers, which start at 8..=13 and hold them for 12 issues (72 cycles): worker
    // 0 exits at 80, worker 5 at 85. The supervisor's next words take the slots as
    // they come back: 80, 81, 82; `sync local` at 83 waits for the last worker (85);
    // exit issues at 85.
    let sup = vec![
        s(Inst::RunAll {
            entry: MReg(0),
            state: MReg(1),
            stride: 4,
        }),
        mark(1),
        mark(2),
        mark(3),
        s(Inst::SyncLocal),
        mark(4),
    ];
    let (_, r) = run(&supervisor_tile(&sup, Some(10)));
    assert_eq!(marks(&r), vec![(1, 80), (2, 81), (3, 82), (4, 85)]);
    assert_eq!(r.cycles, 87);
    assert_eq!(r.per_tile[0].workers[5].cycles, 72);
}

#[test]
fn run_hands_over_the_slot_it_issued_in() {
    // `run` at 7 (slot 1) starts worker 0 at 13 in that slot; the supervisor keeps
    // the other five: its eleven `setzi`s issue at 8..=12, 14..=18 and 20 (13 and
    // 19 are the worker's), and the mark at 21.
    let mut sup = vec![s(Inst::Run {
        entry: MReg(0),
        state: MReg(1),
        worker: 0,
    })];
    sup.extend((2..13).map(|r| li(r, 1)));
    sup.push(mark(1));
    sup.push(s(Inst::SyncLocal));
    sup.push(mark(2));
    let (_, r) = run(&supervisor_tile(&sup, Some(10)));
    // The worker holds its slot 13..85; `sync local` at 22 waits for it.
    assert_eq!(marks(&r), vec![(1, 21), (2, 85)]);
}

#[test]
fn amp_rate_comes_from_the_machine() {
    let slope = |rate: u32| {
        let mut m = Machine::small();
        m.timing.amp_f16_macs_per_cycle = rate;
        let points = tessera_sim::bench::calibration(&m, 1, &[256, 2048]);
        let fit = tessera_sim::bench::calibration_fit(&points).unwrap();
        fit.slope
    };
    // 64 MACs per cycle: six workers each stream a row (four 64-MAC steps) per four
    // rounds of 6 cycles: 4 cycles per row per tile.
    assert!((slope(64) - 4.0).abs() < 0.01, "{}", slope(64));
    // Half the rate: every step holds its worker a second round.
    assert!((slope(32) - 8.0).abs() < 0.02, "{}", slope(32));
    // A faster unit waits on issue: our `amp` is one issue of 64 MACs.
    assert!((slope(128) - 4.0).abs() < 0.01, "{}", slope(128));
}

#[test]
fn supervisor_takes_the_first_slot_any_worker_returns() {
    // Worker w spins 20 - 3w nops: 25 - 3w issues. `runall` at 7 starts them at
    // 8..=13; worker 5, started last, exits first at 13 + 6 * 10 = 73, and the
    // supervisor's mark issues in that slot, long before worker 0 exits at 158.
    let mut t = TileBuilder::new(0);
    let fix = t.code.words.len();
    t.words(&[
        li(0, 0),
        li(1, R0),
        s(Inst::RunAll {
            entry: MReg(0),
            state: MReg(1),
            stride: 4,
        }),
        mark(1),
        s(Inst::SyncLocal),
        mark(2),
        s(Inst::Exit),
    ]);
    let entry = t.label("worker");
    t.words(&[
        li(4, 20),
        s(Inst::IntImm {
            op: tessera_isa::IntOp::Mul,
            d: MReg(3),
            a: MReg(1),
            imm: 3,
        }),
        s(Inst::Int {
            op: tessera_isa::IntOp::Sub,
            d: MReg(2),
            a: MReg(4),
            b: MReg(3),
        }),
        s(Inst::Rpt {
            count: MReg(2),
            body: 1,
        }),
        s(Inst::Nop),
        s(Inst::Exit),
    ]);
    t.code.words[fix] = li(0, entry);
    t.data("state", R0, vec![0; 64]);
    let (_, r) = run(&package(&Machine::small(), vec![t.image()], vec![], vec![]));
    assert_eq!(marks(&r), vec![(1, 73), (2, 158)]);
}
