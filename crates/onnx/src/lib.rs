pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}
