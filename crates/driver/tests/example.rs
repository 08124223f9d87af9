//! The workspace's example (`examples/tiny_layer.rs`) runs and validates: the
//! library's whole path as a user meets it first.

#[path = "../../../examples/tiny_layer.rs"]
mod tiny_layer;

#[test]
fn the_tiny_layer_example_runs_and_validates() {
    if let Err(e) = tiny_layer::main() {
        panic!("{e}");
    }
}
