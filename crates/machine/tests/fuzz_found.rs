//! Inputs found by `tessera bench fuzz --target machine`, kept as tests.

use tessera_machine::Machine;

/// An interleaved region's element span is twice its element size: a power of two
/// of 2^31 overflowed the doubling inside `validate` (a panic in debug builds, a
/// zero span and a division by zero later in release).
#[test]
fn fuzz_found_a_huge_element_size_is_refused() {
    let text = Machine::small()
        .to_toml()
        .replace("element_bytes = 16384", "element_bytes = 2147483648");
    assert!(text.contains("2147483648"));
    let e = Machine::from_toml(&text, "fuzz.toml")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("element_bytes") && e.contains("a power of two from 8 to"),
        "{e}"
    );
    // The largest accepted element: the whole address space.
    let text = Machine::small()
        .to_toml()
        .replace("element_bytes = 16384", "element_bytes = 1048576");
    let e = Machine::from_toml(&text, "fuzz.toml")
        .unwrap_err()
        .to_string();
    assert!(!e.contains("element_bytes ="), "{e}");
}
