//! The run as one self-contained HTML page (`tessera run --profile FILE.html`): a
//! timeline of supersteps, phases, operations and encoder layers with the
//! cropped span and the encoder interval marked, one collapsible group per layer
//! (collapsed when there are many, drawn when first opened), a sortable per-operation table, per-tile heat maps of
//! busy cycles and SRAM high-water marks, an SRAM viewer for any tile, and the
//! faults of a faulted run.
//!
//! The page must open offline and from a mail attachment, so nothing is fetched:
//! CSS and a small vanilla script are inline and the data is one JSON blob in a
//! `<script type="application/json">`. This module only formats what it is given
//! (the CLI fills [`HtmlReport`] from the compile and the simulator), and the same
//! report always gives the same bytes.

use std::collections::HashMap;
use std::fmt::Write;

use serde::Serialize;
use tessera_sim::Fault;

use crate::{LayerSpan, Phase, Profile};

/// Everything the page shows.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HtmlReport {
    /// What ran, e.g. `mlp, batch 4, on c600`.
    pub title: String,
    /// `ok`, `fault` or `mismatch`.
    pub status: String,
    pub clock_hz: u64,
    /// The simulator's cycle count of the whole run.
    pub total_cycles: u64,
    /// End of the last host phase streaming the weights (0 without weights).
    pub init_cycles: u64,
    /// Host phases that stream the weights, once, before the inference.
    pub weight_phases: usize,
    /// The cropped span: `total_cycles - init_cycles`.
    pub run_cycles: u64,
    /// Host transfers inside the cropped span (inputs and outputs).
    pub host_cycles: u64,
    pub encoder: Option<Interval>,
    /// The encoder layers, in layer order (empty for a model without them).
    pub layers: Vec<LayerSpan>,
    pub profile: Profile,
    pub phases: Vec<Phase>,
    /// `labels[i]`: the operation superstep `i` is charged to.
    pub labels: Vec<Option<String>>,
    pub ops: Vec<OpRow>,
    /// Every tile of the machine, in tile order.
    pub tiles: Vec<TileRow>,
    pub sram: SramMap,
    /// Distinct tile layouts; tiles refer to them by index. Embedded packed
    /// (`Embedded::packed`), not by name.
    #[serde(skip)]
    pub layouts: Vec<Layout>,
    pub faults: Vec<Fault>,
}

/// An interval of the run, with the cycles charged to it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Interval {
    pub start: u64,
    pub end: u64,
    pub cycles: u64,
    pub flop: u64,
    pub peak_share: f64,
}

/// One lowered operation, as `tessera run --json` reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OpRow {
    pub name: String,
    pub kind: String,
    pub cycles: u64,
    pub compute: u64,
    pub exchange: u64,
    pub flop: u64,
    pub peak_share: f64,
    pub exchange_bytes: u64,
    pub tiles: u32,
    /// The encoder layer it belongs to, if any.
    pub layer: Option<u32>,
}

/// One tile's figures.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TileRow {
    pub tile: u32,
    /// Cycles during which at least one worker ran a kernel.
    pub busy: u64,
    /// Highest placed end address minus the SRAM start; `None` for a tile the plan
    /// does not use.
    pub peak_bytes: Option<u64>,
    /// Index into [`HtmlReport::layouts`].
    pub layout: Option<u32>,
}

/// The SRAM map of the machine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SramMap {
    pub start: u64,
    pub end: u64,
    pub loader_limit: u64,
    pub regions: Vec<Region>,
    /// The host-descriptor range reserved on every tile, if any.
    pub host_reserved: Option<(u64, u64)>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Region {
    pub start: u64,
    pub end: u64,
    pub interleaved: bool,
    pub executable: bool,
    pub element_bytes: u64,
}

/// One tile's placed buffers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Layout {
    /// Steps of the plan (lifetimes are within `0..steps`).
    pub steps: u64,
    pub peak: u64,
    pub buffers: Vec<PlacedBuffer>,
    /// Fixed ranges reserved at every step: (name, start, end).
    pub reservations: Vec<(String, u64, u64)>,
}

/// A buffer at its address, with the requirements it was placed under.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize)]
pub struct PlacedBuffer {
    pub name: String,
    pub category: String,
    pub addr: u64,
    pub size: u64,
    /// Inclusive step lifetime.
    pub first: u64,
    pub last: u64,
    pub align: u64,
    pub class: String,
    pub tail: u64,
    pub loaded: bool,
}

/// Stores each distinct layout once: returns the distinct layouts, in order of
/// first use, and each tile's index into them.
pub fn dedup_layouts(per_tile: Vec<Option<Layout>>) -> (Vec<Layout>, Vec<Option<u32>>) {
    let mut seen: HashMap<Layout, u32> = HashMap::new();
    let mut distinct = Vec::new();
    let index = per_tile
        .into_iter()
        .map(|l| {
            l.map(|l| {
                *seen.entry(l).or_insert_with_key(|l| {
                    distinct.push(l.clone());
                    (distinct.len() - 1) as u32
                })
            })
        })
        .collect();
    (distinct, index)
}

/// Section ids the page always has, in order.
pub const SECTIONS: &[&str] = &["summary", "timeline", "ops", "tiles", "sram", "faults"];

/// The embedded form: layouts as arrays over tables, which keeps a whole-chip
/// page a fraction of the size of named fields. A many-layer model's tiles hold
/// thousands of buffers each, mostly the same ones as other tiles' at the same
/// addresses, so each distinct buffer is stored once and a layout lists them.
#[derive(Serialize)]
struct Embedded<'a> {
    #[serde(flatten)]
    report: &'a HtmlReport,
    /// (operation, start, end): consecutive supersteps of one operation merged.
    op_spans: Vec<(&'a str, u64, u64)>,
    strings: Vec<&'a str>,
    /// Distinct contracts: [category, size, align, class, tail, loaded], strings
    /// as indices into `strings`.
    kinds: Vec<[u64; 6]>,
    /// Distinct placed buffers, five numbers each, one after the other: name
    /// (into `strings`), kind (into `kinds`), address, first step, last step
    /// minus first.
    buffers: Vec<u64>,
    /// Per layout: [steps, peak, buffers, reservations]; the buffers as indices
    /// into `buffers`, each written as its difference from the one before (they
    /// mostly follow each other); reservations as (name, start, end).
    packed: Vec<PackedLayout>,
}

/// (steps, peak, buffer index differences, reservations as (name, start, end)).
type PackedLayout = (u64, u64, Vec<i64>, Vec<(u64, u64, u64)>);

/// Interns strings, contracts and buffers into [`Embedded`]'s tables.
#[derive(Default)]
struct Tables<'a> {
    strings: Vec<&'a str>,
    string_ids: HashMap<&'a str, u64>,
    kinds: Vec<[u64; 6]>,
    kind_ids: HashMap<[u64; 6], u64>,
    buffers: Vec<u64>,
    buffer_ids: HashMap<[u64; 5], u64>,
}

impl<'a> Tables<'a> {
    fn string(&mut self, s: &'a str) -> u64 {
        *self.string_ids.entry(s).or_insert_with(|| {
            self.strings.push(s);
            (self.strings.len() - 1) as u64
        })
    }

    fn buffer(&mut self, b: &'a PlacedBuffer) -> u64 {
        let kind = [
            self.string(&b.category),
            b.size,
            b.align,
            self.string(&b.class),
            b.tail,
            u64::from(b.loaded),
        ];
        let next = self.kinds.len() as u64;
        let kind = *self.kind_ids.entry(kind).or_insert_with(|| {
            self.kinds.push(kind);
            next
        });
        let row = [
            self.string(&b.name),
            kind,
            b.addr,
            b.first,
            b.last.saturating_sub(b.first),
        ];
        let next = (self.buffers.len() / 5) as u64;
        *self.buffer_ids.entry(row).or_insert_with(|| {
            self.buffers.extend(row);
            next
        })
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum HtmlError {
    #[error("serialising the report data: {0}")]
    Json(#[from] serde_json::Error),
}

/// The page for `r`.
pub fn render_html(r: &HtmlReport) -> Result<String, HtmlError> {
    let mut op_spans: Vec<(&str, u64, u64)> = Vec::new();
    for (s, label) in r.profile.supersteps.iter().zip(&r.labels) {
        let Some(l) = label.as_deref() else { continue };
        match op_spans.last_mut() {
            Some(last) if last.0 == l && last.2 <= s.start => last.2 = s.end,
            _ => op_spans.push((l, s.start, s.end)),
        }
    }
    let mut t = Tables::default();
    let mut packed = Vec::with_capacity(r.layouts.len());
    for l in &r.layouts {
        let mut prev = 0i64;
        let bufs = l
            .buffers
            .iter()
            .map(|b| {
                let id = t.buffer(b) as i64;
                let d = id - prev;
                prev = id;
                d
            })
            .collect();
        let res = l
            .reservations
            .iter()
            .map(|(n, a, b)| (t.string(n), *a, *b))
            .collect();
        packed.push((l.steps, l.peak, bufs, res));
    }
    let data = serde_json::to_string(&Embedded {
        report: r,
        op_spans,
        strings: t.strings,
        kinds: t.kinds,
        buffers: t.buffers,
        packed,
    })?;
    // `<` only occurs inside JSON strings, where `\u003c` means the same: no name
    // can close the script element or open a comment.
    let data = data.replace('<', "\\u003c");
    Ok(page(r, &data))
}

fn page(r: &HtmlReport, data: &str) -> String {
    let mut s = String::with_capacity(data.len() + 32_000);
    let title = escape(&r.title);
    let _ = write!(
        s,
        r##"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Tessera profile: {title}</title>
<style>{CSS}</style>
</head>
<body data-ok="pending">
<header><h1>Tessera profile: {title}</h1>
<nav><a href="#timeline">timeline</a> <a href="#ops">operations</a> <a href="#tiles">tiles</a> <a href="#sram">SRAM viewer</a> <a href="#faults">faults</a></nav></header>
<pre id="errors"></pre>
"##
    );
    let share = |x: u64| 100.0 * x as f64 / r.profile.total.max(1) as f64;
    let _ = write!(
        s,
        r##"<section id="summary"><h2>Summary</h2>
<table class="kv">
<tr><th>status</th><td class="status-{status}">{status}</td></tr>
<tr><th>cropped span (one inference)</th><td>{run} cycles ({ms:.3} ms at {mhz:.0} MHz)</td></tr>
<tr><th>encoder interval</th><td>{enc}</td></tr>
<tr><th>whole run</th><td>{total} cycles in {ss} supersteps: compute {c} ({cs:.1}%), exchange {x} ({xs:.1}%), host {h} ({hs:.1}%), sync {y} ({ys:.1}%)</td></tr>
<tr><th>weight streaming (before the cropped span)</th><td>{init} cycles, {wp}</td></tr>
<tr><th>faults</th><td>{nf}</td></tr>
</table>
</section>
"##,
        status = escape(&r.status),
        run = thousands(r.run_cycles),
        ms = r.run_cycles as f64 / r.clock_hz.max(1) as f64 * 1e3,
        mhz = r.clock_hz as f64 / 1e6,
        enc = r
            .encoder
            .as_ref()
            .map_or("none (no layers.* operation)".to_string(), |e| format!(
                "{} cycles, {:.1}% of f16 peak",
                thousands(e.cycles),
                100.0 * e.peak_share
            )),
        total = thousands(r.profile.total),
        ss = r.profile.supersteps.len(),
        c = thousands(r.profile.compute),
        cs = share(r.profile.compute),
        x = thousands(r.profile.exchange),
        xs = share(r.profile.exchange),
        h = thousands(r.profile.host),
        hs = share(r.profile.host),
        y = thousands(r.profile.sync),
        ys = share(r.profile.sync),
        init = thousands(r.init_cycles),
        wp = match r.weight_phases {
            1 => "1 host phase".to_string(),
            n => format!("{n} host phases"),
        },
        nf = r.faults.len(),
    );
    let cropped = format!(
        "The cropped span ({} cycles) is one inference, the <code>cycles</code> of <code>tessera run --json</code>: from cycle {} (the end of {}, at initialisation) to the end of the run at cycle {}; it includes the inference's host input and output transfers ({} cycles).",
        thousands(r.run_cycles),
        thousands(r.init_cycles),
        match r.weight_phases {
            1 => "the host phase that streams the weights once".to_string(),
            n => format!("the last of the {n} host phases that stream the weights once"),
        },
        thousands(r.total_cycles),
        thousands(r.host_cycles)
    );
    let encoder = match &r.encoder {
        Some(e) => format!(
            "The encoder interval ({} cycles) covers the encoder layers' operations (<code>layers.&lt;i&gt;.*</code>): the compute and exchange of every superstep charged to one of them and the syncs after those supersteps, from cycle {} (the start of the first layer's first operation) to cycle {} (the end of the sync after the last layer's last); this is the <code>encoder</code> of <code>tessera run --json</code>.{}",
            thousands(e.cycles),
            thousands(e.start),
            thousands(e.end),
            if r.layers.is_empty() {
                String::new()
            } else {
                format!(
                    " Its cycles are split into {} by the layer of the operation each is charged to; they add up to it (the <code>layer_cycles</code>).",
                    match r.layers.len() {
                        1 => "one layer".to_string(),
                        n => format!("{n} layers"),
                    }
                )
            }
        ),
        None => "This model has no encoder layer operation (<code>layers.*</code>), so there is no encoder interval.".to_string(),
    };
    let _ = write!(
        s,
        r##"<section id="timeline"><h2>Timeline</h2>
<p class="def" id="def-cropped">{cropped}</p>
<p class="def" id="def-encoder">{encoder}</p>
<div class="controls">show: <button data-zoom="all">whole run</button> <button data-zoom="cropped">cropped span</button> <button data-zoom="encoder">encoder interval</button>
<span class="legend"><i style="background:{COMPUTE}"></i>compute <i style="background:{EXCHANGE}"></i>exchange <i style="background:{HOST}"></i>host <i style="background:{SYNC}"></i>sync</span></div>
<div id="timeline-plot" class="plot"></div>
<div id="layer-groups"></div>
</section>
<section id="ops"><h2>Operations</h2>
<p>Cycles charged to each lowered operation (a superstep's exchange to the operation of its exchange program, its compute to the operation of the compute steps after it); FLOP of its matrix products; share of the f16 peak over its own cycles; bytes its exchanges deliver; tiles that run its kernels. Click a column header to sort, a row to see the operation on the timeline.</p>
<table id="op-table" class="grid"><thead><tr></tr></thead><tbody></tbody></table>
</section>
<section id="tiles"><h2>Tiles</h2>
<p>Each cell is a tile, in tile order, row by row. Busy: cycles during which at least one worker ran a kernel, against the busiest tile. SRAM: the placement's high-water mark, against the tile's SRAM. Faulting tiles have a red border. Click a tile to open it in the SRAM viewer.</p>
<div id="heatmaps"></div>
</section>
<section id="sram"><h2>SRAM viewer</h2>
<div class="controls">tile <input id="tile-input" type="number" min="0" value="0"> <button id="tile-show">show</button> <button id="tile-peak">highest SRAM</button> <button id="tile-busy">busiest</button> <button id="tile-fault">first fault</button> addresses: <button id="sram-whole">whole SRAM</button> <button id="sram-used">up to the high-water mark</button></div>
<div class="controls"><span class="legend" id="sram-legend"></span></div>
<p id="sram-caption"></p>
<div id="sram-plot" class="plot"></div>
<pre id="sram-detail">Hover over a buffer for its details.</pre>
</section>
<section id="faults"><h2>Faults</h2>
<div id="fault-list"></div>
</section>
<script type="application/json" id="data">{data}</script>
<script>{JS}</script>
</body>
</html>
"##
    );
    s
}

const COMPUTE: &str = "#4e79a7";
const EXCHANGE: &str = "#f28e2b";
const HOST: &str = "#9c755f";
const SYNC: &str = "#bab0ac";

const CSS: &str = r#"
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0 24px 40px;color:#222;max-width:1400px}
header{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:6px 0;z-index:2}
h1{font-size:20px;margin:4px 0}h2{font-size:17px;margin:24px 0 6px}
nav a{margin-right:12px;color:#345}
code{background:#f3f3f3;padding:0 3px}
table.kv th{text-align:left;padding-right:16px;font-weight:600}
table.grid{border-collapse:collapse;font-size:13px}
table.grid th,table.grid td{border-bottom:1px solid #e4e4e4;padding:2px 8px;text-align:right;white-space:nowrap}
table.grid th{cursor:pointer;background:#f5f5f5;position:sticky;top:44px}
table.grid th.sorted-asc:after{content:" \25B2"}table.grid th.sorted-desc:after{content:" \25BC"}
table.grid td.name,table.grid th.name{text-align:left}
tr.op,tr.fault{cursor:pointer}tr.op:hover,tr.fault:hover{background:#eef3fa}
.def{max-width:1100px;margin:4px 0}
.controls{margin:6px 0}.controls button{font:inherit;padding:1px 8px}
.legend{margin-left:18px}#sram-legend{margin-left:0}.legend i{display:inline-block;width:11px;height:11px;margin:0 4px 0 10px;vertical-align:-1px;border:1px solid #888}
.plot svg{display:block;font:11px system-ui,Helvetica,Arial,sans-serif}
#heatmaps{display:flex;flex-wrap:wrap;gap:28px}
.heatmap h3{font-size:14px;margin:4px 0;max-width:640px}
#sram-detail{background:#f7f7f7;padding:6px;min-height:3em;white-space:pre-wrap}
#errors:empty{display:none}#errors{color:#b00;background:#fee;padding:6px}
.status-ok{color:#070}.status-fault,.status-mismatch{color:#b00;font-weight:600}
.tile{cursor:pointer}
details.layer-group{margin:2px 0;border-left:3px solid #b04;padding-left:8px}
details.layer-group summary{cursor:pointer}
.layer-body{margin:4px 0 10px}
rect.layer{cursor:pointer}
"#;

const JS: &str = include_str!("html.js");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Superstep;

    fn report() -> HtmlReport {
        let layout = Layout {
            steps: 4,
            peak: 0x4_8000,
            buffers: vec![PlacedBuffer {
                name: "fc1.w</script><script>alert(1)</script>".into(),
                category: "weights".into(),
                addr: 0x4_0000,
                size: 4096,
                first: 0,
                last: 3,
                align: 8,
                class: "any".into(),
                tail: 0,
                loaded: false,
            }],
            reservations: vec![("host.descriptors".into(), 0x4_f000, 0x4_f800)],
        };
        let (layouts, index) = dedup_layouts(vec![Some(layout.clone()), Some(layout), None]);
        HtmlReport {
            title: "test <run>".into(),
            status: "ok".into(),
            clock_hz: 1_850_000_000,
            total_cycles: 300,
            init_cycles: 100,
            weight_phases: 1,
            run_cycles: 200,
            profile: Profile {
                supersteps: vec![
                    Superstep {
                        index: 0,
                        start: 0,
                        end: 100,
                        host: 100,
                        ..Superstep::default()
                    },
                    Superstep {
                        index: 1,
                        start: 110,
                        end: 300,
                        compute: 190,
                        ..Superstep::default()
                    },
                ],
                total: 300,
                ..Profile::default()
            },
            labels: vec![None, Some("fc1".into())],
            ops: vec![OpRow {
                name: "fc1".into(),
                kind: "linear".into(),
                cycles: 190,
                ..OpRow::default()
            }],
            tiles: index
                .iter()
                .enumerate()
                .map(|(t, l)| TileRow {
                    tile: t as u32,
                    busy: 10 * t as u64,
                    peak_bytes: l.map(|_| 0x8000),
                    layout: *l,
                })
                .collect(),
            sram: SramMap {
                start: 0x4_0000,
                end: 0x5_0000,
                loader_limit: 0x4_f800,
                regions: vec![Region {
                    start: 0x4_0000,
                    end: 0x5_0000,
                    interleaved: false,
                    executable: true,
                    element_bytes: 0x4000,
                }],
                host_reserved: Some((0x4_f000, 0x4_f800)),
            },
            layouts,
            ..HtmlReport::default()
        }
    }

    #[test]
    fn identical_layouts_are_stored_once() {
        let r = report();
        assert_eq!(r.layouts.len(), 1);
        let idx: Vec<_> = r.tiles.iter().map(|t| t.layout).collect();
        assert_eq!(idx, vec![Some(0), Some(0), None]);
    }

    #[test]
    fn the_page_is_self_contained_and_embeds_its_data() {
        let html = render_html(&report()).unwrap();
        for attr in ["src=", "href="] {
            for (i, _) in html.match_indices(attr) {
                let v = &html[i + attr.len()..];
                let v = v.trim_start_matches(['"', '\'']);
                assert!(
                    !v.starts_with("http:") && !v.starts_with("https:") && !v.starts_with("//"),
                    "external {attr} at {i}: {}",
                    &html[i..(i + 60).min(html.len())]
                );
            }
        }
        for banned in ["<link", "@import", "<iframe", "<img", "<object", "<embed"] {
            assert!(!html.contains(banned), "{banned}");
        }
        // CSS and SVG references stay inside the page.
        for (i, _) in html.match_indices("url(") {
            assert!(html[i + 4..].starts_with('#'), "url( at {i}");
        }
        let start = html
            .find(r#"<script type="application/json" id="data">"#)
            .unwrap();
        let body = &html[start..];
        let body = &body[body.find('>').unwrap() + 1..body.find("</script>").unwrap()];
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["run_cycles"], 200);
        assert_eq!(v["ops"][0]["name"], "fc1");
        assert_eq!(v["packed"].as_array().unwrap().len(), 1);
        assert_eq!(v["op_spans"][0], serde_json::json!(["fc1", 110, 300]));
        // The name survives the escaping, intact, inside the data.
        let strings: Vec<&str> = v["strings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        assert!(strings.contains(&"fc1.w</script><script>alert(1)</script>"));
    }

    /// The page's data blob.
    fn data(html: &str) -> serde_json::Value {
        let start = html
            .find(r#"<script type="application/json" id="data">"#)
            .unwrap();
        let body = &html[start..];
        let body = &body[body.find('>').unwrap() + 1..body.find("</script>").unwrap()];
        serde_json::from_str(body).unwrap()
    }

    /// What the page's script does with `packed`, `buffers` and `kinds`.
    fn unpack(v: &serde_json::Value, layout: usize) -> Vec<PlacedBuffer> {
        let n = |x: &serde_json::Value| x.as_u64().unwrap();
        let string = |i: u64| v["strings"][i as usize].as_str().unwrap().to_string();
        let table = v["buffers"].as_array().unwrap();
        let mut id = 0i64;
        v["packed"][layout][2]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                id += d.as_i64().unwrap();
                let b = &table[5 * id as usize..5 * id as usize + 5];
                let k = &v["kinds"][n(&b[1]) as usize];
                PlacedBuffer {
                    name: string(n(&b[0])),
                    category: string(n(&k[0])),
                    addr: n(&b[2]),
                    size: n(&k[1]),
                    first: n(&b[3]),
                    last: n(&b[3]) + n(&b[4]),
                    align: n(&k[2]),
                    class: string(n(&k[3])),
                    tail: n(&k[4]),
                    loaded: n(&k[5]) == 1,
                }
            })
            .collect()
    }

    #[test]
    fn layouts_are_stored_as_tables_and_read_back() {
        let mut r = report();
        let b = |name: &str, addr: u64, first: u64, loaded: bool| PlacedBuffer {
            name: name.into(),
            category: "activations".into(),
            addr,
            size: 64,
            first,
            last: first + 2,
            align: 8,
            class: "any".into(),
            tail: 4,
            loaded,
        };
        let one = Layout {
            steps: 9,
            buffers: vec![
                b("layers.0.x", 0x4_0000, 0, false),
                b("layers.1.x", 0x4_0040, 3, false),
            ],
            ..Layout::default()
        };
        // The second shares a buffer with the first and differs in the other.
        let two = Layout {
            steps: 9,
            buffers: vec![
                b("layers.1.x", 0x4_0040, 3, false),
                b("layers.0.x", 0x4_0000, 0, true),
            ],
            ..Layout::default()
        };
        r.layouts.extend([one, two]);
        let v = data(&render_html(&r).unwrap());
        for (i, l) in r.layouts.iter().enumerate() {
            assert_eq!(unpack(&v, i), l.buffers, "layout {i}");
        }
        // Five buffers placed, four distinct: the shared one is stored once.
        assert_eq!(v["buffers"].as_array().unwrap().len(), 5 * 4);
    }

    #[test]
    fn names_cannot_close_the_script() {
        let html = render_html(&report()).unwrap();
        // Two script elements: the data and the code; nothing else closes one.
        assert_eq!(html.matches("</script").count(), 2, "{html}");
        assert!(!html.contains("<script><"));
        assert!(html.contains("test &lt;run&gt;"));
    }

    #[test]
    fn every_section_exists_once() {
        let html = render_html(&report()).unwrap();
        for id in SECTIONS.iter().chain(&[
            "timeline-plot",
            "op-table",
            "heatmaps",
            "sram-plot",
            "fault-list",
            "errors",
            "layer-groups",
        ]) {
            assert_eq!(
                html.matches(&format!(r#"id="{id}""#)).count(),
                1,
                "section {id}"
            );
        }
        assert!(html.contains("The cropped span (200 cycles)"));
    }

    #[test]
    fn the_same_report_gives_the_same_bytes() {
        assert_eq!(
            render_html(&report()).unwrap(),
            render_html(&report()).unwrap()
        );
    }
}
