//! `tessera_isa::asm::assemble`, then, for an accepted listing, the package round
//! trip and the simulator under a small cycle budget. The generator builds listings
//! from the lines of the seed listings, with tokens replaced by registers, labels,
//! directives and numbers at the edges, and lines repeated, dropped or reordered.

use crate::mutate::number;
use crate::targets::package::simulate;
use crate::{Rng, Seed, Target, corpus};
use rand::Rng as _;

pub struct AsmTarget;

const REGISTERS: [&str; 16] = [
    "$m0", "$m1", "$m7", "$m15", "$mzero", "$a0", "$a7", "$a15", "$azero", "$a0:1", "$a2:3",
    "$a0:3", "$a1:2", "$m16", "$a16", "$m1+=",
];
const DIRECTIVES: [&str; 22] = [
    ".machine small",
    ".machine c600",
    ".machine bow",
    ".machine nosuch",
    ".tiles",
    ".tile",
    ".tile all",
    ".section code 0x4c000 rx",
    ".section data 0x90000 rw",
    ".section",
    ".org",
    ".align",
    ".zero",
    ".byte",
    ".half",
    ".word",
    ".f16",
    ".f32",
    ".symbol",
    ".entry",
    ".exchange",
    ".binding input",
];
const PUNCT: [&str; 12] = [
    ",", "+", "-", "->", "..", "..=", "{", "}", ";", ":", "(", ")",
];
const MNEMONICS: [&str; 16] = [
    "setzi", "add", "sub", "ld32", "st32", "ld64step", "brz", "bri", "call", "run", "runall",
    "sync", "exchange", "hostxfer", "exit", "f32add",
];

impl Target for AsmTarget {
    fn name(&self) -> &'static str {
        "asm"
    }
    fn about(&self) -> &'static str {
        "assemble, then the package round trip and the simulator (20k-cycle budget)"
    }
    fn corpus(&self) -> &'static [Seed] {
        corpus::ASM
    }
    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        let lines: Vec<&str> = self
            .corpus()
            .iter()
            .flat_map(|s| std::str::from_utf8(s.bytes).unwrap_or("").lines())
            .filter(|l| !l.trim().is_empty())
            .collect();
        let mut out = String::new();
        if rng.random_bool(0.9) {
            out.push_str(".machine small\n");
        }
        let n = rng.random_range(1..60);
        for _ in 0..n {
            let line = match rng.random_range(0..10u32) {
                0 => format!(
                    "{} {}",
                    DIRECTIVES[rng.random_range(0..DIRECTIVES.len())],
                    operand(rng)
                ),
                1 => {
                    let m = MNEMONICS[rng.random_range(0..MNEMONICS.len())];
                    let ops: Vec<String> =
                        (0..rng.random_range(0..4)).map(|_| operand(rng)).collect();
                    format!("    {m} {}", ops.join(", "))
                }
                2..=4 => token_edit(lines[rng.random_range(0..lines.len())], rng),
                _ => lines[rng.random_range(0..lines.len())].to_string(),
            };
            out.push_str(&line);
            out.push('\n');
        }
        out.into_bytes()
    }
    fn execute(&self, input: &[u8]) -> Result<String, String> {
        // The command line refuses a file that is not UTF-8 before assembling;
        // replacing the bad bytes still lets the rest of the text reach the parser.
        let text = String::from_utf8_lossy(input);
        // The first diagnostic classifies the input: the ones after it are often
        // consequences of it.
        let p =
            tessera_isa::assemble(&text, "fuzz.s").map_err(|e| match e.diagnostics.first() {
                Some(d) => format!("asm: {}", d.message),
                None => format!("asm: {e}"),
            })?;
        simulate(&p, true)
    }
}

fn operand(rng: &mut Rng) -> String {
    match rng.random_range(0..6u32) {
        0 => REGISTERS[rng.random_range(0..REGISTERS.len())].into(),
        1 => number(rng).to_string(),
        2 => format!("{:#x}", number(rng).unsigned_abs()),
        3 => [
            "main", "done", "buf", "table", "state", "src", "all", "code", "data", "rx", "rw",
        ][rng.random_range(0..11)]
        .into(),
        4 => PUNCT[rng.random_range(0..PUNCT.len())].into(),
        _ => format!("\"{}\"", ["w.fc1", "", "x"][rng.random_range(0..3)]),
    }
}

/// One line with one token replaced, dropped or repeated.
fn token_edit(line: &str, rng: &mut Rng) -> String {
    let mut toks: Vec<String> = line
        .split_inclusive([' ', ','])
        .map(str::to_string)
        .collect();
    if toks.is_empty() {
        return line.to_string();
    }
    let i = rng.random_range(0..toks.len());
    match rng.random_range(0..4u32) {
        0 => {
            toks.remove(i);
        }
        1 => {
            let t = toks[i].clone();
            toks.insert(i, t);
        }
        _ => toks[i] = format!("{} ", operand(rng)),
    }
    toks.concat()
}
