//! A layer loop's finalists are compiled from plans lowered for their shape;
//! filling in the later layers' weights afterwards gives exactly the package the
//! whole lowering compiles to.

use tessera_compile::{CompileOptions, compile_lowered, complete_layer_weights};
use tessera_graph::{EncoderLayerConfig, encoder_layer, init_weights};
use tessera_machine::Machine;
use tessera_package::write_package;
use tessera_plan::{LowerOptions, WeightDtype, lower_exact, lower_shape};

#[test]
fn completing_a_shape_only_compile_gives_the_whole_lowerings_package() {
    let cfg = EncoderLayerConfig {
        layers: 3,
        ..EncoderLayerConfig::tiny(1)
    };
    let graph = encoder_layer(&cfg).unwrap();
    let weights = init_weights(&graph, 1);
    let machine = Machine::small();
    for dtype in [WeightDtype::F16, WeightDtype::Fp8] {
        let o = LowerOptions {
            weight_dtype: dtype,
            ..LowerOptions::default()
        };
        let opts = CompileOptions {
            lower: o.clone(),
            ..CompileOptions::default()
        };
        let shape = lower_shape(&machine, &graph, &weights, &o).unwrap();
        assert!(shape.layer_weights_pending);
        let mut c = compile_lowered(&machine, &shape, &opts).unwrap();
        let full_plan = lower_exact(&machine, &graph, &weights, &o).unwrap();
        assert!(!full_plan.layer_weights_pending);
        let full = compile_lowered(&machine, &full_plan, &opts).unwrap();
        assert_ne!(
            write_package(&c.package),
            write_package(&full.package),
            "the shape's package holds the first layer's weights for every layer"
        );
        c.layer_weights_pending = Some(o);
        let layers = std::sync::atomic::AtomicU32::new(0);
        let count = || {
            layers.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        };
        complete_layer_weights(&machine, &graph, &weights, &mut c, &count).unwrap();
        // Each later layer's weights made once, whatever the threads.
        assert_eq!(layers.into_inner(), 2);
        assert!(c.layer_weights_pending.is_none());
        assert_eq!(
            write_package(&c.package),
            write_package(&full.package),
            "{dtype:?}"
        );
        assert_eq!(c.fp8_weights, full.fp8_weights);
    }
}
