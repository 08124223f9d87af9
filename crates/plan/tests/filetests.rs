//! Lowering filetests: each `tests/lower/NAME.graph` is a graph in its text form
//! (`tessera_graph::Graph::parse`), lowered with seed-1 weights and the default
//! options, and compared with `tests/lower/NAME.plan`. The first lines may say
//! `// tiles: N` to lower on `Machine::small()` with `N` tiles. Create or refresh
//! the plans with `UPDATE_LOWER=1 cargo test -p tessera-plan --test filetests`.

use std::path::Path;

use tessera_graph::{Graph, MlpConfig, init_weights, mlp};
use tessera_machine::Machine;
use tessera_plan::{LowerOptions, lower, verify};

fn lower_text(text: &str) -> String {
    let graph = Graph::parse(text).unwrap_or_else(|e| panic!("{e}"));
    let tiles = text
        .lines()
        .find_map(|l| l.strip_prefix("// tiles:"))
        .map(|n| n.trim().parse::<u32>().expect("a tile count"));
    let machine = match tiles {
        Some(n) => Machine::small().with_tiles(n),
        None => Machine::small(),
    };
    let plan = lower(
        &machine,
        &graph,
        &init_weights(&graph, 1),
        &LowerOptions::default(),
    )
    .unwrap();
    assert_eq!(verify(&plan), vec![]);
    plan.to_string()
}

#[test]
fn every_graph_file_lowers_to_its_plan() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lower");
    let mut cases: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "graph"))
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no cases in {}", dir.display());
    for case in cases {
        let plan = lower_text(&std::fs::read_to_string(&case).unwrap());
        let expected_path = case.with_extension("plan");
        if std::env::var_os("UPDATE_LOWER").is_some() {
            std::fs::write(&expected_path, &plan).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (UPDATE_LOWER=1 creates it)",
                expected_path.display()
            )
        });
        assert!(
            plan == expected,
            "{} differs from the plan (UPDATE_LOWER=1 refreshes it):\n{plan}",
            expected_path.display()
        );
    }
}

/// A graph read back from its text lowers to the plan of the graph itself: the
/// text form loses nothing the lowering reads.
#[test]
fn a_printed_model_lowers_as_the_model() {
    let graph = mlp(&MlpConfig::tiny(2)).unwrap();
    let direct = lower(
        &Machine::small(),
        &graph,
        &init_weights(&graph, 1),
        &LowerOptions::default(),
    )
    .unwrap();
    assert_eq!(lower_text(&graph.to_string()), direct.to_string());
}
