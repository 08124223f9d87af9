//! The simulator never panics: random valid words (supervisor and worker code,
//! branches anywhere, exchanges and host transfers with random operands) and random
//! bytes as code, each run to a result under a small cycle budget.

mod common;

use common::*;
use proptest::prelude::*;
use tessera_isa::{Word, testgen};
use tessera_machine::Machine;
use tessera_package::*;
use tessera_sim::{SimOptions, Simulator};

fn image_from_bytes(tile: u32, code: Vec<u8>, data: Vec<u8>) -> TileImage {
    let size = code.len() as u32;
    TileImage {
        tile,
        entry: CODE,
        symbols: vec![Symbol {
            name: "fuzz".into(),
            addr: CODE,
            size,
            kind: SymbolKind::Code,
        }],
        segments: vec![
            Segment {
                name: "code".into(),
                addr: CODE,
                size,
                bytes: code,
                perms: Perms {
                    read: true,
                    write: true,
                    execute: true,
                },
            },
            Segment {
                name: "data".into(),
                addr: R1,
                size: data.len() as u32,
                bytes: data,
                perms: Perms::default(),
            },
        ],
    }
}

fn run_all(p: &Package) {
    if let Ok(mut sim) = Simulator::new(p) {
        let r = sim.run(&SimOptions {
            cycle_budget: 30_000,
            ..SimOptions::default()
        });
        // Whatever happened, the report is consistent.
        assert_eq!(r.status == tessera_sim::Status::Ok, r.faults.is_empty());
    }
}

fn exchanges() -> Vec<ExchangeProgram> {
    vec![ExchangeProgram {
        id: 1,
        name: "x".into(),
    }]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        rng_seed: proptest::test_runner::RngSeed::Fixed(11),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_words_never_panic(
        words in proptest::collection::vec(testgen::word(), 1..60),
        data in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        // Lay out with bundle alignment; the same code on two tiles.
        let mut b = tessera_sim::bench::CodeBuilder::new(CODE);
        for w in &words {
            b.push(*w);
        }
        let code = b.bytes().unwrap();
        let tiles = (0..2).map(|t| image_from_bytes(t, code.clone(), data.clone())).collect();
        let bindings = vec![HostBinding {
            data: Vec::new(),
            name: "io".into(),
            kind: BindingKind::Input,
            bytes: 64,
            slices: vec![],
        }];
        run_all(&package(&Machine::small(), tiles, exchanges(), bindings));
    }

    #[test]
    fn random_bytes_never_panic(
        code in proptest::collection::vec(any::<u32>(), 1..64),
        data in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        // Bias towards valid opcodes so that execution gets somewhere.
        let bytes: Vec<u8> = code
            .iter()
            .flat_map(|w| ((w & 0x80ff_ffff) | ((w >> 24) % 0x49) << 24).to_le_bytes())
            .collect();
        let tiles = vec![image_from_bytes(0, bytes, data)];
        run_all(&package(&Machine::small(), tiles, exchanges(), vec![]));
    }
}

#[test]
fn a_word_sequence_example_runs() {
    // Sanity check for the harness itself: a plain exit.
    let code = tessera_isa::encode(&[Word::Single(tessera_isa::Inst::Exit)]).unwrap();
    let p = package(
        &Machine::small(),
        vec![image_from_bytes(0, code, vec![])],
        vec![],
        vec![],
    );
    let r = Simulator::new(&p).unwrap().run(&SimOptions::default());
    assert!(r.faults.is_empty());
}
