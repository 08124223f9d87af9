//! The text syntax of one instruction or bundle (specified in `docs/asm.md`): a
//! lexer shared with the file assembler, operands, the choice among the assembly
//! forms of the instruction table (each form's parsing and `Display` for [`Inst`]
//! are generated there), and `Display` for [`Word`]. Whatever `Display` prints,
//! [`parse_word`] accepts and turns back into the same value; the disassembler
//! relies on that.

use crate::encode::validate_word;
use crate::inst::*;
use crate::table::FORMS;
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
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                let name = &line[start + 1..i];
                let tok = if CONTROL_REGISTERS.contains(&name) {
                    // A keyword of the instructions that name it (`uput $FP_SCL`).
                    Tok::Ident(line[start..i].to_string())
                } else if name == "mzero" {
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
                            "bad register `{}` (expected $m0..$m15, $mzero, $a0..$a15, $azero, $FP_SCL)",
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

/// The control registers instructions name (as keyword operands, `$` included).
const CONTROL_REGISTERS: &[&str] = &["FP_SCL"];

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
pub(crate) struct Ops<'a> {
    s: &'a InstStmt,
    resolve: &'a dyn Fn(&str) -> Option<i64>,
}

impl Ops<'_> {
    /// Checks the number of operands: `n`, or `n - 1` when the last is optional.
    pub fn count(&self, n: usize, optional: bool, form: &str) -> Result<(), SyntaxError> {
        let found = self.s.operands.len();
        if found == n || (optional && found + 1 == n) {
            return Ok(());
        }
        let takes = if optional {
            format!("{} or {n} operands", n - 1)
        } else {
            format!("{n} operand{}", if n == 1 { "" } else { "s" })
        };
        err(
            self.s.col,
            format!(
                "`{}` takes {takes} ({form}), found {found}",
                self.s.mnemonic
            ),
        )
    }
    pub fn len(&self) -> usize {
        self.s.operands.len()
    }
    fn get(&self, i: usize) -> (&Operand, usize) {
        let (o, c) = &self.s.operands[i];
        (o, *c)
    }
    /// The column of operand `i`.
    pub fn col(&self, i: usize) -> usize {
        self.s.operands[i].1
    }
    pub fn m(&self, i: usize) -> Result<MReg, SyntaxError> {
        match self.get(i) {
            (Operand::M(n), _) => Ok(MReg(*n)),
            (Operand::MInc(_), c) => err(c, "this operand is not post-incremented: remove `+=`"),
            (_, c) => err(c, "expected an $m register"),
        }
    }
    /// A pointer advanced by a stride register: `$mN+=$mS`.
    pub fn ptr_stride(&self, i: usize) -> Result<(MReg, MReg), SyntaxError> {
        match self.get(i) {
            (Operand::MStride(n, r), _) => Ok((MReg(*n), MReg(*r))),
            (_, c) => {
                self.minc(i)?;
                err(c, "expected `$mBase+=$mStride` or an increment")
            }
        }
    }
    pub fn minc(&self, i: usize) -> Result<MReg, SyntaxError> {
        match self.get(i) {
            (Operand::MInc(n), _) => Ok(MReg(*n)),
            (Operand::MStride(..), c) => err(c, "this pointer takes no stride register"),
            (Operand::M(_), c) => err(c, "expected a post-incremented pointer `$mN+=`"),
            (_, c) => err(c, "expected a post-incremented pointer `$mN+=`"),
        }
    }
    pub fn a(&self, i: usize) -> Result<AReg, SyntaxError> {
        match self.get(i) {
            (Operand::A { first, last }, _) if first == last => Ok(AReg(*first)),
            (Operand::A { .. }, c) => err(c, "expected a single $a register, found a range"),
            (_, c) => err(c, "expected an $a register"),
        }
    }
    pub fn pair(&self, i: usize) -> Result<AReg, SyntaxError> {
        match self.get(i) {
            (Operand::A { first, last }, _) if first % 2 == 0 && *last == first + 1 => {
                Ok(AReg(*first))
            }
            (_, c) => err(c, "expected a register pair `$aN:N+1` with N even"),
        }
    }
    pub fn quad(&self, i: usize) -> Result<AReg, SyntaxError> {
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
    pub fn a_vec(&self, i: usize, pair: bool) -> Result<AReg, SyntaxError> {
        if pair { self.pair(i) } else { self.a(i) }
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
    /// An integer in `lo..=hi`; `what` names it in the error, which also gives a
    /// large bound in hex.
    pub fn int(&self, i: usize, lo: i64, hi: i64, what: &str) -> Result<i64, SyntaxError> {
        let (v, c) = self.expr(i)?;
        if (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            let hex = if hi > 255 {
                format!(" ({hi:#x})")
            } else {
                String::new()
            };
            err(c, format!("{what} {v} is out of range {lo}..={hi}{hex}"))
        }
    }
    pub fn target(&self, i: usize) -> Result<u32, SyntaxError> {
        let (v, c) = self.expr(i)?;
        if !(0..1 << 20).contains(&v) {
            return err(c, format!("branch target {v:#x} is not below 2^20"));
        }
        if v % 4 != 0 {
            return err(c, format!("branch target {v:#x} is not 4-byte aligned"));
        }
        Ok(v as u32)
    }
}

/// What an operand looks like, for choosing between forms that share a mnemonic
/// (the `when` patterns of the instruction table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `$mN`.
    M,
    /// `$aN` or `$aN:M`.
    A,
    /// `$aN:M` with M other than N.
    Range,
    /// A number, an expression or a symbol.
    Imm,
    /// `$mN+=$mS`.
    Stride,
    /// Anything.
    Any,
    /// Any number of further operands.
    Rest,
}

impl Shape {
    fn fits(self, o: &Operand) -> bool {
        match self {
            Shape::M => matches!(o, Operand::M(_)),
            Shape::A => matches!(o, Operand::A { .. }),
            Shape::Range => matches!(o, Operand::A { first, last } if first != last),
            Shape::Imm => matches!(o, Operand::Expr(_) | Operand::Word(_)),
            Shape::Stride => matches!(o, Operand::MStride(..)),
            Shape::Any | Shape::Rest => true,
        }
    }
}

/// Builds an instruction from a statement's operands, or says what is wrong.
pub(crate) type Build = fn(&Ops) -> Result<Inst, SyntaxError>;

/// One way of writing an instruction, generated from the instruction table.
pub(crate) struct Form {
    /// The variant it builds.
    #[cfg_attr(not(test), allow(dead_code))]
    pub variant: &'static str,
    /// Whether a mnemonic is this form's.
    pub spells: fn(&str) -> bool,
    /// The operand shapes that select this form among those of its mnemonic.
    pub guard: Option<&'static [Shape]>,
    /// Keyword operands and their positions, which also select the form.
    pub keywords: &'static [(usize, &'static str)],
    /// The number of operands; the last may be left out when `optional`.
    pub count: usize,
    pub optional: bool,
    /// The operands as count errors describe them.
    pub form: &'static str,
    /// Reports the error when no form of the mnemonic fits the operands.
    pub otherwise: Option<Build>,
    pub parse: fn(&str, &Ops) -> Result<Inst, SyntaxError>,
}

impl Form {
    /// Whether the form is chosen by its operands rather than being the fallback.
    fn selective(&self) -> bool {
        self.guard.is_some() || !self.keywords.is_empty()
    }

    fn fits(&self, ops: &[(Operand, usize)]) -> bool {
        let shapes_fit = match self.guard {
            None => true,
            Some(shapes) => {
                let rest = shapes.last() == Some(&Shape::Rest);
                let fixed = &shapes[..shapes.len() - usize::from(rest)];
                (ops.len() == fixed.len() || (rest && ops.len() > fixed.len()))
                    && fixed.iter().zip(ops).all(|(s, (o, _))| s.fits(o))
            }
        };
        shapes_fit
            && self
                .keywords
                .iter()
                .all(|&(i, w)| matches!(ops.get(i), Some((Operand::Word(x), _)) if x == w))
    }
}

/// How `mn` splits into consecutive parts, each one of the spellings offered for
/// it: the index of the spelling used for each part.
pub(crate) fn split_mnemonic(mn: &str, parts: &[&[&str]]) -> Option<[usize; 3]> {
    fn split(mn: &str, parts: &[&[&str]], at: usize, out: &mut [usize; 3]) -> bool {
        match parts.split_first() {
            None => mn.is_empty(),
            Some((first, rest)) => first.iter().enumerate().any(|(k, s)| {
                mn.strip_prefix(s).is_some_and(|tail| {
                    out[at] = k;
                    split(tail, rest, at + 1, out)
                })
            }),
        }
    }
    let mut out = [0; 3];
    split(mn, parts, 0, &mut out).then_some(out)
}

/// `mov` whose operands fit none of its forms.
pub(crate) fn mov_operands(o: &Ops) -> Result<Inst, SyntaxError> {
    match o.get(0) {
        (Operand::M(_), _) => err(
            o.col(1),
            "expected a register (use `setzi` or `li` for a constant)",
        ),
        (_, c) => err(c, "expected a register"),
    }
}

/// Whether `mn` names an instruction, so that a misspelling is caught when the
/// line is parsed rather than when it is emitted.
fn known_mnemonic(mn: &str) -> bool {
    mn == "li" || FORMS.iter().any(|f| (f.spells)(mn))
}

/// Lowers one instruction statement to its words (one, or several for `li`).
pub(crate) fn lower_inst(
    s: &InstStmt,
    resolve: &dyn Fn(&str) -> Option<i64>,
) -> Result<Vec<Inst>, SyntaxError> {
    let o = Ops { s, resolve };
    let mn = s.mnemonic.as_str();
    if mn == "li" {
        o.count(2, false, "$mD, imm32")?;
        let d = o.m(0)?;
        let (v, c) = o.expr(1)?;
        if !(i64::from(i32::MIN)..=i64::from(u32::MAX)).contains(&v) {
            return err(c, format!("value {v} does not fit 32 bits"));
        }
        let v = v as u32;
        // Fixed length, whatever the value, so that layout never depends on the
        // value of a label.
        return Ok(vec![
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
        ]);
    }
    let forms: Vec<&Form> = FORMS.iter().filter(|f| (f.spells)(mn)).collect();
    let chosen = forms
        .iter()
        .find(|f| f.selective() && f.fits(&s.operands))
        .or_else(|| forms.iter().find(|f| !f.selective()));
    if let Some(f) = chosen {
        return (f.parse)(mn, &o).map(|i| vec![i]);
    }
    let Some(first) = forms.first() else {
        return err(s.col, format!("unknown mnemonic `{mn}`"));
    };
    o.count(first.count, first.optional, first.form)?;
    if let Some(&(i, _)) = first.keywords.first() {
        let words: Vec<String> = forms
            .iter()
            .filter_map(|f| f.keywords.first())
            .map(|(_, w)| format!("`{w}`"))
            .collect();
        return err(o.col(i), format!("expected {}", words.join(" or ")));
    }
    match forms.iter().find_map(|f| f.otherwise) {
        Some(otherwise) => otherwise(&o).map(|i| vec![i]),
        None => err(s.col, format!("unknown mnemonic `{mn}`")),
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

/// Register operands as the syntax writes them: `$m` (with `$mzero`), one `$a`
/// (with `$azero`), a pair, a quad, and a pair or single register.
pub(crate) struct M(pub MReg);
pub(crate) struct A(pub AReg);
pub(crate) struct P(pub AReg);
pub(crate) struct Q(pub AReg);
pub(crate) struct V(pub AReg, pub bool);

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

impl fmt::Display for Word {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Word::Single(i) => i.fmt(f),
            Word::Bundle(a, b) => write!(f, "{{ {a} ; {b} }}"),
        }
    }
}
