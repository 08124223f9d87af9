//! Inputs found by `tessera bench fuzz --target asm`, kept as tests.

use tessera_isa::assemble;

fn listing(tiles: u64) -> String {
    format!(
        ".machine small\n.tiles {tiles}\n.tile all\n.section code 0x4c000 rx\n.entry main\nmain:\n    exit\n"
    )
}

/// `.tiles 327686` passed the assembler's own bound (2^20), `.tile all` then laid
/// out one image per tile and only the package check refused the count: 0.4 s per
/// input in a release build, over a second near 2^20. The machine's bound is
/// checked where the count is read.
#[test]
fn fuzz_found_a_tile_count_beyond_the_machine_is_refused_where_it_is_read() {
    let e = assemble(&listing(327_686), "fuzz.s")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("fuzz.s:2:") && e.contains("tile count 327686 is out of range 1..=16384"),
        "{e}"
    );
    assert_eq!(assemble(&listing(16), "ok.s").unwrap().tiles.len(), 16);
}
