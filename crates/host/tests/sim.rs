//! End to end in the simulator: packages whose only host path is the emitted
//! descriptors and snippets (no preloading), checked byte by byte.

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_host::*;
use tessera_machine::Machine;
use tessera_package::BindingKind::{Input, Output, Weight};

fn hand_layout() -> Vec<BindingSpec> {
    let mut x: Vec<SliceSpec> = (0..8).map(|t| slice(t, 384 * t, 384, 0x98000)).collect();
    x.push(slice(3, 0, 1, 0x98401));
    vec![
        binding(
            "w",
            Weight,
            5000,
            vec![
                slice(0, 0, 2048, 0x90000),
                slice(1, 2048, 2952, 0x90000),
                slice(2, 0, 5000, 0x90100),
            ],
        ),
        binding("x", Input, 3072, x),
        binding("ids", Input, 1, vec![slice(7, 0, 1, 0x9A003)]),
        binding(
            "y",
            Output,
            1030,
            vec![slice(4, 0, 1025, 0xA0000), slice(5, 1025, 5, 0xA0001)],
        ),
        binding("z", Output, 8192, vec![slice(6, 0, 8192, 0xA8000)]),
    ]
}

#[test]
fn every_byte_arrives_through_the_descriptors() {
    let machine = Machine::small().with_tiles(8);
    let fin = hand_layout();
    // Sizing at provisional addresses: every tensor at the start of SRAM.
    let provisional = HostPlan::new(
        &machine,
        &with_addresses(&fin, |_, _, _| machine.sram_start()),
    )
    .unwrap();
    let bounds = provisional.bound_per_tile().to_vec();
    let reserved = provisional.max_bound();
    let plan = HostPlan::new(&machine, &fin).unwrap();
    plan.check_addresses().unwrap();
    assert_eq!(plan.bound_per_tile(), bounds.as_slice());
    let hosts = emit_all(&plan, &bounds, reserved);
    let run = run_and_check(&machine, &plan, &hosts, 1);
    let phases = plan.phases().len();
    // Weights: tile 2's whole copy is 1 phase; inputs: tile 3 has two slices;
    // outputs: one each.
    assert_eq!(phases, 1 + 2 + 1);
    assert_eq!(run.host_phases, phases);
    assert_eq!(
        run.host_bytes,
        5000 + 2048 + 2952 + 3072 + 1 + 1 + 1030 + 8192
    );
    assert_eq!(run.host_cycles, plan.link_cycles(&machine, 0..phases));
    eprintln!(
        "hand layout: {phases} phases, reservation {reserved} B (bounds {bounds:?}), \
         {} B moved, {} host-link cycles of {} total",
        run.host_bytes, run.host_cycles, run.cycles
    );
}

#[test]
fn relocated_packets_run_from_the_original_reservation() {
    let machine = Machine::small().with_tiles(8);
    let a = 0x90000;
    let shared = |second: u32| {
        vec![
            binding(
                "x",
                Input,
                2500,
                vec![slice(0, 0, 2500, a), slice(0, 0, 2500, second)],
            ),
            binding(
                "y",
                Output,
                600,
                vec![slice(1, 0, 300, a), slice(2, 300, 300, a)],
            ),
        ]
    };
    let provisional = HostPlan::new(&machine, &shared(a)).unwrap();
    let bounds = provisional.bound_per_tile().to_vec();
    assert_eq!(
        emit_provisional(&provisional, 0)
            .unwrap()
            .records_deduplicated,
        1
    );
    let plan = HostPlan::new(&machine, &shared(a + 0x1000)).unwrap();
    let hosts = emit_all(&plan, &bounds, provisional.max_bound());
    assert_eq!(hosts[0].records_deduplicated, 0);
    assert_eq!(hosts[0].bytes_used, bounds[0]);
    run_and_check(&machine, &plan, &hosts, 2);
}

#[test]
fn random_layouts_fit_their_bound_and_deliver_every_byte() {
    let machine = Machine::small().with_tiles(8);
    let (start, limit) = (machine.sram_start(), 0xE0000);
    let (mut shared_before, mut shared_after, mut host_cycles) = (0u64, 0u64, 0u64);
    for seed in 0..24u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(1000 + seed);
        let fin = random_layout(&mut rng, &machine, RESERVATION + 0x1000);
        // Provisional addresses: all equal (maximal sharing) or arbitrary.
        let prov = with_addresses(&fin, |_, _, s| {
            if seed % 2 == 0 {
                start
            } else {
                rng.random_range(start..limit - s.bytes)
            }
        });
        let provisional = HostPlan::new(&machine, &prov).unwrap();
        let bounds = provisional.bound_per_tile().to_vec();
        let reserved = provisional.max_bound();
        assert!(reserved <= 0x1000 && reserved.is_multiple_of(4));
        for t in 0..machine.tiles {
            let h = emit_provisional(&provisional, t).unwrap();
            assert_eq!(h.bytes_before_dedup, bounds[t as usize]);
            shared_before += u64::from(h.records_deduplicated);
        }
        let plan = HostPlan::new(&machine, &fin).unwrap();
        plan.check_addresses().unwrap();
        assert_eq!(plan.bound_per_tile(), bounds.as_slice(), "seed {seed}");
        let hosts = emit_all(&plan, &bounds, reserved);
        for h in &hosts {
            assert!(
                h.bytes_used <= bounds[h.tile as usize],
                "seed {seed} tile {}",
                h.tile
            );
            assert!(h.segments.iter().all(|s| s.addr >= RESERVATION
                && s.addr + s.bytes.len() as u32 <= RESERVATION + reserved));
            shared_after += u64::from(h.records_deduplicated);
        }
        let run = run_and_check(&machine, &plan, &hosts, seed);
        assert_eq!(run.host_phases, plan.phases().len());
        assert_eq!(
            run.host_cycles,
            plan.link_cycles(&machine, 0..plan.phases().len())
        );
        host_cycles += run.host_cycles;
    }
    // The layouts do exercise relocation: packets shared provisionally stop
    // being shared at the final, distinct addresses.
    assert!(shared_before > 0);
    assert_eq!(shared_after, 0);
    eprintln!(
        "random layouts: {shared_before} records shared provisionally, {shared_after} after placement, {host_cycles} host-link cycles"
    );
}

/// A corrupted descriptor record must stop the tile with a fault that names the
/// record and what is wrong with it, before any byte moves.
#[test]
fn corrupted_records_fault_with_their_cause() {
    use tessera_sim::{FaultKind, SimOptions, Simulator, Status};
    let machine = Machine::small().with_tiles(2);
    let specs = [binding("x", Input, 3000, vec![slice(1, 0, 3000, 0x90000)])];
    let plan = HostPlan::new(&machine, &specs).unwrap();
    let hosts = emit_all(&plan, plan.bound_per_tile(), plan.max_bound());
    // Record fields after the 4-byte count: binding +0, flags +2, host offset
    // +4, tile address +8, length +12.
    let cases: [(usize, u32, FaultKind, &str); 6] = [
        (16, 0, FaultKind::InvalidOperand, "empty record (0 bytes)"),
        (16, 3001, FaultKind::InvalidOperand, "exceed binding `x`"),
        (6, 2, FaultKind::InvalidOperand, "unknown flags 0x2"),
        (6, 1, FaultKind::InvalidOperand, "goes to the host"),
        (4, 7, FaultKind::InvalidOperand, "no binding #7"),
        (
            0,
            1 << 16,
            FaultKind::InvalidMemoryAddress,
            "runs outside SRAM",
        ),
    ];
    for (at, value, kind, cause) in cases {
        let mut p = package(&machine, &plan, &hosts, &[vec![], vec![]]);
        let seg = p.tiles[1]
            .segments
            .iter_mut()
            .find(|s| s.name == "host.desc.0")
            .unwrap();
        // The flags and binding index are u16 fields; the rest are u32.
        let width = if at == 4 || at == 6 { 2 } else { 4 };
        seg.bytes[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
        let mut sim = Simulator::new(&p).unwrap();
        sim.set_binding("x", &[0xA5; 3000]).unwrap();
        let report = sim.run(&SimOptions {
            preload_bindings: false,
            ..SimOptions::default()
        });
        assert_eq!(report.status, Status::Fault, "{cause}");
        let f = &report.faults[0];
        assert_eq!((f.tile, f.kind), (1, kind), "{cause}: {f}");
        assert!(f.cause.contains(cause), "{cause}: {}", f.cause);
        assert!(f.instruction.starts_with("hostxfer"), "{f}");
        assert_eq!(
            sim.read_memory(1, 0x90000, 3000).unwrap(),
            vec![0; 3000],
            "{cause}: nothing moves"
        );
    }
}
