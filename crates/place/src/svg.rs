//! A placed tile as an SVG picture: address upwards, step to the right. Each buffer
//! is a rectangle over its lifetime and its bytes, coloured by category, with its
//! name, size, alignment, memory class and tail on hover; regions, memory elements,
//! the loader limit and reservations are drawn behind. For people who read a
//! placement rather than its numbers (`tessera place PROBLEM --svg FILE`).

use std::fmt::Write;

use tessera_machine::Machine;

use crate::problem::{MemClass, TilePlacement, TileProblem};

const W: f64 = 960.0;
const H: f64 = 640.0;
const LEFT: f64 = 90.0;
const BOTTOM: f64 = 40.0;
const TOP: f64 = 30.0;
const RIGHT: f64 = 170.0;

/// The colour of a category (or memory class when a request has none).
pub fn category_colour(category: &str) -> &'static str {
    match category {
        "activations" | "activation" => "#4e79a7",
        "weights" | "weight" => "#f28e2b",
        "partials" | "partial" => "#e15759",
        "vertex_state" => "#76b7b2",
        "code" | "executable" => "#59a14f",
        "exchange_code" => "#b07aa1",
        "host descriptors" | "reserved" => "#9c755f",
        _ => "#bab0ac",
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn class_name(c: MemClass) -> &'static str {
    match c {
        MemClass::Any => "any",
        MemClass::NonInterleaved => "non-interleaved",
        MemClass::Interleaved => "interleaved",
        MemClass::Executable => "executable",
    }
}

/// Renders `placement` of `problem` on `machine`'s SRAM.
pub fn render_svg(machine: &Machine, problem: &TileProblem, placement: &TilePlacement) -> String {
    let lo = u64::from(machine.regions.first().map_or(0, |r| r.start));
    let hi = u64::from(machine.regions.last().map_or(1, |r| r.end)).max(lo + 1);
    let steps = problem
        .requests
        .iter()
        .map(|r| r.last + 1)
        .chain(problem.sequences.iter().map(|s| s.last + 1))
        .max()
        .unwrap_or(1)
        .max(1);
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let x = |step: u64| LEFT + pw * step as f64 / steps as f64;
    let y = |addr: u64| TOP + ph * (1.0 - (addr.saturating_sub(lo)) as f64 / (hi - lo) as f64);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<title>tile {} placement: peak {:#x}, {} buffers</title>"#,
        placement.tile,
        placement.peak,
        placement.allocations.len()
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    // Regions, elements, loader limit.
    for (i, r) in machine.regions.iter().enumerate() {
        let (a, b) = (u64::from(r.start), u64::from(r.end));
        let fill = if r.interleaved { "#f4f4fb" } else { "#fbfbf4" };
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{:.1}" width="{pw}" height="{:.1}" fill="{fill}" stroke="#999"><title>region {i}: {a:#x}..{b:#x}{}{}, elements of {} bytes</title></rect>"##,
            y(b),
            y(a) - y(b),
            if r.interleaved { ", interleaved" } else { "" },
            if r.executable { ", executable" } else { "" },
            r.element_bytes
        );
        let step = u64::from(r.element_bytes.max(1)) * if r.interleaved { 2 } else { 1 };
        let mut e = a + step;
        while e < b {
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/>"##,
                LEFT + pw,
                y(e),
                y(e)
            );
            e += step;
        }
        let _ = writeln!(s, r#"<text x="4" y="{:.1}">{a:#x}</text>"#, y(a) - 2.0);
    }
    let ll = u64::from(machine.loader_limit);
    let _ = writeln!(
        s,
        r#"<line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="black" stroke-dasharray="4 3"><title>loader limit {ll:#x}</title></line>"#,
        LEFT + pw,
        y(ll),
        y(ll)
    );
    for r in &problem.reservations {
        let _ = writeln!(
            s,
            r#"<rect class="reservation" x="{LEFT}" y="{:.1}" width="{pw}" height="{:.1}" fill="{}" fill-opacity="0.6"><title>{}: {:#x}..{:#x} (reserved at every step)</title></rect>"#,
            y(r.end),
            (y(r.start) - y(r.end)).max(1.0),
            category_colour("reserved"),
            escape(&r.name),
            r.start,
            r.end
        );
    }
    // Buffers.
    let mut drawn = 0usize;
    let mut rect = |s: &mut String,
                    name: &str,
                    addr: u64,
                    size: u64,
                    first: u64,
                    last: u64,
                    cat: &str,
                    detail: String| {
        drawn += 1;
        let _ = writeln!(
            s,
            r##"<rect class="buffer" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}" stroke="#333" stroke-width="0.3"><title>{} @ {addr:#x}: {size} bytes, steps {first}..={last}, {detail}, category {}</title></rect>"##,
            x(first),
            y(addr + size),
            (x(last + 1) - x(first)).max(0.5),
            (y(addr) - y(addr + size)).max(0.5),
            category_colour(cat),
            escape(name),
            escape(cat)
        );
    };
    for r in &problem.requests {
        let Some(addr) = placement.offset_of(&r.name) else {
            continue;
        };
        let cat = r
            .category
            .clone()
            .unwrap_or_else(|| class_name(r.class).to_string());
        let detail = format!(
            "align {}, class {}, tail {}{}",
            r.align,
            class_name(r.class),
            r.tail,
            if r.loaded { ", loaded" } else { "" }
        );
        rect(&mut s, &r.name, addr, r.size, r.first, r.last, &cat, detail);
    }
    for q in &problem.sequences {
        let Some(a) = placement.allocations.iter().find(|a| a.id == q.name) else {
            continue;
        };
        let stride = a.stride.unwrap_or(q.size);
        let cat = q
            .category
            .clone()
            .unwrap_or_else(|| class_name(q.class).to_string());
        for i in 0..q.count {
            let detail = format!(
                "member {i} of {}, align {}, class {}",
                q.count,
                q.align,
                class_name(q.class)
            );
            rect(
                &mut s,
                &q.name,
                a.offset + i * stride,
                q.size,
                q.first,
                q.last,
                &cat,
                detail,
            );
        }
    }
    // Axes and legend.
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="{:.1}">step 0</text><text x="{:.1}" y="{:.1}" text-anchor="end">step {}</text>"#,
        H - BOTTOM + 15.0,
        LEFT + pw,
        H - BOTTOM + 15.0,
        steps - 1
    );
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="18">tile {}: {} buffers, peak {:#x} ({} mode)</text>"#,
        placement.tile,
        drawn,
        placement.peak,
        placement.mode_used.name()
    );
    for (i, cat) in [
        "activations",
        "weights",
        "partials",
        "vertex_state",
        "code",
        "exchange_code",
        "host descriptors",
        "other",
    ]
    .iter()
    .enumerate()
    {
        let ly = TOP + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{ly:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}">{cat}</text>"#,
            W - RIGHT + 12.0,
            category_colour(cat),
            W - RIGHT + 30.0,
            ly + 10.0
        );
    }
    s.push_str("</svg>\n");
    s
}
