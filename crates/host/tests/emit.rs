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
    // Weight phase 0, input phases 1-2, output phase 3. Tile 0: one weight
    // block of two records (36 B), two input blocks of one record each (20 B,
    // whether the slice takes 1 packet or 3), and the empty block for the
    // output phase.
    assert_eq!(plan.bound(0), 36 + 20 + 20 + 4);
    let h = emit_tile(&plan, 0, plan.bound(0), &[(RESERVATION, RESERVATION + 80)]).unwrap();
    assert_eq!(h.bytes_before_dedup, 80);
    assert_eq!(h.bytes_used, 36 + 20 + 4);
    assert_eq!(h.records_deduplicated, 1);
    assert_eq!(h.records_stored, 2 + 1);
    let a = &h.phase_block_addr;
    assert_eq!(a[1], a[2]);
    assert_eq!(a.len(), 4);
    assert_eq!(h.segments.len(), 1);
    assert_eq!(h.segments[0].addr, RESERVATION);
    assert_eq!(h.segments[0].bytes.len(), 60);
    // First use order: weight block, input block, empty block.
    assert_eq!(
        a[..],
        [
            RESERVATION,
            RESERVATION + 36,
            RESERVATION + 36,
            RESERVATION + 56
        ]
    );
    assert_eq!(&h.segments[0].bytes[56..], &[0, 0, 0, 0]);
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
    assert_eq!(before.bytes_used, 60);
    assert_eq!(before.records_deduplicated, 1);

    let placed = replicated([A, A + 0x1000], [A + 0x2000, A + 0x2400]);
    let fin = HostPlan::new(&m, &placed).unwrap();
    assert_eq!(fin.bound_per_tile(), bound.as_slice());
    let after = emit_tile(&fin, 0, bound[0], &[(RESERVATION, RESERVATION + reserved)]).unwrap();
    assert_eq!(after.records_deduplicated, 0);
    assert_eq!(after.bytes_used, 80);
    assert!(after.bytes_used <= bound[0]);
    assert_eq!(reserved, 80);
    let distinct: std::collections::HashSet<_> = after.phase_block_addr.iter().collect();
    assert_eq!(distinct.len(), 4);
    let summary = HostSummary::of(&[before.clone(), after.clone()]);
    assert_eq!(
        (
            summary.tiles,
            summary.bytes_before_dedup,
            summary.bytes_used
        ),
        (2, 160, 60 + 80)
    );
    assert_eq!(
        (summary.max_tile_bytes_used, summary.records_deduplicated),
        (80, 1)
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
    // 80 bytes: the weight block (36) and later the empty block (4) fill the
    // first range; each input block goes to the first range still roomy enough.
    let ranges = [
        (0xA0000, 0xA0000 + 40),
        (0xB0000, 0xB0000 + 30),
        (0xC0000, 0xC1000),
    ];
    let h = emit_tile(&plan, 0, plan.bound(0), &ranges).unwrap();
    assert_eq!(
        h.phase_block_addr,
        [0xA0000, 0xB0000, 0xC0000, 0xA0000 + 36]
    );
    let segs: Vec<(u32, usize)> = h.segments.iter().map(|s| (s.addr, s.bytes.len())).collect();
    assert_eq!(segs, [(0xA0000, 40), (0xB0000, 20), (0xC0000, 20)]);
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
    let e = emit_tile(&plan, 0, 60, &[(RESERVATION, RESERVATION + 0x1000)]).unwrap_err();
    assert_eq!(
        e,
        HostError::ExceedsBound {
            tile: 0,
            needed: 80,
            bound: 60
        }
    );
    let text = e.to_string();
    assert!(
        text.contains("internal error") && text.contains("80") && text.contains("60"),
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
    // 1,100 bytes take two link packets but one record.
    assert_eq!(plan.transfer(2, 0).unwrap().packets, 2);
    assert_eq!(b.len(), 4 + 16);
    assert_eq!(u32_at(0), 1);
    assert_eq!(
        (u16_at(4), u16_at(6), u32_at(8), u32_at(12), u32_at(16)),
        (0, 0, 0, 0x91234, 1100)
    );
    let o = encode_block(&plan, 2, 1);
    assert_eq!(o.len(), 20);
    assert_eq!(&o[..8], &[1, 0, 0, 0, 1, 0, 1, 0]);
    assert_eq!(encode_block(&plan, 1, 0), [0, 0, 0, 0]);
}

/// The packed records, read back from the emitted bytes and cut into packets by
/// this test's own rule, put every byte where one record per packet did: the
/// unpacked list is built straight from the slices, not through the plan.
#[test]
fn packed_records_expand_to_the_unpacked_packets() {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    type Piece = (u32, u16, bool, u32, u32, u32);
    let mut rng = ChaCha8Rng::seed_from_u64(0x13_0013);
    let mut checked = 0usize;
    for case in 0..200 {
        let mut machine = Machine::small().with_tiles(8);
        let payload = [1, 7, 64, 1024, rng.random_range(1..3000)][case % 5];
        machine.timing.host_packet_payload_bytes = payload;
        let specs = random_layout(&mut rng, &machine, RESERVATION + 0x1000);
        let plan = HostPlan::new(&machine, &specs).unwrap();

        let mut unpacked: Vec<Piece> = Vec::new();
        for (bi, b) in specs.iter().enumerate() {
            for s in &b.slices {
                let mut done = 0;
                while done < s.bytes {
                    let len = payload.min(s.bytes - done);
                    unpacked.push((
                        s.tile,
                        bi as u16,
                        b.kind == Output,
                        s.offset + done,
                        s.tile_addr + done,
                        len,
                    ));
                    done += len;
                }
            }
        }

        let mut expanded: Vec<Piece> = Vec::new();
        for tile in 0..machine.tiles {
            let bound = plan.bound(tile);
            let h = emit_tile(&plan, tile, bound, &[(RESERVATION, RESERVATION + bound)]).unwrap();
            let read = |addr: u32, len: usize| -> Vec<u8> {
                let s = h
                    .segments
                    .iter()
                    .find(|s| s.addr <= addr && addr - s.addr < s.bytes.len() as u32)
                    .expect("the block lies in a placed segment");
                let at = (addr - s.addr) as usize;
                s.bytes[at..at + len].to_vec()
            };
            let u32_of = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
            for (phase, &addr) in h.phase_block_addr.iter().enumerate() {
                let count = u32_of(&read(addr, 4), 0) as usize;
                assert_eq!(
                    count,
                    plan.transfers(tile, phase).count(),
                    "case {case}: a record per transfer"
                );
                assert!(
                    count <= 1 || one_phase(plan.phases()[phase].kind),
                    "case {case}"
                );
                if count == 0 {
                    continue;
                }
                let body = read(addr + 4, 16 * count);
                for r in body.chunks(16) {
                    let binding = u16::from_le_bytes([r[0], r[1]]);
                    let flags = u16::from_le_bytes([r[2], r[3]]);
                    let (host, at, len) = (u32_of(r, 4), u32_of(r, 8), u32_of(r, 12));
                    assert!(len > 0 && flags <= 1, "case {case}");
                    let mut done = 0;
                    while done < len {
                        let piece = payload.min(len - done);
                        expanded.push((tile, binding, flags == 1, host + done, at + done, piece));
                        done += piece;
                    }
                    checked += 1;
                }
            }
        }
        unpacked.sort_unstable();
        expanded.sort_unstable();
        assert_eq!(expanded, unpacked, "case {case}, payload {payload}");
        let records = plan.record_total() as usize;
        assert!(records <= unpacked.len(), "case {case}");
    }
    assert!(checked > 500, "{checked} records checked");
}
