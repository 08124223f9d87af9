//! Model definitions: names, shapes, configs.

use tessera_graph::{DType, EncoderLayerConfig, GraphError, MlpConfig, OpKind, encoder_layer, mlp};

fn param_table(g: &tessera_graph::Graph) -> Vec<(String, Vec<usize>)> {
    g.param_specs()
        .map(|(n, s, _, _)| (n.to_string(), s.dims().to_vec()))
        .collect()
}

#[test]
fn so400m_mlp_names_and_shapes() {
    let g = mlp(&MlpConfig::so400m(2)).unwrap();
    let expected: Vec<(String, Vec<usize>)> = [
        ("mlp.ln.gamma", vec![1152]),
        ("mlp.ln.beta", vec![1152]),
        ("mlp.fc1.weight", vec![1152, 4304]),
        ("mlp.fc1.bias", vec![4304]),
        ("mlp.fc2.weight", vec![4304, 1152]),
        ("mlp.fc2.bias", vec![1152]),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_string(), s))
    .collect();
    assert_eq!(param_table(&g), expected);
    let x = g.input("x").unwrap();
    let y = g.output("y").unwrap();
    assert_eq!(g.shape(x).dims(), [1458, 1152]);
    assert_eq!(g.shape(y).dims(), [1458, 1152]);
    assert_eq!(g.dtype(y), DType::F16);
    assert_eq!(g.param_count(), 2 * 1152 * 4304 + 4304 + 3 * 1152);
    // The two dense layers are plain 2-D matmuls with bias, as the lowering expects.
    let mms: Vec<_> = g
        .ops()
        .iter()
        .filter_map(|op| match &op.kind {
            OpKind::MatMul {
                a,
                b,
                transpose_b,
                bias,
            } => Some((
                op.name.as_str(),
                g.shape(*a).dims().to_vec(),
                g.shape(*b).dims().to_vec(),
                *transpose_b,
                bias.is_some(),
            )),
            _ => None,
        })
        .collect();
    assert_eq!(
        mms,
        [
            ("mlp.fc1", vec![1458, 1152], vec![1152, 4304], false, true),
            ("mlp.fc2", vec![1458, 4304], vec![4304, 1152], false, true),
        ]
    );
    let dump = g.to_string();
    assert!(
        dump.contains("# mlp.fc1") && dump.contains("output \"y\""),
        "{dump}"
    );
}

#[test]
fn so400m_encoder_shapes() {
    let cfg = EncoderLayerConfig::so400m(2);
    assert_eq!(
        (cfg.tokens(), cfg.patch_dim(), cfg.head_dim()),
        (729, 588, 72)
    );
    let g = encoder_layer(&cfg).unwrap();
    g.validate().unwrap();
    assert_eq!(g.shape(g.input("patches").unwrap()).dims(), [1458, 588]);
    assert!(
        g.output("tokens").is_none(),
        "the tokens go out only on request"
    );
    assert_eq!(g.shape(g.output("pooled").unwrap()).dims(), [2, 1152]);
    let with_tokens = encoder_layer(&EncoderLayerConfig {
        token_output: true,
        ..cfg.clone()
    })
    .unwrap();
    let tokens = with_tokens.output("tokens").unwrap();
    assert_eq!(with_tokens.shape(tokens).dims(), [1458, 1152]);
    let p = |n: &str| g.param(n).map(|t| g.shape(t).dims().to_vec());
    assert_eq!(p("embed.patch.weight"), Some(vec![588, 1152]));
    assert_eq!(p("embed.pos"), Some(vec![729, 1152]));
    assert_eq!(p("layers.0.attn.q.weight"), Some(vec![1152, 1152]));
    assert_eq!(p("layers.0.mlp.fc1.weight"), Some(vec![1152, 4304]));
    assert_eq!(p("post_ln.gamma"), Some(vec![1152]));
    assert_eq!(p("head.probe"), Some(vec![1, 1, 1152]));
    assert_eq!(p("head.attn.out.bias"), Some(vec![1152]));
    assert_eq!(p("head.mlp.fc2.weight"), Some(vec![4304, 1152]));
    // Attention scores per head: [batch, heads, tokens, tokens], and the probe's
    // [batch, heads, 1, tokens].
    let scores: Vec<Vec<usize>> = g
        .ops()
        .iter()
        .filter(|op| matches!(op.kind, OpKind::Softmax { .. }))
        .map(|op| g.shape(op.output).dims().to_vec())
        .collect();
    assert_eq!(scores, [vec![2, 16, 729, 729], vec![2, 16, 1, 729]]);
}

#[test]
fn encoder_layers_and_head_are_configurable() {
    let mut cfg = EncoderLayerConfig::tiny(1);
    cfg.layers = 3;
    cfg.map_head = false;
    let g = encoder_layer(&cfg).unwrap();
    assert!(g.param("layers.2.mlp.fc2.bias").is_some());
    assert!(g.param("head.probe").is_none());
    assert!(g.output("pooled").is_none());
    // Without the head the tokens are the only result, asked for or not.
    assert!(g.output("tokens").is_some());
}

#[test]
fn bad_configs_are_errors() {
    let mut m = MlpConfig::tiny(1);
    m.hidden = 0;
    assert!(matches!(mlp(&m), Err(GraphError::Config(_))));
    let mut e = EncoderLayerConfig::tiny(1);
    e.heads = 5;
    assert!(matches!(encoder_layer(&e), Err(GraphError::Config(_))));
    let mut e = EncoderLayerConfig::tiny(1);
    e.patch = 5;
    assert!(matches!(encoder_layer(&e), Err(GraphError::Config(_))));
    let mut e = EncoderLayerConfig::tiny(1);
    e.eps = -1.0;
    assert!(encoder_layer(&e).is_err());
}

#[test]
fn patchify_orders_rows_columns_channels() {
    // One 4x4 image with 2 channels, value = 100*row + 10*col + channel.
    let (side, ch, patch) = (4, 2, 2);
    let img: Vec<f32> = (0..side)
        .flat_map(|r| {
            (0..side).flat_map(move |c| (0..ch).map(move |k| (100 * r + 10 * c + k) as f32))
        })
        .collect();
    let p = tessera_graph::models::patchify(&img, 1, side, ch, patch).unwrap();
    assert_eq!(p.len(), img.len());
    // Patch 1 is the top-right one: rows 0-1, columns 2-3.
    assert_eq!(
        &p[8..16],
        &[20.0, 21.0, 30.0, 31.0, 120.0, 121.0, 130.0, 131.0]
    );
    assert!(tessera_graph::models::patchify(&img, 1, side, ch, 3).is_none());
    assert!(tessera_graph::models::patchify(&img[1..], 1, side, ch, patch).is_none());
}
