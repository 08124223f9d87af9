//! The emitter: deduplication, placement into the reservation and other ranges,
//! the internal bound error, and the supervisor snippet's encoding.

mod common;

use common::*;
use tessera_host::*;
use tessera_isa::{Inst, IntOp, MReg, Word, decode_all, encode};
use tessera_machine::Machine;
use tessera_package::BindingKind::{Input, Output, Weight};

const A: u32 = 0x90000;

/// Tile 0 gets the same 2,500 input bytes twice and the same 1,024 weight
/// bytes twice; tile 1 takes part in fewer phases.
fn replicated(addr_x: [u32; 2], addr_w: [u32; 2]) -> Vec<BindingSpec> {
    vec![
        binding(
            "x",
            Input,
            2500,
            vec![slice(0, 0, 2500, addr_x[0]), slice(0, 0, 2500, addr_x[1])],
        ),
        binding(
            "w",
            Weight,
            1024,
            vec![
                slice(0, 0, 1024, addr_w[0]),
                slice(0, 0, 1024, addr_w[1]),
                slice(1, 0, 1024, A),
            ],
        ),
        binding(
            "y",
            Output,
            600,
            vec![slice(1, 0, 300, A + 0x1000), slice(2, 300, 300, A)],
        ),
    ]
}

#[test]
fn identical_blocks_on_a_tile_are_stored_once() {
    let m = Machine::small();
    let plan = HostPlan::new(&m, &replicated([A, A], [A + 0x2000, A + 0x2000])).unwrap();
    // Weight phases 0-1, input phases 2-3, output phase 4. Tile 0: two 1-record
    // weight blocks (20 B each), two 3-record input blocks (52 B each), and the
    // empty block for the output phase.
    assert_eq!(plan.bound(0), 20 + 20 + 52 + 52 + 4);
    let h = emit_tile(&plan, 0, plan.bound(0), &[(RESERVATION, RESERVATION + 148)]).unwrap();
    assert_eq!(h.bytes_before_dedup, 148);
    assert_eq!(h.bytes_used, 20 + 52 + 4);
    assert_eq!(h.packets_deduplicated, 1 + 3);
    assert_eq!(h.packets_stored, 1 + 3);
    let a = &h.phase_block_addr;
    assert_eq!(a[0], a[1]);
    assert_eq!(a[2], a[3]);
    assert_eq!(a.len(), 5);
    assert_eq!(h.segments.len(), 1);
    assert_eq!(h.segments[0].addr, RESERVATION);
    assert_eq!(h.segments[0].bytes.len(), 76);
    // First use order: weight block, input block, empty block.
    assert_eq!(
        a[..],
        [
            RESERVATION,
            RESERVATION,
            RESERVATION + 20,
            RESERVATION + 20,
            RESERVATION + 72
        ]
    );
    assert_eq!(&h.segments[0].bytes[72..], &[0, 0, 0, 0]);
}

/// The seed's relocation test: blocks shared at provisional addresses stop
/// being equal once the tensors move, and the unshared blocks still fit the
/// bound taken before placement.
#[test]
fn relocation_unshares_packets_within_the_original_bound() {
    let m = Machine::small();
    let provisional = HostPlan::new(&m, &replicated([A, A], [A + 0x2000, A + 0x2000])).unwrap();
    let bound = provisional.bound_per_tile().to_vec();
    let reserved = provisional.max_bound();
    let before = emit_provisional(&provisional, 0).unwrap();
    assert_eq!(before.bytes_used, 76);
    assert_eq!(before.packets_deduplicated, 4);

    let placed = replicated([A, A + 0x1000], [A + 0x2000, A + 0x2400]);
    let fin = HostPlan::new(&m, &placed).unwrap();
    assert_eq!(fin.bound_per_tile(), bound.as_slice());
    let after = emit_tile(&fin, 0, bound[0], &[(RESERVATION, RESERVATION + reserved)]).unwrap();
    assert_eq!(after.packets_deduplicated, 0);
    assert_eq!(after.bytes_used, 148);
    assert!(after.bytes_used <= bound[0]);
    assert_eq!(reserved, 148);
    let distinct: std::collections::HashSet<_> = after.phase_block_addr.iter().collect();
    assert_eq!(distinct.len(), 5);
    let summary = HostSummary::of(&[before.clone(), after.clone()]);
    assert_eq!(
        (
            summary.tiles,
            summary.bytes_before_dedup,
            summary.bytes_used
        ),
        (2, 296, 76 + 148)
    );
    assert_eq!(
        (summary.max_tile_bytes_used, summary.packets_deduplicated),
        (148, 4)
    );
    eprintln!(
        "relocation: bound {} B/tile (reservation {reserved}), provisional {} B after dedup, final {} B",
        bound[0], before.bytes_used, after.bytes_used
    );
}

#[test]
fn blocks_spill_from_the_reservation_into_other_free_ranges() {
    let m = Machine::small();
    let plan = HostPlan::new(&m, &replicated([A, A + 0x1000], [A + 0x2000, A + 0x2400])).unwrap();
    // 148 bytes: 40 fit in the reservation (the two weight blocks), the rest go
    // to the next range that has room for each block.
    let ranges = [
        (0xA0000, 0xA0000 + 40),
        (0xB0000, 0xB0000 + 50),
        (0xC0000, 0xC1000),
    ];
    let h = emit_tile(&plan, 0, plan.bound(0), &ranges).unwrap();
    assert_eq!(
        h.phase_block_addr,
        [0xA0000, 0xA0000 + 20, 0xC0000, 0xC0000 + 52, 0xB0000]
    );
    let segs: Vec<(u32, usize)> = h.segments.iter().map(|s| (s.addr, s.bytes.len())).collect();
    assert_eq!(segs, [(0xA0000, 40), (0xB0000, 4), (0xC0000, 104)]);
    assert_eq!(h.package_segments().len(), 3);
}

#[test]
fn ranges_are_aligned_and_clipped_to_loadable_sram() {
    let m = Machine::small();
    let plan = HostPlan::new(&m, &[binding("w", Weight, 4, vec![slice(0, 0, 4, A)])]).unwrap();
    assert_eq!(plan.bound(0), 20);
    // 0x90001..0x90016 holds 20 aligned bytes only from 0x90004 to 0x90014: too few.
    let e = emit_tile(&plan, 0, 20, &[(0x90001, 0x90016)]).unwrap_err();
    assert_eq!(
        e,
        HostError::NoRoom {
            tile: 0,
            block: 20,
            needed: 20,
            available: 16
        }
    );
    let h = emit_tile(&plan, 0, 20, &[(0x90001, 0x90018)]).unwrap();
    assert_eq!(h.phase_block_addr, [0x90004]);
    // Above the loader limit descriptors could not be loaded.
    let top = m.loader_limit;
    assert!(matches!(
        emit_tile(&plan, 0, 20, &[(top, m.sram_end())]),
        Err(HostError::NoRoom { available: 0, .. })
    ));
    assert!(emit_tile(&plan, 0, 20, &[(top - 20, m.sram_end())]).is_ok());
    assert!(matches!(
        emit_tile(&plan, 0, 20, &[(0x90000, 0x90100), (0x900F0, 0x90200)]),
        Err(HostError::OverlappingRanges { .. })
    ));
    assert!(matches!(
        emit_tile(&plan, 9, 20, &[(0x90000, 0x90100)]),
        Err(HostError::NoSuchTile { tile: 9, tiles: 4 })
    ));
}

#[test]
fn needing_more_than_the_bound_is_an_internal_error_with_both_numbers() {
    let m = Machine::small();
    let plan = HostPlan::new(&m, &replicated([A, A + 8], [A, A + 8])).unwrap();
    let e = emit_tile(&plan, 0, 100, &[(RESERVATION, RESERVATION + 0x1000)]).unwrap_err();
    assert_eq!(
        e,
        HostError::ExceedsBound {
            tile: 0,
            needed: 148,
            bound: 100
        }
    );
    let text = e.to_string();
    assert!(
        text.contains("internal error") && text.contains("148") && text.contains("100"),
        "{text}"
    );
}

#[test]
fn the_snippet_is_five_fixed_words_loading_the_block_address() {
    let m = Machine::small();
    let plan = HostPlan::new(&m, &[binding("w", Weight, 4, vec![slice(0, 0, 4, A)])]).unwrap();
    for addr in [0x4C000u32, 0x80000, 0x8FFFC, 0xE7B9C, 0x9ABC4] {
        let h = emit_tile(&plan, 0, 20, &[(addr, addr + 20)]).unwrap();
        let words = h.supervisor_words(0, MReg(7)).unwrap();
        assert_eq!(words.len(), SNIPPET_WORDS);
        let code = encode(&words).unwrap();
        assert_eq!(code.len() as u32, SNIPPET_BYTES);
        let decoded: Vec<Word> = decode_all(&code)
            .unwrap()
            .into_iter()
            .map(|(_, w)| w)
            .collect();
        assert_eq!(decoded, words);
        let Word::Single(Inst::Setzi {
            d: MReg(7),
            imm: hi,
        }) = words[1]
        else {
            panic!("{:?}", words[1])
        };
        let Word::Single(Inst::IntImm {
            op: IntOp::Shl,
            imm: 12,
            ..
        }) = words[2]
        else {
            panic!("{:?}", words[2])
        };
        let Word::Single(Inst::IntImm {
            op: IntOp::Or,
            imm: lo,
            ..
        }) = words[3]
        else {
            panic!("{:?}", words[3])
        };
        assert_eq!((hi << 12) | u32::from(lo), addr);
        assert_eq!(words[0], Word::Single(Inst::SyncGlobal));
        assert_eq!(words[4], Word::Single(Inst::HostXfer { desc: MReg(7) }));
    }
    let h = emit_provisional(&plan, 0).unwrap();
    assert_eq!(
        h.supervisor_words(1, MReg(1)),
        Err(HostError::NoSuchPhase {
            phase: 1,
            phases: 1
        })
    );
    assert_eq!(
        h.supervisor_words(0, MReg::ZERO),
        Err(HostError::BadRegister(15))
    );
    assert_eq!(
        h.supervisor_code(0..1, MReg(1)).unwrap().len(),
        SNIPPET_WORDS
    );
}

#[test]
fn block_encoding_matches_the_descriptor_format() {
    let m = Machine::small();
    let specs = [
        binding("x", Input, 1100, vec![slice(2, 0, 1100, 0x91234)]),
        binding("y", Output, 16, vec![slice(2, 8, 8, 0x95000)]),
    ];
    let plan = HostPlan::new(&m, &specs).unwrap();
    let b = encode_block(&plan, 2, 0);
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    assert_eq!(b.len(), 4 + 32);
    assert_eq!(u32_at(0), 2);
    assert_eq!(
        (u16_at(4), u16_at(6), u32_at(8), u32_at(12), u32_at(16)),
        (0, 0, 0, 0x91234, 1024)
    );
    assert_eq!(
        (u16_at(20), u16_at(22), u32_at(24), u32_at(28), u32_at(32)),
        (0, 0, 1024, 0x91634, 76)
    );
    let o = encode_block(&plan, 2, 1);
    assert_eq!(o.len(), 20);
    assert_eq!(&o[..8], &[1, 0, 0, 0, 1, 0, 1, 0]);
    assert_eq!(encode_block(&plan, 1, 0), [0, 0, 0, 0]);
}
