//! The file assembler: text (syntax in `docs/asm.md`) to a validated [`Package`].
//!
//! Stages: every line is parsed on its own (all syntax errors are reported at
//! once); directives that concern the whole package (`.machine`, `.tile`,
//! exchanges, bindings) are collected; tiles that receive the same lines are
//! grouped and each group is laid out once (pass 1: addresses of labels) and
//! emitted once (pass 2: words and data, with every label known); finally
//! exchanges and bindings are resolved against the symbols of the tiles they name
//! and the package is validated.

use crate::encode::encode_word;
use crate::inst::{Inst, Word};
use crate::syntax::{self, Cursor, Expr, SyntaxError, Tok, WordStmt, err, lex};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use tessera_machine::Machine;
use tessera_package::{
    BindingKind, BindingSlice, ExchangeProgram, HostBinding, Package, Perms, Segment, Symbol,
    SymbolKind, TileImage,
};

/// One error, located at `file:line:col` (1-based; line 0 means the whole file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub file: String,
    pub line: usize,
    pub col: usize,
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: error: {}", self.file, self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: error: {}",
                self.file, self.line, self.col, self.message
            )
        }
    }
}

/// Why a source file did not assemble: one or more located diagnostics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsmError {
    pub diagnostics: Vec<Diagnostic>,
}

impl fmt::Display for AsmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.diagnostics.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            d.fmt(f)?;
        }
        Ok(())
    }
}

impl std::error::Error for AsmError {}

/// Syntax errors beyond this many are not reported (the first ones matter).
const MAX_DIAGNOSTICS: usize = 50;

/// Assembles source text. `file` names the source in diagnostics; a `.machine`
/// path is resolved against the current directory.
pub fn assemble(source: &str, file: &str) -> Result<Package, AsmError> {
    Assembler::new(file, None).run(source)
}

/// Reads and assembles a file; a `.machine` path is resolved against the file's
/// directory.
pub fn assemble_file(path: &Path) -> Result<Package, AsmError> {
    let file = path.display().to_string();
    let source = std::fs::read_to_string(path).map_err(|e| AsmError {
        diagnostics: vec![Diagnostic {
            file: file.clone(),
            line: 0,
            col: 0,
            message: format!("cannot read the file: {e}"),
        }],
    })?;
    Assembler::new(&file, path.parent()).run(&source)
}

// ---------------------------------------------------------------------------
// Statements
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum TileSel {
    All,
    List(Vec<(i64, i64, usize)>),
}

#[derive(Debug, Clone)]
enum Stmt {
    Machine(String),
    Tiles(i64),
    Tile(TileSel),
    Section {
        name: String,
        start: Option<(Expr, Perms)>,
    },
    Org(Expr),
    Align(Expr),
    Zero(Expr),
    Data {
        width: u32,
        items: Vec<(Expr, usize)>,
    },
    Float {
        half: bool,
        items: Vec<f64>,
    },
    Symbol {
        name: String,
        size: Expr,
        kind: Option<SymbolKind>,
        /// A symbol at a fixed address outside every section (memory the program
        /// fills at run time, such as weights), rather than a label's size.
        addr: Option<Expr>,
    },
    Entry(Expr),
    Exchange {
        id: Expr,
        id_col: usize,
        name: String,
    },
    Binding {
        kind: BindingKind,
        name: String,
        bytes: Expr,
    },
    Slice {
        tile: Expr,
        addr: Expr,
        offset: Expr,
        bytes: Expr,
    },
    /// `.bindata "HEX"`: the next bytes of a weight binding's host contents.
    BinData(Vec<u8>),
    Word(WordStmt),
}

impl Stmt {
    fn is_tile_scoped(&self) -> bool {
        matches!(
            self,
            Stmt::Section { .. }
                | Stmt::Org(_)
                | Stmt::Align(_)
                | Stmt::Zero(_)
                | Stmt::Data { .. }
                | Stmt::Float { .. }
                | Stmt::Symbol { .. }
                | Stmt::Entry(_)
                | Stmt::Word(_)
        )
    }
}

#[derive(Debug, Clone)]
struct Line {
    /// 1-based.
    line: usize,
    labels: Vec<(String, usize)>,
    stmt: Option<(Stmt, usize)>,
}

fn parse_line(text: &str, line: usize) -> Result<Line, SyntaxError> {
    let toks = lex(text)?;
    let mut c = Cursor::new(&toks, text.len());
    let mut labels = Vec::new();
    while let (Some(Tok::Ident(s) | Tok::Str(s)), Some(Tok::Colon)) =
        (c.peek(), toks.get(c.pos + 1).map(|t| &t.tok))
    {
        labels.push((s.clone(), c.col()));
        c.pos += 2;
    }
    if c.at_end() {
        return Ok(Line {
            line,
            labels,
            stmt: None,
        });
    }
    let col = c.col();
    let stmt = match c.peek() {
        Some(Tok::Ident(d)) if d.starts_with('.') => {
            let d = d.clone();
            c.pos += 1;
            let s = directive(&d, col, &mut c)?;
            c.expect_end()?;
            s
        }
        _ => Stmt::Word(syntax::word_stmt(&mut c)?),
    };
    Ok(Line {
        line,
        labels,
        stmt: Some((stmt, col)),
    })
}

fn perms(c: &mut Cursor) -> Result<Perms, SyntaxError> {
    let col = c.col();
    let bad = || err(col, "expected permissions: letters from `rwx`, or `none`");
    let Some(Tok::Ident(s)) = c.peek() else {
        return bad();
    };
    if s == "none" {
        c.pos += 1;
        return Ok(Perms::default());
    }
    let mut p = Perms::default();
    for ch in s.chars() {
        let flag = match ch {
            'r' => &mut p.read,
            'w' => &mut p.write,
            'x' => &mut p.execute,
            _ => return bad(),
        };
        if *flag {
            return bad();
        }
        *flag = true;
    }
    c.pos += 1;
    Ok(p)
}

fn int_lit(c: &mut Cursor, what: &str) -> Result<(i64, usize), SyntaxError> {
    let col = c.col();
    match c.peek() {
        Some(Tok::Int(n)) => {
            c.pos += 1;
            Ok((*n, col))
        }
        _ => err(col, format!("expected {what} (a number)")),
    }
}

fn float_item(c: &mut Cursor) -> Result<f64, SyntaxError> {
    let col = c.col();
    let neg = if c.eat(&Tok::Minus) {
        true
    } else {
        c.eat(&Tok::Plus);
        false
    };
    let v = match c.next().map(|t| &t.tok) {
        Some(Tok::Float(f)) => *f,
        Some(Tok::Int(n)) => *n as f64,
        Some(Tok::Ident(s)) if s == "inf" || s == "infinity" => f64::INFINITY,
        Some(Tok::Ident(s)) if s == "nan" => f64::NAN,
        _ => return err(col, "expected a floating-point number"),
    };
    Ok(if neg { -v } else { v })
}

fn list<T>(
    c: &mut Cursor,
    mut item: impl FnMut(&mut Cursor) -> Result<T, SyntaxError>,
) -> Result<Vec<T>, SyntaxError> {
    let mut out = vec![item(c)?];
    while c.eat(&Tok::Comma) {
        out.push(item(c)?);
    }
    Ok(out)
}

fn directive(d: &str, col: usize, c: &mut Cursor) -> Result<Stmt, SyntaxError> {
    Ok(match d {
        ".machine" => Stmt::Machine(c.name("a machine preset name or a quoted TOML path")?.0),
        ".tiles" => Stmt::Tiles(int_lit(c, "a tile count")?.0),
        ".tile" => {
            if let Some(Tok::Ident(s)) = c.peek()
                && s == "all"
            {
                c.pos += 1;
                Stmt::Tile(TileSel::All)
            } else {
                Stmt::Tile(TileSel::List(list(c, |c| {
                    let (lo, col) = int_lit(c, "a tile number")?;
                    if c.eat(&Tok::DotDot) {
                        let (hi, _) = int_lit(c, "the end of the tile range")?;
                        Ok((lo, hi - 1, col))
                    } else if c.eat(&Tok::DotDotEq) {
                        Ok((lo, int_lit(c, "the end of the tile range")?.0, col))
                    } else {
                        Ok((lo, lo, col))
                    }
                })?))
            }
        }
        ".section" => {
            let (name, _) = c.name("a section name")?;
            let start = if c.at_end() {
                None
            } else {
                let addr = c.expr()?;
                Some((addr, perms(c)?))
            };
            Stmt::Section { name, start }
        }
        ".org" => Stmt::Org(c.expr()?),
        ".align" => Stmt::Align(c.expr()?),
        ".zero" | ".space" => Stmt::Zero(c.expr()?),
        ".byte" | ".half" | ".word" => Stmt::Data {
            width: match d {
                ".byte" => 1,
                ".half" => 2,
                _ => 4,
            },
            items: list(c, |c| {
                let col = c.col();
                Ok((c.expr()?, col))
            })?,
        },
        ".f16" | ".f32" => Stmt::Float {
            half: d == ".f16",
            items: list(c, float_item)?,
        },
        ".symbol" => {
            let (name, _) = c.name("a label name")?;
            c.eat(&Tok::Comma);
            let size = c.expr()?;
            let kind = if c.eat(&Tok::Comma) || !c.at_end() {
                let kcol = c.col();
                match c.name("`code` or `data`")?.0.as_str() {
                    "code" => Some(SymbolKind::Code),
                    "data" => Some(SymbolKind::Data),
                    _ => return err(kcol, "expected `code` or `data`"),
                }
            } else {
                None
            };
            let addr = if kind.is_some() && (c.eat(&Tok::Comma) || !c.at_end()) {
                Some(c.expr()?)
            } else {
                None
            };
            Stmt::Symbol {
                name,
                size,
                kind,
                addr,
            }
        }
        ".entry" => Stmt::Entry(c.expr()?),
        ".exchange" => {
            let id_col = c.col();
            let id = c.expr()?;
            let name = if c.at_end() {
                String::new()
            } else {
                c.name("an exchange name")?.0
            };
            Stmt::Exchange { id, id_col, name }
        }
        ".binding" => {
            let kcol = c.col();
            let kind = match c.name("`input`, `output` or `weight`")?.0.as_str() {
                "input" => BindingKind::Input,
                "output" => BindingKind::Output,
                "weight" => BindingKind::Weight,
                _ => return err(kcol, "expected `input`, `output` or `weight`"),
            };
            let (name, _) = c.name("a binding name")?;
            Stmt::Binding {
                kind,
                name,
                bytes: c.expr()?,
            }
        }
        ".slice" => Stmt::Slice {
            tile: c.expr()?,
            addr: c.expr()?,
            offset: c.expr()?,
            bytes: c.expr()?,
        },
        ".bindata" => {
            let (hex, hcol) = c.name("a quoted string of hex digits")?;
            let digits = hex.as_bytes();
            if digits.len() % 2 != 0 {
                return err(hcol, "binding data needs two hex digits per byte");
            }
            let nibble = |d: u8| (d as char).to_digit(16).map(|v| v as u8);
            let mut bytes = Vec::with_capacity(digits.len() / 2);
            for pair in digits.chunks_exact(2) {
                match (nibble(pair[0]), nibble(pair[1])) {
                    (Some(h), Some(l)) => bytes.push(h << 4 | l),
                    _ => return err(hcol, "binding data holds only hex digits"),
                }
            }
            Stmt::BinData(bytes)
        }
        _ => return err(col, format!("unknown directive `{d}`")),
    })
}

// ---------------------------------------------------------------------------
// Assembler
// ---------------------------------------------------------------------------

struct Assembler<'a> {
    file: String,
    base_dir: Option<&'a Path>,
}

/// A tile-scoped part of the source: the lines after one `.tile`.
struct Block {
    tiles: Vec<u32>,
    lines: Vec<usize>,
}

struct ExchangeSrc {
    id: (Expr, usize, usize),
    name: String,
}

struct BindingSrc {
    line: usize,
    col: usize,
    kind: BindingKind,
    name: String,
    bytes: Expr,
    slices: Vec<(usize, usize, Stmt)>,
    data: Vec<u8>,
}

/// The laid-out image of a group of tiles, and its symbol table.
struct GroupImage {
    segments: Vec<Segment>,
    entry: u32,
    symbols: Vec<Symbol>,
    table: HashMap<String, u32>,
}

type Res<T> = Result<T, AsmError>;

impl<'a> Assembler<'a> {
    fn new(file: &str, base_dir: Option<&'a Path>) -> Self {
        Assembler {
            file: file.to_string(),
            base_dir,
        }
    }

    fn diag(&self, line: usize, col: usize, message: impl Into<String>) -> AsmError {
        AsmError {
            diagnostics: vec![Diagnostic {
                file: self.file.clone(),
                line,
                col: if line == 0 { 0 } else { col + 1 },
                message: message.into(),
            }],
        }
    }

    fn at(&self, line: usize) -> impl Fn(SyntaxError) -> AsmError + '_ {
        move |e| self.diag(line, e.col, e.message)
    }

    fn run(&self, source: &str) -> Res<Package> {
        let mut lines = Vec::new();
        let mut diagnostics = Vec::new();
        for (i, text) in source.lines().enumerate() {
            match parse_line(text, i + 1) {
                Ok(l) => lines.push(l),
                Err(e) => {
                    if diagnostics.len() < MAX_DIAGNOSTICS {
                        diagnostics.extend(self.diag(i + 1, e.col, e.message).diagnostics);
                    }
                }
            }
        }
        if !diagnostics.is_empty() {
            return Err(AsmError { diagnostics });
        }

        // Whole-package directives and the tile blocks.
        let mut machine: Option<Machine> = None;
        let mut blocks: Vec<Block> = Vec::new();
        let mut exchanges: Vec<ExchangeSrc> = Vec::new();
        let mut bindings: Vec<BindingSrc> = Vec::new();
        for (idx, l) in lines.iter().enumerate() {
            let scoped =
                !l.labels.is_empty() || l.stmt.as_ref().is_some_and(|(s, _)| s.is_tile_scoped());
            if scoped {
                match blocks.last_mut() {
                    Some(b) => b.lines.push(idx),
                    None => {
                        let col = l
                            .labels
                            .first()
                            .map_or_else(|| l.stmt.as_ref().map_or(0, |(_, c)| *c), |(_, c)| *c);
                        return Err(self.diag(
                            l.line,
                            col,
                            "no tile selected: write `.tile N` (or `.tile all`) first",
                        ));
                    }
                }
            }
            let Some((stmt, col)) = &l.stmt else { continue };
            let col = *col;
            match stmt {
                Stmt::Machine(name) => {
                    if machine.is_some() || !blocks.is_empty() {
                        return Err(self.diag(
                            l.line,
                            col,
                            "`.machine` must appear once, before any `.tile`",
                        ));
                    }
                    machine = Some(
                        self.load_machine(name)
                            .map_err(|m| self.diag(l.line, col, m))?,
                    );
                }
                Stmt::Tiles(n) => {
                    let Some(m) = machine.as_mut() else {
                        return Err(self.diag(l.line, col, "`.tiles` must follow `.machine`"));
                    };
                    if !blocks.is_empty() {
                        return Err(self.diag(
                            l.line,
                            col,
                            "`.tiles` must come before any `.tile`",
                        ));
                    }
                    // The machine's own bound, checked before `.tile all` expands to
                    // one image per tile, not after the whole listing is laid out.
                    let max = tessera_machine::MAX_TILES;
                    if !(1..=max as i64).contains(n) {
                        return Err(self.diag(
                            l.line,
                            col,
                            format!("tile count {n} is out of range 1..={max}"),
                        ));
                    }
                    m.tiles = *n as u32;
                }
                Stmt::Tile(sel) => {
                    let Some(m) = machine.as_ref() else {
                        return Err(self.diag(
                            l.line,
                            col,
                            "`.machine` must come before the first `.tile`",
                        ));
                    };
                    let tiles = self.tile_set(sel, m, l.line)?;
                    blocks.push(Block {
                        tiles,
                        lines: Vec::new(),
                    });
                }
                Stmt::Exchange { id, id_col, name } => exchanges.push(ExchangeSrc {
                    id: (id.clone(), l.line, *id_col),
                    name: name.clone(),
                }),
                Stmt::Binding { kind, name, bytes } => bindings.push(BindingSrc {
                    line: l.line,
                    col,
                    kind: *kind,
                    name: name.clone(),
                    bytes: bytes.clone(),
                    slices: Vec::new(),
                    data: Vec::new(),
                }),
                Stmt::Slice { .. } => match bindings.last_mut() {
                    Some(b) => b.slices.push((l.line, col, stmt.clone())),
                    None => return Err(self.diag(l.line, col, "`.slice` outside a `.binding`")),
                },
                Stmt::BinData(bytes) => match bindings.last_mut() {
                    Some(b) => b.data.extend_from_slice(bytes),
                    None => {
                        return Err(self.diag(l.line, col, "`.bindata` outside a `.binding`"));
                    }
                },
                _ => {}
            }
        }
        let Some(machine) = machine else {
            return Err(self.diag(0, 0, "missing `.machine` directive (e.g. `.machine c600`)"));
        };

        // Tiles receiving the same blocks share one layout.
        let mut groups: BTreeMap<Vec<usize>, Vec<u32>> = BTreeMap::new();
        {
            let mut per_tile: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
            for (bi, b) in blocks.iter().enumerate() {
                for &t in &b.tiles {
                    per_tile.entry(t).or_default().push(bi);
                }
            }
            for (t, key) in per_tile {
                groups.entry(key).or_default().push(t);
            }
        }
        let several = groups.len() > 1;
        let mut images: Vec<GroupImage> = Vec::new();
        let mut tile_group: BTreeMap<u32, usize> = BTreeMap::new();
        for (key, tiles) in &groups {
            let src: Vec<&Line> = key
                .iter()
                .flat_map(|&bi| blocks[bi].lines.iter().map(|&i| &lines[i]))
                .collect();
            let image = self.assemble_tile(&machine, &src).map_err(|mut e| {
                if several {
                    for d in &mut e.diagnostics {
                        d.message
                            .push_str(&format!(" (assembling tile {})", tiles[0]));
                    }
                }
                e
            })?;
            for &t in tiles {
                tile_group.insert(t, images.len());
            }
            images.push(image);
        }
        let symbols_of = |tile: i64| -> Option<&HashMap<String, u32>> {
            let t = u32::try_from(tile).ok()?;
            tile_group.get(&t).map(|&g| &images[g].table)
        };
        let no_symbols = |_: &str| None;

        let eval_tile = |e: &Expr, line: usize| -> Res<i64> {
            let v = e.eval(&no_symbols).map_err(self.at(line))?;
            Ok(v)
        };
        let eval_on = |e: &Expr, tile: i64, line: usize| -> Res<i64> {
            let table = symbols_of(tile);
            let resolve = |s: &str| table.and_then(|t| t.get(s)).map(|&a| i64::from(a));
            e.eval(&resolve).map_err(|err| {
                let mut msg = err.message;
                if msg.starts_with("undefined symbol") {
                    msg.push_str(&format!(" on tile {tile}"));
                }
                self.diag(line, err.col, msg)
            })
        };
        let u32_of = |v: i64, line: usize, col: usize, what: &str| -> Res<u32> {
            u32::try_from(v)
                .map_err(|_| self.diag(line, col, format!("{what} {v} is out of range")))
        };

        let mut out_exchanges = Vec::new();
        for x in &exchanges {
            let (id_e, line, col) = &x.id;
            let id = eval_tile(id_e, *line)?;
            let id = u16::try_from(id).map_err(|_| {
                self.diag(
                    *line,
                    *col,
                    format!("exchange id {id} is out of range 0..=65535"),
                )
            })?;
            out_exchanges.push(ExchangeProgram {
                id,
                name: x.name.clone(),
            });
        }

        let mut out_bindings = Vec::new();
        for b in &bindings {
            let bytes = eval_tile(&b.bytes, b.line)?;
            let mut slices = Vec::new();
            for (line, col, s) in &b.slices {
                let Stmt::Slice {
                    tile,
                    addr,
                    offset,
                    bytes,
                } = s
                else {
                    continue;
                };
                let t = eval_tile(tile, *line)?;
                let a = eval_on(addr, t, *line)?;
                slices.push(BindingSlice {
                    tile: u32_of(t, *line, *col, "tile")?,
                    tile_addr: u32_of(a, *line, *col, "address")?,
                    offset: u32_of(eval_on(offset, t, *line)?, *line, *col, "offset")?,
                    bytes: u32_of(eval_on(bytes, t, *line)?, *line, *col, "length")?,
                });
            }
            out_bindings.push(HostBinding {
                data: b.data.clone(),
                name: b.name.clone(),
                kind: b.kind,
                bytes: u32_of(bytes, b.line, b.col, "binding length")?,
                slices,
            });
        }

        let tiles = tile_group
            .iter()
            .map(|(&tile, &g)| {
                let img = &images[g];
                TileImage {
                    tile,
                    segments: img.segments.clone(),
                    entry: img.entry,
                    symbols: img.symbols.clone(),
                }
            })
            .collect();
        let package = Package {
            machine_toml: machine.to_toml(),
            tiles,
            exchanges: out_exchanges,
            bindings: out_bindings,
        };
        tessera_package::validate(&package).map_err(|e| self.diag(0, 0, e.to_string()))?;
        Ok(package)
    }

    fn load_machine(&self, name: &str) -> Result<Machine, String> {
        let resolved = match self.base_dir {
            Some(dir)
                if !tessera_machine::PRESETS.contains(&name) && Path::new(name).is_relative() =>
            {
                dir.join(name).display().to_string()
            }
            _ => name.to_string(),
        };
        Machine::load(&resolved).map_err(|e| {
            // A diagnostic is one line: the error with its causes (the OS error).
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                text += &format!(": {c}");
                cause = c.source();
            }
            text
        })
    }

    fn tile_set(&self, sel: &TileSel, m: &Machine, line: usize) -> Res<Vec<u32>> {
        match sel {
            TileSel::All => Ok((0..m.tiles).collect()),
            TileSel::List(items) => {
                let mut out = Vec::new();
                for &(lo, hi, col) in items {
                    if lo < 0 || hi < lo || hi >= i64::from(m.tiles) {
                        return Err(self.diag(
                            line,
                            col,
                            format!(
                                "tile range {lo}..={hi} is empty or outside 0..{} (machine `{}`)",
                                m.tiles, m.name
                            ),
                        ));
                    }
                    out.extend(lo as u32..=hi as u32);
                }
                out.sort_unstable();
                out.dedup();
                Ok(out)
            }
        }
    }

    /// Lays out and emits the lines of one group of tiles.
    fn assemble_tile(&self, m: &Machine, lines: &[&Line]) -> Res<GroupImage> {
        let layout = self.layout(m, lines)?;
        self.emit(m, lines, layout)
    }
}

// ---------------------------------------------------------------------------
// Layout and emission of one tile image
// ---------------------------------------------------------------------------

struct Sec {
    /// Ranges reserved by `.zero`/`.space`: zeros even in code, where other gaps
    /// (alignment, `.org`) are filled with `nop`.
    zeros: Vec<(u64, u64)>,
    name: String,
    addr: u32,
    perms: Perms,
    line: usize,
    col: usize,
    /// Next free address (u64: a section may end exactly at 2^32).
    pos: u64,
    data: Vec<u8>,
}

struct Label {
    name: String,
    addr: u32,
    sec: usize,
    line: usize,
    col: usize,
}

/// Where pass 1 put a line's content: section, address, and whether a `nop`
/// precedes a bundle to align it.
#[derive(Clone, Copy)]
struct Place {
    sec: usize,
    addr: u64,
    pad_nop: bool,
}

struct Layout {
    secs: Vec<Sec>,
    labels: Vec<Label>,
    index: HashMap<String, usize>,
    places: Vec<Option<Place>>,
    sizes: Vec<(usize, usize, String, Expr, Option<SymbolKind>)>,
    /// `.symbol NAME SIZE KIND ADDR`: line, column, name, size, kind, address.
    free: Vec<(usize, usize, String, Expr, SymbolKind, Expr)>,
    entry: Option<(usize, Expr)>,
}

const ADDR_LIMIT: u64 = 1 << 32;

impl Assembler<'_> {
    fn layout(&self, m: &Machine, lines: &[&Line]) -> Res<Layout> {
        let mut lay = Layout {
            secs: Vec::new(),
            labels: Vec::new(),
            index: HashMap::new(),
            places: vec![None; lines.len()],
            sizes: Vec::new(),
            free: Vec::new(),
            entry: None,
        };
        let mut cur: Option<usize> = None;
        let mut pending: Vec<(String, usize, usize)> = Vec::new();
        // The open repeat body: words left, and the `rpt` line.
        let mut body: Option<(u64, usize)> = None;

        fn bind(
            a: &Assembler,
            lay: &mut Layout,
            pending: &mut Vec<(String, usize, usize)>,
            cur: Option<usize>,
            addr: u64,
        ) -> Res<()> {
            for (name, line, col) in pending.drain(..) {
                let Some(sec) = cur else {
                    return Err(a.diag(
                        line,
                        col,
                        format!("label `{name}` is outside a section: write `.section` first"),
                    ));
                };
                if let Some(&prev) = lay.index.get(&name) {
                    return Err(a.diag(
                        line,
                        col,
                        format!(
                            "label `{name}` is already defined (line {})",
                            lay.labels[prev].line
                        ),
                    ));
                }
                lay.index.insert(name.clone(), lay.labels.len());
                lay.labels.push(Label {
                    name,
                    addr: addr as u32,
                    sec,
                    line,
                    col,
                });
            }
            Ok(())
        }

        for (li, l) in lines.iter().enumerate() {
            pending.extend(l.labels.iter().map(|(n, c)| (n.clone(), l.line, *c)));
            let Some((stmt, col)) = &l.stmt else { continue };
            let (line, col) = (l.line, *col);
            let known = |lay: &Layout, e: &Expr| -> Res<i64> {
                e.eval(&|s| lay.index.get(s).map(|&i| i64::from(lay.labels[i].addr)))
                    .map_err(|err| {
                        self.diag(
                            line,
                            err.col,
                            format!(
                                "{} (only constants and labels defined earlier are allowed here)",
                                err.message
                            ),
                        )
                    })
            };
            let need_sec = |cur: Option<usize>| -> Res<usize> {
                cur.ok_or_else(|| self.diag(line, col, "no section: write `.section` first"))
            };
            match stmt {
                Stmt::Section { name, start } => {
                    if let Some(c) = cur {
                        let at = lay.secs[c].pos;
                        bind(self, &mut lay, &mut pending, Some(c), at)?;
                    }
                    let existing = lay.secs.iter().position(|s| &s.name == name);
                    match (start, existing) {
                        (None, Some(i)) => cur = Some(i),
                        (None, None) => {
                            return Err(self.diag(
                                line,
                                col,
                                format!(
                                    "unknown section `{name}`: give an address and permissions to open it"
                                ),
                            ));
                        }
                        (Some(_), Some(i)) => {
                            return Err(self.diag(
                                line,
                                col,
                                format!(
                                    "section `{name}` is already open on this tile (line {}); write `.section {name}` to continue it",
                                    lay.secs[i].line
                                ),
                            ));
                        }
                        (Some((addr, perms)), None) => {
                            let a = known(&lay, addr)?;
                            let a = u32::try_from(a).map_err(|_| {
                                self.diag(line, col, format!("section address {a} is out of range"))
                            })?;
                            cur = Some(lay.secs.len());
                            lay.secs.push(Sec {
                                name: name.clone(),
                                addr: a,
                                perms: *perms,
                                line,
                                col,
                                pos: u64::from(a),
                                data: Vec::new(),
                                zeros: Vec::new(),
                            });
                        }
                    }
                }
                Stmt::Org(e) => {
                    let s = need_sec(cur)?;
                    let v = known(&lay, e)?;
                    let sec = &mut lay.secs[s];
                    if v < 0 || (v as u64) < sec.pos || v as u64 > ADDR_LIMIT {
                        return Err(self.diag(
                            line,
                            col,
                            format!(
                                "`.org {v:#x}` would move backwards (section `{}` is at {:#x})",
                                sec.name, sec.pos
                            ),
                        ));
                    }
                    sec.pos = v as u64;
                }
                Stmt::Align(e) => {
                    let s = need_sec(cur)?;
                    let v = known(&lay, e)?;
                    if !(1..=1 << 16).contains(&v) || (v & (v - 1)) != 0 {
                        return Err(self.diag(
                            line,
                            col,
                            format!("alignment {v} is not a power of two in 1..=65536"),
                        ));
                    }
                    let sec = &mut lay.secs[s];
                    sec.pos = sec.pos.div_ceil(v as u64) * v as u64;
                }
                Stmt::Zero(e) => {
                    let s = need_sec(cur)?;
                    let v = known(&lay, e)?;
                    if v < 0 {
                        return Err(self.diag(line, col, format!("negative size {v}")));
                    }
                    // Reserved space is content: a label before it names it.
                    let at = lay.secs[s].pos;
                    bind(self, &mut lay, &mut pending, Some(s), at)?;
                    let end = at.saturating_add(v as u64);
                    if end > ADDR_LIMIT {
                        return Err(self.diag(line, col, "section runs past the address space"));
                    }
                    lay.secs[s].zeros.push((at, end));
                    lay.secs[s].pos = end;
                }
                Stmt::Data { .. } | Stmt::Float { .. } | Stmt::Word(_) => {
                    let s = need_sec(cur)?;
                    let sec = &mut lay.secs[s];
                    let mut pad_nop = false;
                    let size = match stmt {
                        Stmt::Data { width, items } => u64::from(*width) * items.len() as u64,
                        Stmt::Float { half, items } => {
                            (if *half { 2 } else { 4 }) * items.len() as u64
                        }
                        Stmt::Word(w) => {
                            if !sec.perms.execute {
                                return Err(self.diag(
                                    line,
                                    col,
                                    format!(
                                        "instruction in section `{}`, which is not executable (permissions need `x`)",
                                        sec.name
                                    ),
                                ));
                            }
                            if !sec.pos.is_multiple_of(4) {
                                return Err(self.diag(
                                    line,
                                    col,
                                    format!(
                                        "instruction at {:#x} is not 4-byte aligned (use `.align 4`)",
                                        sec.pos
                                    ),
                                ));
                            }
                            let bundle = matches!(w, WordStmt::Bundle(..));
                            if bundle && !sec.pos.is_multiple_of(8) {
                                if let Some((_, rpt_line)) = body {
                                    return Err(self.diag(
                                        line,
                                        col,
                                        format!(
                                            "bundle at {:#x} is not 8-byte aligned inside the repeat body of the `rpt` on line {rpt_line}, and an alignment `nop` there would change the body: arrange the body so its bundles fall on 8-byte boundaries",
                                            sec.pos
                                        ),
                                    ));
                                }
                                pad_nop = true;
                                sec.pos += 4;
                            }
                            if let Some((left, _)) = body.as_mut() {
                                *left = left.saturating_sub(stmt_words(w));
                            }
                            if body.is_some_and(|(left, _)| left == 0) {
                                body = None;
                            }
                            if let Some(n) = rpt_body(w) {
                                // A body that opens with a bundle starts 8-byte
                                // aligned: the padding goes before the `rpt`.
                                if next_is_bundle(&lines[li + 1..]) && sec.pos.is_multiple_of(8) {
                                    pad_nop = true;
                                    sec.pos += 4;
                                }
                                body = Some((n, line));
                            }
                            u64::from(w.size())
                        }
                        _ => 0,
                    };
                    let at = sec.pos;
                    bind(self, &mut lay, &mut pending, Some(s), at)?;
                    let sec = &mut lay.secs[s];
                    sec.pos = at + size;
                    if sec.pos > ADDR_LIMIT {
                        return Err(self.diag(line, col, "section runs past the address space"));
                    }
                    lay.places[li] = Some(Place {
                        sec: s,
                        addr: if pad_nop { at - 4 } else { at },
                        pad_nop,
                    });
                }
                Stmt::Symbol {
                    name,
                    size,
                    kind,
                    addr: Some(addr),
                } => {
                    // The parser takes an address only after a kind.
                    let kind = kind.unwrap_or(SymbolKind::Data);
                    lay.free
                        .push((line, col, name.clone(), size.clone(), kind, addr.clone()));
                }
                Stmt::Symbol {
                    name,
                    size,
                    kind,
                    addr: None,
                } => {
                    lay.sizes
                        .push((line, col, name.clone(), size.clone(), *kind));
                }
                Stmt::Entry(e) => {
                    if let Some((prev, _)) = &lay.entry {
                        return Err(self.diag(
                            line,
                            col,
                            format!("second `.entry` for this tile (first on line {prev})"),
                        ));
                    }
                    lay.entry = Some((line, e.clone()));
                }
                _ => {}
            }
        }
        if !pending.is_empty() {
            let at = cur.map_or(0, |c| lay.secs[c].pos);

            bind(self, &mut lay, &mut pending, cur, at)?;
        }
        self.check_sections(m, &lay.secs)?;
        Ok(lay)
    }

    fn check_sections(&self, m: &Machine, secs: &[Sec]) -> Res<()> {
        for s in secs {
            let end = s.pos;
            let range = format!("[{:#x}, {end:#x})", s.addr);
            if end == u64::from(s.addr) {
                return Err(self.diag(s.line, s.col, format!("section `{}` is empty", s.name)));
            }
            if s.addr < m.sram_start() || end > u64::from(m.sram_end()) {
                return Err(self.diag(
                    s.line,
                    s.col,
                    format!(
                        "section `{}` {range} lies outside tile SRAM [{:#x}, {:#x})",
                        s.name,
                        m.sram_start(),
                        m.sram_end()
                    ),
                ));
            }
            if s.perms.execute {
                let bad = m
                    .regions
                    .iter()
                    .find(|r| !r.executable && u64::from(r.start) < end && s.addr < r.end);
                if let Some(r) = bad {
                    return Err(self.diag(
                        s.line,
                        s.col,
                        format!(
                            "executable section `{}` {range} reaches the non-executable region [{:#x}, {:#x})",
                            s.name, r.start, r.end
                        ),
                    ));
                }
            }
        }
        let mut order: Vec<&Sec> = secs.iter().collect();
        order.sort_by_key(|s| s.addr);
        for w in order.windows(2) {
            if w[0].pos > u64::from(w[1].addr) {
                let (first, second) = if w[0].line <= w[1].line {
                    (w[0], w[1])
                } else {
                    (w[1], w[0])
                };
                return Err(self.diag(
                    second.line,
                    second.col,
                    format!(
                        "section `{}` [{:#x}, {:#x}) overlaps section `{}` [{:#x}, {:#x}) (line {})",
                        second.name,
                        second.addr,
                        second.pos,
                        first.name,
                        first.addr,
                        first.pos,
                        first.line
                    ),
                ));
            }
        }
        Ok(())
    }

    fn emit(&self, m: &Machine, lines: &[&Line], mut lay: Layout) -> Res<GroupImage> {
        let table: HashMap<String, u32> = lay
            .labels
            .iter()
            .map(|l| (l.name.clone(), l.addr))
            .collect();
        let resolve = |s: &str| table.get(s).map(|&a| i64::from(a));
        let mut nop = Vec::new();
        encode_word(&Word::Single(Inst::Nop), &mut nop)
            .map_err(|e| self.diag(0, 0, format!("cannot encode nop: {e}")))?;

        for (li, l) in lines.iter().enumerate() {
            let (Some(place), Some((stmt, col))) = (lay.places[li], &l.stmt) else {
                continue;
            };
            let line = l.line;
            let mut bytes = Vec::new();
            if place.pad_nop {
                bytes.extend_from_slice(&nop);
            }
            match stmt {
                Stmt::Word(w) => {
                    let words = syntax::lower_word(w, &resolve).map_err(self.at(line))?;
                    for word in &words {
                        encode_word(word, &mut bytes)
                            .map_err(|e| self.diag(line, *col, e.to_string()))?;
                    }
                }
                Stmt::Data { width, items } => {
                    let (lo, hi) = match width {
                        1 => (-0x80, 0xff),
                        2 => (-0x8000, 0xffff),
                        _ => (-0x8000_0000, 0xffff_ffff),
                    };
                    for (e, icol) in items {
                        let v = e.eval(&resolve).map_err(self.at(line))?;
                        if !(lo..=hi).contains(&v) {
                            return Err(self.diag(
                                line,
                                *icol,
                                format!("value {v} does not fit {} bits", width * 8),
                            ));
                        }
                        bytes.extend_from_slice(&(v as u32).to_le_bytes()[..*width as usize]);
                    }
                }
                Stmt::Float { half, items } => {
                    for &v in items {
                        if *half {
                            bytes.extend_from_slice(&half::f16::from_f64(v).to_le_bytes());
                        } else {
                            bytes.extend_from_slice(&(v as f32).to_le_bytes());
                        }
                    }
                }
                _ => continue,
            }
            let sec = &mut lay.secs[place.sec];
            let rel = (place.addr - u64::from(sec.addr)) as usize;
            pad_to(sec, rel, &nop);
            sec.data.extend_from_slice(&bytes);
        }

        let mut segments: Vec<Segment> = lay
            .secs
            .iter()
            .map(|s| Segment {
                name: s.name.clone(),
                addr: s.addr,
                size: (s.pos - u64::from(s.addr)) as u32,
                bytes: s.data.clone(),
                perms: s.perms,
            })
            .collect();
        for (s, sec) in segments.iter().zip(&lay.secs) {
            let init_end = u64::from(s.addr) + s.bytes.len() as u64;
            if !s.bytes.is_empty() && init_end > u64::from(m.loader_limit) {
                return Err(self.diag(
                    sec.line,
                    sec.col,
                    format!(
                        "initialised contents of section `{}` end at {init_end:#x}, past the loader limit {:#x} (only `.zero`/`.space` may reach beyond it)",
                        s.name, m.loader_limit
                    ),
                ));
            }
        }
        segments.sort_by_key(|s| s.addr);

        // Symbol sizes: explicit, or up to the next label of the section.
        let mut explicit: HashMap<&str, (u32, Option<SymbolKind>)> = HashMap::new();
        for (line, col, name, size, kind) in &lay.sizes {
            if !lay.index.contains_key(name) {
                return Err(self.diag(
                    *line,
                    *col,
                    format!("`.symbol` names `{name}`, which is not a label on this tile"),
                ));
            }
            let v = size.eval(&resolve).map_err(self.at(*line))?;
            let v = u32::try_from(v)
                .map_err(|_| self.diag(*line, *col, format!("symbol size {v} is out of range")))?;
            explicit.insert(name, (v, *kind));
        }
        let mut symbols: Vec<(u32, usize, Symbol)> = Vec::new();
        for (i, l) in lay.labels.iter().enumerate() {
            let sec = &lay.secs[l.sec];
            let next = lay
                .labels
                .iter()
                .filter(|o| o.sec == l.sec && o.addr > l.addr)
                .map(|o| u64::from(o.addr))
                .min()
                .unwrap_or(sec.pos);
            let (size, kind) = explicit
                .get(l.name.as_str())
                .copied()
                .unwrap_or(((next - u64::from(l.addr)) as u32, None));
            let kind = kind.unwrap_or(if sec.perms.execute {
                SymbolKind::Code
            } else {
                SymbolKind::Data
            });
            if u64::from(l.addr) + u64::from(size) > u64::from(m.sram_end()) {
                return Err(self.diag(
                    l.line,
                    l.col,
                    format!("symbol `{}` of {size} bytes runs past tile SRAM", l.name),
                ));
            }
            symbols.push((
                l.addr,
                i,
                Symbol {
                    name: l.name.clone(),
                    addr: l.addr,
                    size,
                    kind,
                },
            ));
        }
        // Symbols outside sections follow the labels in definition order.
        let mut free_names: HashMap<&str, usize> = HashMap::new();
        for (j, (line, col, name, size, kind, addr)) in lay.free.iter().enumerate() {
            if let Some(l) = lay.index.get(name).map(|&i| &lay.labels[i]) {
                return Err(self.diag(
                    *line,
                    *col,
                    format!(
                        "symbol `{name}` is also a label on this tile (line {})",
                        l.line
                    ),
                ));
            }
            if let Some(prev) = free_names.insert(name, *line) {
                return Err(self.diag(
                    *line,
                    *col,
                    format!("symbol `{name}` is defined twice on this tile (line {prev})"),
                ));
            }
            let size = size.eval(&resolve).map_err(self.at(*line))?;
            let size = u32::try_from(size).map_err(|_| {
                self.diag(*line, *col, format!("symbol size {size} is out of range"))
            })?;
            let at = addr.eval(&resolve).map_err(self.at(*line))?;
            let at = u32::try_from(at)
                .ok()
                .filter(|&a| {
                    a >= m.sram_start() && u64::from(a) + u64::from(size) <= u64::from(m.sram_end())
                })
                .ok_or_else(|| {
                    self.diag(
                        *line,
                        *col,
                        format!(
                            "symbol `{name}` [{at:#x}, +{size}) lies outside tile SRAM [{:#x}, {:#x})",
                            m.sram_start(),
                            m.sram_end()
                        ),
                    )
                })?;
            symbols.push((
                at,
                lay.labels.len() + j,
                Symbol {
                    name: name.clone(),
                    addr: at,
                    size,
                    kind: *kind,
                },
            ));
        }
        symbols.sort_by_key(|(a, i, _)| (*a, *i));

        let entry = match &lay.entry {
            Some((line, e)) => {
                let v = e.eval(&resolve).map_err(self.at(*line))?;
                let ok = u32::try_from(v).ok().filter(|&a| {
                    a % 4 == 0
                        && segments.iter().any(|s| {
                            s.perms.execute
                                && s.addr <= a
                                && u64::from(a) + 4 <= u64::from(s.addr) + u64::from(s.size)
                        })
                });
                ok.ok_or_else(|| {
                    self.diag(
                        *line,
                        0,
                        format!(
                            "entry point {v:#x} is not a 4-byte aligned address inside an executable section"
                        ),
                    )
                })?
            }
            None => match lay.secs.iter().find(|s| s.perms.execute) {
                Some(s) => s.addr,
                None => {
                    let line = lines.first().map_or(0, |l| l.line);
                    return Err(self.diag(
                        line,
                        0,
                        "this tile has no executable section: every tile image needs code to enter",
                    ));
                }
            },
        };
        Ok(GroupImage {
            segments,
            entry,
            symbols: symbols.into_iter().map(|(_, _, s)| s).collect(),
            table,
        })
    }
}

/// Words a statement issues (a bundle is one slot, `li` three).
fn stmt_words(w: &WordStmt) -> u64 {
    match w {
        WordStmt::Single(s) => syntax::expansion_len(s) as u64,
        WordStmt::Bundle(..) => 1,
    }
}

/// The body length of a `rpt`, when it is a plain number.
fn rpt_body(w: &WordStmt) -> Option<u64> {
    let WordStmt::Single(s) = w else { return None };
    if s.mnemonic != "rpt" {
        return None;
    }
    match s.operands.get(1) {
        Some((syntax::Operand::Expr(e), _)) => e
            .eval(&|_| None)
            .ok()
            .and_then(|v| u64::try_from(v).ok())
            .filter(|&v| v > 0),
        _ => None,
    }
}

/// Whether the next statement with content is a bundle.
fn next_is_bundle(lines: &[&Line]) -> bool {
    lines
        .iter()
        .find_map(|l| l.stmt.as_ref())
        .is_some_and(|(s, _)| matches!(s, Stmt::Word(WordStmt::Bundle(..))))
}

/// Fills a section's contents up to `rel` bytes: with `nop` words where an
/// executable section has whole aligned words to fill outside `.zero` ranges, so
/// that padding stays executable; with zeros otherwise.
fn pad_to(sec: &mut Sec, rel: usize, nop: &[u8]) {
    while sec.data.len() < rel {
        let addr = u64::from(sec.addr) + sec.data.len() as u64;
        let reserved = sec.zeros.iter().any(|&(a, b)| a < addr + 4 && addr < b);
        if sec.perms.execute && addr.is_multiple_of(4) && rel - sec.data.len() >= 4 && !reserved {
            sec.data.extend_from_slice(nop);
        } else {
            sec.data.push(0);
        }
    }
}
