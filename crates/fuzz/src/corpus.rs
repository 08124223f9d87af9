//! The seed corpora, compiled into the crate so that the command line needs no
//! files beside it. `tests/short.rs` checks that these lists name exactly the files
//! under `corpus/` and that every seed is accepted by its reader.

use crate::Seed;

macro_rules! seeds {
    ($($file:literal),* $(,)?) => {
        &[$(Seed {
            name: $file,
            bytes: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/corpus/", $file)),
        }),*]
    };
}

pub const PACKAGE: &[Seed] = seeds![
    "package/misaligned_ld64step.tpk",
    "package/small.tpk",
    "package/tanh.tpk",
    "package/tiles.tpk",
];

pub const ASM: &[Seed] = seeds![
    "asm/aligned_ld64step.s",
    "asm/small.s",
    "asm/tanh.s",
    "asm/tiles.s",
];

pub const PLACE_CSV: &[Seed] = seeds![
    "place-csv/aligned.csv",
    "place-csv/inclusive.csv",
    "place-csv/minimalloc_input12.csv",
];

pub const PLACE_JSON: &[Seed] = seeds![
    "place-json/example.json",
    "place-json/overflow.json",
    "place-json/seed_split.json",
];

pub const MACHINE: &[Seed] = seeds![
    "machine/bow.toml",
    "machine/c600.toml",
    "machine/small.toml",
];

pub const CONFIG: &[Seed] = seeds![
    "config/small.toml",
    "config/so400m.toml",
    "config/tiny.toml",
];

pub const SAFETENSORS: &[Seed] = seeds![
    "safetensors/f16.safetensors",
    "safetensors/f32.safetensors",
    "safetensors/mixed.safetensors",
];
