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
fn exchanging_tile(tile: u32) -> TileImage {
    let mut t = TileBuilder::new(tile);
    t.words(&[
        s(Inst::SyncGlobal),
        s(Inst::Exchange { id: 1 }),
        s(Inst::SyncGlobal),
        s(Inst::Exit),
    ]);
    t.data("buf", R1, vec![0; 16384]);
    t.image()
}

/// The exchange phase's cycles for `transfers` (src tile, bytes, destination tiles),
/// on the four tiles of `small`. Each source sends from R1 (+4 KiB per transfer it
/// sends); each destination receives at R1 + 8 KiB (+4 KiB per transfer received).
fn exchange(transfers: &[(u32, u32, &[u32])]) -> u64 {
    let mut sent = [0u32; 4];
    let mut got = [0u32; 4];
    let transfers = transfers
        .iter()
        .map(|&(src, bytes, dsts)| {
            let src_addr = R1 + 4096 * sent[src as usize];
            sent[src as usize] += 1;
            let dsts = dsts
                .iter()
                .map(|&d| {
                    let a = R1 + 8192 + 4096 * got[d as usize];
                    got[d as usize] += 1;
                    (d, a)
                })
                .collect();
            Transfer {
                src_tile: src,
                src_addr,
                bytes,
                dsts,
            }
        })
        .collect();
    let x = ExchangeProgram {
        id: 1,
        name: "x".into(),
        transfers,
    };
    let tiles = (0..4).map(exchanging_tile).collect();
    let (_, r) = run(&package(&Machine::small(), tiles, vec![x], vec![]));
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
    // One sender, one receiver: 4096 bytes at 4 B/cycle.
    assert_eq!(exchange(&[(2, 4096, &[0])]), 100 + 1024);
    // Two tiles of one bus pair receiving different data: each at its own
    // 4 B/cycle, no penalty for sharing the pair.
    assert_eq!(exchange(&[(2, 4096, &[0]), (3, 4096, &[1])]), 100 + 1024);
    // One tile receiving from two senders: 8192 bytes through its 4 B/cycle.
    assert_eq!(exchange(&[(2, 4096, &[0]), (3, 4096, &[0])]), 100 + 2048);
    // Both tiles of a pair receiving the same two streams: each receives 8192
    // bytes at double width (8 B/cycle); each sender sends 4096 at 4 B/cycle.
    assert_eq!(
        exchange(&[(2, 4096, &[0, 1]), (3, 4096, &[0, 1])]),
        100 + 1024
    );
    // The same two streams to tiles of different pairs: no double width.
    assert_eq!(
        exchange(&[(0, 4096, &[1, 2]), (3, 4096, &[1, 2])]),
        100 + 2048
    );
    // A sender is never faster than 4 B/cycle, whoever receives.
    assert_eq!(exchange(&[(2, 8192, &[0, 1])]), 100 + 2048);
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
