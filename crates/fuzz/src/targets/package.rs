//! `tessera_package::read_package`, then, for an accepted package, the simulator:
//! load it and run it under a small cycle budget. The generator edits the package
//! model of a seed (tile ids, addresses, sizes, permissions, random code, exchanges,
//! bindings, the embedded machine) and writes it with the real writer; sometimes it
//! then corrupts length and count fields and reseals the checksums, so that the
//! reader's field checks are reached rather than its checksums alone.

use crate::mutate::interesting;
use crate::targets::tree::mutate_toml;
use crate::{Rng, Seed, Target, corpus};
use rand::Rng as _;
use tessera_machine::Machine;
use tessera_package::*;
use tessera_sim::{SimOptions, Simulator};

pub struct PackageTarget;

/// Enough for the seeds to finish and for a loop to time out quickly.
const CYCLE_BUDGET: u64 = 20_000;

impl Target for PackageTarget {
    fn name(&self) -> &'static str {
        "package"
    }
    fn about(&self) -> &'static str {
        "read_package, then Simulator::new and run (20k-cycle budget)"
    }
    fn corpus(&self) -> &'static [Seed] {
        corpus::PACKAGE
    }
    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        let seeds = self.corpus();
        let seed = seeds[rng.random_range(0..seeds.len())];
        let Ok(mut p) = read_package(seed.bytes) else {
            return seed.bytes.to_vec();
        };
        for _ in 0..1 + rng.random_range(0..4u32) {
            edit(&mut p, rng);
        }
        let mut bytes = write_package(&p);
        if rng.random_bool(0.3) {
            corrupt_fields(&mut bytes, rng);
        }
        bytes
    }
    fn fixup(&self, input: &mut Vec<u8>, rng: &mut Rng) {
        // Without this nearly every mutation stops at a checksum.
        if rng.random_bool(0.8) {
            reseal_checksums(input);
        }
    }
    fn execute(&self, input: &[u8]) -> Result<String, String> {
        let p = read_package(input).map_err(|e| format!("read: {e}"))?;
        // Both ways of getting bindings in: alternate on something the input decides.
        simulate(&p, input.len() % 2 == 1)
    }
}

/// The package round trip, then the simulator under [`CYCLE_BUDGET`]: the accepted
/// outcome names the first fault's kind. A round trip that differs, or a report whose
/// status and faults disagree, is a panic.
pub(crate) fn simulate(p: &Package, preload_bindings: bool) -> Result<String, String> {
    let again = read_package(&write_package(p));
    assert!(
        again.as_ref().is_ok_and(|q| q == p),
        "an accepted package does not survive write and read: {again:?}"
    );
    let mut sim = Simulator::new(p).map_err(|e| format!("load: {e}"))?;
    let r = sim.run(&SimOptions {
        cycle_budget: CYCLE_BUDGET,
        preload_bindings,
        trace: false,
        ..SimOptions::default()
    });
    assert_eq!(
        r.status == tessera_sim::Status::Ok,
        r.faults.is_empty(),
        "the status and the fault list disagree"
    );
    Ok(match r.faults.first() {
        None => "sim ok".into(),
        Some(f) => format!("sim fault {}", super::variant(&format!("{:?}", f.kind))),
    })
}

/// Overwrites one to three little-endian fields after the header with interesting
/// integers (counts and lengths become huge, zero or off by one) and reseals.
fn corrupt_fields(bytes: &mut [u8], rng: &mut Rng) {
    let header = 16 + 4 * 24 + 4;
    if bytes.len() <= header + 4 {
        return;
    }
    for _ in 0..1 + rng.random_range(0..3u32) {
        let at = rng.random_range(header..bytes.len() - 4);
        let v = interesting(rng) as u32;
        bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    reseal_checksums(bytes);
}

/// An address worth trying: near the existing ones, at region edges, or extreme.
fn addr(rng: &mut Rng, near: u32) -> u32 {
    match rng.random_range(0..6u32) {
        0 => near.wrapping_add(rng.random_range(0..64) * 4),
        1 => near.wrapping_sub(rng.random_range(1..64)),
        2 => [0x4_c000, 0x9_0000, 0x9_a000, 0x8_0000, 0xf_fffc, 0x10_0000][rng.random_range(0..6)],
        3 => interesting(rng) as u32,
        _ => near,
    }
}

/// Random code words whose opcodes mostly decode, so that execution gets somewhere.
fn code(rng: &mut Rng, words: usize) -> Vec<u8> {
    (0..words)
        .flat_map(|_| {
            let w: u32 = rng.random();
            ((w & 0x80ff_ffff) | (((w >> 24) % 0x49) << 24)).to_le_bytes()
        })
        .collect()
}

fn edit(p: &mut Package, rng: &mut Rng) {
    match rng.random_range(0..12u32) {
        0 => {
            p.machine_toml = match rng.random_range(0..4u32) {
                0 => Machine::bow().to_toml(),
                1 => Machine::small()
                    .with_tiles(rng.random_range(1..8))
                    .to_toml(),
                _ => mutate_toml(&p.machine_toml, rng),
            }
        }
        1 if !p.tiles.is_empty() => {
            let i = rng.random_range(0..p.tiles.len());
            let t = &mut p.tiles[i];
            match rng.random_range(0..3u32) {
                0 => t.tile = rng.random_range(0..8),
                1 => t.tile = interesting(rng) as u32,
                _ => t.entry = addr(rng, t.entry),
            }
        }
        2 if !p.tiles.is_empty() => {
            let mut t = p.tiles[rng.random_range(0..p.tiles.len())].clone();
            t.tile = rng.random_range(0..8);
            let at = rng.random_range(0..=p.tiles.len());
            p.tiles.insert(at, t);
        }
        3..=5 => {
            let Some(t) = pick_mut(&mut p.tiles, rng) else {
                return;
            };
            let Some(s) = pick_mut(&mut t.segments, rng) else {
                return;
            };
            match rng.random_range(0..6u32) {
                0 => s.addr = addr(rng, s.addr),
                1 => s.size = interesting(rng) as u32,
                2 => s.size = s.size.wrapping_add(rng.random_range(0..16)),
                3 => {
                    let n = rng.random_range(0..64);
                    s.bytes = code(rng, n);
                    s.size = s.size.max(s.bytes.len() as u32);
                }
                4 => {
                    let bits: u8 = rng.random_range(0..8);
                    s.perms = Perms {
                        read: bits & 1 != 0,
                        write: bits & 2 != 0,
                        execute: bits & 4 != 0,
                    };
                }
                _ => s.bytes.truncate(rng.random_range(0..=s.bytes.len())),
            }
        }
        6 => {
            let Some(t) = pick_mut(&mut p.tiles, rng) else {
                return;
            };
            let words = rng.random_range(1..48);
            let at = addr(rng, t.entry);
            let bytes = code(rng, words);
            t.segments.push(Segment {
                name: format!("fuzz{}", t.segments.len()),
                addr: at,
                size: bytes.len() as u32,
                bytes,
                perms: Perms {
                    read: true,
                    write: rng.random(),
                    execute: true,
                },
            });
            if rng.random_bool(0.7) {
                t.entry = at;
            }
        }
        7 => {
            let Some(t) = pick_mut(&mut p.tiles, rng) else {
                return;
            };
            let Some(s) = pick_mut(&mut t.symbols, rng) else {
                return;
            };
            match rng.random_range(0..3u32) {
                0 => s.name.clear(),
                1 => s.addr = addr(rng, s.addr),
                _ => s.size = interesting(rng) as u32,
            }
        }
        8 => {
            // A named phase, or a renamed one.
            match pick_mut(&mut p.exchanges, rng) {
                Some(x) if rng.random_bool(0.5) => x.id = rng.random_range(0..4),
                _ => p.exchanges.push(ExchangeProgram {
                    id: rng.random_range(0..8),
                    name: "fuzz".into(),
                }),
            }
        }
        9 => {
            // An exchange instruction written over a word of a code segment.
            let Some(t) = pick_mut(&mut p.tiles, rng) else {
                return;
            };
            let Some(s) = pick_mut(&mut t.segments, rng) else {
                return;
            };
            if s.bytes.len() < 4 {
                return;
            }
            let a = tessera_isa::MReg(rng.random_range(0..16));
            let inst = match rng.random_range(0..4u32) {
                0 => tessera_isa::Inst::Send {
                    a,
                    bytes: interesting(rng) as u16,
                },
                1 => tessera_isa::Inst::Mux {
                    tile: rng.random_range(0..6),
                },
                2 => tessera_isa::Inst::Recv {
                    a,
                    msg: rng.random_range(0..4),
                },
                _ => tessera_isa::Inst::Exchange {
                    id: rng.random_range(0..4),
                },
            };
            if let Ok(w) = tessera_isa::encode_inst(&inst) {
                let at = rng.random_range(0..s.bytes.len() / 4) * 4;
                s.bytes[at..at + 4].copy_from_slice(&w.to_le_bytes());
            }
        }
        _ => {
            let b = match pick_mut(&mut p.bindings, rng) {
                Some(b) => b,
                None => {
                    p.bindings.push(HostBinding {
                        name: "fuzz".into(),
                        kind: BindingKind::Input,
                        bytes: 16,
                        slices: Vec::new(),
                        data: Vec::new(),
                    });
                    p.bindings.last_mut().expect("just pushed")
                }
            };
            match rng.random_range(0..4u32) {
                0 => {
                    b.kind = [BindingKind::Input, BindingKind::Output, BindingKind::Weight]
                        [rng.random_range(0..3)];
                    if b.kind == BindingKind::Weight {
                        b.data = vec![0x3c; b.bytes.min(4096) as usize];
                    }
                }
                1 => b.bytes = interesting(rng) as u32,
                2 => b.slices.push(BindingSlice {
                    tile: rng.random_range(0..4),
                    tile_addr: addr(rng, 0x9_0000),
                    offset: rng.random_range(0..64),
                    bytes: rng.random_range(0..64),
                }),
                _ => b.data.resize(rng.random_range(0..64), 0),
            }
        }
    }
}

fn pick_mut<'a, T>(v: &'a mut [T], rng: &mut Rng) -> Option<&'a mut T> {
    if v.is_empty() {
        None
    } else {
        let i = rng.random_range(0..v.len());
        v.get_mut(i)
    }
}
