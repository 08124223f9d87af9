//! Placement problems, read and placed as `tessera place` does: CSV through
//! `parse_csv` and `place_flat`, JSON through `Problem::from_json` and
//! `place_tiles`. The search runs under a small node budget so that an execution
//! stays short; the budget changes how hard the allocator tries, not what it accepts.

use crate::mutate::{interesting, number};
use crate::targets::tree::mutate_json;
use crate::{Rng, Seed, Target, corpus};
use rand::Rng as _;
use tessera_machine::Machine;
use tessera_place::{MemClass, Options, Problem, Request, TileProblem, parse_csv, place_flat};

const NODE_BUDGET: u64 = 2_000;

fn options(capacity: Option<u64>) -> Options {
    Options {
        capacity,
        node_budget: NODE_BUDGET,
        ..Options::default()
    }
}

/// Something the input decides, to vary the options without a side channel.
fn input_hash(input: &[u8]) -> u64 {
    input.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

pub struct CsvTarget;

const HEADERS: [&str; 7] = [
    "id,lower,upper,size",
    "id,lower,upper,size,alignment",
    "id,start,end,size",
    "size,upper,lower,id",
    "id,begin,upper,size",
    "id,lower,upper,size,offset",
    "id,lower,size",
];

impl Target for CsvTarget {
    fn name(&self) -> &'static str {
        "place-csv"
    }
    fn about(&self) -> &'static str {
        "parse_csv, then place_flat (2k search nodes; capacity none, tight or loose)"
    }
    fn corpus(&self) -> &'static [Seed] {
        corpus::PLACE_CSV
    }
    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        let header = HEADERS[rng.random_range(0..HEADERS.len())];
        let cols: Vec<&str> = header.split(',').collect();
        let mut out = format!("{header}\n");
        let rows = rng.random_range(0..40);
        let extreme = rng.random_bool(0.3);
        for r in 0..rows {
            let lower = if extreme && rng.random_bool(0.3) {
                number(rng)
            } else {
                rng.random_range(0..20)
            };
            let fields: Vec<String> = cols
                .iter()
                .map(|c| match *c {
                    "id" => {
                        if rng.random_bool(0.05) {
                            "b0".into()
                        } else {
                            format!("b{r}")
                        }
                    }
                    "lower" | "start" | "begin" => lower.to_string(),
                    "upper" | "end" => {
                        if extreme && rng.random_bool(0.3) {
                            number(rng).to_string()
                        } else {
                            (lower + rng.random_range(0..12)).to_string()
                        }
                    }
                    "size" => {
                        if extreme && rng.random_bool(0.3) {
                            number(rng).to_string()
                        } else {
                            rng.random_range(1..5000).to_string()
                        }
                    }
                    "alignment" => [0u64, 1, 3, 8, 64, 4096, 1 << 40, u64::MAX]
                        [rng.random_range(0..8)]
                    .to_string(),
                    _ => "0".into(),
                })
                .collect();
            out.push_str(&fields.join(","));
            out.push('\n');
        }
        out.into_bytes()
    }
    fn execute(&self, input: &[u8]) -> Result<String, String> {
        let text = std::str::from_utf8(input).map_err(|_| "input is not UTF-8".to_string())?;
        let p = parse_csv(text, "fuzz.csv").map_err(|e| format!("parse: {e}"))?;
        let lb = p.live_lower_bound();
        let capacity = match input_hash(input) % 3 {
            0 => None,
            1 => Some(lb),
            _ => Some(lb.saturating_add(lb / 8)),
        };
        let r = place_flat(&p, &options(capacity)).map_err(|e| format!("place: {e}"))?;
        Ok(if r.fits { "fits" } else { "does not fit" }.into())
    }
}

pub struct JsonTarget;

impl Target for JsonTarget {
    fn name(&self) -> &'static str {
        "place-json"
    }
    fn about(&self) -> &'static str {
        "Problem::from_json on a preset machine, then place_tiles (2k search nodes, diagnosis on)"
    }
    fn corpus(&self) -> &'static [Seed] {
        corpus::PLACE_JSON
    }
    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        if rng.random_bool(0.5) {
            let seeds = self.corpus();
            let seed = seeds[rng.random_range(0..seeds.len())];
            return mutate_json(std::str::from_utf8(seed.bytes).unwrap_or("{}"), rng).into_bytes();
        }
        let tile = random_tile(rng);
        let problem = Problem {
            machine: Some(["small", "c600", "bow"][rng.random_range(0..3)].into()),
            tiles: vec![tile],
        };
        let text = serde_json::to_string_pretty(&problem).unwrap_or_default();
        if rng.random_bool(0.5) {
            mutate_json(&text, rng).into_bytes()
        } else {
            text.into_bytes()
        }
    }
    fn execute(&self, input: &[u8]) -> Result<String, String> {
        let text = std::str::from_utf8(input).map_err(|_| "input is not UTF-8".to_string())?;
        let problem = Problem::from_json(text).map_err(|e| format!("parse: {e}"))?;
        // `tessera place` would read a machine file named here; fuzzing never follows
        // a path taken from its input.
        let name = problem.machine.as_deref().unwrap_or("c600");
        let machine = Machine::preset(name).map_err(|_| "machine: not a preset".to_string())?;
        let capacity = match input_hash(input) % 3 {
            0 => None,
            1 => Some(u64::from(machine.sram_bytes()) / 2),
            _ => Some(interesting_capacity(input_hash(input))),
        };
        let mut fits = true;
        for r in tessera_place::place_tiles(&machine, &problem.tiles, &options(capacity)) {
            let t = r.map_err(|e| format!("place: {e}"))?;
            fits &= t.fits;
        }
        Ok(if fits { "fits" } else { "does not fit" }.into())
    }
}

fn interesting_capacity(h: u64) -> u64 {
    [0, 1, 4096, u64::from(u32::MAX), u64::MAX][(h / 3 % 5) as usize]
}

fn random_tile(rng: &mut Rng) -> TileProblem {
    let big = |rng: &mut Rng| {
        if rng.random_bool(0.1) {
            interesting(rng)
        } else {
            rng.random_range(1..40_000)
        }
    };
    let pow2 = |rng: &mut Rng| {
        if rng.random_bool(0.05) {
            interesting(rng)
        } else {
            1 << rng.random_range(0..8)
        }
    };
    let classes = [
        MemClass::Any,
        MemClass::Interleaved,
        MemClass::Executable,
        MemClass::NonInterleaved,
    ];
    let n = rng.random_range(0..12);
    let requests: Vec<Request> = (0..n)
        .map(|i| {
            let first = rng.random_range(0..10);
            Request {
                name: format!("r{i}"),
                size: big(rng),
                align: pow2(rng),
                end_round: pow2(rng),
                first,
                last: if rng.random_bool(0.05) {
                    interesting(rng)
                } else {
                    first + rng.random_range(0..6)
                },
                class: classes[rng.random_range(0..classes.len())],
                tail: [0, 8, 16, interesting(rng)][rng.random_range(0..4)],
                loaded: rng.random_bool(0.3),
                category: None,
            }
        })
        .collect();
    let separation = if n >= 2 && rng.random_bool(0.3) {
        vec![vec!["r0".to_string(), "r1".to_string()]]
    } else {
        Vec::new()
    };
    TileProblem {
        tile: rng.random_range(0..4),
        requests,
        separation,
        ..TileProblem::default()
    }
}
