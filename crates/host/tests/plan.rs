//! Slicing into packets, phase membership, the storage bound and its
//! independence from tile addresses, and input validation.

mod common;

use common::*;
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashSet;
use tessera_host::*;
use tessera_machine::Machine;
use tessera_package::BindingKind::{Input, Output, Weight};

const A: u32 = 0x90000;

fn one_slice(bytes: u32) -> HostPlan {
    let specs = [binding("x", Input, bytes, vec![slice(1, 0, bytes, A)])];
    HostPlan::new(&Machine::small(), &specs).unwrap()
}

#[test]
fn slices_split_at_the_payload_boundary() {
    for (bytes, expect) in [
        (1, vec![1]),
        (1023, vec![1023]),
        (1024, vec![1024]),
        (1025, vec![1024, 1]),
        (2048, vec![1024, 1024]),
        (3000, vec![1024, 1024, 952]),
    ] {
        let plan = one_slice(bytes);
        let t = plan.transfer(1, 0).unwrap();
        assert_eq!(t.packets as usize, expect.len(), "{bytes} bytes");
        let packets: Vec<Packet> = plan.packets(t).collect();
        assert_eq!(
            packets.iter().map(|p| p.bytes).collect::<Vec<_>>(),
            expect,
            "{bytes} bytes"
        );
        let mut at = 0;
        for p in &packets {
            assert_eq!((p.host_offset, p.tile_addr), (at, A + at));
            assert!(!p.to_host);
            at += p.bytes;
        }
        assert_eq!(at, bytes);
        // One block of a count and one record however many packets; tiles 0,
        // 2, 3 sit the phase out and keep one empty block.
        assert_eq!(plan.bound(1), 4 + 16);
        let r = plan.record(t);
        assert_eq!((r.host_offset, r.tile_addr, r.bytes), (0, A, bytes));
        assert_eq!(plan.bound_per_tile(), &[4, plan.bound(1), 4, 4]);
    }
}

#[test]
fn output_packets_go_to_the_host() {
    let specs = [binding("y", Output, 8, vec![slice(0, 0, 8, A)])];
    let plan = HostPlan::new(&Machine::small(), &specs).unwrap();
    let t = plan.transfer(0, 0).unwrap();
    assert!(plan.packets(t).all(|p| p.to_host));
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        rng_seed: RngSeed::Fixed(0x5eed),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn packets_cover_a_slice_exactly(bytes in 1u32..20_000, payload in 1u32..3000, offset in 0u32..5000) {
        let mut m = Machine::small();
        m.timing.host_packet_payload_bytes = payload;
        let specs = [binding("x", Weight, offset + bytes, vec![slice(2, offset, bytes, A)])];
        let plan = HostPlan::new(&m, &specs).unwrap();
        let t = plan.transfer(2, 0).unwrap();
        prop_assert_eq!(t.packets, bytes.div_ceil(payload));
        let mut at = offset;
        for p in plan.packets(t) {
            prop_assert!(p.bytes >= 1 && p.bytes <= payload);
            prop_assert_eq!(p.host_offset, at);
            prop_assert_eq!(p.tile_addr, A + (at - offset));
            at += p.bytes;
        }
        prop_assert_eq!(at, offset + bytes);
    }
}

#[test]
fn phases_run_weights_then_inputs_then_outputs_one_transfer_per_tile() {
    let specs = [
        binding(
            "out",
            Output,
            64,
            vec![slice(0, 0, 32, A), slice(0, 32, 32, A + 64)],
        ),
        binding(
            "in",
            Input,
            100,
            vec![
                slice(1, 50, 50, A),
                slice(1, 0, 50, A + 100),
                slice(2, 0, 100, A),
            ],
        ),
        binding("w", Weight, 10, vec![slice(3, 0, 10, A)]),
    ];
    let plan = HostPlan::new(&Machine::small(), &specs).unwrap();
    let kinds: Vec<_> = plan.phases().iter().map(|p| p.kind).collect();
    assert_eq!(kinds, [Weight, Input, Input, Output, Output]);
    assert_eq!(plan.phases_of(Weight), 0..1);
    assert_eq!(plan.phases_of(Input), 1..3);
    assert_eq!(plan.phases_of(Output), 3..5);
    // Within a tile, transfers follow host offsets, not tile addresses or the
    // order slices were listed in.
    assert_eq!(plan.transfer(1, 1).unwrap().offset, 0);
    assert_eq!(plan.transfer(1, 2).unwrap().offset, 50);
    assert_eq!(plan.transfer(2, 1).unwrap().bytes, 100);
    assert!(plan.transfer(2, 2).is_none());
    // Binding indices are positions in the input, which package_bindings keeps.
    assert_eq!(plan.transfer(3, 0).unwrap().binding, 2);
    let names: Vec<_> = plan
        .package_bindings()
        .into_iter()
        .map(|b| b.name)
        .collect();
    assert_eq!(names, ["out", "in", "w"]);
    // tile 0: two 1-record output blocks + empty; tile 1: two input blocks +
    // empty; tile 2: one input block + empty; tile 3: one weight block + empty.
    assert_eq!(plan.bound_per_tile(), &[44, 44, 24, 24]);
    assert_eq!(plan.max_bound(), 44);
    assert_eq!(plan.packet_total(), 6);
    assert_eq!(plan.phase_bytes(1), 150);
}

#[test]
fn an_absent_kind_has_an_empty_range_in_order() {
    let specs = [
        binding("out", Output, 4, vec![slice(0, 0, 4, A)]),
        binding("w", Weight, 4, vec![slice(0, 0, 4, A)]),
    ];
    let plan = HostPlan::new(&Machine::small(), &specs).unwrap();
    assert_eq!(plan.phases_of(Weight), 0..1);
    assert_eq!(plan.phases_of(Input), 1..1);
    assert_eq!(plan.phases_of(Output), 1..2);
    let empty = HostPlan::new(&Machine::small(), &[]).unwrap();
    assert!(empty.phases().is_empty());
    assert_eq!(empty.max_bound(), 0);
    assert_eq!(empty.phases_of(Input), 0..0);
}

/// Checks the structural promises of a plan against its specs.
fn check_phases(plan: &HostPlan, specs: &[BindingSpec]) {
    let order = |k| KIND_ORDER.iter().position(|&x| x == k).unwrap();
    let mut seen = HashSet::new();
    for (i, p) in plan.phases().iter().enumerate() {
        let tiles: Vec<u32> = p.transfers.iter().map(|t| t.tile).collect();
        // One transfer per tile, except in a kind with a single phase, where a
        // tile's transfers follow each other in binding and host-offset order.
        if one_phase(p.kind) {
            let key = |t: &Transfer| (t.tile, t.binding, t.offset, t.bytes, t.slice);
            assert!(p.transfers.windows(2).all(|w| key(&w[0]) < key(&w[1])));
        } else {
            assert!(
                tiles.windows(2).all(|w| w[0] < w[1]),
                "phase {i}: tiles {tiles:?}"
            );
        }
        assert!(!p.transfers.is_empty());
        if i > 0 {
            assert!(order(plan.phases()[i - 1].kind) <= order(p.kind));
        }
        for t in &p.transfers {
            let b = &specs[t.binding as usize];
            assert_eq!(b.kind, p.kind);
            let s = &b.slices[t.slice as usize];
            assert_eq!(
                (s.tile, s.offset, s.bytes, s.tile_addr),
                (t.tile, t.offset, t.bytes, t.tile_addr)
            );
            assert!(seen.insert((t.binding, t.slice)), "slice moved twice");
        }
    }
    let total: usize = specs.iter().map(|b| b.slices.len()).sum();
    assert_eq!(seen.len(), total, "every slice moves once");
    // No more phases of a kind than the busiest tile has slices of it.
    for kind in KIND_ORDER {
        let mut per_tile = std::collections::HashMap::<u32, usize>::new();
        for b in specs.iter().filter(|b| b.kind == kind) {
            for s in &b.slices {
                *per_tile.entry(s.tile).or_default() += 1;
            }
        }
        let busiest = per_tile.values().copied().max().unwrap_or(0);
        let want = if one_phase(kind) {
            busiest.min(1)
        } else {
            busiest
        };
        assert_eq!(plan.phases_of(kind).len(), want);
    }
}

#[test]
fn random_layouts_plan_the_same_at_any_address() {
    let machine = Machine::small().with_tiles(8);
    let (start, end) = (machine.sram_start(), machine.sram_end());
    for seed in 0..64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let specs = random_layout(&mut rng, &machine, 0x90000);
        let plan = HostPlan::new(&machine, &specs).unwrap();
        check_phases(&plan, &specs);
        for trial in 0..4 {
            let moved = with_addresses(&specs, |_, _, s| match trial {
                0 => start,
                1 => 0,
                2 => u32::MAX - s.bytes,
                _ => rng.random_range(start..end - s.bytes),
            });
            let other = HostPlan::new(&machine, &moved).unwrap();
            assert_eq!(other.bound_per_tile(), plan.bound_per_tile(), "seed {seed}");
            assert_eq!(other.phases().len(), plan.phases().len());
            for (a, b) in other.phases().iter().zip(plan.phases()) {
                let key = |t: &Transfer| (t.tile, t.binding, t.slice, t.packets);
                assert!(a.transfers.iter().map(key).eq(b.transfers.iter().map(key)));
            }
        }
    }
}

#[test]
fn the_bound_counts_what_the_emitter_writes_before_deduplication() {
    let machine = Machine::small().with_tiles(8);
    for seed in 100..132 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let specs = random_layout(&mut rng, &machine, 0x90000);
        let plan = HostPlan::new(&machine, &specs).unwrap();
        for tile in 0..machine.tiles {
            let h = emit_provisional(&plan, tile).unwrap();
            assert_eq!(
                h.bytes_before_dedup,
                plan.bound(tile),
                "seed {seed} tile {tile}"
            );
            assert!(h.bytes_used <= h.bytes_before_dedup);
            assert!(plan.bound(tile).is_multiple_of(4));
            // Each phase's block at its address holds that phase's encoding.
            for (p, &addr) in h.phase_block_addr.iter().enumerate() {
                let block = encode_block(&plan, tile, p);
                let seg = h
                    .segments
                    .iter()
                    .find(|s| s.addr <= addr && addr < s.addr + s.bytes.len() as u32)
                    .unwrap();
                let at = (addr - seg.addr) as usize;
                assert_eq!(&seg.bytes[at..at + block.len()], block.as_slice());
            }
        }
    }
}

#[test]
fn malformed_bindings_are_rejected() {
    let m = Machine::small();
    let err = |specs: Vec<BindingSpec>| HostPlan::new(&m, &specs).unwrap_err();
    assert_eq!(
        err(vec![binding("x", Input, 8, vec![slice(0, 0, 0, A)])]),
        HostError::EmptySlice {
            binding: "x".into(),
            slice: 0
        }
    );
    assert!(matches!(
        err(vec![binding("x", Input, 8, vec![slice(0, 4, 5, A)])]),
        HostError::SliceOutsideBinding {
            offset: 4,
            len: 5,
            bytes: 8,
            ..
        }
    ));
    assert!(matches!(
        err(vec![binding("x", Input, 8, vec![slice(4, 0, 8, A)])]),
        HostError::TileOutOfRange {
            tile: 4,
            tiles: 4,
            ..
        }
    ));
    assert!(matches!(
        err(vec![binding(
            "y",
            Output,
            8,
            vec![slice(0, 0, 6, A), slice(1, 4, 4, A)]
        )]),
        HostError::OverlappingOutput {
            a: 0,
            b: 1,
            offset: 4,
            ..
        }
    ));
    assert_eq!(
        err(vec![binding("", Input, 8, vec![])]),
        HostError::EmptyName { index: 0 }
    );
    assert_eq!(
        err(vec![
            binding("x", Input, 8, vec![]),
            binding("x", Output, 8, vec![])
        ]),
        HostError::DuplicateBinding("x".into())
    );
    let mut zero = Machine::small();
    zero.timing.host_packet_payload_bytes = 0;
    assert_eq!(
        HostPlan::new(&zero, &[]).unwrap_err(),
        HostError::ZeroPayload
    );
    // Inputs may repeat host bytes (replicated tensors); outputs may not.
    let dup = [binding(
        "x",
        Input,
        8,
        vec![slice(0, 0, 8, A), slice(0, 0, 8, A)],
    )];
    assert!(HostPlan::new(&m, &dup).is_ok());
}

#[test]
fn addresses_are_checked_only_when_asked() {
    let m = Machine::small();
    let specs = [binding("x", Input, 8, vec![slice(0, 0, 8, 0x10)])];
    let plan = HostPlan::new(&m, &specs).unwrap();
    assert!(matches!(
        plan.check_addresses(),
        Err(HostError::SliceOutsideSram {
            tile_addr: 0x10,
            ..
        })
    ));
    let end = m.sram_end();
    let at_end = [binding("x", Input, 8, vec![slice(0, 0, 8, end - 8)])];
    assert!(
        HostPlan::new(&m, &at_end)
            .unwrap()
            .check_addresses()
            .is_ok()
    );
    let past = [binding("x", Input, 8, vec![slice(0, 0, 8, end - 4)])];
    assert!(HostPlan::new(&m, &past).unwrap().check_addresses().is_err());
}

#[test]
fn link_cycles_follow_the_simulator_model() {
    let m = Machine::small();
    let plan = one_slice(4270);
    let rate = m.host_to_chip_bytes_per_cycle();
    let expect = u64::from(m.timing.host_transfer_overhead_cycles) + (4270.0 / rate).ceil() as u64;
    assert_eq!(plan.link_cycles(&m, 0..plan.phases().len()), expect);
    assert_eq!(plan.link_cycles(&m, 0..0), 0);
}

#[test]
fn a_full_chip_plans_with_a_common_bound() {
    let machine = Machine::c600();
    let tiles = machine.tiles;
    // An input of 3,000 bytes per tile and an output of 512 bytes per tile, on
    // every tile: the shape a batch split gives.
    let specs = [
        binding(
            "x",
            Input,
            3000 * tiles,
            (0..tiles).map(|t| slice(t, 3000 * t, 3000, A)).collect(),
        ),
        binding(
            "y",
            Output,
            512 * tiles,
            (0..tiles)
                .map(|t| slice(t, 512 * t, 512, A + 0x1000))
                .collect(),
        ),
    ];
    let plan = HostPlan::new(&machine, &specs).unwrap();
    assert_eq!(plan.phases().len(), 2);
    assert!(plan.bound_per_tile().iter().all(|&b| b == 4 + 16 + 4 + 16));
    let total: u32 = (0..tiles)
        .map(|t| emit_provisional(&plan, t).unwrap().bytes_used)
        .sum();
    assert_eq!(total, 40 * tiles);
    assert_eq!(plan.record_total(), 2 * u64::from(tiles));
    assert_eq!(plan.packet_total(), 4 * u64::from(tiles));
}

#[test]
fn usage_says_where_a_tiles_bytes_go() {
    let specs = [
        binding("w", Weight, 5000, vec![slice(0, 0, 5000, A)]),
        binding(
            "x",
            Input,
            4096,
            vec![
                slice(0, 0, 2048, A + 0x2000),
                slice(0, 2048, 2048, A + 0x3000),
            ],
        ),
        binding("y", Output, 8, vec![slice(1, 0, 8, A)]),
    ];
    let plan = HostPlan::new(&Machine::small(), &specs).unwrap();
    let u = plan.usage(0).unwrap();
    let rows: Vec<_> = u
        .kinds
        .iter()
        .map(|k| {
            (
                k.kind,
                k.phases,
                k.joined,
                k.packets,
                k.bytes,
                k.descriptor_bytes,
                k.per_packet_descriptor_bytes,
                k.snippet_bytes,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (Weight, 1, 1, 5, 5000, 20, 4 + 5 * 16, 20),
            (Input, 2, 2, 4, 4096, 40, 2 * (4 + 2 * 16), 40),
            (Output, 1, 0, 0, 0, 0, 0, 20),
        ]
    );
    assert_eq!((u.empty_block_bytes, u.bound), (4, 64));
    assert_eq!(plan.busiest_tile(), 0);
    assert!(plan.usage(4).is_none());
}

#[test]
fn a_tiles_weights_share_one_phase_and_one_block() {
    // Tile 0 holds three weight slices of two bindings, tile 1 one: one weight
    // phase, in which tile 0's block lists three records in binding and
    // host-offset order (4 + 3 * 16 bytes), whatever the listing order.
    let specs = [
        binding(
            "w",
            Weight,
            3000,
            vec![slice(0, 2000, 1000, A), slice(0, 0, 2000, A + 0x1000)],
        ),
        binding(
            "v",
            Weight,
            9,
            vec![slice(1, 0, 9, A), slice(0, 0, 9, A + 0x2000)],
        ),
        binding("x", Input, 4, vec![slice(1, 0, 4, A + 64)]),
    ];
    let plan = HostPlan::new(&Machine::small(), &specs).unwrap();
    assert_eq!(plan.phases_of(Weight), 0..1);
    let mine: Vec<_> = plan
        .transfers(0, 0)
        .map(|t| (t.binding, t.offset, t.packets))
        .collect();
    assert_eq!(mine, [(0, 0, 2), (0, 2000, 1), (1, 0, 1)]);
    assert_eq!(plan.bound(0), 4 + 3 * 16 + 4);
    assert_eq!(plan.bound(1), 20 + 20);
    let u = plan.usage(0).unwrap();
    assert_eq!((u.kinds[0].joined, u.kinds[0].records), (1, 3));
    assert_eq!(u.kinds[0].per_packet_descriptor_bytes, 3 * 4 + 4 * 16);
    assert_eq!(encode_block(&plan, 0, 0).len(), 4 + 3 * 16);
}
