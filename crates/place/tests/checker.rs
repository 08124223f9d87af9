//! The checker against hand-made placements: one valid, then each rule broken once.

use tessera_machine::Machine;
use tessera_place::check::Rule;
use tessera_place::{
    Alias, Allocation, FlatBuffer, FlatProblem, MemClass, Mode, Request, Reservation, Sequence,
    TilePlacement, TileProblem, check_flat, check_placement,
};

fn req(name: &str, size: u64, first: u64, last: u64, class: MemClass) -> Request {
    Request {
        name: name.into(),
        size,
        align: 8,
        end_round: 1,
        first,
        last,
        class,
        tail: 0,
        loaded: false,
        category: None,
    }
}

fn problem() -> TileProblem {
    let mut a = req("a", 100, 0, 5, MemClass::NonInterleaved);
    a.end_round = 16;
    a.tail = 8;
    a.loaded = true;
    TileProblem {
        tile: 0,
        requests: vec![
            a,
            req("b", 64, 0, 5, MemClass::Any),
            req("c", 64, 6, 9, MemClass::Any),
            req("v", 16, 2, 3, MemClass::Any),
            req("d", 64, 0, 9, MemClass::Interleaved),
        ],
        reservations: vec![Reservation {
            name: "code".into(),
            start: 0x4_C000,
            end: 0x5_0000,
        }],
        separation: vec![vec!["a".into(), "d".into()]],
        aliases: vec![Alias {
            name: "v".into(),
            of: "b".into(),
            offset: 32,
        }],
        sequences: vec![Sequence {
            name: "s".into(),
            count: 3,
            size: 24,
            align: 8,
            end_round: 8,
            first: 0,
            last: 9,
            class: MemClass::Any,
            tail: 0,
            loaded: false,
            separate: false,
            category: None,
        }],
    }
}

fn at(id: &str, offset: u64) -> Allocation {
    Allocation {
        id: id.into(),
        offset,
        stride: None,
    }
}

fn valid() -> TilePlacement {
    TilePlacement {
        tile: 0,
        mode_used: Mode::Lifetime,
        peak: 0x8_0040,
        allocations: vec![
            at("a", 0x5_0000),
            at("b", 0x5_0100),
            at("c", 0x5_0000),
            at("v", 0x5_0120),
            at("d", 0x8_0000),
            Allocation {
                id: "s".into(),
                offset: 0x5_0200,
                stride: Some(24),
            },
        ],
    }
}

fn moved(pl: &TilePlacement, moves: &[(&str, u64)]) -> TilePlacement {
    let mut pl = pl.clone();
    for (id, off) in moves {
        if let Some(a) = pl.allocations.iter_mut().find(|a| a.id == *id) {
            a.offset = *off;
        }
    }
    pl
}

fn rules(t: &TileProblem, pl: &TilePlacement) -> Vec<Rule> {
    check_placement(&Machine::c600(), t, pl, None)
        .into_iter()
        .map(|v| v.rule)
        .collect()
}

#[test]
fn valid_placement_passes() {
    let v = check_placement(&Machine::c600(), &problem(), &valid(), None);
    assert!(v.is_empty(), "{v:?}");
}

#[test]
fn each_broken_rule_is_caught() {
    let t = problem();
    let base = valid();
    let cases: Vec<(Rule, TilePlacement)> = vec![
        (
            Rule::Overlap,
            moved(&base, &[("b", 0x5_0040), ("v", 0x5_0060)]),
        ),
        (
            Rule::Alignment,
            moved(&base, &[("b", 0x5_0104), ("v", 0x5_0124)]),
        ),
        (
            Rule::EndRound,
            moved(&base, &[("b", 0x5_0068), ("v", 0x5_0088)]),
        ),
        (Rule::Class, moved(&base, &[("d", 0x7_FF00)])),
        (Rule::Tail, moved(&base, &[("a", 0x7_FF90)])),
        (
            Rule::Reservation,
            moved(&base, &[("b", 0x4_C000), ("v", 0x4_C020)]),
        ),
        (Rule::Alias, moved(&base, &[("v", 0x5_0128)])),
        (
            Rule::Region,
            moved(&base, &[("b", 0xE_8000), ("v", 0xE_8020)]),
        ),
    ];
    for (rule, pl) in cases {
        let got = rules(&t, &pl);
        assert!(got.contains(&rule), "{rule:?} not caught: {got:?}");
    }
}

#[test]
fn loader_limit_separation_stride_and_missing_are_caught() {
    let base = valid();
    // Loader limit: `a` may live anywhere, placed so its loaded bytes pass the limit.
    let mut t = problem();
    t.requests[0].class = MemClass::Any;
    let got = rules(&t, &moved(&base, &[("a", 0xE_7B80)]));
    assert!(got.contains(&Rule::LoaderLimit), "{got:?}");

    // Separation: `d` in the same 16 KiB element as `a`.
    let mut t = problem();
    t.requests[4].class = MemClass::Any;
    let got = rules(&t, &moved(&base, &[("d", 0x5_0300)]));
    assert_eq!(got, vec![Rule::Separation]);

    // Stride below the rounded member size.
    let t = problem();
    let mut pl = base.clone();
    pl.allocations[5].stride = Some(16);
    assert!(rules(&t, &pl).contains(&Rule::Stride));

    // A separated sequence whose members share an element.
    let mut t = problem();
    t.sequences[0].separate = true;
    assert!(rules(&t, &base).contains(&Rule::Separation));

    // Missing and unknown allocations.
    let mut pl = base.clone();
    pl.allocations.retain(|a| a.id != "c");
    pl.allocations.push(at("ghost", 0x9_0000));
    let got = rules(&problem(), &pl);
    assert!(
        got.contains(&Rule::Missing) && got.contains(&Rule::Unknown),
        "{got:?}"
    );
}

#[test]
fn violations_name_requests_and_bytes() {
    let v = check_placement(
        &Machine::c600(),
        &problem(),
        &moved(&valid(), &[("b", 0x5_0040), ("v", 0x5_0060)]),
        None,
    );
    let o = v
        .iter()
        .find(|v| v.rule == Rule::Overlap)
        .expect("an overlap");
    assert!(o.names.contains(&"a".to_string()) && o.names.contains(&"b".to_string()));
    // `a` occupies its rounded end: 100 bytes rounded to 112.
    assert_eq!(o.bytes, 0x5_0070 - 0x5_0040);
}

#[test]
fn flat_checker_catches_overlap_alignment_capacity() {
    let b = |id: &str, lower: i64, upper: i64, size: u64, align: u64| FlatBuffer {
        id: id.into(),
        lower,
        upper,
        size,
        align,
    };
    let p = FlatProblem {
        buffers: vec![b("x", 0, 4, 8, 1), b("y", 2, 6, 8, 4), b("z", 4, 8, 8, 1)],
    };
    assert!(check_flat(&p, &[0, 8, 0], Some(16)).is_empty());
    let r =
        |o: &[u64]| -> Vec<Rule> { check_flat(&p, o, Some(16)).iter().map(|v| v.rule).collect() };
    assert_eq!(r(&[0, 4, 0]), vec![Rule::Overlap, Rule::Overlap]);
    assert_eq!(r(&[0, 10, 0]), vec![Rule::Alignment, Rule::Region]);
    assert_eq!(r(&[0, 8, 12]), vec![Rule::Region, Rule::Overlap]);
}
