//! Shared test helpers: binding specs, hand-built packages whose supervisors run
//! only the host snippets, and a simulator check of every transferred byte.

#![allow(dead_code)]

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_host::*;
use tessera_isa::{Inst, MReg, Word, encode};
use tessera_machine::Machine;
use tessera_package::{BindingKind, Package, Perms, Segment, TileImage};
use tessera_sim::{SimOptions, Simulator, Status, TraceKind};

pub const CODE_BASE: u32 = 0x4C000;
/// The common reservation sits at the start of region 1, data buffers after it.
pub const RESERVATION: u32 = 0x80000;
pub const DESC_REG: MReg = MReg(3);

pub fn slice(tile: u32, offset: u32, bytes: u32, tile_addr: u32) -> SliceSpec {
    SliceSpec {
        tile,
        offset,
        bytes,
        tile_addr,
    }
}

pub fn binding(name: &str, kind: BindingKind, bytes: u32, slices: Vec<SliceSpec>) -> BindingSpec {
    BindingSpec {
        name: name.into(),
        kind,
        bytes,
        slices,
    }
}

/// The same bindings with every tile address replaced.
pub fn with_addresses(
    specs: &[BindingSpec],
    mut addr: impl FnMut(usize, usize, &SliceSpec) -> u32,
) -> Vec<BindingSpec> {
    specs
        .iter()
        .enumerate()
        .map(|(bi, b)| BindingSpec {
            slices: b
                .slices
                .iter()
                .enumerate()
                .map(|(si, s)| SliceSpec {
                    tile_addr: addr(bi, si, s),
                    ..s.clone()
                })
                .collect(),
            ..b.clone()
        })
        .collect()
}

/// Final emission of every tile of the machine into the common reservation
/// `[RESERVATION, RESERVATION + reserved)`, checked against `bounds` (the
/// provisional plan's).
pub fn emit_all(plan: &HostPlan, bounds: &[u32], reserved: u32) -> Vec<TileHost> {
    (0..bounds.len() as u32)
        .map(|t| {
            emit_tile(
                plan,
                t,
                bounds[t as usize],
                &[(RESERVATION, RESERVATION + reserved)],
            )
            .unwrap_or_else(|e| panic!("tile {t}: {e}"))
        })
        .collect()
}

/// A package whose tile `t` runs every host phase's snippet, then exits, with
/// `hosts[t]`'s descriptors and `data` (per tile, (addr, bytes)) as initial
/// memory.
pub fn package(
    machine: &Machine,
    plan: &HostPlan,
    hosts: &[TileHost],
    data: &[Vec<(u32, Vec<u8>)>],
) -> Package {
    let tiles = hosts
        .iter()
        .map(|h| {
            let mut words = h.supervisor_code(0..plan.phases().len(), DESC_REG).unwrap();
            assert_eq!(words.len(), SNIPPET_WORDS * plan.phases().len());
            words.push(Word::Single(Inst::Exit));
            let code = encode(&words).unwrap();
            let mut segments = vec![Segment {
                name: "code".into(),
                addr: CODE_BASE,
                size: code.len() as u32,
                bytes: code,
                perms: Perms {
                    read: true,
                    write: false,
                    execute: true,
                },
            }];
            segments.extend(h.package_segments());
            for (i, (addr, bytes)) in data[h.tile as usize].iter().enumerate() {
                segments.push(Segment {
                    name: format!("out.{i}"),
                    addr: *addr,
                    size: bytes.len() as u32,
                    bytes: bytes.clone(),
                    perms: Perms {
                        read: true,
                        write: true,
                        execute: false,
                    },
                });
            }
            TileImage {
                tile: h.tile,
                segments,
                entry: CODE_BASE,
                symbols: vec![],
            }
        })
        .collect();
    let p = Package {
        machine_toml: machine.to_toml(),
        tiles,
        exchanges: vec![],
        bindings: plan.package_bindings(),
    };
    tessera_package::validate(&p).unwrap();
    p
}

/// What one simulated run spent.
#[derive(Debug)]
pub struct HostRun {
    pub cycles: u64,
    /// Cycles between host transfer starts and ends, summed over phases.
    pub host_cycles: u64,
    pub host_phases: usize,
    pub host_bytes: u64,
}

/// Builds the package, fills inputs and weights with random bytes and output
/// sources with other random bytes, runs the simulator (no preloading) and
/// checks every byte of every slice arrived where the plan said.
pub fn run_and_check(machine: &Machine, plan: &HostPlan, hosts: &[TileHost], seed: u64) -> HostRun {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut data: Vec<Vec<(u32, Vec<u8>)>> = vec![Vec::new(); machine.tiles as usize];
    let mut host: Vec<Vec<u8>> = Vec::new();
    for b in plan.bindings() {
        let mut buf = vec![0u8; b.bytes as usize];
        if b.kind == BindingKind::Output {
            for s in &b.slices {
                let mut src = vec![0u8; s.bytes as usize];
                rng.fill_bytes(&mut src);
                buf[s.offset as usize..(s.offset + s.bytes) as usize].copy_from_slice(&src);
                data[s.tile as usize].push((s.tile_addr, src));
            }
        } else {
            rng.fill_bytes(&mut buf);
        }
        host.push(buf);
    }
    let p = package(machine, plan, hosts, &data);
    let mut sim = Simulator::new(&p).unwrap();
    for (b, buf) in plan.bindings().iter().zip(&host) {
        if b.kind != BindingKind::Output {
            sim.set_binding(&b.name, buf).unwrap();
        }
    }
    let report = sim.run(&SimOptions {
        preload_bindings: false,
        trace: true,
        ..SimOptions::default()
    });
    assert_eq!(report.status, Status::Ok, "{:?}", report.faults);
    for (b, buf) in plan.bindings().iter().zip(&host) {
        match b.kind {
            BindingKind::Output => {
                // Host bytes no slice covers stay zero.
                assert_eq!(sim.binding(&b.name).unwrap(), buf.as_slice(), "{}", b.name);
            }
            _ => {
                for (si, s) in b.slices.iter().enumerate() {
                    let got = sim.read_memory(s.tile, s.tile_addr, s.bytes).unwrap();
                    let want = &buf[s.offset as usize..(s.offset + s.bytes) as usize];
                    assert!(got == want, "{} slice {si} on tile {}", b.name, s.tile);
                }
            }
        }
    }
    // The descriptors are read, never written.
    for h in hosts {
        for s in &h.segments {
            let got = sim
                .read_memory(h.tile, s.addr, s.bytes.len() as u32)
                .unwrap();
            assert_eq!(got, s.bytes.as_slice());
        }
    }
    let (mut host_cycles, mut host_phases, mut host_bytes, mut open) = (0, 0, 0, None);
    for e in &report.trace {
        match e.kind {
            TraceKind::HostTransferStart { .. } => open = Some(e.cycle),
            TraceKind::HostTransferEnd { bytes } => {
                host_cycles += e.cycle - open.take().expect("a start before each end");
                host_phases += 1;
                host_bytes += bytes;
            }
            _ => {}
        }
    }
    HostRun {
        cycles: report.cycles,
        host_cycles,
        host_phases,
        host_bytes,
    }
}

/// A random binding layout on `machine`: sizes around and across the payload,
/// output slices partitioning their buffer, input and weight slices sometimes
/// replicated (to another tile, or twice to one tile). Final addresses are
/// disjoint per tile from `base`, with random gaps and alignment.
pub fn random_layout(rng: &mut ChaCha8Rng, machine: &Machine, base: u32) -> Vec<BindingSpec> {
    let payload = machine.timing.host_packet_payload_bytes;
    let tiles = machine.tiles;
    let mut next = vec![base; tiles as usize];
    let mut alloc = |rng: &mut ChaCha8Rng, tile: u32, bytes: u32| {
        let align = [1u32, 2, 4, 8][rng.random_range(0..4)];
        let at = (next[tile as usize] + rng.random_range(0..64)).next_multiple_of(align);
        next[tile as usize] = at + bytes;
        at
    };
    let count = rng.random_range(1..=6);
    let mut specs = Vec::new();
    for i in 0..count {
        let kind =
            [BindingKind::Weight, BindingKind::Input, BindingKind::Output][rng.random_range(0..3)];
        let bytes = match rng.random_range(0..4) {
            0 => payload * rng.random_range(1..=3),
            1 => rng.random_range(1..=16),
            _ => rng.random_range(1..=3 * payload + 7),
        };
        let pieces = rng.random_range(1..=4).min(bytes);
        let mut cuts: Vec<u32> = (0..pieces - 1)
            .map(|_| rng.random_range(1..bytes))
            .collect();
        cuts.push(0);
        cuts.push(bytes);
        cuts.sort_unstable();
        cuts.dedup();
        let mut slices = Vec::new();
        for w in cuts.windows(2) {
            let (offset, len) = (w[0], w[1] - w[0]);
            let tile = rng.random_range(0..tiles);
            slices.push(slice(tile, offset, len, alloc(rng, tile, len)));
            if kind != BindingKind::Output && rng.random_bool(0.3) {
                let again = if rng.random_bool(0.5) {
                    tile
                } else {
                    rng.random_range(0..tiles)
                };
                slices.push(slice(again, offset, len, alloc(rng, again, len)));
            }
        }
        specs.push(binding(&format!("b{i}"), kind, bytes, slices));
    }
    specs
}
