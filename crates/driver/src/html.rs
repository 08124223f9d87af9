//! What a run is shown as outside the terminal: the self-contained HTML profile
//! (timeline with the encoder layers, operation table, heat maps, SRAM viewer,
//! faults) and the Chrome trace-event file.

use std::collections::HashMap;

use tessera_compile::Compiled;
use tessera_machine::Machine;
use tessera_profile::html;

use crate::{Attribution, Error, ModelSpec, Run, RunStatus};

/// The Chrome trace-event file of `run` (Perfetto UI, chrome://tracing), its
/// supersteps labelled with the operations `attribution` charged them to, its
/// encoder layers on a track of their own.
pub fn chrome_trace(machine: &Machine, run: &Run, attribution: &Attribution) -> String {
    tessera_profile::chrome_trace(
        &run.report.trace,
        &run.profile,
        &attribution.labels,
        &layer_spans(attribution),
        machine.clock_hz as f64,
    )
}

fn layer_spans(a: &Attribution) -> Vec<tessera_profile::LayerSpan> {
    a.layers
        .iter()
        .map(|l| tessera_profile::LayerSpan {
            layer: l.layer,
            start: l.start,
            end: l.end,
            cycles: l.cycles,
        })
        .collect()
}

/// One tile's placed buffers as the HTML profile draws them: the plan's buffer
/// names without the request's `@bufN` suffix, so that tiles holding the same
/// buffers at the same addresses share one stored layout.
fn tile_layout(l: &tessera_compile::TileLayout) -> html::Layout {
    use html::{Layout, PlacedBuffer};
    let at: HashMap<&str, &tessera_place::Allocation> = l
        .placement
        .allocations
        .iter()
        .map(|a| (a.id.as_str(), a))
        .collect();
    let display = |name: &str| -> String {
        match name.rsplit_once('@') {
            Some((n, id)) if id.starts_with("buf") => n.to_string(),
            _ => name.to_string(),
        }
    };
    let mut buffers = Vec::new();
    let mut steps = 1;
    for r in &l.problem.requests {
        steps = steps.max(r.last + 1);
        let Some(a) = at.get(r.name.as_str()) else {
            continue;
        };
        buffers.push(PlacedBuffer {
            name: display(&r.name),
            category: r
                .category
                .clone()
                .unwrap_or_else(|| r.class.name().to_string()),
            addr: a.offset,
            size: r.size,
            first: r.first,
            last: r.last,
            align: r.align,
            class: r.class.name().to_string(),
            tail: r.tail,
            loaded: r.loaded,
        });
    }
    for q in &l.problem.sequences {
        steps = steps.max(q.last + 1);
        let Some(a) = at.get(q.name.as_str()) else {
            continue;
        };
        for i in 0..q.count {
            buffers.push(PlacedBuffer {
                name: format!("{}[{i}]", display(&q.name)),
                category: q
                    .category
                    .clone()
                    .unwrap_or_else(|| q.class.name().to_string()),
                addr: a.offset + i * a.stride.unwrap_or(q.size),
                size: q.size,
                first: q.first,
                last: q.last,
                align: q.align,
                class: q.class.name().to_string(),
                tail: q.tail,
                loaded: q.loaded,
            });
        }
    }
    Layout {
        steps,
        peak: l.placement.peak,
        buffers,
        reservations: l
            .problem
            .reservations
            .iter()
            .map(|r| (r.name.clone(), r.start, r.end))
            .collect(),
    }
}

/// The HTML profile of `run` (of `compiled`, compiled from `spec` for `machine`)
/// with its operations as `attribution` charged them, its outcome `status`.
/// Needs the placements kept ([`crate::Options::keep_layouts`]) for the SRAM
/// viewer; without them the viewer is empty.
pub fn profile_html(
    machine: &Machine,
    spec: &ModelSpec,
    compiled: &Compiled,
    run: &Run,
    attribution: &Attribution,
    status: RunStatus,
) -> Result<String, Error> {
    let c = compiled;
    let report = &run.report;
    let layouts = c.layouts.as_deref().unwrap_or_default();
    let sram_start = u64::from(machine.sram_start());
    let (layouts_distinct, index) = html::dedup_layouts(
        (0..machine.tiles as usize)
            .map(|t| layouts.get(t).map(tile_layout))
            .collect(),
    );
    let busy = tessera_profile::tile_busy(&report.trace, machine.tiles);
    let tiles = (0..machine.tiles)
        .map(|t| html::TileRow {
            tile: t,
            busy: busy[t as usize],
            peak_bytes: layouts
                .get(t as usize)
                .map(|l| l.placement.peak.saturating_sub(sram_start)),
            layout: index[t as usize],
        })
        .collect();
    let (model, size) = spec.title();
    let (rs, re) = c.report.host.reserved_range;
    let page = html::HtmlReport {
        title: format!(
            "{model} ({size}), batch {}, on {} ({} tiles)",
            spec.batch, machine.name, machine.tiles
        ),
        status: status.as_str().to_string(),
        clock_hz: machine.clock_hz,
        total_cycles: report.cycles,
        init_cycles: run.init_cycles,
        weight_phases: c.report.host.weight_phases,
        run_cycles: run.run_cycles,
        host_cycles: run.host_cycles,
        encoder: attribution.encoder.as_ref().map(|e| html::Interval {
            start: e.start,
            end: e.end,
            cycles: e.cycles,
            flop: e.flop,
            peak_share: e.peak_share,
        }),
        layers: layer_spans(attribution),
        profile: run.profile.clone(),
        phases: tessera_profile::phases(&report.trace),
        labels: attribution.labels.clone(),
        ops: attribution
            .ops
            .iter()
            .map(|o| html::OpRow {
                name: o.name.clone(),
                kind: o.kind.clone(),
                cycles: o.cycles,
                compute: o.compute,
                exchange: o.exchange,
                flop: o.flop,
                peak_share: o.peak_share,
                exchange_bytes: o.exchange_bytes,
                tiles: o.tiles,
                layer: crate::layer_of(&o.name).map(|l| l.0),
            })
            .collect(),
        tiles,
        sram: html::SramMap {
            start: sram_start,
            end: machine
                .regions
                .last()
                .map_or(sram_start, |r| u64::from(r.end)),
            loader_limit: u64::from(machine.loader_limit),
            regions: machine
                .regions
                .iter()
                .map(|r| html::Region {
                    start: u64::from(r.start),
                    end: u64::from(r.end),
                    interleaved: r.interleaved,
                    executable: r.executable,
                    element_bytes: u64::from(r.element_bytes),
                })
                .collect(),
            host_reserved: (re > rs).then_some((u64::from(rs), u64::from(re))),
        },
        layouts: layouts_distinct,
        faults: report.faults.clone(),
    };
    Ok(html::render_html(&page)?)
}
