//! Each tile's part of an exchange phase: the counts the fit loop and the
//! estimate read agree with the parts the compiler emits from, on real plans.

use tessera_graph::{EncoderLayerConfig, encoder_layer, init_weights};
use tessera_machine::Machine;
use tessera_plan::exchange_code::{TileCounts, exchange_counts, exchange_parts};
use tessera_plan::{LowerOptions, lower};

#[test]
fn counts_agree_with_the_parts_on_every_phase() {
    for (machine, cfg) in [
        (Machine::small(), EncoderLayerConfig::tiny(2)),
        (Machine::small().with_tiles(16), EncoderLayerConfig::tiny(3)),
    ] {
        let graph = encoder_layer(&cfg).unwrap();
        let weights = init_weights(&graph, 1);
        let plan = lower(&machine, &graph, &weights, &LowerOptions::default()).unwrap();
        assert!(!plan.exchanges.is_empty());
        let mut messages = 0;
        for x in &plan.exchanges {
            let parts = exchange_parts(&plan, x);
            let counts = exchange_counts(&plan, x);
            for (t, (p, c)) in parts.iter().zip(&counts).enumerate() {
                let from_parts = TileCounts {
                    sends: p.sends.len(),
                    groups: p.recv_groups(),
                    relative: p.relative,
                };
                assert_eq!(*c, from_parts, "exchange #{} tile {t}", x.id);
                assert_eq!(
                    c.code_bytes(),
                    p.code_bytes(),
                    "exchange #{} tile {t}",
                    x.id
                );
                messages += p.sends.len();
            }
            // Every byte a copy moves is sent once and landed by each destination.
            let sent: u64 = parts
                .iter()
                .flat_map(|p| p.sends.iter().map(|s| u64::from(s.1)))
                .sum();
            let copied: u64 = x.copies.iter().map(|c| u64::from(c.bytes)).sum();
            assert_eq!(sent, copied, "exchange #{}", x.id);
        }
        assert!(messages > 0);
    }
}

/// The planner's estimate charges exchange by the simulator's rule, so it follows
/// the machine's overlap of exchange code and bytes: the same plan's exchange
/// estimate falls as the overlap grows, and nothing else in it moves.
#[test]
fn the_estimate_follows_the_overlap_of_code_and_bytes() {
    let machine = Machine::small();
    let graph = encoder_layer(&EncoderLayerConfig::tiny(2)).unwrap();
    let weights = init_weights(&graph, 1);
    let plan = lower(&machine, &graph, &weights, &LowerOptions::default()).unwrap();
    let at = |percent: u32| {
        let mut m = machine.clone();
        m.timing.exchange_code_overlap_percent = percent;
        tessera_plan::estimate(&m, &plan)
    };
    let (none, half, full) = (at(0), at(50), at(100));
    assert_eq!(none, tessera_plan::estimate(&machine, &plan));
    assert!(
        none.exchange > half.exchange && half.exchange > full.exchange,
        "{none:?} {half:?} {full:?}"
    );
    for e in [half, full] {
        assert_eq!((e.compute, e.sync), (none.compute, none.sync));
        assert_eq!(e.cycles, e.compute + e.exchange + e.sync);
    }
}
