//! The profile: what a simulated run spent its cycles on. It owns the reading of a
//! simulator trace into chip-wide phases (compute, exchange, host transfers, syncs)
//! per superstep, and their totals. It must never run anything or change a trace:
//! it reads what the simulator recorded, so its figures are the simulator's.

mod chrome;
pub mod html;

pub use chrome::{TILE_TRACKS, check_trace, chrome_trace};
use serde::Serialize;
use tessera_sim::{TraceEvent, TraceKind};

/// One superstep, chip-wide: from the end of the previous sync to the next sync.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Superstep {
    pub index: u32,
    pub start: u64,
    pub end: u64,
    /// Cycles in exchange phases that began in this superstep.
    pub exchange: u64,
    /// Cycles in host-transfer phases that began in this superstep.
    pub host: u64,
    /// The rest: the slowest tile's compute.
    pub compute: u64,
    /// Exchange program ids run in this superstep.
    pub exchanges: Vec<u16>,
    /// Bytes moved over the host link in this superstep.
    pub host_bytes: u64,
}

/// One encoder layer of a run, as the caller grouped the operations: its
/// interval and the cycles charged to it (the reports that draw layers take
/// them as given; this crate does not know what a layer is).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LayerSpan {
    /// The `i` of `layers.<i>.`.
    pub layer: u32,
    pub start: u64,
    pub end: u64,
    pub cycles: u64,
}

/// Totals over a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Profile {
    pub supersteps: Vec<Superstep>,
    pub compute: u64,
    pub exchange: u64,
    pub host: u64,
    /// Cycles between a superstep's end and the next one's start (barriers).
    pub sync: u64,
    pub total: u64,
    /// Every host-transfer phase, (start, end), in order.
    pub host_phases: Vec<(u64, u64)>,
}

/// Reads the chip-wide events of a trace (tile events are ignored).
pub fn profile(trace: &[TraceEvent]) -> Profile {
    let mut p = Profile::default();
    let mut open: Option<Superstep> = None;
    let mut phase_start = None;
    for e in trace.iter().filter(|e| e.tile.is_none()) {
        match &e.kind {
            TraceKind::SuperstepStart { index } => {
                if let Some(last) = p.supersteps.last() {
                    p.sync += e.cycle.saturating_sub(last.end);
                }
                open = Some(Superstep {
                    index: *index,
                    start: e.cycle,
                    ..Superstep::default()
                });
            }
            TraceKind::ExchangeStart { .. } | TraceKind::HostTransferStart { .. } => {
                phase_start = Some(e.cycle);
            }
            TraceKind::ExchangeEnd { id } => {
                if let (Some(s), Some(ss)) = (phase_start.take(), open.as_mut()) {
                    ss.exchange += e.cycle.saturating_sub(s);
                    ss.exchanges.push(*id);
                }
            }
            TraceKind::HostTransferEnd { bytes } => {
                if let (Some(s), Some(ss)) = (phase_start.take(), open.as_mut()) {
                    ss.host += e.cycle.saturating_sub(s);
                    ss.host_bytes += bytes;
                    p.host_phases.push((s, e.cycle));
                }
            }
            TraceKind::SuperstepEnd { .. } => close(&mut p, &mut open, e.cycle),
            _ => {}
        }
    }
    // The last superstep ends with the run, not with a sync.
    let end = trace.iter().map(|e| e.cycle).max().unwrap_or(0);
    close(&mut p, &mut open, end);
    p.total = p.supersteps.last().map_or(0, |s| s.end);
    p
}

fn close(p: &mut Profile, open: &mut Option<Superstep>, end: u64) {
    if let Some(mut ss) = open.take() {
        ss.end = end.max(ss.start);
        ss.compute = (ss.end - ss.start).saturating_sub(ss.exchange + ss.host);
        p.compute += ss.compute;
        p.exchange += ss.exchange;
        p.host += ss.host;
        p.supersteps.push(ss);
    }
}

/// One exchange or host-transfer phase, chip-wide, as the simulator recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Phase {
    /// `exchange` or `host`.
    pub kind: &'static str,
    pub start: u64,
    pub end: u64,
    /// The exchange program's id, or the bytes a host transfer moved.
    pub detail: u64,
}

/// Every exchange and host-transfer phase of a run, in order.
pub fn phases(trace: &[TraceEvent]) -> Vec<Phase> {
    let mut out = Vec::new();
    let mut start = None;
    for e in trace.iter().filter(|e| e.tile.is_none()) {
        match &e.kind {
            TraceKind::ExchangeStart { .. } | TraceKind::HostTransferStart { .. } => {
                start = Some(e.cycle);
            }
            TraceKind::ExchangeEnd { id } => {
                if let Some(s) = start.take() {
                    out.push(Phase {
                        kind: "exchange",
                        start: s,
                        end: e.cycle.max(s),
                        detail: u64::from(*id),
                    });
                }
            }
            TraceKind::HostTransferEnd { bytes } => {
                if let Some(s) = start.take() {
                    out.push(Phase {
                        kind: "host",
                        start: s,
                        end: e.cycle.max(s),
                        detail: *bytes,
                    });
                }
            }
            _ => {}
        }
    }
    out
}

/// Per tile `0..tiles`: cycles during which at least one of its workers ran a
/// kernel (overlapping kernels count once). A kernel still running when the trace
/// ends (a fault stopped the run) counts up to the tile's last event.
pub fn tile_busy(trace: &[TraceEvent], tiles: u32) -> Vec<u64> {
    let n = tiles as usize;
    let mut busy = vec![0u64; n];
    let mut open = vec![(0u32, 0u64); n];
    let mut last = vec![0u64; n];
    for e in trace {
        let Some(t) = e.tile.map(|t| t as usize).filter(|&t| t < n) else {
            continue;
        };
        last[t] = last[t].max(e.cycle);
        match &e.kind {
            TraceKind::KernelStart { .. } => {
                if open[t].0 == 0 {
                    open[t].1 = e.cycle;
                }
                open[t].0 += 1;
            }
            TraceKind::KernelEnd { .. } if open[t].0 > 0 => {
                open[t].0 -= 1;
                if open[t].0 == 0 {
                    busy[t] += e.cycle.saturating_sub(open[t].1);
                }
            }
            _ => {}
        }
    }
    for t in 0..n {
        if open[t].0 > 0 {
            busy[t] += last[t].saturating_sub(open[t].1);
        }
    }
    busy
}

/// A fixed-width text table of the supersteps and the totals.
pub fn render(p: &Profile) -> String {
    let mut out =
        String::from("superstep      start        end    compute   exchange       host\n");
    for s in &p.supersteps {
        out += &format!(
            "{:>9} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
            s.index, s.start, s.end, s.compute, s.exchange, s.host
        );
    }
    let share = |x: u64| 100.0 * x as f64 / p.total.max(1) as f64;
    out += &format!(
        "total {} cycles: compute {} ({:.1}%), exchange {} ({:.1}%), host {} ({:.1}%), sync {} ({:.1}%)\n",
        p.total,
        p.compute,
        share(p.compute),
        p.exchange,
        share(p.exchange),
        p.host,
        share(p.host),
        p.sync,
        share(p.sync)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chip(cycle: u64, kind: TraceKind) -> TraceEvent {
        TraceEvent {
            cycle,
            tile: None,
            context: None,
            kind,
        }
    }

    #[test]
    fn phases_add_up_to_the_run() {
        let trace = vec![
            chip(0, TraceKind::SuperstepStart { index: 0 }),
            chip(0, TraceKind::HostTransferStart { bytes: 64 }),
            chip(1500, TraceKind::HostTransferEnd { bytes: 64 }),
            chip(2000, TraceKind::SuperstepEnd { index: 0 }),
            chip(2090, TraceKind::SuperstepStart { index: 1 }),
            chip(2090, TraceKind::ExchangeStart { id: 3 }),
            chip(2300, TraceKind::ExchangeEnd { id: 3 }),
            chip(5000, TraceKind::SuperstepEnd { index: 1 }),
            chip(5090, TraceKind::SuperstepStart { index: 2 }),
            chip(6000, TraceKind::Mark { tag: 1 }),
        ];
        let p = profile(&trace);
        assert_eq!(p.supersteps.len(), 3);
        assert_eq!((p.host, p.exchange, p.sync), (1500, 210, 180));
        assert_eq!(p.compute, 500 + 2700 + 910);
        assert_eq!(p.total, 6000);
        assert_eq!(p.compute + p.exchange + p.host + p.sync, p.total);
        assert_eq!(p.supersteps[1].exchanges, vec![3]);
        assert_eq!(p.supersteps[0].host_bytes, 64);
        assert_eq!(p.host_phases, vec![(0, 1500)]);
        assert!(render(&p).contains("total 6000 cycles"));
    }

    #[test]
    fn busy_cycles_count_overlapping_kernels_once() {
        let k = |cycle, tile, start: bool| TraceEvent {
            cycle,
            tile: Some(tile),
            context: None,
            kind: if start {
                TraceKind::KernelStart {
                    symbol: "k".into(),
                    workers: 1,
                }
            } else {
                TraceKind::KernelEnd {
                    symbol: "k".into(),
                    workers: 1,
                }
            },
        };
        let trace = vec![
            chip(0, TraceKind::ExchangeStart { id: 2 }),
            k(5, 0, true),
            k(10, 0, true),
            chip(12, TraceKind::ExchangeEnd { id: 2 }),
            k(20, 0, false),
            k(30, 0, false),
            k(40, 1, true),
            k(50, 0, true),
            k(55, 0, false),
            k(70, 1, false),
            k(80, 2, true),
            k(90, 2, false),
            k(95, 2, true),
            k(99, 9, true),
        ];
        assert_eq!(tile_busy(&trace, 3), vec![25 + 5, 30, 10]);
        let ph = phases(&trace);
        assert_eq!(ph.len(), 1);
        assert_eq!(
            (ph[0].kind, ph[0].start, ph[0].end, ph[0].detail),
            ("exchange", 0, 12, 2)
        );
    }

    #[test]
    fn empty_trace_is_an_empty_profile() {
        assert_eq!(profile(&[]), Profile::default());
    }
}
