//! The profile reads the simulator's trace: its total is the run's cycle count and
//! its supersteps are the simulator's, for a run with syncs and uneven tiles.

use tessera_sim::{SimOptions, Simulator, Status};

const PROGRAM: &str = "
.machine small
.tile 0
.section code 0x4c000 rx
.entry main
main:
    sync global
    rpt 40, 1
    nop
    sync global
    exit
.tile 1
.section code 0x4c000 rx
.entry main
main:
    rpt 100, 1
    nop
    sync global
    sync global
    setzi $m1, 3
    exit
";

#[test]
fn profile_total_and_supersteps_are_the_simulators() {
    let package = tessera_isa::assemble(PROGRAM, "agree.s").expect("assembles");
    let mut sim = Simulator::new(&package).expect("loads");
    let report = sim.run(&SimOptions::default());
    assert_eq!(report.status, Status::Ok, "{:?}", report.faults);
    let p = tessera_profile::profile(&report.trace);
    assert_eq!(p.total, report.cycles);
    assert_eq!(p.supersteps.len() as u32, report.supersteps);
    assert_eq!(report.supersteps, 3);
    assert_eq!(p.compute + p.exchange + p.host + p.sync, p.total);
}
