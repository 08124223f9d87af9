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
    let (what, needed) = too_large_for_a_tile(&m, precheck(&m, &mlp(&cfg).unwrap()));
    assert!(what.contains("matmul `mlp.fc1`"), "{what}");
    assert!(needed > u64::from(m.sram_bytes()));
}

/// The refusal's subject and bytes needed, checked to be against one tile's SRAM.
fn too_large_for_a_tile(m: &Machine, r: Result<(), PlanError>) -> (String, u64) {
    match r {
        Err(PlanError::TooLarge {
            what,
            needed,
            available,
            scope,
        }) => {
            assert_eq!(scope, "one tile");
            assert_eq!(available, u64::from(m.sram_bytes()));
            (what, needed)
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
}

/// An attention head whose keys and one block of scores cannot share a tile is
/// refused with its figures; one whose keys fit is let through even where the
/// keys, their transpose and the values together would not (the tile never holds
/// all three at once).
#[test]
fn an_attention_head_whose_keys_no_tile_can_hold_is_refused() {
    let m = Machine::c600();
    let layer = |image_size: usize| {
        let cfg = tessera_graph::EncoderLayerConfig {
            image_size,
            ..tessera_graph::EncoderLayerConfig::so400m(1)
        };
        tessera_graph::encoder_layer(&cfg).unwrap()
    };
    // 42 x 42 = 1,764 tokens: keys 1,776 x 80 x 2 bytes and one block of scores.
    precheck(&m, &layer(588)).unwrap();
    // 64 x 64 = 4,096 tokens: 655,360 + 131,072 bytes on one tile.
    let (what, needed) = too_large_for_a_tile(&m, precheck(&m, &layer(896)));
    assert!(what.contains("keys and one 16-query block"), "{what}");
    assert_eq!(needed, 4096 * 80 * 2 + 4096 * 32);
}

/// 27 tiny layers on one tile: their weight store takes 461,376 bytes.
fn tiny_tower_on_one_tile() -> (
    tessera_machine::Machine,
    tessera_graph::Graph,
    tessera_graph::TensorMap,
) {
    let cfg = tessera_graph::EncoderLayerConfig {
        layers: 27,
        ..tessera_graph::EncoderLayerConfig::tiny(1)
    };
    let graph = tessera_graph::encoder_layer(&cfg).unwrap();
    let weights = tessera_graph::init_weights(&graph, 1);
    (
        tessera_machine::Machine::small().with_tiles(1),
        graph,
        weights,
    )
}

/// What lives for the whole program is judged at the fit loop's smallest
/// budgets, not the first: on one tile, the first plan holds more than the
/// tile for the whole program, the plan at the smallest budgets does not.
#[test]
fn whole_program_bytes_are_judged_at_the_smallest_budgets() {
    let (machine, graph, weights) = tiny_tower_on_one_tile();
    let plan = tessera_plan::lower(
        &machine,
        &graph,
        &weights,
        &tessera_plan::LowerOptions::default(),
    )
    .expect("the plan at the smallest budgets fits");
    assert!(plan.layer_loop.is_some());
}

/// A tower whose weights, stored once, exceed a tile's SRAM (here squeezed to
/// 400,000 bytes) is refused after one lowering, with the bytes missing and
/// what takes them.
#[test]
fn resident_bytes_beyond_a_tile_are_refused_with_their_categories() {
    let (machine, graph, weights) = tiny_tower_on_one_tile();
    match tessera_plan::lower(
        &machine,
        &graph,
        &weights,
        &tessera_plan::LowerOptions {
            capacity: Some(400_000),
            ..tessera_plan::LowerOptions::default()
        },
    ) {
        Err(tessera_plan::PlanError::Resident {
            needed,
            available,
            missing,
            categories,
            total_missing,
            tiles,
            live_missing,
            live_tiles,
            floor_missing,
            floor_tiles,
            budgets,
            ..
        }) => {
            assert_eq!(missing, needed - available);
            // The figures above are the plan (of the first and the one at the
            // smallest budgets) that misses less for the whole program; what
            // lives for the whole program is live at every step, so that
            // plan's busiest steps miss at least as much. Both are over.
            let (busiest, over) = if budgets == "smallest" {
                (floor_missing, floor_tiles)
            } else {
                assert_eq!(budgets, "first");
                (live_missing, live_tiles)
            };
            assert!(busiest >= total_missing && over >= tiles);
            assert!(floor_missing > 0 && live_missing > 0);
            assert_eq!(categories[0].0, "weight store");
            assert_eq!(categories.iter().map(|c| c.1).sum::<u64>(), needed);
        }
        other => panic!("expected Resident, got {other:?}"),
    }
}
