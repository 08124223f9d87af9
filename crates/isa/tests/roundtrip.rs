//! Round trips: text → word → text, program → package → disassembly → identical
//! package, arbitrary code bytes → disassembly → identical package, and no panics
//! on arbitrary assembler input.

use proptest::prelude::*;
use tessera_isa::*;
use tessera_machine::Machine;
use tessera_package::*;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x7e55e4a),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Disassembles a package, re-assembles the listing, and checks the bytes.
fn assert_round_trip(p: &Package) {
    let text = disassemble(p, None, None);
    let again = match assemble(&text, "listing.s") {
        Ok(q) => q,
        Err(e) => panic!("the listing does not assemble:\n{e}\n--- listing ---\n{text}"),
    };
    assert!(
        write_package(p) == write_package(&again),
        "re-assembly differs\n--- listing ---\n{text}\n--- original ---\n{p:#?}\n--- again ---\n{again:#?}"
    );
}

#[derive(Debug, Clone)]
enum Item {
    Word(Word),
    Branch(u8, u8),
    Data(u32),
    Align8,
    Zero4,
}

fn item() -> impl Strategy<Value = Item> {
    prop_oneof![
        8 => tessera_isa::testgen::word().prop_map(Item::Word),
        1 => (0u8..4, 0u8..4).prop_map(|(k, l)| Item::Branch(k, l)),
        1 => any::<u32>().prop_map(Item::Data),
        1 => Just(Item::Align8),
        1 => Just(Item::Zero4),
    ]
}

/// A program: items with four labels at random places, then a data section.
fn program() -> impl Strategy<Value = (Vec<Item>, [prop::sample::Index; 4], Vec<u32>)> {
    (
        proptest::collection::vec(item(), 1..40),
        any::<[prop::sample::Index; 4]>(),
        proptest::collection::vec(any::<u32>(), 0..6),
    )
}

fn rpt_body(w: &Word) -> Option<u8> {
    match w {
        Word::Single(Inst::Rpt { body, .. } | Inst::Rpti { body, .. }) => Some(*body),
        _ => None,
    }
}

/// Mirrors the assembler's layout: would a bundle need padding inside a body?
fn misaligned_in_body(items: &[Item]) -> bool {
    let mut pos = 0usize;
    let mut left = 0u32;
    for (i, it) in items.iter().enumerate() {
        match it {
            Item::Word(w) => {
                if matches!(w, Word::Bundle(..)) && pos % 8 == 4 {
                    if left > 0 {
                        return true;
                    }
                    pos += 4;
                }
                left = left.saturating_sub(1);
                if let Some(n) = rpt_body(w) {
                    let next_bundle =
                        matches!(items.get(i + 1), Some(Item::Word(Word::Bundle(..))));
                    if next_bundle && pos.is_multiple_of(8) {
                        pos += 4;
                    }
                    left = u32::from(n);
                }
                pos += w.byte_len();
            }
            Item::Branch(..) => {
                left = left.saturating_sub(1);
                pos += 4;
            }
            Item::Data(_) | Item::Zero4 => pos += 4,
            Item::Align8 => pos = pos.div_ceil(8) * 8,
        }
    }
    false
}

fn source(items: &[Item], labels: &[prop::sample::Index; 4], data: &[u32]) -> String {
    let mut at: Vec<usize> = labels.iter().map(|i| i.index(items.len() + 1)).collect();
    at.sort_unstable();
    let mut s = String::from(".machine small\n.tile all\n.section code 0x4c000 rx\n");
    let mut next = 0;
    for (i, it) in items.iter().enumerate() {
        while next < 4 && at[next] == i {
            s += &format!("l{next}:\n");
            next += 1;
        }
        match it {
            Item::Word(w) => s += &format!("    {w}\n"),
            Item::Branch(k, l) => {
                let m = ["bri", "brz $m1,", "brnz $m2,", "call $m10,"][*k as usize];
                s += &format!("    {m} l{l}\n");
            }
            Item::Data(v) => s += &format!("    .word {v:#x}\n"),
            Item::Align8 => s += "    .align 8\n",
            Item::Zero4 => s += "    .zero 4\n",
        }
    }
    while next < 4 {
        s += &format!("l{next}:\n");
        next += 1;
    }
    s += "    exit\n.section data 0x90000 rw\ntable:\n";
    for v in data {
        s += &format!("    .word {v:#x}\n");
    }
    s += "    .space 12\n";
    s
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn words_print_and_parse_back(w in tessera_isa::testgen::word()) {
        let text = w.to_string();
        prop_assert_eq!(parse_word(&text), Ok(w), "{}", text);
    }
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn programs_survive_disassembly(
        (items, labels, data) in program(),
    ) {
        // A bundle misaligned inside a repeat body is an error (the assembler
        // cannot pad there); such programs are checked in tests/asm.rs.
        prop_assume!(!misaligned_in_body(&items));
        let src = source(&items, &labels, &data);
        let p = match assemble(&src, "random.s") {
            Ok(p) => p,
            Err(e) => panic!("{e}\n{src}"),
        };
        // The code is exactly the items, with a nop before each misaligned bundle;
        // branch words depend on label addresses and are checked by the round trip.
        let code = &p.tiles[0].segments[0].bytes;
        let mut expect = Vec::new();
        let mut skip = Vec::new();
        let nop = encode(&[Word::Single(Inst::Nop)]).unwrap();
        for (i, it) in items.iter().enumerate() {
            match it {
                Item::Word(w) => {
                    let opens_bundle_body = rpt_body(w).is_some()
                        && matches!(items.get(i + 1), Some(Item::Word(Word::Bundle(..))));
                    if (matches!(w, Word::Bundle(..)) && expect.len() % 8 == 4)
                        || (opens_bundle_body && expect.len() % 8 == 0)
                    {
                        expect.extend_from_slice(&nop);
                    }
                    encode_word(w, &mut expect).unwrap();
                }
                Item::Branch(..) => {
                    skip.push(expect.len());
                    expect.extend_from_slice(&[0; 4]);
                }
                Item::Data(v) => expect.extend_from_slice(&v.to_le_bytes()),
                Item::Zero4 => expect.extend_from_slice(&[0; 4]),
                Item::Align8 => {
                    if expect.len() % 8 == 4 {
                        expect.extend_from_slice(&nop);
                    }
                }
            }
        }
        prop_assert_eq!(code.len(), expect.len() + 4);
        for at in skip {
            expect[at..at + 4].copy_from_slice(&code[at..at + 4]);
        }
        prop_assert_eq!(&code[..expect.len()], &expect[..]);
        assert_round_trip(&p);
    }

    /// Arbitrary bytes in a code segment, symbols anywhere in it (also inside
    /// words, in the zero-filled tail and at its end) with arbitrary sizes.
    #[test]
    fn arbitrary_code_bytes_survive_disassembly(
        code in proptest::collection::vec(any::<u8>(), 4..96),
        tail in 0u32..16,
        syms in proptest::collection::vec((0u32..128, 0u32..64, any::<bool>()), 0..6),
        data in proptest::collection::vec(any::<u8>(), 1..24),
    ) {
        let size = code.len() as u32 + tail;
        let mut symbols: Vec<Symbol> = syms
            .iter()
            .enumerate()
            .map(|(i, &(off, sz, kind))| Symbol {
                name: if i == 3 { "odd name".into() } else { format!("s{i}") },
                addr: 0x4c000 + off % (size + 1),
                size: sz,
                kind: if kind { SymbolKind::Code } else { SymbolKind::Data },
            })
            .collect();
        symbols.sort_by_key(|s| s.addr);
        let p = Package {
            machine_toml: Machine::small().to_toml(),
            tiles: vec![TileImage {
                tile: 1,
                segments: vec![
                    Segment {
                        name: "code".into(),
                        addr: 0x4c000,
                        size,
                        bytes: code,
                        perms: Perms { read: true, write: false, execute: true },
                    },
                    Segment {
                        name: "d".into(),
                        addr: 0x90001,
                        size: data.len() as u32 + 3,
                        bytes: data,
                        perms: Perms::default(),
                    },
                ],
                entry: 0x4c000,
                symbols,
            }],
            exchanges: vec![],
            bindings: vec![],
        };
        validate(&p).unwrap();
        assert_round_trip(&p);
    }

    /// The assembler never panics, whatever the text.
    #[test]
    fn assembler_never_panics(lines in proptest::collection::vec(
        proptest::collection::vec(proptest::sample::select(vec![
            ".machine", "small", ".tile", "all", "0", "..", "..=", "3", ".section", "code", "0x4c000",
            "rx", "rw", "-", ".org", ".align", ".word", ".byte", ".half", ".f16", ".f32", "1.5", ".zero",
            ".space", ".symbol", ".entry", ".exchange", ".transfer", "->", ".binding", "input", ".slice",
            "x:", "x", "y:", "\"q\"", "setzi", "$m1", "$m15", "$a0:1", "$a2:3", "$a0:3", "$m2+=", ",", "{",
            "}", ";", "(", ")", "+", "-1", "0xffffffffff", "99999999999999999999", "li", "bri", "rpt",
            "amp", "ld64step", "f32add", "mov", "sync", "local", "#", "\"", "\\", "é", "0x90000",
            "4096", "4", ".tiles", "exit",
        ]), 0..8).prop_map(|t| t.join(" ")),
        0..12,
    )) {
        let _ = assemble(&lines.join("\n"), "fuzz.s");
    }

    #[test]
    fn assembler_never_panics_on_any_text(s in "\\PC{0,200}") {
        let _ = assemble(&s, "fuzz.s");
        let _ = parse_word(&s);
    }
}

#[test]
fn filters_select_tiles_and_symbols() {
    let p = assemble(
        ".machine small\n.tile 0, 2\n.section code 0x4c000 rx\nmain: exit\nf: nop\n  nop\n.tile 1\n.section code 0x4c000 rx\n exit\n",
        "f.s",
    )
    .unwrap();
    let all = disassemble(&p, None, None);
    assert!(
        all.contains(".tile 0, 2\n") && all.contains(".tile 1\n"),
        "{all}"
    );
    let one = disassemble(&p, Some(2), None);
    assert!(
        one.contains(".tile 2\n") && !one.contains(".tile 1"),
        "{one}"
    );
    let f = disassemble(&p, None, Some("f"));
    assert!(f.contains(".org 0x4c004\nf:\n"), "{f}");
    assert!(!f.contains("exit"), "{f}");
    assert!(
        check_filter(&p, Some(3), None)
            .unwrap_err()
            .contains("tiles with images: 0..=2")
    );
    assert!(
        check_filter(&p, Some(1), Some("f"))
            .unwrap_err()
            .contains("no symbol `f` on tile 1")
    );
    assert!(check_filter(&p, None, Some("f")).is_ok());
}
