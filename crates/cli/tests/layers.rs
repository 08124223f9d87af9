//! `tessera run` on a model of several encoder layers: `--json` gives the layer
//! count and each layer's cycles, which add up to the encoder interval's; the
//! text report gives one row per layer and the operation and check tables summed
//! over the layers; a one-layer run keeps the tables of every operation.

mod common;

use common::tessera;

fn run_json(layers: &str) -> serde_json::Value {
    let r = tessera(&[
        "run",
        "--size",
        "tiny",
        "--machine",
        "small",
        "--layers",
        layers,
        "--json",
    ]);
    assert_eq!(r.code, 0, "{}", r.text());
    serde_json::from_str(&r.stdout).expect("json")
}

/// `layers` and `layer_cycles`: one entry per layer, in layer order, adding up
/// to `encoder.cycles`; each layer's cycles fit in its share of the encoder's
/// interval, and the interval runs from the first layer's first operation to
/// the last layer's last.
#[test]
fn json_reports_each_layers_cycles() {
    let v = run_json("3");
    assert_eq!(v["status"], "ok");
    assert_eq!(v["layers"], 3);
    let cycles: Vec<u64> = v["layer_cycles"]
        .as_array()
        .expect("layer_cycles")
        .iter()
        .map(|c| c.as_u64().unwrap())
        .collect();
    assert_eq!(cycles.len(), 3, "{cycles:?}");
    let enc = &v["encoder"];
    let (start, end) = (enc["start"].as_u64().unwrap(), enc["end"].as_u64().unwrap());
    assert_eq!(cycles.iter().sum::<u64>(), enc["cycles"].as_u64().unwrap());
    let span = end - start;
    for c in &cycles {
        // The layers are alike: each takes about a third of the interval.
        assert!(
            span * 9 / 10 < 3 * c && 3 * c < span * 11 / 10,
            "{cycles:?} in {span}"
        );
    }
    // Independently of how the encoder was counted: a layer's cycles are its
    // operations' cycles (compute and exchange) and whole syncs, one after each
    // superstep labelled with one of its operations.
    let supersteps = v["profile"]["supersteps"].as_array().unwrap();
    let sync = supersteps[1]["start"].as_u64().unwrap() - supersteps[0]["end"].as_u64().unwrap();
    assert!(sync > 0);
    for (i, c) in cycles.iter().enumerate() {
        let ops: u64 = v["ops"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| {
                o["name"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("layers.{i}."))
            })
            .map(|o| o["cycles"].as_u64().unwrap())
            .sum();
        assert!(
            ops > 0 && *c > ops,
            "layer {i}: {c} cycles, its operations {ops}"
        );
        assert_eq!(
            (c - ops) % sync,
            0,
            "layer {i}: {c} - {ops} in syncs of {sync}"
        );
        assert!((c - ops) / sync < supersteps.len() as u64, "layer {i}");
    }
    // The interval starts in the superstep of the first layer operation and
    // ends at a superstep's start (the end of a sync).
    let first = v["ops"]
        .as_array()
        .unwrap()
        .iter()
        .position(|o| o["name"].as_str().unwrap().starts_with("layers.0."))
        .unwrap();
    assert!(first > 0, "an operation runs before the layers");
    assert!(
        supersteps
            .iter()
            .any(|s| s["start"].as_u64().unwrap() <= start && start < s["end"].as_u64().unwrap()),
        "{start}"
    );
    assert!(
        supersteps.iter().any(|s| s["start"].as_u64() == Some(end)),
        "{end}"
    );
    // Every field of a one-layer run is still there, with one layer.
    let one = run_json("1");
    assert_eq!(one["layers"], 1);
    assert_eq!(one["layer_cycles"][0], one["encoder"]["cycles"]);
    for (key, _) in one.as_object().unwrap() {
        assert!(v.get(key).is_some(), "`{key}` is missing at 3 layers");
    }
}

/// The operation rows of the text report, name first.
fn op_rows(text: &str) -> Vec<Vec<&str>> {
    text.lines()
        .skip_while(|l| !l.starts_with("operation "))
        .skip(1)
        .take_while(|l| !l.starts_with("superstep "))
        .map(|l| l.split_whitespace().collect())
        .collect()
}

#[test]
fn text_sums_the_operations_over_the_layers() {
    let three = tessera(&[
        "run",
        "--size",
        "tiny",
        "--machine",
        "small",
        "--layers",
        "3",
    ]);
    assert_eq!(three.code, 0, "{}", three.text());
    let layers: Vec<&str> = three
        .stdout
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("layer "))
        .skip(1)
        .take_while(|l| !l.starts_with("operation "))
        .collect();
    assert_eq!(layers.len(), 3, "{}", three.stdout);
    for (i, l) in layers.iter().enumerate() {
        assert!(l.trim_start().starts_with(&format!("{i} ")), "{l}");
        assert!(l.ends_with('%'), "{l}");
    }
    let rows = op_rows(&three.stdout);
    let fc1: Vec<_> = rows
        .iter()
        .filter(|r| r[0].ends_with(".mlp.fc1") && r[0].starts_with("layers."))
        .collect();
    assert_eq!(fc1.len(), 1, "{}", three.stdout);
    assert_eq!(fc1[0][..3], ["layers.*.mlp.fc1", "3", "linear"]);
    assert!(
        !rows.iter().any(|r| r[0].starts_with("layers.1.")),
        "{}",
        three.stdout
    );
    // No table lists an operation or a tensor of one layer.
    assert!(!three.stdout.contains("layers.1."), "{}", three.stdout);
    let gelu = three
        .stdout
        .lines()
        .find(|l| l.contains(" layers.*.mlp.gelu "))
        .expect("the summed check of the MLP's output");
    assert!(gelu.starts_with("layers.*.mlp.fc1 "), "{gelu}");
    assert!(gelu.contains("worst of 3: layer "), "{gelu}");
    // Operations outside the layers keep their own rows, counted once.
    let embed = rows
        .iter()
        .find(|r| r[0] == "embed.patch")
        .expect("embed.patch");
    assert_eq!(embed[1], "1");

    // The summed row is the sum of the layers' rows in --json.
    let v = run_json("3");
    let fc1_cycles: u64 = v["ops"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| {
            let name = o["name"].as_str().unwrap();
            name.starts_with("layers.") && name.ends_with(".mlp.fc1")
        })
        .map(|o| o["cycles"].as_u64().unwrap())
        .sum();
    assert_eq!(fc1[0][4], fc1_cycles.to_string());

    // A mismatch in one layer marks the summed check, from that layer.
    let bad = tessera(&[
        "run",
        "--size",
        "tiny",
        "--machine",
        "small",
        "--layers",
        "3",
        "--perturb",
        "layers.1.mlp.fc1",
    ]);
    assert_eq!(bad.code, 1, "{}", bad.text());
    let gelu = bad
        .stdout
        .lines()
        .find(|l| l.contains(" layers.*.mlp.gelu "))
        .expect("the summed check of the MLP's output");
    assert!(
        gelu.contains("worst of 3: layer 1;") && gelu.ends_with("MISMATCH"),
        "{gelu}"
    );

    // One layer: every operation by its own name, no count, no layer rows.
    let one = tessera(&["run", "--size", "tiny", "--machine", "small"]);
    assert_eq!(one.code, 0, "{}", one.text());
    assert!(!one.stdout.contains("count"), "{}", one.stdout);
    assert!(!one.stdout.contains("layers.*"), "{}", one.stdout);
    let rows = op_rows(&one.stdout);
    assert!(
        rows.iter()
            .any(|r| r[0] == "layers.0.mlp.fc1" && r[1] == "linear")
    );
}
