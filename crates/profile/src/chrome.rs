//! The run as a Chrome trace-event file (JSON object format), which Perfetto UI and
//! chrome://tracing open. Chip tracks: supersteps, the operation each superstep is
//! charged to, the encoder layers (one slice per layer, so that a many-layer run
//! can be navigated layer by layer), and the exchange and host phases. Tile tracks: the kernels a tile ran,
//! one track per worker (and one for `runall` kernels, which take every worker), so
//! that slices on a track never overlap. Above [`TILE_TRACKS`] tiles, the first tile
//! of each equal group stands for the group, which keeps a whole-chip run small
//! enough to open. Times are microseconds at the machine's clock.

use std::collections::HashMap;

use serde_json::{Value, json};
use tessera_sim::{TraceEvent, TraceKind};

use crate::{LayerSpan, Profile};

/// Tiles drawn at most; more are represented one per group.
pub const TILE_TRACKS: u32 = 64;

const CHIP: u32 = 0;
const TILES: u32 = 1;

/// `labels[i]`: the operation superstep `i` is charged to, if any; `layers`: the
/// encoder layers, drawn on a track of their own.
pub fn chrome_trace(
    trace: &[TraceEvent],
    p: &Profile,
    labels: &[Option<String>],
    layers: &[LayerSpan],
    clock_hz: f64,
) -> String {
    let us = |cycle: u64| (cycle as f64 / clock_hz * 1e6 * 1e4).round() / 1e4;
    let mut ev: Vec<Value> = Vec::new();
    let name_process = |ev: &mut Vec<Value>, pid: u32, name: &str| {
        ev.push(
            json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0,
            "args": {"name": name}}),
        );
    };
    let name_thread = |ev: &mut Vec<Value>, pid: u32, tid: u32, name: &str| {
        ev.push(
            json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0,
            "args": {"name": name}}),
        );
    };
    name_process(&mut ev, CHIP, "chip");
    name_thread(&mut ev, CHIP, 0, "supersteps");
    name_thread(&mut ev, CHIP, 1, "operations");
    name_thread(&mut ev, CHIP, 2, "exchange and host phases");
    if !layers.is_empty() {
        name_thread(&mut ev, CHIP, 3, "layers");
    }
    let slice =
        |ev: &mut Vec<Value>, pid: u32, tid: u32, name: &str, start: u64, end: u64, args: Value| {
            ev.push(
                json!({"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": us(start),
            "dur": us(end) - us(start), "args": args}),
            );
        };
    for s in &p.supersteps {
        slice(
            &mut ev,
            CHIP,
            0,
            &format!("superstep {}", s.index),
            s.start,
            s.end,
            json!({"compute": s.compute, "exchange": s.exchange, "host": s.host}),
        );
    }
    // Consecutive supersteps charged to one operation make one slice.
    let mut run: Option<(&str, u64, u64)> = None;
    for (s, label) in p.supersteps.iter().zip(labels) {
        match (run, label.as_deref()) {
            (Some((n, a, _)), Some(l)) if n == l => run = Some((n, a, s.end)),
            (prev, l) => {
                if let Some((n, a, b)) = prev {
                    slice(&mut ev, CHIP, 1, n, a, b, json!({}));
                }
                run = l.map(|l| (l, s.start, s.end));
            }
        }
    }
    if let Some((n, a, b)) = run {
        slice(&mut ev, CHIP, 1, n, a, b, json!({}));
    }
    for l in layers.iter().filter(|l| l.end > l.start) {
        slice(
            &mut ev,
            CHIP,
            3,
            &format!("layer {}", l.layer),
            l.start,
            l.end,
            json!({"cycles": l.cycles}),
        );
    }

    let tiles = trace
        .iter()
        .filter_map(|e| e.tile)
        .max()
        .map_or(0, |t| t + 1);
    let group = tiles.div_ceil(TILE_TRACKS).max(1);
    name_process(&mut ev, TILES, "tiles");
    let mut open: HashMap<(u32, u32), (u64, std::sync::Arc<str>)> = HashMap::new();
    let mut phase: Option<u64> = None;
    let mut named = std::collections::BTreeSet::new();
    for e in trace {
        let Some(tile) = e.tile else {
            match &e.kind {
                TraceKind::ExchangeStart { .. } | TraceKind::HostTransferStart { .. } => {
                    phase = Some(e.cycle);
                }
                TraceKind::ExchangeEnd { id } => {
                    if let Some(a) = phase.take() {
                        slice(
                            &mut ev,
                            CHIP,
                            2,
                            &format!("exchange {id}"),
                            a,
                            e.cycle,
                            json!({}),
                        );
                    }
                }
                TraceKind::HostTransferEnd { bytes } => {
                    if let Some(a) = phase.take() {
                        slice(
                            &mut ev,
                            CHIP,
                            2,
                            "host transfer",
                            a,
                            e.cycle,
                            json!({"bytes": bytes}),
                        );
                    }
                }
                _ => {}
            }
            continue;
        };
        if tile % group != 0 {
            continue;
        }
        let (symbol, workers, start) = match &e.kind {
            TraceKind::KernelStart { symbol, workers } => (symbol, *workers, true),
            TraceKind::KernelEnd { symbol, workers } => (symbol, *workers, false),
            _ => continue,
        };
        // One track per worker; `runall` kernels on a track of their own.
        let lane = if workers.count_ones() == 1 {
            workers.trailing_zeros()
        } else {
            6
        };
        let tid = tile * 8 + lane;
        if named.insert(tid) {
            let who = if lane == 6 {
                "all workers".to_string()
            } else {
                format!("worker {lane}")
            };
            let tiles_of = if group > 1 {
                format!(" (tiles {}..{})", tile, (tile + group).min(tiles) - 1)
            } else {
                String::new()
            };
            name_thread(
                &mut ev,
                TILES,
                tid,
                &format!("tile {tile}{tiles_of}: {who}"),
            );
        }
        if start {
            open.insert((tile, lane), (e.cycle, symbol.clone()));
        } else if let Some((a, s)) = open.remove(&(tile, lane)) {
            slice(&mut ev, TILES, tid, &s, a, e.cycle, json!({}));
        }
    }
    json!({
        "traceEvents": ev,
        "displayTimeUnit": "ns",
        "otherData": {"clock_hz": clock_hz, "tiles": tiles, "tiles_per_track": group},
    })
    .to_string()
}

/// Checks the trace-event format a viewer relies on: every event has `ph`, `ts`,
/// `pid` and `tid`; complete events (`X`) a non-negative `dur`; and on each track,
/// slices nest (none starts inside another and ends after it). Returns the first
/// problem found.
pub fn check_trace(json: &str) -> Result<usize, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let events = v["traceEvents"].as_array().ok_or("no traceEvents array")?;
    let mut tracks: HashMap<(u64, u64), Vec<(f64, f64)>> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        for key in ["ph", "ts", "pid", "tid"] {
            if e.get(key).is_none() {
                return Err(format!("event {i} has no `{key}`: {e}"));
            }
        }
        if e["ph"] == "X" {
            let dur = e["dur"].as_f64().ok_or(format!("event {i} has no `dur`"))?;
            if dur < 0.0 {
                return Err(format!("event {i} has a negative duration"));
            }
            let ts = e["ts"]
                .as_f64()
                .ok_or(format!("event {i}: `ts` is not a number"))?;
            let key = (
                e["pid"].as_u64().unwrap_or(0),
                e["tid"].as_u64().unwrap_or(0),
            );
            tracks.entry(key).or_default().push((ts, ts + dur));
        }
    }
    const EPS: f64 = 1e-3;
    for (key, mut slices) in tracks {
        slices.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut stack: Vec<f64> = Vec::new();
        for (a, b) in slices {
            while stack.last().is_some_and(|&end| end <= a + EPS) {
                stack.pop();
            }
            if let Some(&end) = stack.last()
                && b > end + EPS
            {
                return Err(format!(
                    "track {key:?}: a slice at {a} ends at {b}, after its parent's end {end}"
                ));
            }
            stack.push(b);
        }
    }
    Ok(events.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(cycle: u64, tile: Option<u32>, kind: TraceKind) -> TraceEvent {
        TraceEvent {
            cycle,
            tile,
            context: None,
            kind,
        }
    }

    fn kernel(cycle: u64, tile: u32, workers: u8, start: bool) -> TraceEvent {
        let symbol = format!("k{workers}");
        ev(
            cycle,
            Some(tile),
            if start {
                TraceKind::KernelStart {
                    symbol: symbol.into(),
                    workers,
                }
            } else {
                TraceKind::KernelEnd {
                    symbol: symbol.into(),
                    workers,
                }
            },
        )
    }

    #[test]
    fn a_run_becomes_nested_slices_on_named_tracks() {
        let trace = vec![
            ev(0, None, TraceKind::SuperstepStart { index: 0 }),
            // Two single-worker kernels overlap on tile 0: separate tracks.
            kernel(10, 0, 0b1, true),
            kernel(12, 0, 0b10, true),
            kernel(50, 0, 0b1, false),
            kernel(60, 0, 0b10, false),
            kernel(70, 1, 0b11_1111, true),
            kernel(90, 1, 0b11_1111, false),
            ev(100, None, TraceKind::SuperstepEnd { index: 0 }),
            ev(190, None, TraceKind::SuperstepStart { index: 1 }),
            ev(190, None, TraceKind::ExchangeStart { id: 0 }),
            ev(250, None, TraceKind::ExchangeEnd { id: 0 }),
            ev(400, None, TraceKind::SuperstepEnd { index: 1 }),
        ];
        let p = crate::profile(&trace);
        let labels = vec![Some("a".to_string()), Some("a".to_string())];
        let layers = [LayerSpan {
            layer: 0,
            start: 190,
            end: 400,
            cycles: 210,
        }];
        let json = chrome_trace(&trace, &p, &labels, &layers, 1.0e6);
        let n = check_trace(&json).unwrap();
        let v: Value = serde_json::from_str(&json).unwrap();
        let slices: Vec<&Value> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .collect();
        // 2 supersteps, 1 merged operation, 1 layer, 1 exchange, 3 kernels.
        assert_eq!(slices.len(), 8, "{json}");
        assert!(n > slices.len());
        let op: Vec<_> = slices
            .iter()
            .filter(|e| e["tid"] == 1 && e["pid"] == 0)
            .collect();
        assert_eq!(
            (op.len(), op[0]["ts"].as_f64(), op[0]["dur"].as_f64()),
            (1, Some(0.0), Some(400.0))
        );
        assert!(json.contains("tile 1: all workers"));
        let layer: Vec<_> = slices.iter().filter(|e| e["tid"] == 3).collect();
        assert_eq!(
            (
                layer.len(),
                layer[0]["name"].as_str(),
                layer[0]["ts"].as_f64()
            ),
            (1, Some("layer 0"), Some(190.0))
        );
        assert!(json.contains(r#""name":"layers""#));
    }

    #[test]
    fn the_checker_refuses_what_a_viewer_would_misdraw() {
        let partial = r#"{"traceEvents":[
            {"ph":"X","name":"a","pid":1,"tid":1,"ts":0,"dur":10},
            {"ph":"X","name":"b","pid":1,"tid":1,"ts":5,"dur":10}]}"#;
        assert!(
            check_trace(partial)
                .unwrap_err()
                .contains("after its parent")
        );
        let nested = partial.replace(r#""ts":5,"dur":10"#, r#""ts":5,"dur":5"#);
        assert_eq!(check_trace(&nested), Ok(2));
        let no_tid = r#"{"traceEvents":[{"ph":"X","name":"a","pid":1,"ts":0,"dur":1}]}"#;
        assert!(check_trace(no_tid).unwrap_err().contains("`tid`"));
        let no_dur = r#"{"traceEvents":[{"ph":"X","name":"a","pid":1,"tid":1,"ts":0}]}"#;
        assert!(check_trace(no_dur).unwrap_err().contains("`dur`"));
    }
}
