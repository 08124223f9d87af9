//! The assembler: layout rules, pseudo-instructions, tiles, and located errors.

use tessera_isa::*;
use tessera_package::{Package, SymbolKind, read_package, write_package};

fn asm(src: &str) -> Package {
    match assemble(src, "t.s") {
        Ok(p) => p,
        Err(e) => panic!("assembly failed:\n{e}"),
    }
}

/// The first diagnostic, as `line:col: message`.
fn asm_err(src: &str) -> String {
    let e = assemble(src, "t.s").expect_err("assembly must fail");
    let d = &e.diagnostics[0];
    format!("{}:{}: {}", d.line, d.col, d.message)
}

const HEAD: &str = ".machine small\n.tile 0\n.section code 0x4c000 rx\n";

fn code_of(p: &Package) -> &[u8] {
    &p.tiles[0].segments[0].bytes
}

fn words(ws: &[Word]) -> Vec<u8> {
    encode(ws).unwrap()
}

#[test]
fn instructions_and_labels() {
    let p = asm(&format!(
        "{HEAD}start: setzi $m1, end\n  bri start\nend:\n  exit\n"
    ));
    let t = &p.tiles[0];
    assert_eq!(t.entry, 0x4c000);
    assert_eq!(
        code_of(&p),
        words(&[
            Word::Single(Inst::Setzi {
                d: MReg(1),
                imm: 0x4c008
            }),
            Word::Single(Inst::Bri { target: 0x4c000 }),
            Word::Single(Inst::Exit),
        ])
    );
    let names: Vec<_> = t
        .symbols
        .iter()
        .map(|s| (s.name.as_str(), s.addr, s.size, s.kind))
        .collect();
    assert_eq!(
        names,
        [
            ("start", 0x4c000, 8, SymbolKind::Code),
            ("end", 0x4c008, 4, SymbolKind::Code)
        ]
    );
}

#[test]
fn li_expands_to_three_words_for_any_value() {
    for v in [0u32, 5, 0x3f80_0000, 0xffff_ffff, 0x000f_ffff] {
        let p = asm(&format!("{HEAD}  li $m2, {v:#x}\n"));
        assert_eq!(
            code_of(&p),
            words(&[
                Word::Single(Inst::Setzi {
                    d: MReg(2),
                    imm: v >> 12
                }),
                Word::Single(Inst::IntImm {
                    op: IntOp::Shl,
                    d: MReg(2),
                    a: MReg(2),
                    imm: 12
                }),
                Word::Single(Inst::IntImm {
                    op: IntOp::Or,
                    d: MReg(2),
                    a: MReg(2),
                    imm: (v & 0xfff) as u16
                }),
            ])
        );
    }
    // Negative values are their 32-bit two's complement.
    let p = asm(&format!("{HEAD}  li $m2, -1\n"));
    let q = asm(&format!("{HEAD}  li $m2, 0xffffffff\n"));
    assert_eq!(code_of(&p), code_of(&q));
}

#[test]
fn bundles_are_aligned_with_a_nop_and_labels_follow_the_padding() {
    let p = asm(&format!(
        "{HEAD}  exit\nloop: {{ f32add $a0, $a1, $a2 ; nop }}\n  bri loop\n"
    ));
    let bundle = Word::Bundle(
        Inst::Nop,
        Inst::FBin {
            op: FBinOp::Add,
            vec: FVec::F32,
            d: AReg(0),
            a: AReg(1),
            b: AReg(2),
        },
    );
    assert_eq!(
        code_of(&p),
        words(&[
            Word::Single(Inst::Exit),
            Word::Single(Inst::Nop),
            bundle,
            Word::Single(Inst::Bri { target: 0x4c008 }),
        ])
    );
    let l = p.tiles[0]
        .symbols
        .iter()
        .find(|s| s.name == "loop")
        .unwrap();
    assert_eq!(l.addr, 0x4c008);
}

#[test]
fn a_repeat_body_opening_with_a_bundle_is_aligned_before_the_rpt() {
    let p = asm(&format!(
        "{HEAD}  exit\n  nop\nr: rpt 4, 1\n  {{ nop ; f32add $a0, $a0, $a2 }}\n"
    ));
    let bundle = Word::Bundle(
        Inst::Nop,
        Inst::FBin {
            op: FBinOp::Add,
            vec: FVec::F32,
            d: AReg(0),
            a: AReg(0),
            b: AReg(2),
        },
    );
    assert_eq!(
        code_of(&p),
        words(&[
            Word::Single(Inst::Exit),
            Word::Single(Inst::Nop),
            Word::Single(Inst::Nop),
            Word::Single(Inst::Rpti { count: 4, body: 1 }),
            bundle,
        ])
    );
    let r = p.tiles[0].symbols.iter().find(|s| s.name == "r").unwrap();
    assert_eq!(r.addr, 0x4c00c);
    let e = asm_err(&format!(
        "{HEAD}  nop\n  rpt 4, 3\n  {{ nop ; f32add $a0, $a0, $a2 }}\n  nop\n  {{ nop ; f32add $a0, $a0, $a2 }}\n"
    ));
    assert!(e.starts_with("8:3: bundle at 0x4c014 is not 8-byte aligned inside the repeat body of the `rpt` on line 5"), "{e}");
}

#[test]
fn data_directives_and_reserved_space() {
    let p = asm(&format!(
        "{HEAD}  exit\n.section data 0x90000 rw\nt: .byte 1, -1\n .half 0x1234\n .align 4\n .word t+2\n .f16 1.0, -2\n .f32 0.5\nbig: .space 100\n"
    ));
    let d = &p.tiles[0].segments[1];
    assert_eq!(
        d.bytes,
        [
            1, 0xff, 0x34, 0x12, 2, 0, 9, 0, 0x00, 0x3c, 0x00, 0xc0, 0, 0, 0, 0x3f
        ]
    );
    assert_eq!(d.size, 16 + 100);
    let big = p.tiles[0].symbols.iter().find(|s| s.name == "big").unwrap();
    assert_eq!(
        (big.addr, big.size, big.kind),
        (0x90010, 100, SymbolKind::Data)
    );
}

#[test]
fn zero_in_code_is_zeros_but_alignment_is_nops() {
    let p = asm(&format!("{HEAD}  exit\n  .zero 4\n  .align 16\n  exit\n"));
    let nop = words(&[Word::Single(Inst::Nop)]);
    let exit = words(&[Word::Single(Inst::Exit)]);
    let expect: Vec<u8> = [exit.clone(), vec![0; 4], nop.clone(), nop, exit].concat();
    assert_eq!(code_of(&p), expect);
}

#[test]
fn explicit_symbol_sizes_kinds_and_entry() {
    let p = asm(&format!(
        "{HEAD}  exit\nw: exit\n  exit\n.symbol w 4\n.symbol \"odd name\" 0 data\n\"odd name\":\n.entry w\n"
    ));
    let t = &p.tiles[0];
    assert_eq!(t.entry, 0x4c004);
    let w = t.symbols.iter().find(|s| s.name == "w").unwrap();
    assert_eq!(w.size, 4);
    let odd = t.symbols.iter().find(|s| s.name == "odd name").unwrap();
    assert_eq!(
        (odd.addr, odd.size, odd.kind),
        (0x4c00c, 0, SymbolKind::Data)
    );
}

#[test]
fn tiles_replicate_and_resolve_their_own_labels() {
    let p = asm(
        ".machine small\n.tiles 8\n.tile all\n.section code 0x4c000 rx\n  bri x\n.tile 2..4, 7\n.section code\n  exit\n.tile 0..=7\n.section code\nx: exit\n\
         .exchange 1 e\n.binding weight w 8\n.slice 3 x 0 8\n",
    );
    assert_eq!(p.tiles.len(), 8);
    let with_extra: Vec<u32> = p
        .tiles
        .iter()
        .filter(|t| t.segments[0].bytes.len() == 12)
        .map(|t| t.tile)
        .collect();
    assert_eq!(with_extra, [2, 3, 7]);
    let x_of = |tile: usize| {
        p.tiles[tile]
            .symbols
            .iter()
            .find(|s| s.name == "x")
            .unwrap()
            .addr
    };
    assert_eq!(x_of(2), 0x4c008);
    assert_eq!(x_of(0), 0x4c004);
    assert_eq!((p.exchanges[0].id, p.exchanges[0].name.as_str()), (1, "e"));
    assert_eq!(p.bindings[0].slices[0].tile_addr, 0x4c008);
    // The package survives its own format.
    assert_eq!(read_package(&write_package(&p)).unwrap(), p);
}

#[test]
fn machine_file_paths_resolve_against_the_source() {
    let dir = std::env::temp_dir().join(format!("tessera-asm-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let m = tessera_machine::Machine::small().with_tiles(2);
    std::fs::write(dir.join("m.toml"), m.to_toml()).unwrap();
    std::fs::write(
        dir.join("p.s"),
        ".machine \"m.toml\"\n.tile 1\n.section code 0x4c000 rx\n exit\n",
    )
    .unwrap();
    let p = assemble_file(&dir.join("p.s")).unwrap();
    assert_eq!(p.machine_toml, m.to_toml());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn errors_are_located_and_clear() {
    let cases: &[(&str, &str)] = &[
        ("  frob $m1\n", "4:3: unknown mnemonic `frob`"),
        ("  add $m1, $m2, $m16\n", "4:17: bad register `$m16`"),
        ("  add $m1, $a2, $m3\n", "4:12: expected an $m register"),
        (
            "  add $m1, $m2, 4096\n",
            "4:17: immediate 4096 is out of range",
        ),
        ("  ld64 $a1:2, $m1, 0\n", "4:8: expected a register pair"),
        ("  ld128 $a2:5, $m1, 0\n", "4:9: expected a register quad"),
        (
            "  ld64step $a0:1, $m2, 1\n",
            "4:19: expected a post-incremented",
        ),
        (
            "  ld64step $a0:1, $m2+=, 128\n",
            "4:26: increment (in units of 8 bytes) 128 is out of range",
        ),
        (
            "  setzi $m1, 0x100000\n",
            "4:14: immediate 1048576 is out of range",
        ),
        ("  bri nowhere\n", "4:7: undefined symbol `nowhere`"),
        (
            "  bri 0x4c002\n",
            "4:7: branch target 0x4c002 is not 4-byte aligned",
        ),
        ("  run $m1, $m2, 6\n", "4:17: worker 6 is out of range"),
        (
            "  amp $a0:1, $a2:3, $a4:5, 4\n",
            "4:28: phase 4 is out of range 0..=3",
        ),
        (
            "  rpt $m1, 0\n",
            "4:12: body length (in words) 0 is out of range",
        ),
        (
            "  { add $m1, $m1, $m1 ; exit }\n",
            "4:3: a bundle needs one aux-pipe",
        ),
        (
            "  { f32add $a0, $a0, $a0 ; f32exp $a1, $a1 }\n",
            "4:3: a bundle needs one main-pipe",
        ),
        (
            "  { li $m1, 3 ; f32exp $a1, $a1 }\n",
            "4:5: a pseudo-instruction cannot be part of a bundle",
        ),
        ("  nop ; nop\n", "4:7: `;` separates"),
        // tanh exists for f32 scalars and f16 pairs only, each on single registers.
        (
            "  f16v4tanh $a0:1, $a2:3\n",
            "4:3: unknown mnemonic `f16v4tanh`",
        ),
        (
            "  f32v2tanh $a0:1, $a2:3\n",
            "4:3: unknown mnemonic `f32v2tanh`",
        ),
        (
            "  f16v2tanh $a0:1, $a2\n",
            "4:13: expected a single $a register, found a range",
        ),
        ("  sync everyone\n", "4:8: expected `local` or `global`"),
        ("  add $m1, $m2\n", "4:3: `add` takes 3 operands"),
        (
            "  .byte 1\n  exit\n",
            "5:3: instruction at 0x4c001 is not 4-byte aligned",
        ),
        (
            "x: exit\nx: exit\n",
            "5:1: label `x` is already defined (line 4)",
        ),
        (
            "  .word 0x100000000\n",
            "4:9: value 4294967296 does not fit 32 bits",
        ),
        ("  .frob 1\n", "4:3: unknown directive `.frob`"),
        (
            "  exit\n.section d 0x4c002 rw\n .word 1\n",
            "5:1: section `d` [0x4c002, 0x4c006) overlaps section `code`",
        ),
        (
            "  exit\n.section d 0xe7ff0 rw\n .space 32\n",
            "5:1: section `d` [0xe7ff0, 0xe8010) lies outside tile SRAM",
        ),
        (
            "  exit\n.section d 0xe7ba0 rw\n .space 4\n .word 1, 2, 3, 4\n",
            "5:1: initialised contents of section `d` end at 0xe7bb4",
        ),
        (
            "  exit\n.section d 0x7fff0 rx\n .space 32\n",
            "5:1: executable section `d` [0x7fff0, 0x80010) reaches the non-executable region",
        ),
        (
            "  exit\n.section d 0x90000 rw\n  exit\n",
            "6:3: instruction in section `d`, which is not executable",
        ),
        (
            "  exit\n.section code 0x4d000 rx\n",
            "5:1: section `code` is already open",
        ),
        ("  exit\n.section other\n", "5:1: unknown section `other`"),
        (
            "  exit\n.org 0x4b000\n",
            "5:1: `.org 0x4b000` would move backwards",
        ),
        (
            "  exit\n.align 3\n",
            "5:1: alignment 3 is not a power of two",
        ),
        (
            "  exit\n.entry 0x90000\n",
            "5:1: entry point 0x90000 is not",
        ),
        (
            "  exit\n.symbol ghost 4\n",
            "5:1: `.symbol` names `ghost`, which is not a label",
        ),
        (
            "  exit\n.tile 4\n",
            "5:7: tile range 4..=4 is empty or outside 0..4",
        ),
        (
            // Exchange is code: the package lists no transfers.
            "  exit\n.transfer 0 0 4 -> 1 0\n",
            "5:1: unknown directive `.transfer`",
        ),
        (
            "  exit\n.exchange 70000 big\n",
            "5:11: exchange id 70000 is out of range",
        ),
        ("  ld32 $a0, $m1, 0x\n", "4:18: bad number `0x`"),
        (
            "  mov $m1, 5\n",
            "4:12: expected a register (use `setzi` or `li`",
        ),
        (
            "  exit\n.section \"unterminated 0x90000 rw\n",
            "5:10: unterminated string",
        ),
        ("  exit @\n", "4:8: unexpected character `@`"),
    ];
    for (body, want) in cases {
        let got = asm_err(&format!("{HEAD}{body}"));
        assert!(
            got.starts_with(want),
            "source:\n{body}\nwant prefix: {want}\ngot:         {got}"
        );
    }
}

#[test]
fn file_level_errors() {
    assert!(asm_err(".tile 0\n").contains("`.machine` must come before"));
    assert!(asm_err("  exit\n").contains("no tile selected"));
    assert!(asm_err("").contains("missing `.machine`"));
    assert!(asm_err(".machine nope\n").contains("unknown machine preset `nope`"));
    assert!(
        asm_err(".machine small\n.tile 0\n.section d 0x90000 rw\n .word 1\n")
            .contains("no executable section")
    );
    assert!(
        asm_err(".machine small\n.tile 0\n.section c 0x4c000 rx\n")
            .contains("section `c` is empty")
    );
    // Undefined labels on one tile of a replicated block name that tile.
    let e = asm_err(
        ".machine small\n.tile all\n.section c 0x4c000 rx\n bri x\n.tile 1\n.section c\nx: exit\n",
    );
    assert!(
        e.contains("undefined symbol `x`") && e.contains("tile 0"),
        "{e}"
    );
    let e = asm_err(
        ".machine small\n.tile 0\n.section c 0x4c000 rx\nx: exit\n.binding input b 4\n.slice 1 x 0 4\n",
    );
    assert!(
        e.starts_with("6:") && e.contains("undefined symbol `x` on tile 1"),
        "{e}"
    );
    // Package-level inconsistencies are reported too.
    let e = asm_err(
        ".machine small\n.tile 0\n.section c 0x4c000 rx\n exit\n.binding output o 4\n.slice 0 0x90000 0 8\n",
    );
    assert!(e.contains("host binding `o`"), "{e}");
}

#[test]
fn every_syntax_error_is_reported() {
    let e = assemble(&format!("{HEAD}  frob\n  exit\n  frab $m1\n"), "many.s").unwrap_err();
    let lines: Vec<usize> = e.diagnostics.iter().map(|d| d.line).collect();
    assert_eq!(lines, [4, 6]);
    let text = e.to_string();
    assert!(
        text.starts_with("many.s:4:3: error: unknown mnemonic `frob`"),
        "{text}"
    );
}

#[test]
fn single_words_parse_and_print() {
    for text in [
        "setzi $m1, 0x9a000",
        "mov $m1, $m2",
        "ld64step $a0:1, $m2+=, -1",
        "rpt 100, 2",
        "sync global",
        "f16v4mac $a0:1, $a2:3, $a4:5",
        "{ ld2xst64pace $a2:3, $a4:5, $a0:1, $m1+=, $m2+=, $m3+= ; amp $a0:1, $a2:3, $a4:5, 0 }",
        "st32 $azero, $mzero, 0",
        "f32tanh $a0, $a1",
        "f16v2tanh $a2, $azero",
        "{ ld64step $a0:1, $m2+=, 1 ; f16v2tanh $a2, $a3 }",
        "{ st64step $a2:3, $m5+=, 4 ; f16v2exp $a1, $a0 }",
        "f16v4acc $a2:3",
        "{ ld64 $a0:1, $m5, 0 ; f16v8acc $a0:3 }",
        "f32v2gina $a4:5",
        "uput $FP_SCL, $a6",
        "{ ld64step $a0:1, $m2+=, 1 ; uput $FP_SCL, $a6 }",
        "f8v4tof16 $a2:3, $a0",
        "f16v8tof8 $a6:7, $a8:11",
    ] {
        assert_eq!(parse_word(text).unwrap().to_string(), text);
    }
    // Aliases and optional parts print canonically.
    assert_eq!(
        parse_word("ld32 $a1, $m1").unwrap().to_string(),
        "ld32 $a1, $m1, 0"
    );
    assert_eq!(
        parse_word("OR $m1, $m2, $m15").unwrap().to_string(),
        "mov $m1, $m2"
    );
    assert_eq!(
        parse_word("{ amp $a0:1, $a2:3, $a4:5, 1 ; nop }").unwrap(),
        Word::Bundle(
            Inst::Nop,
            Inst::Amp {
                out: AReg(0),
                inp: AReg(2),
                pin: AReg(4),
                phase: 1
            }
        )
    );
    assert!(parse_word("li $m1, 5").is_err());
    // A quad must start at a multiple of 4, a pair at an even register.
    assert!(parse_word("f16v8acc $a2:5").is_err());
    assert!(parse_word("f32v2gina $a3:4").is_err());
    // `$FP_SCL` is the one control register, and only `uput` names it; the
    // conversions take a pair and a register, a pair and a quad.
    for bad in [
        "uput $FP_SCL, $m1",
        "uput $a1",
        "uput $FP_NFMT, $a1",
        "mov $a1, $FP_SCL",
        "f8v4tof16 $a1, $a0",
        "f16v8tof8 $a0:1, $a2:5",
    ] {
        assert!(parse_word(bad).is_err(), "{bad}");
    }
    assert_eq!(
        parse_word_with("bri x+8", &|s| (s == "x").then_some(0x4c000)).unwrap(),
        Word::Single(Inst::Bri { target: 0x4c008 })
    );
}

/// Symbols outside every section and a weight binding's host contents: what a
/// compiled package carries beyond labels, assembled and listed back identically.
#[test]
fn free_symbols_and_binding_data_round_trip() {
    let src = format!(
        "{HEAD}main:\n  exit\n.symbol \"w@buf1\" 64 data 0x80000\n\
         .binding weight w 4\n.slice 0 0x80000 0 4\n.bindata \"0a0b\"\n.bindata \"0c0d\"\n"
    );
    let p = asm(&src);
    let w = p.tiles[0]
        .symbols
        .iter()
        .find(|s| s.name == "w@buf1")
        .expect("free symbol");
    assert_eq!((w.addr, w.size, w.kind), (0x80000, 64, SymbolKind::Data));
    assert_eq!(p.bindings[0].data, [0x0a, 0x0b, 0x0c, 0x0d]);
    let listing = disassemble(&p, None, None);
    assert!(
        listing.contains(".symbol \"w@buf1\" 64 data 0x80000"),
        "{listing}"
    );
    let again = asm(&listing);
    assert_eq!(write_package(&again), write_package(&p));

    assert!(
        asm_err(&format!(
            "{HEAD}main:\n  exit\n.symbol main 4 code 0x80000\n"
        ))
        .contains("also a label")
    );
    assert!(
        asm_err(&format!("{HEAD}main:\n  exit\n.symbol w 4 data 0x10\n"))
            .contains("outside tile SRAM")
    );
    assert!(
        asm_err(&format!(
            "{HEAD}main:\n  exit\n.binding weight w 2\n.bindata \"0g\"\n"
        ))
        .contains("hex digits")
    );
}
