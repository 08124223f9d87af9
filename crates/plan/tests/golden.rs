//! Golden plans: each case lowers a small model and compares the plan's text form
//! with `tests/golden/NAME.plan`. Refresh with
//! `UPDATE_GOLDEN=1 cargo test -p tessera-plan --test golden`.

use std::path::Path;

use tessera_graph::{MlpConfig, init_weights, mlp};
use tessera_machine::Machine;
use tessera_plan::{LowerOptions, lower_mlp, verify};

fn check(name: &str, text: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.plan"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    assert!(
        text == expected,
        "{} differs from the plan (UPDATE_GOLDEN=1 refreshes it):\n{text}",
        path.display()
    );
}

#[test]
fn tiny_mlp_on_four_tiles() {
    let graph = mlp(&MlpConfig::tiny(2)).unwrap();
    let weights = init_weights(&graph, 1);
    let plan = lower_mlp(
        &Machine::small(),
        &graph,
        &weights,
        &LowerOptions::default(),
    )
    .unwrap();
    assert_eq!(verify(&plan), vec![]);
    check("mlp_tiny_b2_small", &plan.to_string());
}
