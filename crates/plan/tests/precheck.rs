//! `precheck`: a model that cannot fit is refused from its graph alone, with the
//! bytes needed and available, before any weight is generated.

use tessera_graph::{DType, MlpConfig, mlp};
use tessera_machine::Machine;
use tessera_plan::{PlanError, precheck};

#[test]
fn a_linear_that_no_tile_can_hold_is_refused() {
    let m = Machine::small();
    precheck(&m, &mlp(&MlpConfig::tiny(2)).unwrap()).unwrap();
    // Parameters, inputs and outputs fit the chip's four tiles; fc1's output does
    // not fit one tile's SRAM even in 16 row passes over all four tiles.
    let cfg = MlpConfig {
        batch: 1,
        tokens: 8192,
        width: 32,
        hidden: 8192,
        eps: 1e-6,
        dtype: DType::F16,
    };
    match precheck(&m, &mlp(&cfg).unwrap()) {
        Err(PlanError::TooLarge {
            what,
            needed,
            available,
            scope,
        }) => {
            assert!(what.contains("matmul `mlp.fc1`"), "{what}");
            assert_eq!(scope, "one tile");
            assert_eq!(available, u64::from(m.sram_bytes()));
            assert!(needed > available);
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
}
