//! The text syntax of one instruction or bundle (specified in `docs/asm.md`): a
//! lexer shared with the file assembler, operand parsing, and `Display` for
//! [`Inst`] and [`Word`]. Whatever `Display` prints, [`parse_word`] accepts and turns
//! back into the same value; the disassembler relies on that.

use crate::encode::validate_word;
use crate::inst::*;
use std::fmt;

/// A syntax or range error at a column (0-based byte offset) of the parsed text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    pub col: usize,
    pub message: String,
}

impl fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "column {}: {}", self.col + 1, self.message)
    }
}

impl std::error::Error for SyntaxError {}

pub(crate) fn err<T>(col: usize, message: impl Into<String>) -> Result<T, SyntaxError> {
    Err(SyntaxError {
        col,
        message: message.into(),
    })
}

// ---------------------------------------------------------------------------
// Lexer
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    /// Identifier, directive (`.word`) or mnemonic.
    Ident(String),
    /// A quoted name (`"weights.fc1 [0]"`), for symbols that are not identifiers.
    Str(String),
    Int(i64),
    Float(f64),
    M(u8),
    /// `$aN` (`last == first`), `$aN:M`.
    A {
        first: u8,
        last: u8,
    },
    Comma,
    Colon,
    Semi,
    Plus,
    Minus,
    PlusEq,
    LBrace,
    RBrace,
    LParen,
    RParen,
    Arrow,
    DotDot,
    DotDotEq,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Token {
    pub tok: Tok,
    pub col: usize,
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}
fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'.'
}

/// Whether `s` can be written bare (otherwise it must be quoted).
pub(crate) fn is_plain_ident(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty() && is_ident_start(b[0]) && b.iter().all(|&c| is_ident_char(c))
}

/// Prints a name bare when possible, quoted otherwise.
pub(crate) fn quote_name(s: &str) -> String {
    if is_plain_ident(s) {
        s.to_string()
    } else {
        let mut out = String::from("\"");
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }
}

/// Splits one line into tokens; a `#` or `//` outside a string ends the line.
pub(crate) fn lex(line: &str) -> Result<Vec<Token>, SyntaxError> {
    let b = line.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        let simple = |t| Token { tok: t, col: start };
        match c {
            b' ' | b'\t' | b'\r' => i += 1,
            b'#' => break,
            b'/' if b.get(i + 1) == Some(&b'/') => break,
            b',' => {
                out.push(simple(Tok::Comma));
                i += 1
            }
            b':' => {
                out.push(simple(Tok::Colon));
                i += 1
            }
            b';' => {
                out.push(simple(Tok::Semi));
                i += 1
            }
            b'{' => {
                out.push(simple(Tok::LBrace));
                i += 1
            }
            b'}' => {
                out.push(simple(Tok::RBrace));
                i += 1
            }
            b'(' => {
                out.push(simple(Tok::LParen));
                i += 1
            }
            b')' => {
                out.push(simple(Tok::RParen));
                i += 1
            }
            b'+' if b.get(i + 1) == Some(&b'=') => {
                out.push(simple(Tok::PlusEq));
                i += 2
            }
            b'+' => {
                out.push(simple(Tok::Plus));
                i += 1
            }
            b'-' if b.get(i + 1) == Some(&b'>') => {
                out.push(simple(Tok::Arrow));
                i += 2
            }
            b'-' => {
                out.push(simple(Tok::Minus));
                i += 1
            }
            b'.' if b.get(i + 1) == Some(&b'.') => {
                if b.get(i + 2) == Some(&b'=') {
                    out.push(simple(Tok::DotDotEq));
                    i += 3
                } else {
                    out.push(simple(Tok::DotDot));
                    i += 2
                }
            }
            b'"' => {
                let mut s = String::new();
                i += 1;
                loop {
                    match line[i..].chars().next() {
                        None => return err(start, "unterminated string"),
                        Some('"') => {
                            i += 1;
                            break;
                        }
                        Some('\\') => {
                            match line[i + 1..].chars().next() {
                                Some('"') => s.push('"'),
                                Some('\\') => s.push('\\'),
                                Some('n') => s.push('\n'),
                                _ => return err(i, "unknown escape (use \\\" \\\\ or \\n)"),
                            }
                            i += 2;
                        }
                        Some(ch) => {
                            s.push(ch);
                            i += ch.len_utf8();
                        }
                    }
                }
                out.push(simple(Tok::Str(s)));
            }
            b'$' => {
                i += 1;
                while i < b.len() && b[i].is_ascii_alphanumeric() {
                    i += 1;
                }
                let name = &line[start + 1..i];
                let tok = if name == "mzero" {
                    Tok::M(15)
                } else if name == "azero" {
                    Tok::A {
                        first: 15,
                        last: 15,
                    }
                } else if let Some(n) = name.strip_prefix('m').and_then(reg_num) {
                    Tok::M(n)
                } else if let Some(n) = name.strip_prefix('a').and_then(reg_num) {
                    let mut last = n;
                    if b.get(i) == Some(&b':') && b.get(i + 1).is_some_and(u8::is_ascii_digit) {
                        let s = i + 1;
                        i += 1;
                        while i < b.len() && b[i].is_ascii_digit() {
                            i += 1;
                        }
                        match reg_num(&line[s..i]) {
                            Some(l) => last = l,
                            None => return err(s, format!("bad register `{}`", &line[start..i])),
                        }
                    }
                    Tok::A { first: n, last }
                } else {
                    return err(
                        start,
                        format!(
                            "bad register `{}` (expected $m0..$m15, $mzero, $a0..$a15, $azero)",
                            &line[start..i]
                        ),
                    );
                };
                out.push(simple(tok));
            }
            c if c.is_ascii_digit() => {
                i += 1;
                let hex_or_bin = c == b'0' && matches!(b.get(i), Some(b'x' | b'X' | b'b' | b'B'));
                while i < b.len() {
                    let d = b[i];
                    let next_digit = b.get(i + 1).is_some_and(u8::is_ascii_digit);
                    if d.is_ascii_alphanumeric() || d == b'_' {
                        // A decimal exponent may carry a sign.
                        if !hex_or_bin
                            && (d == b'e' || d == b'E')
                            && matches!(b.get(i + 1), Some(b'+' | b'-'))
                        {
                            i += 2;
                        } else {
                            i += 1;
                        }
                    } else if d == b'.' && !hex_or_bin && next_digit {
                        i += 1;
                    } else {
                        break;
                    }
                }
                out.push(simple(number(&line[start..i], start)?));
            }
            b'.' if b.get(i + 1).copied().is_some_and(is_ident_start) => {
                i += 1;
                while i < b.len() && is_ident_char(b[i]) {
                    i += 1;
                }
                out.push(simple(Tok::Ident(line[start..i].to_string())));
            }
            c if is_ident_start(c) => {
                while i < b.len() && is_ident_char(b[i]) {
                    i += 1;
                }
                out.push(simple(Tok::Ident(line[start..i].to_string())));
            }
            _ => {
                let ch = line[i..].chars().next().unwrap_or('?');
                return err(start, format!("unexpected character `{ch}`"));
            }
        }
    }
    Ok(out)
}

fn reg_num(s: &str) -> Option<u8> {
    // No leading zeros, so that every register has one spelling.
    if s.is_empty() || s.len() > 2 || (s.len() == 2 && s.starts_with('0')) {
        return None;
    }
    let n: u8 = s.parse().ok()?;
    (n < 16).then_some(n)
}

fn number(text: &str, col: usize) -> Result<Tok, SyntaxError> {
    let clean: String = text.chars().filter(|&c| c != '_').collect();
    let lower = clean.to_ascii_lowercase();
    let parsed = if let Some(h) = lower.strip_prefix("0x") {
        i64::from_str_radix(h, 16).ok().map(Tok::Int)
    } else if let Some(bin) = lower.strip_prefix("0b") {
        i64::from_str_radix(bin, 2).ok().map(Tok::Int)
    } else if lower.contains(['.', 'e']) {
        lower.parse::<f64>().ok().map(Tok::Float)
    } else {
        lower.parse::<i64>().ok().map(Tok::Int)
    };
    match parsed {
        Some(t) => Ok(t),
        None => err(col, format!("bad number `{text}`")),
    }
}

// ---------------------------------------------------------------------------
// Expressions
// ---------------------------------------------------------------------------

/// An integer expression: numbers and symbols combined with `+`, `-` and
/// parentheses. Symbols resolve late, so an expression may name a later label.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Expr {
    Num(i64),
    Sym(String, usize),
    Neg(Box<Expr>),
    Add(Box<Expr>, Box<Expr>),
    Sub(Box<Expr>, Box<Expr>),
}

impl Expr {
    pub fn eval(&self, resolve: &dyn Fn(&str) -> Option<i64>) -> Result<i64, SyntaxError> {
        Ok(match self {
            Expr::Num(n) => *n,
            Expr::Sym(s, col) => match resolve(s) {
                Some(v) => v,
                None => return err(*col, format!("undefined symbol `{s}`")),
            },
            Expr::Neg(e) => e.eval(resolve)?.wrapping_neg(),
            Expr::Add(a, b) => a.eval(resolve)?.wrapping_add(b.eval(resolve)?),
            Expr::Sub(a, b) => a.eval(resolve)?.wrapping_sub(b.eval(resolve)?),
        })
    }
}

/// A cursor over the tokens of one line.
pub(crate) struct Cursor<'a> {
    pub toks: &'a [Token],
    pub pos: usize,
    /// Column reported for "missing operand" errors at the end of the line.
    pub end_col: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(toks: &'a [Token], end_col: usize) -> Self {
        Cursor {
            toks,
            pos: 0,
            end_col,
        }
    }
    pub fn peek(&self) -> Option<&'a Tok> {
        self.toks.get(self.pos).map(|t| &t.tok)
    }
    pub fn col(&self) -> usize {
        self.toks.get(self.pos).map_or(self.end_col, |t| t.col)
    }
    pub fn next(&mut self) -> Option<&'a Token> {
        let t = self.toks.get(self.pos);
        if t.is_some() {
            self.pos += 1;
        }
        t
    }
    pub fn at_end(&self) -> bool {
        self.pos >= self.toks.len()
    }
    pub fn eat(&mut self, t: &Tok) -> bool {
        if self.peek() == Some(t) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    pub fn expect(&mut self, t: &Tok, what: &str) -> Result<(), SyntaxError> {
        if self.eat(t) {
            Ok(())
        } else {
            err(self.col(), format!("expected {what}"))
        }
    }
    pub fn expect_end(&self) -> Result<(), SyntaxError> {
        if self.at_end() {
            Ok(())
        } else {
            err(self.col(), "unexpected text after the operands")
        }
    }
    /// An identifier or quoted name.
    pub fn name(&mut self, what: &str) -> Result<(String, usize), SyntaxError> {
        let col = self.col();
        match self.peek() {
            Some(Tok::Ident(s)) | Some(Tok::Str(s)) => {
                self.pos += 1;
                Ok((s.clone(), col))
            }
            _ => err(col, format!("expected {what}")),
        }
    }
    pub fn expr(&mut self) -> Result<Expr, SyntaxError> {
        let mut e = self.term()?;
        loop {
            if self.eat(&Tok::Plus) {
                e = Expr::Add(Box::new(e), Box::new(self.term()?));
            } else if self.eat(&Tok::Minus) {
                e = Expr::Sub(Box::new(e), Box::new(self.term()?));
            } else {
                return Ok(e);
            }
        }
    }
    fn term(&mut self) -> Result<Expr, SyntaxError> {
        let col = self.col();
        match self.next().map(|t| &t.tok) {
            Some(Tok::Int(n)) => Ok(Expr::Num(*n)),
            Some(Tok::Ident(s)) | Some(Tok::Str(s)) => Ok(Expr::Sym(s.clone(), col)),
            Some(Tok::Minus) => Ok(Expr::Neg(Box::new(self.term()?))),
            Some(Tok::Plus) => self.term(),
            Some(Tok::LParen) => {
                let e = self.expr()?;
                self.expect(&Tok::RParen, "`)`")?;
                Ok(e)
            }
            Some(Tok::Float(_)) => err(col, "expected an integer, found a floating-point number"),
            _ => err(col, "expected a number or a symbol"),
        }
    }
}

// ---------------------------------------------------------------------------
// Instruction statements
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Operand {
    M(u8),
    /// `$mN+=`: a post-incremented pointer.
    MInc(u8),
    /// `$mN+=$mS`: a pointer advanced by the stride register `$mS` (8-byte units).
    MStride(u8, u8),
    A {
        first: u8,
        last: u8,
    },
    Expr(Expr),
    Word(String),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct InstStmt {
    pub mnemonic: String,
    pub col: usize,
    pub operands: Vec<(Operand, usize)>,
}

/// One instruction line: a single instruction (or pseudo-instruction) or a bundle.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum WordStmt {
    Single(InstStmt),
    Bundle(InstStmt, InstStmt, usize),
}

/// Words a pseudo-instruction expands to; 1 for real instructions.
pub(crate) fn expansion_len(s: &InstStmt) -> usize {
    if s.mnemonic == "li" { 3 } else { 1 }
}

impl WordStmt {
    /// Encoded size in bytes, not counting a `nop` inserted to align a bundle.
    pub fn size(&self) -> u32 {
        match self {
            WordStmt::Single(s) => 4 * expansion_len(s) as u32,
            WordStmt::Bundle(..) => 8,
        }
    }
}

fn inst_stmt(c: &mut Cursor) -> Result<InstStmt, SyntaxError> {
    let (mnemonic, col) = match c.next() {
        Some(Token {
            tok: Tok::Ident(s),
            col,
        }) => (s.to_ascii_lowercase(), *col),
        Some(t) => return err(t.col, "expected an instruction mnemonic"),
        None => return err(c.end_col, "expected an instruction"),
    };
    if !known_mnemonic(&mnemonic) {
        return err(col, format!("unknown mnemonic `{mnemonic}`"));
    }
    let mut operands = Vec::new();
    let stop = |t: Option<&Tok>| matches!(t, None | Some(Tok::Semi) | Some(Tok::RBrace));
    if !stop(c.peek()) {
        loop {
            let ocol = c.col();
            let op = match c.peek() {
                Some(Tok::M(n)) => {
                    c.pos += 1;
                    if c.eat(&Tok::PlusEq) {
                        match c.peek() {
                            Some(Tok::M(r)) => {
                                let r = *r;
                                c.pos += 1;
                                Operand::MStride(*n, r)
                            }
                            _ => Operand::MInc(*n),
                        }
                    } else {
                        Operand::M(*n)
                    }
                }
                Some(Tok::A { first, last }) => {
                    c.pos += 1;
                    Operand::A {
                        first: *first,
                        last: *last,
                    }
                }
                // Bare words for `sync local`; symbols otherwise (decided by the
                // instruction, which knows what it expects).
                Some(Tok::Ident(s))
                    if !matches!(
                        c.toks.get(c.pos + 1).map(|t| &t.tok),
                        Some(Tok::Plus | Tok::Minus)
                    ) =>
                {
                    c.pos += 1;
                    Operand::Word(s.clone())
                }
                _ => Operand::Expr(c.expr()?),
            };
            operands.push((op, ocol));
            if !c.eat(&Tok::Comma) {
                break;
            }
        }
    }
    if !stop(c.peek()) {
        return err(c.col(), "expected `,` or the end of the instruction");
    }
    Ok(InstStmt {
        mnemonic,
        col,
        operands,
    })
}

/// Parses an instruction or bundle from the cursor up to the end of the line.
pub(crate) fn word_stmt(c: &mut Cursor) -> Result<WordStmt, SyntaxError> {
    if let Some(Tok::LBrace) = c.peek() {
        let col = c.col();
        c.pos += 1;
        let a = inst_stmt(c)?;
        c.expect(&Tok::Semi, "`;` between the two instructions of a bundle")?;
        let b = inst_stmt(c)?;
        c.expect(&Tok::RBrace, "`}` closing the bundle")?;
        c.expect_end()?;
        for s in [&a, &b] {
            if expansion_len(s) != 1 {
                return err(s.col, "a pseudo-instruction cannot be part of a bundle");
            }
        }
        return Ok(WordStmt::Bundle(a, b, col));
    }
    let s = inst_stmt(c)?;
    if c.peek() == Some(&Tok::Semi) {
        return err(
            c.col(),
            "`;` separates the instructions of a bundle: write `{ main ; aux }`",
        );
    }
    c.expect_end()?;
    Ok(WordStmt::Single(s))
}

/// Operand access with checks and positioned errors.
struct Ops<'a> {
    s: &'a InstStmt,
    resolve: &'a dyn Fn(&str) -> Option<i64>,
}

impl Ops<'_> {
    fn count(&self, n: usize, form: &str) -> Result<(), SyntaxError> {
        if self.s.operands.len() == n {
            Ok(())
        } else {
            err(
                self.s.col,
                format!(
                    "`{}` takes {n} operand{} ({form}), found {}",
                    self.s.mnemonic,
                    if n == 1 { "" } else { "s" },
                    self.s.operands.len()
                ),
            )
        }
    }
    fn get(&self, i: usize) -> (&Operand, usize) {
        let (o, c) = &self.s.operands[i];
        (o, *c)
    }
    fn m(&self, i: usize) -> Result<MReg, SyntaxError> {
        match self.get(i) {
            (Operand::M(n), _) => Ok(MReg(*n)),
            (Operand::MInc(_), c) => err(c, "this operand is not post-incremented: remove `+=`"),
            (_, c) => err(c, "expected an $m register"),
        }
    }
    /// A pointer operand that may carry a stride: `$mN+=` or `$mN+=$mS`.
    fn mstride(&self, i: usize) -> Result<(MReg, Option<MReg>), SyntaxError> {
        match self.get(i) {
            (Operand::MStride(n, r), _) => Ok((MReg(*n), Some(MReg(*r)))),
            _ => Ok((self.minc(i)?, None)),
        }
    }
    fn minc(&self, i: usize) -> Result<MReg, SyntaxError> {
        match self.get(i) {
            (Operand::MInc(n), _) => Ok(MReg(*n)),
            (Operand::MStride(..), c) => err(c, "this pointer takes no stride register"),
            (Operand::M(_), c) => err(c, "expected a post-incremented pointer `$mN+=`"),
            (_, c) => err(c, "expected a post-incremented pointer `$mN+=`"),
        }
    }
    fn a(&self, i: usize) -> Result<AReg, SyntaxError> {
        match self.get(i) {
            (Operand::A { first, last }, _) if first == last => Ok(AReg(*first)),
            (Operand::A { .. }, c) => err(c, "expected a single $a register, found a range"),
            (_, c) => err(c, "expected an $a register"),
        }
    }
    fn pair(&self, i: usize) -> Result<AReg, SyntaxError> {
        match self.get(i) {
            (Operand::A { first, last }, _) if first % 2 == 0 && *last == first + 1 => {
                Ok(AReg(*first))
            }
            (_, c) => err(c, "expected a register pair `$aN:N+1` with N even"),
        }
    }
    fn quad(&self, i: usize) -> Result<AReg, SyntaxError> {
        match self.get(i) {
            (Operand::A { first, last }, _) if first % 4 == 0 && *last == first + 3 => {
                Ok(AReg(*first))
            }
            (_, c) => err(
                c,
                "expected a register quad `$aN:N+3` with N a multiple of 4",
            ),
        }
    }
    fn a_vec(&self, i: usize, pair: bool) -> Result<AReg, SyntaxError> {
        if pair { self.pair(i) } else { self.a(i) }
    }
    fn is_pair(&self, i: usize) -> bool {
        matches!(self.get(i).0, Operand::A { first, last } if last != first)
    }
    fn expr(&self, i: usize) -> Result<(i64, usize), SyntaxError> {
        match self.get(i) {
            (Operand::Expr(e), c) => Ok((e.eval(self.resolve)?, c)),
            (Operand::Word(w), c) => match (self.resolve)(w) {
                Some(v) => Ok((v, c)),
                None => err(c, format!("undefined symbol `{w}`")),
            },
            (_, c) => err(c, "expected an immediate value or a symbol"),
        }
    }
    fn is_imm(&self, i: usize) -> bool {
        matches!(self.get(i).0, Operand::Expr(_) | Operand::Word(_))
    }
    fn uimm(&self, i: usize, max: u32, what: &str) -> Result<u32, SyntaxError> {
        let (v, c) = self.expr(i)?;
        if (0..=i64::from(max)).contains(&v) {
            Ok(v as u32)
        } else {
            let hex = if max > 255 {
                format!(" ({max:#x})")
            } else {
                String::new()
            };
            err(c, format!("{what} {v} is out of range 0..={max}{hex}"))
        }
    }
    fn range(&self, i: usize, lo: i64, hi: i64, what: &str) -> Result<i64, SyntaxError> {
        let (v, c) = self.expr(i)?;
        if (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            err(c, format!("{what} {v} is out of range {lo}..={hi}"))
        }
    }
    fn target(&self, i: usize) -> Result<u32, SyntaxError> {
        let (v, c) = self.expr(i)?;
        if !(0..1 << 20).contains(&v) {
            return err(c, format!("branch target {v:#x} is not below 2^20"));
        }
        if v % 4 != 0 {
            return err(c, format!("branch target {v:#x} is not 4-byte aligned"));
        }
        Ok(v as u32)
    }
    /// The memory offset of `ld32`/`st64`...: optional, in units of the access size.
    fn mem_imm(&self, i: usize) -> Result<u16, SyntaxError> {
        if self.s.operands.len() == i {
            return Ok(0);
        }
        Ok(self.uimm(i, 4095, "offset (in units of the access size)")? as u16)
    }
    fn mem_count(&self, form: &str) -> Result<(), SyntaxError> {
        match self.s.operands.len() {
            2 | 3 => Ok(()),
            n => err(
                self.s.col,
                format!(
                    "`{}` takes 2 or 3 operands ({form}), found {n}",
                    self.s.mnemonic
                ),
            ),
        }
    }
}

const INT_OPS: [(&str, IntOp); 14] = [
    ("add", IntOp::Add),
    ("sub", IntOp::Sub),
    ("mul", IntOp::Mul),
    ("and", IntOp::And),
    ("or", IntOp::Or),
    ("xor", IntOp::Xor),
    ("shl", IntOp::Shl),
    ("shr", IntOp::Shr),
    ("sar", IntOp::Sar),
    ("cmpeq", IntOp::CmpEq),
    ("cmpult", IntOp::CmpUlt),
    ("cmpslt", IntOp::CmpSlt),
    ("min", IntOp::Min),
    ("max", IntOp::Max),
];
const FVECS: [(&str, FVec); 4] = [
    ("f32v2", FVec::F32V2),
    ("f16v2", FVec::F16V2),
    ("f16v4", FVec::F16V4),
    ("f32", FVec::F32),
];
const FBIN_OPS: [(&str, FBinOp); 5] = [
    ("add", FBinOp::Add),
    ("sub", FBinOp::Sub),
    ("mul", FBinOp::Mul),
    ("max", FBinOp::Max),
    ("min", FBinOp::Min),
];
const FUN_OPS: [(&str, FUnOp); 7] = [
    ("exp", FUnOp::Exp),
    ("recip", FUnOp::Recip),
    ("rsqrt", FUnOp::Rsqrt),
    ("sqrt", FUnOp::Sqrt),
    ("neg", FUnOp::Neg),
    ("abs", FUnOp::Abs),
    ("tanh", FUnOp::Tanh),
];

fn int_op_name(op: IntOp) -> &'static str {
    INT_OPS
        .iter()
        .find(|(_, o)| *o == op)
        .map_or("?", |(n, _)| n)
}
fn fvec_name(v: FVec) -> &'static str {
    FVECS.iter().find(|(_, o)| *o == v).map_or("?", |(n, _)| n)
}
fn fbin_name(op: FBinOp) -> &'static str {
    FBIN_OPS
        .iter()
        .find(|(_, o)| *o == op)
        .map_or("?", |(n, _)| n)
}
fn fun_name(op: FUnOp) -> &'static str {
    FUN_OPS
        .iter()
        .find(|(_, o)| *o == op)
        .map_or("?", |(n, _)| n)
}

const PLAIN_MNEMONICS: [&str; 32] = [
    "nop",
    "exit",
    "setzi",
    "li",
    "mov",
    "ld32",
    "st32",
    "ld64",
    "st64",
    "ld128",
    "ld64step",
    "st64step",
    "ld2x64pace",
    "ldst64pace",
    "ld2xst64pace",
    "ampw",
    "br",
    "bri",
    "brz",
    "brnz",
    "call",
    "rpt",
    "run",
    "runall",
    "sync",
    "exchange",
    "hostxfer",
    "send",
    "mux",
    "recv",
    "mark",
    "amp",
];

/// Whether `mn` names an instruction, so that a misspelling is caught when the
/// line is parsed rather than when it is emitted.
fn known_mnemonic(mn: &str) -> bool {
    if PLAIN_MNEMONICS.contains(&mn)
        || mn == "f16v2tof32"
        || mn == "f32v2tof16"
        || mn == "f16v2tanh"
        || mn == "f16v2exp"
        || mn == "sort4x16lo"
        || mn == "sort4x16hi"
        || mn == "f16v4acc"
        || mn == "f16v8acc"
        || mn == "f32v2gina"
        || mn == "f16v2gina"
        || mn == "f16v4cmac"
        || INT_OPS.iter().any(|(n, _)| *n == mn)
    {
        return true;
    }
    FVECS.iter().any(|(v, vec)| {
        mn.strip_prefix(v).is_some_and(|op| {
            FBIN_OPS.iter().any(|(n, _)| *n == op)
                || matches!(op, "mac" | "sum" | "bcast")
                || (*vec == FVec::F32 && FUN_OPS.iter().any(|(n, _)| *n == op))
        })
    })
}

/// Lowers one instruction statement to its words (one, or several for `li`).
pub(crate) fn lower_inst(
    s: &InstStmt,
    resolve: &dyn Fn(&str) -> Option<i64>,
) -> Result<Vec<Inst>, SyntaxError> {
    let o = Ops { s, resolve };
    let mn = s.mnemonic.as_str();
    let one = |i: Inst| Ok(vec![i]);
    if let Some((_, op)) = INT_OPS.iter().find(|(n, _)| *n == mn) {
        o.count(3, "$mD, $mA, $mB or $mD, $mA, imm")?;
        let (d, a) = (o.m(0)?, o.m(1)?);
        if o.is_imm(2) {
            let imm = o.uimm(2, 4095, "immediate")? as u16;
            return one(Inst::IntImm { op: *op, d, a, imm });
        }
        return one(Inst::Int {
            op: *op,
            d,
            a,
            b: o.m(2)?,
        });
    }
    if let Some((vname, vec)) = FVECS.iter().find(|(n, _)| mn.starts_with(n)) {
        let op = &mn[vname.len()..];
        let p = vec.is_pair();
        let vec = *vec;
        if let Some((_, bop)) = FBIN_OPS.iter().find(|(n, _)| *n == op) {
            o.count(3, "d, a, b")?;
            return one(Inst::FBin {
                op: *bop,
                vec,
                d: o.a_vec(0, p)?,
                a: o.a_vec(1, p)?,
                b: o.a_vec(2, p)?,
            });
        }
        match op {
            "mac" => {
                o.count(3, "d, a, b")?;
                return one(Inst::FMac {
                    vec,
                    d: o.a_vec(0, p)?,
                    a: o.a_vec(1, p)?,
                    b: o.a_vec(2, p)?,
                });
            }
            "sum" => {
                o.count(2, "$aD, source")?;
                return one(Inst::FSum {
                    vec,
                    d: o.a(0)?,
                    a: o.a_vec(1, p)?,
                });
            }
            "bcast" => {
                o.count(2, "destination, $aA")?;
                return one(Inst::FBcast {
                    vec,
                    d: o.a_vec(0, p)?,
                    a: o.a(1)?,
                });
            }
            _ => {}
        }
        if vec == FVec::F32
            && let Some((_, uop)) = FUN_OPS.iter().find(|(n, _)| *n == op)
        {
            o.count(2, "$aD, $aA")?;
            return one(Inst::FUn {
                op: *uop,
                d: o.a(0)?,
                a: o.a(1)?,
            });
        }
    }
    match mn {
        "nop" => {
            o.count(0, "none")?;
            one(Inst::Nop)
        }
        "exit" => {
            o.count(0, "none")?;
            one(Inst::Exit)
        }
        "setzi" => {
            o.count(2, "$mD, imm20")?;
            let d = o.m(0)?;
            let imm = o.uimm(1, (1 << 20) - 1, "immediate")?;
            one(Inst::Setzi { d, imm })
        }
        "li" => {
            o.count(2, "$mD, imm32")?;
            let d = o.m(0)?;
            let (v, c) = o.expr(1)?;
            if !(i64::from(i32::MIN)..=i64::from(u32::MAX)).contains(&v) {
                return err(c, format!("value {v} does not fit 32 bits"));
            }
            let v = v as u32;
            // Fixed length, whatever the value, so that layout never depends on the
            // value of a label.
            Ok(vec![
                Inst::Setzi { d, imm: v >> 12 },
                Inst::IntImm {
                    op: IntOp::Shl,
                    d,
                    a: d,
                    imm: 12,
                },
                Inst::IntImm {
                    op: IntOp::Or,
                    d,
                    a: d,
                    imm: (v & 0xfff) as u16,
                },
            ])
        }
        "mov" => {
            o.count(2, "destination, source")?;
            match (&o.get(0).0, &o.get(1).0) {
                (Operand::M(_), Operand::M(_)) => one(Inst::Int {
                    op: IntOp::Or,
                    d: o.m(0)?,
                    a: o.m(1)?,
                    b: MReg::ZERO,
                }),
                (Operand::A { .. }, Operand::M(_)) => one(Inst::MovAm {
                    d: o.a(0)?,
                    a: o.m(1)?,
                }),
                (Operand::M(_), Operand::A { .. }) => one(Inst::MovMa {
                    d: o.m(0)?,
                    a: o.a(1)?,
                }),
                (Operand::A { .. }, Operand::A { .. }) => {
                    let pair = o.is_pair(0);
                    one(Inst::FMov {
                        d: o.a_vec(0, pair)?,
                        a: o.a_vec(1, pair)?,
                        pair,
                    })
                }
                (Operand::M(_), _) => err(
                    o.get(1).1,
                    "expected a register (use `setzi` or `li` for a constant)",
                ),
                _ => err(o.get(0).1, "expected a register"),
            }
        }
        "ld32" | "st32" => {
            o.mem_count("register, $mBase[, offset]")?;
            let base = o.m(1)?;
            let imm = o.mem_imm(2)?;
            let load = mn == "ld32";
            match (&o.get(0).0, load) {
                (Operand::M(_), true) => one(Inst::Ld32M {
                    d: o.m(0)?,
                    base,
                    imm,
                }),
                (Operand::M(_), false) => one(Inst::St32M {
                    s: o.m(0)?,
                    base,
                    imm,
                }),
                (_, true) => one(Inst::Ld32 {
                    d: o.a(0)?,
                    base,
                    imm,
                }),
                (_, false) => one(Inst::St32 {
                    s: o.a(0)?,
                    base,
                    imm,
                }),
            }
        }
        "ld64" | "st64" | "ld128" => {
            o.mem_count("register, $mBase[, offset]")?;
            let base = o.m(1)?;
            let imm = o.mem_imm(2)?;
            match mn {
                "ld64" => one(Inst::Ld64 {
                    d: o.pair(0)?,
                    base,
                    imm,
                }),
                "st64" => one(Inst::St64 {
                    s: o.pair(0)?,
                    base,
                    imm,
                }),
                _ => one(Inst::Ld128 {
                    d: o.quad(0)?,
                    base,
                    imm,
                }),
            }
        }
        "ld64step" if o.s.operands.len() == 2 => {
            o.count(2, "$aN:N+1, $mBase+=$mStride")?;
            let d = o.pair(0)?;
            match o.mstride(1)? {
                (base, Some(stride)) => one(Inst::Ld64Stride { d, base, stride }),
                (_, None) => err(o.get(1).1, "expected `$mBase+=$mStride` or an increment"),
            }
        }
        "ld64step" | "st64step" => {
            o.count(3, "$aN:N+1, $mBase+=, increment")?;
            let r = o.pair(0)?;
            let base = o.minc(1)?;
            let inc = o.range(2, -128, 127, "increment (in units of 8 bytes)")? as i8;
            if mn == "ld64step" {
                one(Inst::Ld64Step { d: r, base, inc })
            } else {
                one(Inst::St64Step { s: r, base, inc })
            }
        }
        "ld2x64pace" => {
            o.count(4, "$aD0:pair, $aD1:pair, $mP0+=, $mP1+=")?;
            let (d0, d1, (p0, stride), p1) = (o.pair(0)?, o.pair(1)?, o.mstride(2)?, o.minc(3)?);
            match stride {
                None => one(Inst::Ld2x64Pace { d0, d1, p0, p1 }),
                Some(stride) => one(Inst::Ld2x64PaceStride {
                    d0,
                    d1,
                    p0,
                    p1,
                    stride,
                }),
            }
        }
        "ldst64pace" => {
            o.count(4, "$aD:pair, $aS:pair, $mLoad+=, $mStore+=")?;
            let (d, s, (pl, stride), ps) = (o.pair(0)?, o.pair(1)?, o.mstride(2)?, o.minc(3)?);
            match stride {
                None => one(Inst::Ldst64Pace { d, s, pl, ps }),
                Some(stride) => one(Inst::Ldst64PaceStride {
                    d,
                    s,
                    pl,
                    ps,
                    stride,
                }),
            }
        }
        "ld2xst64pace" => {
            o.count(
                6,
                "$aD0:pair, $aD1:pair, $aS:pair, $mP0+=, $mP1+=, $mStore+=",
            )?;
            let (d0, d1, s) = (o.pair(0)?, o.pair(1)?, o.pair(2)?);
            let ((p0, stride), p1, ps) = (o.mstride(3)?, o.minc(4)?, o.minc(5)?);
            match stride {
                None => one(Inst::Ld2xSt64Pace {
                    d0,
                    d1,
                    s,
                    p0,
                    p1,
                    ps,
                }),
                Some(stride) => {
                    if d0.0 % 4 != 0 || d1.0 != d0.0 + 2 {
                        return err(
                            o.get(0).1,
                            "the strided form loads a quad: `$aN:N+1, $aN+2:N+3` with N a multiple of 4",
                        );
                    }
                    one(Inst::Ld2xSt64PaceStride {
                        d0,
                        d1,
                        s,
                        p0,
                        p1,
                        ps,
                        stride,
                    })
                }
            }
        }
        "ampw" => {
            o.count(2, "$mBase+=, quad")?;
            let base = o.minc(0)?;
            let quad = o.uimm(1, 31, "weight quad")? as u8;
            one(Inst::AmpLoadW { base, quad })
        }
        "br" => {
            o.count(1, "$mA")?;
            one(Inst::Br { a: o.m(0)? })
        }
        "bri" => {
            o.count(1, "target")?;
            one(Inst::Bri {
                target: o.target(0)?,
            })
        }
        "brz" | "brnz" => {
            o.count(2, "$mC, target")?;
            let c = o.m(0)?;
            let target = o.target(1)?;
            if mn == "brz" {
                one(Inst::Brz { c, target })
            } else {
                one(Inst::Brnz { c, target })
            }
        }
        "call" => {
            o.count(2, "$mLink, target")?;
            one(Inst::Call {
                link: o.m(0)?,
                target: o.target(1)?,
            })
        }
        "rpt" => {
            o.count(2, "$mCount or count, body words")?;
            let body = o.range(1, 1, 255, "body length (in words)")? as u8;
            if o.is_imm(0) {
                let count = o.uimm(0, 4095, "repeat count")? as u16;
                one(Inst::Rpti { count, body })
            } else {
                one(Inst::Rpt {
                    count: o.m(0)?,
                    body,
                })
            }
        }
        "run" => {
            o.count(3, "$mEntry, $mState, worker")?;
            one(Inst::Run {
                entry: o.m(0)?,
                state: o.m(1)?,
                worker: o.uimm(2, 5, "worker")? as u8,
            })
        }
        "runall" => {
            o.count(3, "$mEntry, $mState, stride")?;
            one(Inst::RunAll {
                entry: o.m(0)?,
                state: o.m(1)?,
                stride: o.uimm(2, 0xffff, "stride")? as u16,
            })
        }
        "sync" => {
            o.count(1, "local or global")?;
            match o.get(0) {
                (Operand::Word(w), _) if w == "local" => one(Inst::SyncLocal),
                (Operand::Word(w), _) if w == "global" => one(Inst::SyncGlobal),
                (_, c) => err(c, "expected `local` or `global`"),
            }
        }
        "exchange" => {
            o.count(1, "exchange id")?;
            one(Inst::Exchange {
                id: o.uimm(0, 0xffff, "exchange id")? as u16,
            })
        }
        "send" => {
            o.count(2, "$mA, bytes")?;
            one(Inst::Send {
                a: o.m(0)?,
                bytes: o.uimm(1, 0xffff, "message bytes")? as u16,
            })
        }
        "mux" => {
            o.count(1, "source tile")?;
            one(Inst::Mux {
                tile: o.uimm(0, 0xf_ffff, "source tile")?,
            })
        }
        "recv" => {
            o.count(2, "$mA, message")?;
            one(Inst::Recv {
                a: o.m(0)?,
                msg: o.uimm(1, 0xffff, "message index")? as u16,
            })
        }
        "hostxfer" => {
            o.count(1, "$mDesc")?;
            one(Inst::HostXfer { desc: o.m(0)? })
        }
        "mark" => {
            o.count(1, "tag")?;
            one(Inst::Mark {
                tag: o.uimm(0, 0xffff, "tag")? as u16,
            })
        }
        "f16v2tanh" => {
            o.count(2, "$aD, $aA")?;
            one(Inst::F16v2Tanh {
                d: o.a(0)?,
                a: o.a(1)?,
            })
        }
        "f16v2exp" => {
            o.count(2, "$aD, $aA")?;
            one(Inst::F16v2Exp {
                d: o.a(0)?,
                a: o.a(1)?,
            })
        }
        "f16v4acc" => {
            o.count(1, "$aA:pair")?;
            one(Inst::F16Acc {
                a: o.pair(0)?,
                quad: false,
            })
        }
        "f16v8acc" => {
            o.count(1, "$aA:quad")?;
            one(Inst::F16Acc {
                a: o.quad(0)?,
                quad: true,
            })
        }
        "f32v2gina" => {
            o.count(1, "$aD:pair")?;
            one(Inst::F32v2Gina { d: o.pair(0)? })
        }
        "f16v2gina" => {
            o.count(1, "$aD")?;
            one(Inst::F16v2Gina { d: o.a(0)? })
        }
        "f16v4cmac" => {
            o.count(2, "$aA:pair, $aB:pair")?;
            one(Inst::F16v4Cmac {
                a: o.pair(0)?,
                b: o.pair(1)?,
            })
        }
        "f16v2tof32" => {
            o.count(2, "$aD:pair, $aA")?;
            one(Inst::F16v2ToF32 {
                d: o.pair(0)?,
                a: o.a(1)?,
            })
        }
        "f32v2tof16" => {
            o.count(2, "$aD, $aA:pair")?;
            one(Inst::F32v2ToF16 {
                d: o.a(0)?,
                a: o.pair(1)?,
            })
        }
        "sort4x16lo" | "sort4x16hi" => {
            o.count(3, "$aD, $aA, $aB")?;
            one(Inst::Sort4x16 {
                hi: mn == "sort4x16hi",
                d: o.a(0)?,
                a: o.a(1)?,
                b: o.a(2)?,
            })
        }
        "amp" => {
            o.count(4, "$aOut:pair, $aIn:pair, $aPin:pair, phase")?;
            one(Inst::Amp {
                out: o.pair(0)?,
                inp: o.pair(1)?,
                pin: o.pair(2)?,
                phase: o.uimm(3, 3, "phase")? as u8,
            })
        }
        _ => err(s.col, format!("unknown mnemonic `{mn}`")),
    }
}

/// Lowers a word statement to words; bundles are put in (main, aux) order.
pub(crate) fn lower_word(
    w: &WordStmt,
    resolve: &dyn Fn(&str) -> Option<i64>,
) -> Result<Vec<Word>, SyntaxError> {
    match w {
        WordStmt::Single(s) => {
            let insts = lower_inst(s, resolve)?;
            for i in &insts {
                validate_word(&Word::Single(*i)).map_err(|e| SyntaxError {
                    col: s.col,
                    message: e.to_string(),
                })?;
            }
            Ok(insts.into_iter().map(Word::Single).collect())
        }
        WordStmt::Bundle(a, b, col) => {
            let x = lower_inst(a, resolve)?[0];
            let y = lower_inst(b, resolve)?[0];
            let word = match (x.pipe(), y.pipe()) {
                (Pipe::Main, Pipe::Aux) => Word::Bundle(x, y),
                (Pipe::Aux, Pipe::Main) => Word::Bundle(y, x),
                (Pipe::Main, Pipe::Main) => {
                    return err(
                        *col,
                        "a bundle needs one aux-pipe (floating-point or amp) instruction, found two main-pipe instructions",
                    );
                }
                (Pipe::Aux, Pipe::Aux) => {
                    return err(
                        *col,
                        "a bundle needs one main-pipe instruction, found two aux-pipe instructions",
                    );
                }
            };
            validate_word(&word).map_err(|e| SyntaxError {
                col: *col,
                message: e.to_string(),
            })?;
            Ok(vec![word])
        }
    }
}

/// Parses one instruction or bundle with numeric operands only (symbols are
/// undefined). Pseudo-instructions, which expand to several words, are rejected.
pub fn parse_word(text: &str) -> Result<Word, SyntaxError> {
    parse_word_with(text, &|_| None)
}

/// Parses one instruction or bundle, resolving symbols with `resolve`.
pub fn parse_word_with(
    text: &str,
    resolve: &dyn Fn(&str) -> Option<i64>,
) -> Result<Word, SyntaxError> {
    let toks = lex(text)?;
    let mut c = Cursor::new(&toks, text.len());
    let w = word_stmt(&mut c)?;
    let words = lower_word(&w, resolve)?;
    match words.as_slice() {
        [one] => Ok(*one),
        _ => err(0, "a pseudo-instruction expands to several words"),
    }
}

// ---------------------------------------------------------------------------
// Display
// ---------------------------------------------------------------------------

struct M(MReg);
struct A(AReg);
struct P(AReg);
struct Q(AReg);
struct V(AReg, bool);

impl fmt::Display for M {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == MReg::ZERO {
            f.write_str("$mzero")
        } else {
            write!(f, "$m{}", self.0.0)
        }
    }
}
impl fmt::Display for A {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == AReg::ZERO {
            f.write_str("$azero")
        } else {
            write!(f, "$a{}", self.0.0)
        }
    }
}
impl fmt::Display for P {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "$a{}:{}", self.0.0, u16::from(self.0.0) + 1)
    }
}
impl fmt::Display for Q {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "$a{}:{}", self.0.0, u16::from(self.0.0) + 3)
    }
}
impl fmt::Display for V {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.1 {
            P(self.0).fmt(f)
        } else {
            A(self.0).fmt(f)
        }
    }
}

impl fmt::Display for Inst {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Inst::Nop => f.write_str("nop"),
            Inst::Setzi { d, imm } => write!(f, "setzi {}, {imm:#x}", M(d)),
            Inst::Int {
                op: IntOp::Or,
                d,
                a,
                b: MReg::ZERO,
            } => write!(f, "mov {}, {}", M(d), M(a)),
            Inst::Int { op, d, a, b } => {
                write!(f, "{} {}, {}, {}", int_op_name(op), M(d), M(a), M(b))
            }
            Inst::IntImm { op, d, a, imm } => {
                write!(f, "{} {}, {}, {imm}", int_op_name(op), M(d), M(a))
            }
            Inst::MovAm { d, a } => write!(f, "mov {}, {}", A(d), M(a)),
            Inst::MovMa { d, a } => write!(f, "mov {}, {}", M(d), A(a)),
            Inst::Ld32M { d, base, imm } => write!(f, "ld32 {}, {}, {imm}", M(d), M(base)),
            Inst::Ld32 { d, base, imm } => write!(f, "ld32 {}, {}, {imm}", A(d), M(base)),
            Inst::St32M { s, base, imm } => write!(f, "st32 {}, {}, {imm}", M(s), M(base)),
            Inst::St32 { s, base, imm } => write!(f, "st32 {}, {}, {imm}", A(s), M(base)),
            Inst::Ld64 { d, base, imm } => write!(f, "ld64 {}, {}, {imm}", P(d), M(base)),
            Inst::St64 { s, base, imm } => write!(f, "st64 {}, {}, {imm}", P(s), M(base)),
            Inst::Ld64Step { d, base, inc } => {
                write!(f, "ld64step {}, {}+=, {inc}", P(d), M(base))
            }
            Inst::St64Step { s, base, inc } => {
                write!(f, "st64step {}, {}+=, {inc}", P(s), M(base))
            }
            Inst::Ld128 { d, base, imm } => write!(f, "ld128 {}, {}, {imm}", Q(d), M(base)),
            Inst::Ld2x64Pace { d0, d1, p0, p1 } => write!(
                f,
                "ld2x64pace {}, {}, {}+=, {}+=",
                P(d0),
                P(d1),
                M(p0),
                M(p1)
            ),
            Inst::Ldst64Pace { d, s, pl, ps } => {
                write!(f, "ldst64pace {}, {}, {}+=, {}+=", P(d), P(s), M(pl), M(ps))
            }
            Inst::Ld2xSt64Pace {
                d0,
                d1,
                s,
                p0,
                p1,
                ps,
            } => write!(
                f,
                "ld2xst64pace {}, {}, {}, {}+=, {}+=, {}+=",
                P(d0),
                P(d1),
                P(s),
                M(p0),
                M(p1),
                M(ps)
            ),
            Inst::Ld64Stride { d, base, stride } => {
                write!(f, "ld64step {}, {}+={}", P(d), M(base), M(stride))
            }
            Inst::Ld2x64PaceStride {
                d0,
                d1,
                p0,
                p1,
                stride,
            } => write!(
                f,
                "ld2x64pace {}, {}, {}+={}, {}+=",
                P(d0),
                P(d1),
                M(p0),
                M(stride),
                M(p1)
            ),
            Inst::Ldst64PaceStride {
                d,
                s,
                pl,
                ps,
                stride,
            } => write!(
                f,
                "ldst64pace {}, {}, {}+={}, {}+=",
                P(d),
                P(s),
                M(pl),
                M(stride),
                M(ps)
            ),
            Inst::Ld2xSt64PaceStride {
                d0,
                d1,
                s,
                p0,
                p1,
                ps,
                stride,
            } => write!(
                f,
                "ld2xst64pace {}, {}, {}, {}+={}, {}+=, {}+=",
                P(d0),
                P(d1),
                P(s),
                M(p0),
                M(stride),
                M(p1),
                M(ps)
            ),
            Inst::AmpLoadW { base, quad } => write!(f, "ampw {}+=, {quad}", M(base)),
            Inst::Br { a } => write!(f, "br {}", M(a)),
            Inst::Bri { target } => write!(f, "bri {target:#x}"),
            Inst::Brz { c, target } => write!(f, "brz {}, {target:#x}", M(c)),
            Inst::Brnz { c, target } => write!(f, "brnz {}, {target:#x}", M(c)),
            Inst::Call { link, target } => write!(f, "call {}, {target:#x}", M(link)),
            Inst::Rpt { count, body } => write!(f, "rpt {}, {body}", M(count)),
            Inst::Rpti { count, body } => write!(f, "rpt {count}, {body}"),
            Inst::Exit => f.write_str("exit"),
            Inst::Run {
                entry,
                state,
                worker,
            } => write!(f, "run {}, {}, {worker}", M(entry), M(state)),
            Inst::RunAll {
                entry,
                state,
                stride,
            } => write!(f, "runall {}, {}, {stride}", M(entry), M(state)),
            Inst::SyncLocal => f.write_str("sync local"),
            Inst::SyncGlobal => f.write_str("sync global"),
            Inst::Exchange { id } => write!(f, "exchange {id}"),
            Inst::HostXfer { desc } => write!(f, "hostxfer {}", M(desc)),
            Inst::Send { a, bytes } => write!(f, "send {}, {bytes}", M(a)),
            Inst::Mux { tile } => write!(f, "mux {tile}"),
            Inst::Recv { a, msg } => write!(f, "recv {}, {msg}", M(a)),
            Inst::Mark { tag } => write!(f, "mark {tag}"),
            Inst::FBin { op, vec, d, a, b } => {
                let p = vec.is_pair();
                write!(
                    f,
                    "{}{} {}, {}, {}",
                    fvec_name(vec),
                    fbin_name(op),
                    V(d, p),
                    V(a, p),
                    V(b, p)
                )
            }
            Inst::FMac { vec, d, a, b } => {
                let p = vec.is_pair();
                write!(
                    f,
                    "{}mac {}, {}, {}",
                    fvec_name(vec),
                    V(d, p),
                    V(a, p),
                    V(b, p)
                )
            }
            Inst::FUn { op, d, a } => write!(f, "f32{} {}, {}", fun_name(op), A(d), A(a)),
            Inst::F16v2Tanh { d, a } => write!(f, "f16v2tanh {}, {}", A(d), A(a)),
            Inst::F16v2Exp { d, a } => write!(f, "f16v2exp {}, {}", A(d), A(a)),
            Inst::F16v2ToF32 { d, a } => write!(f, "f16v2tof32 {}, {}", P(d), A(a)),
            Inst::F32v2ToF16 { d, a } => write!(f, "f32v2tof16 {}, {}", A(d), P(a)),
            Inst::Sort4x16 { hi, d, a, b } => write!(
                f,
                "sort4x16{} {}, {}, {}",
                if hi { "hi" } else { "lo" },
                A(d),
                A(a),
                A(b)
            ),
            Inst::F16Acc { a, quad: false } => write!(f, "f16v4acc {}", P(a)),
            Inst::F16Acc { a, quad: true } => write!(f, "f16v8acc {}", Q(a)),
            Inst::F32v2Gina { d } => write!(f, "f32v2gina {}", P(d)),
            Inst::F16v2Gina { d } => write!(f, "f16v2gina {}", A(d)),
            Inst::F16v4Cmac { a, b } => write!(f, "f16v4cmac {}, {}", P(a), P(b)),
            Inst::FSum { vec, d, a } => {
                write!(f, "{}sum {}, {}", fvec_name(vec), A(d), V(a, vec.is_pair()))
            }
            Inst::FMov { d, a, pair } => write!(f, "mov {}, {}", V(d, pair), V(a, pair)),
            Inst::FBcast { vec, d, a } => write!(
                f,
                "{}bcast {}, {}",
                fvec_name(vec),
                V(d, vec.is_pair()),
                A(a)
            ),
            Inst::Amp {
                out,
                inp,
                pin,
                phase,
            } => write!(f, "amp {}, {}, {}, {phase}", P(out), P(inp), P(pin)),
        }
    }
}

impl fmt::Display for Word {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Word::Single(i) => i.fmt(f),
            Word::Bundle(a, b) => write!(f, "{{ {a} ; {b} }}"),
        }
    }
}
