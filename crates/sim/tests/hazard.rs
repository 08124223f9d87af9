//! Hazards between a tile's contexts (`docs/sim.md`, "Hazards"): hand-written
//! programs, assembled, where the supervisor touches what a running worker
//! touches later, or loads AMP weights a running worker still uses.

use tessera_sim::{Context, FaultKind, SimOptions, SimReport, Simulator, Status};

/// One tile of c600: the supervisor `sup` (after `main:`), then the workers'
/// code `workers` (labels of its own), and a data section at 0x90000 with
/// `buf` (256 bytes) and `weights` (512 bytes of the AMP weight layout).
fn program(sup: &str, workers: &str) -> String {
    format!(
        ".machine c600\n.tiles 1\n.tile 0\n.section code 0x4c000 rx\n.entry main\nmain:\n{sup}\n\
         .align 8\n{workers}\n\
         .section data 0x90000 rw\nbuf:\n    .zero 256\nweights:\n    .zero 512\n"
    )
}

fn run(source: &str) -> SimReport {
    let package = tessera_isa::assemble(source, "hazard.s").unwrap_or_else(|e| panic!("{e}"));
    let mut sim = Simulator::new(&package).unwrap();
    sim.run(&SimOptions::default())
}

/// The one fault of a run, which must be an ExecutionHazard.
fn hazard(report: &SimReport) -> &tessera_sim::Fault {
    assert_eq!(report.status, Status::Fault, "{:#?}", report.faults);
    assert_eq!(report.faults.len(), 1, "{:#?}", report.faults);
    let f = &report.faults[0];
    assert_eq!(f.kind, FaultKind::ExecutionHazard, "{f}");
    f
}

/// Worker code reading `buf` (its state pointer) on 40 issues, 240 cycles.
const READER: &str = "reader:
    rpt 40, 1
    ld32 $m2, $m0, 0
    exit";

#[test]
fn supervisor_store_into_a_buffer_a_running_worker_reads_faults() {
    let r = run(&program(
        "    setzi $m2, reader
    setzi $m3, buf
    run $m2, $m3, 3
    setzi $m5, 7
    st32 $m5, $m3, 0
    sync local
    exit",
        READER,
    ));
    let f = hazard(&r);
    assert_eq!(f.tile, 0);
    assert_eq!(f.context, Context::Supervisor);
    assert_eq!(f.races, Some(Context::Worker(3)));
    assert_eq!(f.symbol.as_deref(), Some("main"));
    assert_eq!(f.offset, 16);
    assert_eq!(f.instruction, "st32 $m5, $m3, 0");
    assert_eq!(f.address, Some(0x90000));
    assert!(
        f.cause.contains("0x90000..0x90004") && f.cause.contains("worker 3"),
        "{}",
        f.cause
    );
    let text = f.to_string();
    assert!(
        text.starts_with("tile 0 supervisor: ExecutionHazard at main+0x10 `st32 $m5, $m3, 0`"),
        "{text}"
    );
}

#[test]
fn supervisor_store_to_a_disjoint_range_is_no_hazard() {
    // The worker reads buf[0..4]; the supervisor writes buf[4..8] and buf[64..68].
    let r = run(&program(
        "    setzi $m2, reader
    setzi $m3, buf
    run $m2, $m3, 3
    setzi $m5, 7
    st32 $m5, $m3, 1
    st32 $m5, $m3, 16
    sync local
    exit",
        READER,
    ));
    assert_eq!(r.status, Status::Ok, "{:#?}", r.faults);
}

#[test]
fn supervisor_store_after_the_workers_last_read_is_no_hazard() {
    // The worker reads buf once, at its first issue, then keeps running: a store
    // that comes after the read in cycles is seen by nobody (the matmul
    // kernels store the next call's header so).
    let r = run(&program(
        "    setzi $m2, early
    setzi $m3, buf
    run $m2, $m3, 0
    nop
    nop
    nop
    nop
    nop
    nop
    nop
    nop
    setzi $m5, 7
    st32 $m5, $m3, 0
    sync local
    exit",
        "early:
    ld32 $m2, $m0, 0
    rpt 40, 1
    nop
    exit",
    ));
    assert_eq!(r.status, Status::Ok, "{:#?}", r.faults);
}

#[test]
fn supervisor_load_of_bytes_a_running_worker_writes_faults() {
    let r = run(&program(
        "    setzi $m2, writer
    setzi $m3, buf
    run $m2, $m3, 1
    ld32 $m5, $m3, 2
    sync local
    exit",
        "writer:
    setzi $m2, 9
    rpt 40, 1
    st32 $m2, $m0, 2
    exit",
    ));
    let f = hazard(&r);
    assert_eq!(f.context, Context::Supervisor);
    assert_eq!(f.races, Some(Context::Worker(1)));
    assert_eq!(f.instruction, "ld32 $m5, $m3, 2");
    assert!(
        f.cause.contains("load from 0x90008..0x9000c"),
        "{}",
        f.cause
    );
    assert!(f.cause.contains("writes"), "{}", f.cause);
}

/// Worker code running the AMP on 40 issues.
const AMP_USER: &str = "amp_user:
    rpt 40, 1
    amp $a0:1, $a2:3, $a4:5, 0
    exit";

#[test]
fn supervisor_ampw_while_a_worker_runs_amp_faults() {
    let r = run(&program(
        "    setzi $m2, amp_user
    setzi $m3, buf
    setzi $m4, weights
    run $m2, $m3, 5
    ampw $m4+=, 0
    sync local
    exit",
        AMP_USER,
    ));
    let f = hazard(&r);
    assert_eq!(f.context, Context::Supervisor);
    assert_eq!(f.races, Some(Context::Worker(5)));
    assert_eq!(f.symbol.as_deref(), Some("main"));
    assert_eq!(f.offset, 16);
    assert_eq!(f.instruction, "ampw $m4+=, 0");
    assert!(f.cause.contains("worker 5"), "{}", f.cause);
}

#[test]
fn supervisor_ampw_and_store_after_sync_local_are_no_hazard() {
    let r = run(&program(
        "    setzi $m2, amp_user
    setzi $m3, buf
    setzi $m4, weights
    run $m2, $m3, 5
    setzi $m2, reader
    run $m2, $m3, 4
    sync local
    ampw $m4+=, 0
    st32 $m4, $m3, 0
    exit",
        &format!("{AMP_USER}\n.align 8\n{READER}"),
    ));
    assert_eq!(r.status, Status::Ok, "{:#?}", r.faults);
}

#[test]
fn worker_ampw_while_another_worker_runs_amp_faults() {
    // Worker 0 runs the AMP for 240 cycles; worker 1, started right after it,
    // loads weights meanwhile.
    let r = run(&program(
        "    setzi $m2, amp_user
    setzi $m3, buf
    run $m2, $m3, 0
    setzi $m2, loader
    setzi $m3, weights
    run $m2, $m3, 1
    sync local
    exit",
        &format!(
            "{AMP_USER}
.align 8
loader:
    ampw $m0+=, 0
    exit"
        ),
    ));
    let f = hazard(&r);
    assert_eq!(f.context, Context::Worker(1));
    assert_eq!(f.races, Some(Context::Worker(0)));
    assert_eq!(f.symbol.as_deref(), Some("loader"));
    assert_eq!(f.instruction, "ampw $m0+=, 0");
}

#[test]
fn hazards_are_reported_the_same_on_every_run() {
    let source = program(
        "    setzi $m2, reader
    setzi $m3, buf
    run $m2, $m3, 3
    run $m2, $m3, 1
    setzi $m5, 7
    st32 $m5, $m3, 0
    sync local
    exit",
        READER,
    );
    let a = run(&source);
    let f = hazard(&a);
    // Both workers read buf after the store; the report names the lower.
    assert_eq!(f.races, Some(Context::Worker(1)));
    let b = run(&source);
    assert_eq!(a.faults, b.faults);
}

#[test]
fn host_transfer_into_a_buffer_a_running_worker_reads_faults() {
    // `hostxfer` writes buf[0..4] from the host while worker 2 still reads it.
    let source = program(
        "    setzi $m2, reader
    setzi $m3, buf
    setzi $m4, desc
    run $m2, $m3, 2
    hostxfer $m4
    sync local
    exit",
        READER,
    )
    .replace("weights:\n", "desc:\n    .word 1, 0, 0, buf, 4\nweights:\n")
        + ".binding input x 4\n.slice 0 buf 0 4\n";
    let f = hazard(&run(&source)).clone();
    assert_eq!(f.context, Context::Supervisor);
    assert_eq!(f.races, Some(Context::Worker(2)));
    assert_eq!(f.instruction, "hostxfer $m4");
    assert!(f.cause.contains("store to 0x90000..0x90004"), "{}", f.cause);
}

/// Worker code streaming 40 AMP feeder bundles: loads from 0x90000 and
/// 0x90008 on, stores from 0xa0000 on (320 bytes, the last at its 41st issue).
const FEEDER: &str = "feeder:
    setzi $m2, 0x90000
    setzi $m3, 0x90008
    setzi $m4, 0xa0000
    rpt 40, 1
    { ld2xst64pace $a0:1, $a2:3, $a4:5, $m2+=, $m3+=, $m4+= ; amp $a4:5, $a0:1, $a2:3, 0 }
    exit";

#[test]
fn supervisor_store_into_an_amp_feeders_streams_faults() {
    // Into the store stream's last bytes, and into the loads' (a separate run).
    for (at, theirs) in [("0xa0138", "writes"), ("0x90100", "reads")] {
        let r = run(&program(
            &format!(
                "    setzi $m2, feeder
    setzi $m3, {at}
    run $m2, $m3, 4
    st32 $m3, $m3, 0
    sync local
    exit"
            ),
            FEEDER,
        ));
        let f = hazard(&r);
        assert_eq!(f.races, Some(Context::Worker(4)));
        assert!(f.cause.contains(theirs), "{}", f.cause);
    }
    // Past the end of every stream: no hazard.
    let r = run(&program(
        "    setzi $m2, feeder
    setzi $m3, 0xa0140
    run $m2, $m3, 4
    st32 $m3, $m3, 0
    sync local
    exit",
        FEEDER,
    ));
    assert_eq!(r.status, Status::Ok, "{:#?}", r.faults);
}

/// Worker code reading a row-major input of ten 64-byte rows, the first 32
/// bytes of each (three plain feeder issues and a strided one a row), from
/// 0x90000; the second load stream from 0x90008, the store stream from 0xa0000.
const STRIDED_FEEDER: &str = "sfeeder:
    setzi $m2, 0x90000
    setzi $m3, 0x90008
    setzi $m4, 0xa0000
    setzi $m5, 5
    nop
    rpt 10, 4
    { ld2xst64pace $a0:1, $a2:3, $a4:5, $m2+=, $m3+=, $m4+= ; amp $a4:5, $a0:1, $a2:3, 0 }
    { ld2xst64pace $a0:1, $a2:3, $a4:5, $m2+=, $m3+=, $m4+= ; amp $a4:5, $a0:1, $a2:3, 1 }
    { ld2xst64pace $a0:1, $a2:3, $a4:5, $m2+=, $m3+=, $m4+= ; amp $a4:5, $a0:1, $a2:3, 2 }
    { ld2xst64pace $a0:1, $a2:3, $a4:5, $m2+=$m5, $m3+=, $m4+= ; amp $a4:5, $a0:1, $a2:3, 3 }
    exit";

#[test]
fn strided_feeder_rows_race_and_their_gaps_do_not() {
    let store_at = |at: &str| {
        run(&program(
            &format!(
                "    setzi $m2, sfeeder
    setzi $m3, {at}
    run $m2, $m3, 2
    st32 $m3, $m3, 0
    sync local
    exit"
            ),
            STRIDED_FEEDER,
        ))
    };
    // Row 8's bytes 0x90200..0x90220 are read late in the run.
    let r = store_at("0x90204");
    let f = hazard(&r);
    assert_eq!(f.races, Some(Context::Worker(2)));
    assert!(f.cause.contains("reads 0x90200..0x90220"), "{}", f.cause);
    // Row 5's second half (0x90160..0x90180) is never read, nor reached by the
    // second load stream (0x90008..0x90148).
    let r = store_at("0x90168");
    assert_eq!(r.status, Status::Ok, "{:#?}", r.faults);
}
