//! Golden listings: each `tests/golden/NAME.s` assembles, disassembles to exactly
//! `NAME.dis`, and the listing re-assembles to identical package bytes. Refresh the
//! expected listings with `UPDATE_GOLDEN=1 cargo test -p tessera-isa --test golden`.

use std::path::Path;
use tessera_isa::{assemble, assemble_file, disassemble};
use tessera_package::write_package;

#[test]
fn golden_listings() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut sources: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "s"))
        .collect();
    sources.sort();
    assert!(
        !sources.is_empty(),
        "no golden sources in {}",
        dir.display()
    );
    for src in sources {
        let p = assemble_file(&src).unwrap_or_else(|e| panic!("{e}"));
        let listing = disassemble(&p, None, None);
        let expected_path = src.with_extension("dis");
        if update {
            std::fs::write(&expected_path, &listing).unwrap();
        } else {
            let expected = std::fs::read_to_string(&expected_path).unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (run with UPDATE_GOLDEN=1 to create it)",
                    expected_path.display()
                )
            });
            assert!(
                listing == expected,
                "{} differs from the disassembly of {} (UPDATE_GOLDEN=1 refreshes it):\n{listing}",
                expected_path.display(),
                src.display()
            );
        }
        let again = assemble(&listing, "listing.s").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            write_package(&p),
            write_package(&again),
            "{}",
            src.display()
        );
    }
}
