//! The compiler's paths through the vision tower, on small layers, through the
//! library: each compiles, runs on the simulator and validates operation by
//! operation; validation catches a 1% error in any kernel kind with a constant,
//! and in one tile's block of one operation's output. The test knobs are
//! options ([`Experimental`]), so these run side by side in one process.

use std::path::{Path, PathBuf};

use tessera_driver::{
    Compiled, Experimental, KernelMutation, LayerDims, Machine, Model, ModelKind, ModelSpec,
    MutableKernel, NoProgress, Options, Run, RunStatus, SimulateOptions, Size, Validation,
};

/// The `small` machine, with `tiles` tiles when given.
fn small(tiles: Option<u32>) -> Machine {
    let m = Machine::load("small").expect("the small preset");
    match tiles {
        Some(t) => m.with_tiles(t),
        None => m,
    }
}

/// Compiles `spec` for `machine` with `opts`, runs it with `sim` and validates it.
fn run(
    spec: &ModelSpec,
    machine: &Machine,
    opts: &Options,
    sim: &SimulateOptions,
) -> (Compiled, Run, Validation) {
    let model = Model::build(spec, machine).expect("model");
    let c = tessera_driver::compile(machine, &model, opts, &NoProgress).expect("compile");
    let r = tessera_driver::simulate(&model, &c, sim, &NoProgress).expect("simulate");
    let v = tessera_driver::validate(&model, &c, &r, &NoProgress).expect("validate");
    (c, r, v)
}

fn one_finalist() -> Options {
    Options {
        finalists: 1,
        ..Options::default()
    }
}

fn tiny_layer() -> ModelSpec {
    ModelSpec::tiny_layer(2)
}

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-driver-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch directory");
    d
}

/// A one-layer config of width 64 and two heads, with `image_size` px images in
/// 14 px patches, written into `dir`. It sends the tokens out too, so that the
/// attention paths these tests pick are checked element by element, not only
/// through the pooled result.
fn small_layer_config(dir: &Path, image_size: u32) -> ModelSpec {
    let c = dir.join(format!("c{image_size}.toml"));
    std::fs::write(
        &c,
        format!(
            "image_size = {image_size}\nchannels = 3\npatch = 14\nwidth = 64\nheads = 2\nmlp_hidden = 128\nlayers = 1\neps = 1e-6\ntoken_output = true\n"
        ),
    )
    .expect("config file");
    ModelSpec {
        kind: ModelKind::Layer {
            dims: LayerDims::File(c),
            tokens: false,
            layers: None,
        },
        batch: 1,
        seed: 1,
    }
}

/// Runs a `small_layer_config` of `image_size` px at `batch` on `tiles` tiles of
/// the small machine (one finalist) with `experimental`; checks that it
/// validates and returns its decisions as text. Seed 2: on this narrow layer the
/// pooled output's error sits at the 4-ulp rule's edge whatever the plan
/// (docs/compile.md, "Tolerance"), and seed 1 crosses it with the AMP's rounding
/// order; these tests are about the plan's decisions, not that edge.
fn small_layer_decisions(
    name: &str,
    image_size: u32,
    batch: usize,
    tiles: u32,
    experimental: Experimental,
) -> String {
    let dir = scratch(name);
    let spec = ModelSpec {
        batch,
        seed: 2,
        ..small_layer_config(&dir, image_size)
    };
    let opts = Options {
        experimental,
        ..one_finalist()
    };
    let (c, _, v) = run(
        &spec,
        &small(Some(tiles)),
        &opts,
        &SimulateOptions::default(),
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(v.status, RunStatus::Ok, "{:?}", v.mismatch);
    c.report.decisions.join("\n")
}

fn mutation(kernel: MutableKernel) -> Experimental {
    Experimental {
        mutate_kernel: Some(KernelMutation {
            kernel,
            factor: 1.01,
        }),
        ..Experimental::default()
    }
}

#[test]
fn a_one_percent_kernel_error_is_a_mismatch() {
    let machine = Machine::load("c600").expect("c600");
    for kernel in MutableKernel::ALL {
        let opts = Options {
            experimental: mutation(kernel),
            ..Options::default()
        };
        let (_, _, v) = run(&tiny_layer(), &machine, &opts, &SimulateOptions::default());
        assert_eq!(v.status, RunStatus::Mismatch, "{kernel}");
    }
    // The mutation belonged to those compiles only.
    let (_, _, v) = run(
        &tiny_layer(),
        &machine,
        &Options::default(),
        &SimulateOptions::default(),
    );
    assert_eq!(v.status, RunStatus::Ok);
}

/// Every operation is checked where it ends, not only the outputs: one tile's
/// block of `fc2`'s output, or of the attention's, scaled by 1.01 after its last
/// step (the perturbation test hook) makes the run a mismatch at that operation
/// and on that tile, the operations before it passing; unperturbed, every
/// operation passes.
#[test]
fn a_one_percent_error_in_one_tiles_block_fails_at_its_operation() {
    let machine = small(None);
    let (c, _, v) = run(
        &tiny_layer(),
        &machine,
        &one_finalist(),
        &SimulateOptions::default(),
    );
    assert_eq!(v.status, RunStatus::Ok);
    assert!(v.mismatch.is_none());
    for (op, check) in c.plan_ops.iter().zip(&v.ops) {
        if op.kind == "output" {
            continue;
        }
        assert_eq!(check.passed, Some(true), "{}", op.name);
        assert!(check.max_abs_error <= check.tolerance, "{}", op.name);
        assert!(check.worst_tile.is_some(), "{}", op.name);
    }
    // A tensor that never exists on the tiles is named, with the reason.
    let fc1 = c
        .plan_ops
        .iter()
        .position(|o| o.name == "layers.0.mlp.fc1")
        .expect("fc1");
    let pre_gelu = &v.ops[fc1].tensors[0];
    assert_eq!(pre_gelu.tensor, "layers.0.mlp.fc1");
    assert!(pre_gelu.max_abs_error.is_none());
    assert!(
        pre_gelu
            .note
            .as_deref()
            .is_some_and(|n| n.contains("never stored")),
        "{pre_gelu:?}"
    );
    for target in ["layers.0.mlp.fc2", "layers.0.attn.matmul"] {
        let sim = SimulateOptions {
            perturb: Some(target.to_string()),
            ..SimulateOptions::default()
        };
        let (c, r, v) = run(&tiny_layer(), &machine, &one_finalist(), &sim);
        assert_eq!(v.status, RunStatus::Mismatch, "{target}");
        let m = v.mismatch.as_ref().expect("a mismatch");
        assert_eq!(m.op, target);
        let perturbed = r.perturbed().expect("perturbed");
        assert_eq!(m.worst_tile, Some(perturbed.tile));
        assert!(m.max_abs_error > m.tolerance);
        let at = c
            .plan_ops
            .iter()
            .position(|o| o.name == target)
            .expect("the target");
        for check in &v.ops[..at] {
            assert_ne!(check.passed, Some(false), "{check:?}");
        }
        assert_eq!(v.ops[at].passed, Some(false));
        // The operations after it are held to what they were fed, so the error
        // they inherit does not fail them; it is reported beside.
        for check in &v.ops[at + 1..] {
            assert_ne!(check.passed, Some(false), "{check:?}");
        }
        let inherited = v.ops[at + 1..]
            .iter()
            .flat_map(|o| &o.tensors)
            .filter_map(|t| Some((t.max_abs_error_inherited?, t.max_abs_error?)))
            .any(|(inherited, own)| inherited > own);
        assert!(
            inherited,
            "{target}: nothing downstream inherited the error"
        );
    }
}

/// The pooling head's single query, its projections not absorbed (test hook), with
/// its keys cut over the tiles of each (image, head) pair, one and two key blocks
/// per tile, a last run of one real key: it validates, and a 1% error in the
/// shifted exponentials' scale is a mismatch.
#[test]
fn a_single_query_cut_over_tiles_validates() {
    let dir = scratch("single-query");
    // 98 px in 14 px patches: 49 tokens, four key blocks, the last with one real key.
    let spec = ModelSpec {
        batch: 2,
        ..small_layer_config(&dir, 98)
    };
    let unabsorbed = Experimental {
        unabsorbed: true,
        ..Experimental::default()
    };
    for (tiles, cut) in [
        (12, "cut over 2 tiles each of 2 key blocks"),
        (16, "cut over 4 tiles each of 1 key block;"),
    ] {
        let opts = Options {
            experimental: unabsorbed.clone(),
            ..Options::default()
        };
        let (c, _, v) = run(
            &spec,
            &small(Some(tiles)),
            &opts,
            &SimulateOptions::default(),
        );
        assert_eq!(v.status, RunStatus::Ok);
        let decisions = c.report.decisions.join("\n");
        assert!(decisions.contains(cut), "{decisions}");
    }
    let opts = Options {
        experimental: Experimental {
            unabsorbed: true,
            ..mutation(MutableKernel::Softmax)
        },
        ..Options::default()
    };
    let (_, _, v) = run(&spec, &small(Some(16)), &opts, &SimulateOptions::default());
    assert_eq!(v.status, RunStatus::Mismatch);
    let _ = std::fs::remove_dir_all(&dir);
}

/// 81 tokens on two tiles a head: 41 query rows a tile. The transposed attention
/// pads them to 48 (three query blocks, the last zeroed in part); with the row
/// path forced, 41 rows are more than the softmax on the AMP's block layout takes
/// (32), so the attention converts the scores to row-major and back around a
/// row-major softmax. Both validate, with the softmax scale folded into the
/// query projection.
#[test]
fn attention_with_41_query_rows_a_tile_validates_on_both_paths() {
    for (row_attention, transposed) in [(false, true), (true, false)] {
        let x = Experimental {
            row_attention,
            ..Experimental::default()
        };
        let decisions = small_layer_decisions("rows41", 126, 1, 4, x);
        assert!(decisions.contains("with 41 query rows"), "{decisions}");
        assert!(
            decisions.contains("folded into the query projection"),
            "{decisions}"
        );
        assert_eq!(
            decisions.contains("scores transposed"),
            transposed,
            "{decisions}"
        );
    }
}

/// 81 tokens, one image of two heads on ten tiles: five tiles a head would share a
/// bus pair with the other head, so each head takes four, its keys cut in two runs
/// of two tiles (three query blocks each), the maxima exchanged and the second
/// run's products merged on the first's tiles. The tokens validate element by
/// element, as they do with whole keys on five tiles a head (the test hook).
#[test]
fn attention_with_its_keys_cut_in_two_runs_validates() {
    for (whole_keys, cut) in [(false, true), (true, false)] {
        let x = Experimental {
            whole_keys,
            ..Experimental::default()
        };
        let decisions = small_layer_decisions("keycut", 126, 1, 10, x);
        assert_eq!(
            decisions.contains("keys cut in two runs, 2 tiles with 3 query blocks over keys 0..48, 2 tiles with 3 over keys 48..81"),
            cut,
            "{decisions}"
        );
        assert_eq!(decisions.contains("scores transposed"), !cut, "{decisions}");
    }
}

/// 81 tokens, one image of two heads on eight tiles: four tiles a head, whole bus
/// pairs. Cut for memory (what the fit loop does when budgets alone leave the
/// attention over the limit), each half of a head holds its run's keys and
/// values; cut by default too, since a tile's two query blocks (21 rows) against
/// six key blocks are more block products than three against three; whole keys
/// where asked. Every way, the tokens validate.
#[test]
fn attention_with_its_keys_cut_for_memory_validates() {
    for (cut_all_keys, whole_keys, why) in [
        (
            true,
            false,
            Some("for memory: half a head's keys and values a tile"),
        ),
        (
            false,
            false,
            Some(
                "fewer block products a tile: 3 by 3 query and key blocks, against 2 by 6 with whole keys",
            ),
        ),
        (false, true, None),
    ] {
        let x = Experimental {
            cut_all_keys,
            whole_keys,
            ..Experimental::default()
        };
        let decisions = small_layer_decisions("keycut-memory", 126, 1, 8, x);
        if let Some(why) = why {
            assert!(
                decisions.contains(&format!("({why}): keys cut in two runs")),
                "{decisions}"
            );
        }
        assert_eq!(
            decisions.contains("scores transposed"),
            why.is_none(),
            "{decisions}"
        );
    }
}

/// Nine tokens: fewer keys than the column softmax's six workers need (two rows
/// each), so the attention takes the row path by itself, and validates.
#[test]
fn attention_with_fewer_than_12_keys_takes_the_row_path() {
    let decisions = small_layer_decisions("keys9", 42, 2, 4, Experimental::default());
    assert!(decisions.contains("keys 9 padded to 16"), "{decisions}");
    assert!(!decisions.contains("scores transposed"), "{decisions}");
}

/// The pooling head's attention has a constant query, so its projections are
/// absorbed: with 81 tokens (six token blocks, the last of one row) and with 9 (one
/// block, paired with zeros in the sums), on four tiles (several runs a tile), and
/// lowered as it stands with the test hook; all validate.
#[test]
fn pooling_head_validates_absorbed_and_not() {
    for (name, image_size) in [("head81", 126), ("head9", 42)] {
        for unabsorbed in [false, true] {
            let x = Experimental {
                unabsorbed,
                ..Experimental::default()
            };
            let decisions = small_layer_decisions(name, image_size, 2, 4, x);
            assert_eq!(
                decisions.contains("projections absorbed"),
                !unabsorbed,
                "{decisions}"
            );
        }
    }
}

/// Squeezed just below what the rules' defaults (rank 1) need on their worst
/// tile, and at what a lower-ranked finalist needs: rank 1 reports the difference
/// as missing bytes, the lower-ranked finalist that keeps fewer bytes per tile is
/// selected, and it runs and validates. Every infeasible finalist reports its
/// failing tiles and missing bytes. (The capacity comes from an unsqueezed
/// compile, so the test follows the plans as the cost model changes. The tiny MLP
/// block on 8 tiles: its finalists differ in bytes (on 16, since the row pieces
/// of the reductions, they all peak at the same bytes); the tiny layer's, with
/// the pooling head absorbed, all peak on the same tile and bytes.)
#[test]
fn a_squeezed_compile_selects_a_lower_ranked_finalist_that_runs() {
    let spec = ModelSpec {
        kind: ModelKind::Mlp(Size::Tiny),
        batch: 2,
        seed: 1,
    };
    let machine = small(Some(8));
    // `simulate` builds every finalist (to simulate them all), for their peaks.
    let finalists = |capacity: u64, simulate: usize| {
        let opts = Options {
            finalists: 6,
            simulate_finalists: simulate,
            capacity: Some(capacity),
            ..Options::default()
        };
        let (c, _, v) = run(&spec, &machine, &opts, &SimulateOptions::default());
        assert_eq!(v.status, RunStatus::Ok);
        c.report
    };
    let roomy = finalists(262_144, 6);
    let peaks: Vec<u64> = roomy
        .finalists
        .iter()
        .map(|f| f.peak_bytes.expect("every finalist fits"))
        .collect();
    let capacity = peaks
        .iter()
        .copied()
        .filter(|&p| p < peaks[0])
        .max()
        .expect("a finalist that needs fewer bytes than rank 1");
    let r = finalists(capacity, 0);
    let f = &r.finalists;
    assert_eq!(f.len(), 6);
    if f[0].built {
        assert!(!f[0].feasible, "{:?}", f[0]);
        assert_eq!(f[0].missing_bytes, Some(peaks[0] - capacity), "{:?}", f[0]);
    }
    for x in f.iter().filter(|x| x.built && !x.feasible) {
        assert!(x.failing_tiles > 0, "{x:?}");
        assert!(x.missing_bytes.is_some_and(|b| b > 0), "{x:?}");
    }
    let selected = r.selected.expect("selected");
    assert!(selected > 1, "selected rank {selected}");
    let best = f
        .iter()
        .filter(|x| x.feasible)
        .min_by_key(|x| (x.estimated_cycles, x.rank))
        .expect("a feasible finalist");
    assert_eq!(best.rank, selected);
    // Built best estimate first until one placed: every finalist estimated
    // below the selected one was built and refused; every one left unbuilt is
    // estimated above it.
    let key = |x: &tessera_driver::FinalistReport| (x.estimated_cycles, x.rank);
    for x in f {
        if key(x) < key(best) {
            assert!(x.built && !x.feasible, "{x:?}");
        }
        if !x.built {
            assert!(key(x) > key(best), "{x:?}");
        }
    }
}

/// What a simulation tells its progress about the layers.
#[derive(Default)]
struct Layers(std::sync::Mutex<Vec<(Option<u32>, u32)>>);

impl tessera_driver::Progress for Layers {
    fn layer(&self, layer: Option<u32>, layers: u32) {
        self.0.lock().unwrap().push((layer, layers));
    }
}

/// The progress of a three-layer run names the layers as they come, the layer
/// predicted for each superstep being the one the attribution charges it to;
/// the layers' cycles add up to the encoder interval's.
#[test]
fn a_simulation_reports_its_layers_as_the_attribution_charges_them() {
    let spec = ModelSpec {
        kind: ModelKind::Layer {
            dims: LayerDims::Preset(Size::Tiny),
            tokens: false,
            layers: Some(3),
        },
        batch: 1,
        seed: 1,
    };
    let machine = small(None);
    let model = Model::build(&spec, &machine).expect("model");
    let c =
        tessera_driver::compile(&machine, &model, &one_finalist(), &NoProgress).expect("compile");
    let seen = Layers::default();
    let sim = SimulateOptions {
        probes: false,
        perturb: None,
    };
    let r = tessera_driver::simulate(&model, &c, &sim, &seen).expect("simulate");
    let at = tessera_driver::attribute(&machine, &model.graph, &c, &r);
    assert_eq!(
        *seen.0.lock().unwrap(),
        [
            (None, 3),
            (Some(0), 3),
            (Some(1), 3),
            (Some(2), 3),
            (None, 3)
        ]
    );
    let predicted = tessera_driver::superstep_layers(&c);
    assert_eq!(predicted.len(), r.profile.supersteps.len());
    for (k, label) in at.labels.iter().enumerate() {
        let charged = label
            .as_deref()
            .and_then(tessera_driver::layer_of)
            .map(|l| l.0);
        assert_eq!(predicted[k], charged, "superstep {k} ({label:?})");
    }
    let layers: Vec<u32> = at.layers.iter().map(|l| l.layer).collect();
    assert_eq!(layers, [0, 1, 2]);
    let encoder = at.encoder.expect("an encoder interval");
    assert_eq!(
        at.layers.iter().map(|l| l.cycles).sum::<u64>(),
        encoder.cycles
    );
    // In order, apart, and inside the encoder's interval.
    for w in at.layers.windows(2) {
        assert!(w[0].end <= w[1].start, "{w:?}");
    }
    assert_eq!(encoder.start, at.layers[0].start);
    assert_eq!(encoder.end, at.layers[2].end);
    for l in &at.layers {
        assert!(l.cycles <= l.end - l.start, "{l:?}");
    }
}
