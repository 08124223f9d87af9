//! The disassembler: a package back to assembly text (layout in `docs/asm.md`).
//!
//! The full listing is itself a source file: assembling it gives a package with
//! identical bytes. Every word is printed only if its text parses back to the same
//! word and re-encodes to the same bytes; anything else (undecodable words,
//! misaligned bundles, bytes cut by a label) is printed as `.word`/`.byte` data.
//! Addresses, encodings and `symbol+offset` locations go in trailing comments.

use crate::encode::{decode_word, encode_word};
use crate::inst::{Inst, Word};
use crate::syntax::{parse_word_with, quote_name};
use std::collections::HashMap;
use std::fmt::Write as _;
use tessera_machine::{Machine, PRESETS};
use tessera_package::{Package, Segment, Symbol, SymbolKind, TileImage};

/// Width of the instruction column before the `#` comment.
const TEXT_COLUMN: usize = 48;

/// Checks that the filters of [`disassemble`] select something, with a message
/// naming what exists otherwise.
pub fn check_filter(p: &Package, tile: Option<u32>, symbol: Option<&str>) -> Result<(), String> {
    let tiles: Vec<&TileImage> = p
        .tiles
        .iter()
        .filter(|t| tile.is_none_or(|n| t.tile == n))
        .collect();
    if let Some(n) = tile
        && tiles.is_empty()
    {
        let have: Vec<String> = p.tiles.iter().map(|t| t.tile.to_string()).collect();
        return Err(format!(
            "tile {n} has no image in this package (tiles with images: {})",
            tile_list(&p.tiles.iter().map(|t| t.tile).collect::<Vec<_>>()).unwrap_or_else(|| {
                if have.is_empty() {
                    "none".into()
                } else {
                    have.join(", ")
                }
            })
        ));
    }
    if let Some(s) = symbol
        && !tiles.iter().any(|t| t.symbols.iter().any(|y| y.name == s))
    {
        return Err(match tile {
            Some(n) => format!("no symbol `{s}` on tile {n}"),
            None => format!("no symbol `{s}` on any tile"),
        });
    }
    Ok(())
}

/// Disassembles a package. Without filters the output re-assembles to the same
/// package bytes; `tile` keeps one tile's image, `symbol` keeps the address range of
/// that symbol (on every selected tile that defines it). Exchanges and bindings are
/// printed only without filters.
pub fn disassemble(p: &Package, tile: Option<u32>, symbol: Option<&str>) -> String {
    let mut out = String::new();
    header(&mut out, p);
    // Tiles with identical images print once, under one `.tile` set.
    let mut groups: Vec<(Vec<u32>, &TileImage)> = Vec::new();
    for t in p.tiles.iter().filter(|t| tile.is_none_or(|n| t.tile == n)) {
        match groups.iter_mut().find(|(_, g)| same_image(g, t)) {
            Some((tiles, _)) => tiles.push(t.tile),
            None => groups.push((vec![t.tile], t)),
        }
    }
    for (tiles, img) in &groups {
        let range = match symbol {
            None => None,
            Some(name) => match img.symbols.iter().find(|s| s.name == name) {
                Some(s) => Some((s.addr, u64::from(s.addr) + u64::from(s.size))),
                None => continue,
            },
        };
        let set = tile_list(tiles).unwrap_or_default();
        let _ = writeln!(out, "\n.tile {set}");
        tile_image(&mut out, img, range);
    }
    if tile.is_none() && symbol.is_none() {
        exchanges_and_bindings(&mut out, p);
    }
    out
}

fn same_image(a: &TileImage, b: &TileImage) -> bool {
    a.entry == b.entry && a.segments == b.segments && a.symbols == b.symbols
}

/// `0, 2, 4..=9`; `None` for an empty list.
fn tile_list(tiles: &[u32]) -> Option<String> {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < tiles.len() {
        let mut j = i;
        while j + 1 < tiles.len() && tiles[j + 1] == tiles[j] + 1 {
            j += 1;
        }
        if j > i {
            parts.push(format!("{}..={}", tiles[i], tiles[j]));
        } else {
            parts.push(tiles[i].to_string());
        }
        i = j + 1;
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

fn header(out: &mut String, p: &Package) {
    let _ = writeln!(out, "# tessera disassembly");
    let m = match Machine::from_toml(&p.machine_toml, "package") {
        Ok(m) => m,
        Err(e) => {
            let _ = writeln!(out, "# the embedded machine description is invalid: {e}");
            return;
        }
    };
    let preset = PRESETS.iter().find_map(|&name| {
        Machine::preset(name)
            .ok()
            .filter(|pm| pm.clone().with_tiles(m.tiles) == m)
            .map(|pm| (name, pm.tiles))
    });
    match preset {
        Some((name, tiles)) => {
            let _ = writeln!(out, ".machine {name}");
            if tiles != m.tiles {
                let _ = writeln!(out, ".tiles {}", m.tiles);
            }
        }
        None => {
            let _ = writeln!(
                out,
                "# the embedded machine `{}` is not a preset: give `.machine` a TOML path to re-assemble",
                m.name
            );
            let _ = writeln!(out, ".machine {}", quote_name(&m.name));
            let _ = writeln!(out, ".tiles {}", m.tiles);
        }
    }
}

fn perms_text(s: &Segment) -> String {
    let mut p = String::new();
    if s.perms.read {
        p.push('r');
    }
    if s.perms.write {
        p.push('w');
    }
    if s.perms.execute {
        p.push('x');
    }
    if p.is_empty() { "none".into() } else { p }
}

fn seg_end(s: &Segment) -> u64 {
    u64::from(s.addr) + u64::from(s.size)
}

/// The segment a symbol's label belongs in: the one containing its address, or
/// else the one it ends (a label at the very end of a segment).
fn home_segment(img: &TileImage, sym: &Symbol) -> Option<usize> {
    let a = u64::from(sym.addr);
    img.segments
        .iter()
        .position(|s| u64::from(s.addr) <= a && a < seg_end(s))
        .or_else(|| img.segments.iter().position(|s| seg_end(s) == a))
}

fn tile_image(out: &mut String, img: &TileImage, range: Option<(u32, u64)>) {
    if range.is_none() {
        match img.symbols.iter().find(|s| s.addr == img.entry) {
            Some(s) => {
                let _ = writeln!(out, ".entry {}", quote_name(&s.name));
            }
            None => {
                let _ = writeln!(out, ".entry {:#x}", img.entry);
            }
        }
    }
    let homes: Vec<Option<usize>> = img.symbols.iter().map(|s| home_segment(img, s)).collect();
    // Branch targets print as label names when a listed label sits there (the
    // first one, as for `.entry`).
    let mut targets = Targets::default();
    for (s, h) in img.symbols.iter().zip(&homes) {
        if h.is_some() {
            targets.by_addr.entry(s.addr).or_insert(&s.name);
            targets.by_name.insert(&s.name, s.addr);
        }
    }
    for (si, seg) in img.segments.iter().enumerate() {
        let mut labels: Vec<&Symbol> = img
            .symbols
            .iter()
            .zip(&homes)
            .filter(|(_, h)| **h == Some(si))
            .map(|(s, _)| s)
            .collect();
        labels.sort_by_key(|s| s.addr);
        let (lo, hi) = match range {
            None => (seg.addr, seg_end(seg)),
            Some((a, b)) => {
                let lo = a.max(seg.addr);
                let hi = b.min(seg_end(seg));
                if u64::from(lo) >= hi && !(u64::from(a) == b && labels.iter().any(|s| s.addr == a))
                {
                    continue;
                }
                (lo, hi)
            }
        };
        let _ = writeln!(
            out,
            ".section {} {:#x} {}",
            quote_name(&seg.name),
            seg.addr,
            perms_text(seg)
        );
        if lo > seg.addr {
            let _ = writeln!(out, ".org {lo:#x}");
        }
        segment(out, seg, &labels, &targets, lo, hi);
    }
    if range.is_none() {
        for (s, h) in img.symbols.iter().zip(&homes) {
            if h.is_none() {
                let _ = writeln!(
                    out,
                    ".symbol {} {} {} {:#x}",
                    quote_name(&s.name),
                    s.size,
                    match s.kind {
                        SymbolKind::Code => "code",
                        SymbolKind::Data => "data",
                    },
                    s.addr
                );
            }
        }
    }
}

fn segment(
    out: &mut String,
    seg: &Segment,
    labels: &[&Symbol],
    targets: &Targets,
    lo: u32,
    hi: u64,
) {
    let exec = seg.perms.execute;
    let init_end = u64::from(seg.addr) + seg.bytes.len() as u64;
    let mut pos = u64::from(lo);
    let mut li = 0;
    // Labels before the range still name the locations inside it.
    let mut loc_name = quote_name(&seg.name);
    let mut loc_base = u64::from(seg.addr);
    while li < labels.len() && u64::from(labels[li].addr) < pos {
        loc_name = quote_name(&labels[li].name);
        loc_base = u64::from(labels[li].addr);
        li += 1;
    }
    loop {
        while li < labels.len() && u64::from(labels[li].addr) == pos {
            let s = labels[li];
            let _ = writeln!(out, "{}:", quote_name(&s.name));
            // The assembler infers a label's size up to the next greater label of the
            // section, or the section end; say so only when that is not the size.
            let inferred = labels
                .iter()
                .map(|o| u64::from(o.addr))
                .filter(|&a| a > u64::from(s.addr))
                .min()
                .unwrap_or(seg_end(seg))
                - u64::from(s.addr);
            let default_kind = if exec {
                SymbolKind::Code
            } else {
                SymbolKind::Data
            };
            if u64::from(s.size) != inferred || s.kind != default_kind {
                let kind = if s.kind == default_kind {
                    ""
                } else if s.kind == SymbolKind::Code {
                    " code"
                } else {
                    " data"
                };
                let _ = writeln!(out, ".symbol {} {}{kind}", quote_name(&s.name), s.size);
            }
            loc_name = quote_name(&s.name);
            loc_base = pos;
            li += 1;
        }
        if pos >= hi {
            break;
        }
        let next_label = labels.get(li).map_or(hi, |s| u64::from(s.addr)).min(hi);
        let loc = format!("{loc_name}+{:#x}", pos - loc_base);
        if pos >= init_end {
            let _ = writeln!(out, "    .space {}", next_label - pos);
            pos = next_label;
            continue;
        }
        let limit = next_label.min(init_end);
        let off = (pos - u64::from(seg.addr)) as usize;
        let avail = &seg.bytes[off..(limit - u64::from(seg.addr)) as usize];
        let (text, len) = if exec {
            code_item(avail, pos, targets)
        } else {
            data_item(avail)
        };
        // Data lines already show their bytes; only instructions need the encoding.
        let hex: Vec<String> = if !exec || text.starts_with('.') {
            Vec::new()
        } else {
            avail[..len]
                .chunks(4)
                .map(|c| {
                    if c.len() == 4 {
                        format!("{:08x}", u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    } else {
                        c.iter().map(|b| format!("{b:02x}")).collect()
                    }
                })
                .collect()
        };
        let line = format!("    {text}");
        let pad = TEXT_COLUMN.saturating_sub(line.len()).max(1);
        if hex.is_empty() {
            let _ = writeln!(out, "{line}{:pad$}# {pos:#07x}  {loc}", "");
        } else {
            let _ = writeln!(
                out,
                "{line}{:pad$}# {pos:#07x}  {:<17}  {loc}",
                "",
                hex.join(" ")
            );
        }
        pos += len as u64;
    }
}

/// Labels listed in a tile's output, for symbolic branch targets.
#[derive(Default)]
struct Targets<'a> {
    by_addr: HashMap<u32, &'a str>,
    by_name: HashMap<&'a str, u32>,
}

/// The branch target of a single control instruction.
fn target_of(w: &Word) -> Option<u32> {
    match w {
        Word::Single(
            Inst::Bri { target }
            | Inst::Brz { target, .. }
            | Inst::Brnz { target, .. }
            | Inst::Call { target, .. },
        ) => Some(*target),
        _ => None,
    }
}

/// One instruction, or data when the bytes do not round-trip as an instruction.
/// A branch to a label's address names the label.
fn code_item(bytes: &[u8], addr: u64, targets: &Targets) -> (String, usize) {
    if !addr.is_multiple_of(4) || bytes.len() < 4 {
        let n = bytes.len().min((4 - addr % 4) as usize);
        return (byte_list(&bytes[..n]), n);
    }
    if let Ok((w, n)) = decode_word(bytes) {
        let aligned = !matches!(w, Word::Bundle(..)) || addr.is_multiple_of(8);
        let mut again = Vec::new();
        let reencodes = encode_word(&w, &mut again).is_ok() && again == bytes[..n];
        let mut text = w.to_string();
        if let Some(t) = target_of(&w)
            && let Some(name) = targets.by_addr.get(&t)
            && let Some(stem) = text.strip_suffix(&format!("{t:#x}"))
        {
            text = format!("{stem}{}", quote_name(name));
        }
        let resolve = |s: &str| targets.by_name.get(s).map(|&a| i64::from(a));
        if aligned && reencodes && parse_word_with(&text, &resolve) == Ok(w) {
            return (text, n);
        }
    }
    let v = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    (format!(".word {v:#010x}"), 4)
}

/// Up to four little-endian words, or the trailing bytes.
fn data_item(bytes: &[u8]) -> (String, usize) {
    if bytes.len() < 4 {
        return (byte_list(bytes), bytes.len());
    }
    let n = (bytes.len() / 4).min(4);
    let words: Vec<String> = bytes[..n * 4]
        .chunks(4)
        .map(|c| format!("{:#010x}", u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .collect();
    (format!(".word {}", words.join(", ")), n * 4)
}

fn byte_list(bytes: &[u8]) -> String {
    let b: Vec<String> = bytes.iter().map(|b| format!("{b:#04x}")).collect();
    format!(".byte {}", b.join(", "))
}

fn exchanges_and_bindings(out: &mut String, p: &Package) {
    for x in &p.exchanges {
        let name = if x.name.is_empty() {
            String::new()
        } else {
            format!(" {}", quote_name(&x.name))
        };
        let _ = writeln!(out, "\n.exchange {}{name}", x.id);
    }
    for b in &p.bindings {
        let kind = match b.kind {
            tessera_package::BindingKind::Input => "input",
            tessera_package::BindingKind::Output => "output",
            tessera_package::BindingKind::Weight => "weight",
        };
        let _ = writeln!(out, "\n.binding {kind} {} {}", quote_name(&b.name), b.bytes);
        for s in &b.slices {
            let _ = writeln!(
                out,
                ".slice {} {:#x} {} {}",
                s.tile, s.tile_addr, s.offset, s.bytes
            );
        }
        // A weight binding's host contents, 64 bytes a line, so that the listing
        // re-assembles to the same package.
        for chunk in b.data.chunks(64) {
            let hex: String = chunk.iter().map(|x| format!("{x:02x}")).collect();
            let _ = writeln!(out, ".bindata \"{hex}\"");
        }
    }
}
