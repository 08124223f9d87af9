//! The AMP kernel against a scalar reference, and the calibration shape.

use tessera_machine::Machine;
use tessera_sim::bench::{AmpLayout, amp_package, amp_reference};
use tessera_sim::{SimOptions, Simulator, Status};

#[test]
fn amp_product_matches_reference() {
    let machine = Machine::small();
    for rows in [1u32, 5, 6, 7, 16, 37] {
        let pkg = amp_package(&machine, 2, rows, 2).unwrap();
        let mut sim = Simulator::new(&pkg).unwrap();
        let report = sim.run(&SimOptions::default());
        assert_eq!(report.status, Status::Ok, "{:?}", report.faults);
        let l = AmpLayout::new(rows);
        let want = amp_reference(rows);
        for tile in 0..2 {
            let got = sim.read_memory(tile, l.y, rows * 32).unwrap();
            let got: Vec<u16> = got
                .chunks(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();
            assert_eq!(got, want, "rows {rows} tile {tile}");
        }
    }
}
