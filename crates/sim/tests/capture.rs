//! Copying tile memory out at superstep boundaries, and the test hook that scales
//! f16 values there: what `tessera run` checks every operation's output with.

mod common;

use common::*;
use tessera_isa::Inst;
use tessera_machine::Machine;
use tessera_package::*;
use tessera_sim::{Capture, CaptureHook, CapturePoint, Perturb, SimOptions, Simulator, Status};

/// f16 1.0 in the low half, 2.0 in the high half.
const ONE_TWO: u32 = 0x4000_3c00;

/// A tile loaded with `value` at `R1` that syncs, swaps that word with tile
/// `other`'s in exchange 7, syncs, exits.
fn tile(tile: u32, other: u32, value: u32) -> TileImage {
    let mut t = TileBuilder::new(tile);
    t.push(s(Inst::SyncGlobal));
    t.words(&exchange_part(7, &[(R1, 4)], &[(other, 0, R1)]));
    t.words(&[s(Inst::SyncGlobal), s(Inst::Exit)]);
    let mut buf = vec![0; 64];
    buf[..4].copy_from_slice(&value.to_le_bytes());
    t.data("buf", R1, buf);
    t.image()
}

fn swap_package() -> Package {
    let x = phase(7);
    package(
        &Machine::small(),
        vec![tile(0, 1, 100), tile(1, 0, ONE_TWO)],
        vec![x],
        vec![],
    )
}

fn word(b: &Option<Vec<u8>>) -> u32 {
    let b = b.as_ref().expect("captured");
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn at(at: CapturePoint, tile: u32, addr: u32, len: u32) -> Capture {
    Capture {
        at,
        tile,
        addr,
        len,
    }
}

#[test]
fn captures_see_memory_before_the_exchange_and_at_the_end() {
    let mut sim = Simulator::new(&swap_package()).unwrap();
    let opts = SimOptions {
        captures: vec![
            at(CapturePoint::Exchange(7, 0), 0, R1, 4),
            at(CapturePoint::End, 0, R1, 4),
            // Never reached, outside memory, a tile without an image.
            at(CapturePoint::Exchange(9, 0), 0, R1, 4),
            at(CapturePoint::End, 0, u32::MAX - 1, 4),
            at(CapturePoint::End, 5, R1, 4),
        ],
        ..SimOptions::default()
    };
    let r = sim.run(&opts);
    assert_eq!(r.status, Status::Ok, "{:#?}", r.faults);
    let c = sim.captured();
    assert_eq!(
        word(&c[0]),
        100,
        "before the swap, tile 0 holds its own word"
    );
    assert_eq!(word(&c[1]), ONE_TWO, "after it, tile 1's");
    assert_eq!(&c[2..], &[None, None, None]);
    // A run without captures leaves none from the last run behind.
    sim.run(&SimOptions::default());
    assert!(sim.captured().is_empty());
}

/// With a hook, each capture's bytes go to it as they are copied out, in the
/// order the run reaches their points, and the simulator keeps none; what was
/// never copied out never arrives.
#[test]
fn a_capture_hook_takes_each_capture_as_it_is_copied_out() {
    let mut sim = Simulator::new(&swap_package()).unwrap();
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = got.clone();
    let opts = SimOptions {
        captures: vec![
            at(CapturePoint::End, 0, R1, 4),
            at(CapturePoint::Exchange(7, 0), 0, R1, 4),
            at(CapturePoint::Exchange(9, 0), 0, R1, 4),
            at(CapturePoint::End, 5, R1, 4),
        ],
        on_capture: Some(CaptureHook(std::sync::Arc::new(move |k, b| {
            sink.lock().unwrap().push((k, b));
        }))),
        ..SimOptions::default()
    };
    let r = sim.run(&opts);
    assert_eq!(r.status, Status::Ok, "{:#?}", r.faults);
    let got = got.lock().unwrap();
    let words: Vec<(usize, u32)> = got
        .iter()
        .map(|(k, b)| (*k, word(&Some(b.clone()))))
        .collect();
    assert_eq!(words, vec![(1, 100), (0, ONE_TWO)]);
    assert!(sim.captured().iter().all(Option::is_none));
}

#[test]
fn a_perturbation_scales_f16_values_before_the_captures_and_the_run_goes_on() {
    let mut sim = Simulator::new(&swap_package()).unwrap();
    let opts = SimOptions {
        captures: vec![Capture {
            at: CapturePoint::Exchange(7, 0),
            tile: 1,
            addr: R1,
            len: 4,
        }],
        perturb: vec![Perturb {
            at: CapturePoint::Exchange(7, 0),
            tile: 1,
            addr: R1,
            len: 4,
            factor: 1.5,
        }],
        ..SimOptions::default()
    };
    let r = sim.run(&opts);
    assert_eq!(r.status, Status::Ok, "{:#?}", r.faults);
    // 1.0 and 2.0 became 1.5 (0x3e00) and 3.0 (0x4200), captured as such and sent
    // on to tile 0 by the exchange.
    assert_eq!(word(&sim.captured()[0]), 0x4200_3e00);
    let b = sim.read_memory(0, R1, 4).unwrap();
    assert_eq!(u32::from_le_bytes([b[0], b[1], b[2], b[3]]), 0x4200_3e00);
    // The next run starts from the loaded image, unperturbed.
    sim.run(&SimOptions::default());
    let b = sim.read_memory(0, R1, 4).unwrap();
    assert_eq!(u32::from_le_bytes([b[0], b[1], b[2], b[3]]), ONE_TWO);
}
