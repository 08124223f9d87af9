//! Inputs found by `tessera bench fuzz --target place-csv`, kept as tests.

use tessera_place::{Options, parse_csv, place_flat};

/// A lifetime starting near `i64::MIN` overflowed the lifetime length in the flat
/// orders and the search (a panic in debug builds). A negative bound is refused
/// when read (steps start at 0), and so is one beyond 2^60; those inside still
/// place.
#[test]
fn fuzz_found_extreme_lifetimes_are_refused_when_read() {
    let text = "id,start,end,size\nb0,-9223372036854775807,35,2373\nb1,2,12,3574\nb2,19,25,3645\n";
    let e = parse_csv(text, "fuzz.csv").unwrap_err().to_string();
    assert!(e.contains("fuzz.csv:2") && e.contains("is negative"), "{e}");
    let text = "id,lower,upper,size\nb0,0,9223372036854775806,64\n";
    let e = parse_csv(text, "fuzz.csv").unwrap_err().to_string();
    assert!(
        e.contains("fuzz.csv:2") && e.contains("beyond +-2^60"),
        "{e}"
    );
    let text = "id,lower,upper,size\nb0,0,1152921504606846976,64\nb1,2,12,32\n";
    let p = parse_csv(text, "ok.csv").unwrap();
    for capacity in [None, Some(96)] {
        let opts = Options {
            capacity,
            node_budget: 2_000,
            ..Options::default()
        };
        assert!(place_flat(&p, &opts).unwrap().fits);
    }
}
