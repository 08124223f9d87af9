//! The AMP feeder fast paths. A matrix product's rows are repeat bodies of
//! `{ ld2xst64pace ; amp }` bundles, and they are most of what a model's tiles
//! issue, so the main loop's bookkeeping per issue (fetch, dispatch, operand
//! decoding, repeat handling) is worth skipping for them: a fifth of the CPU
//! time of a batch-4 tower's simulation (`docs/sim.md`). Here runs of them are
//! issued with the pc, clock and pointers in locals, and a repeat body made only
//! of them is decoded once for all its iterations.
//!
//! Nothing here decides anything the general path does not: every issue makes
//! the same checks, and where one would fail (a fault, the cycle budget, a store
//! into code) the run stops before that issue and leaves it to the general path,
//! which raises what it raises. Same issues, same order, same clock.

use super::{Amp, Ctx, Env, Feeder, Shared, amp_step, ar2, feeder_bundle, set_a2, stride_bytes};
use crate::program::Program;
use tessera_isa::{MReg, Word};

/// The feeder bundles that follow one the main loop has issued, issued here
/// until the next word is anything else (or would fault, or the budget runs
/// out, or a store hits code).
#[inline(always)]
pub(super) fn feeder_run<const F16C: bool>(
    sh: &mut Shared,
    ctx: &mut Ctx,
    amp: &mut Amp,
    env: &Env,
    prog: &Program,
) {
    let mut pc = ctx.pc;
    let mut clock = ctx.clock;
    let mut last = ctx.last_issue;
    let mut issued = 0u64;
    while clock < env.budget && pc.is_multiple_of(8) {
        if pc == ctx.rpt_start
            && ctx.rpt_left > 0
            && let Some(body) = Body::decode(prog, ctx.rpt_start, ctx.rpt_end)
        {
            let (n, at) = body_run::<F16C>(sh, ctx, amp, env, &body, &mut clock, &mut last);
            issued += n;
            pc = at;
            if n > 0 {
                continue;
            }
        }
        let Ok(Word::Bundle(main, aux)) = prog.fetch(pc) else {
            break;
        };
        if !feeder_bundle::<F16C>(sh, ctx, amp, env, main, aux, clock, last) {
            break;
        }
        last = clock;
        clock += env.interval + env.amp_extra;
        issued += 1;
        ctx.m[15] = 0;
        ctx.a[15] = 0;
        let next = pc + 8;
        pc = if ctx.rpt_left > 0 && next == ctx.rpt_end {
            ctx.rpt_left -= 1;
            if ctx.rpt_left > 0 {
                ctx.rpt_start
            } else {
                next
            }
        } else {
            next
        };
        if sh.code_dirty {
            break;
        }
    }
    ctx.pc = pc;
    ctx.clock = clock;
    ctx.last_issue = last;
    ctx.issues += issued;
    ctx.instructions += 2 * issued;
}

/// Longest body taken (the kernels' is four bundles, one row).
const MAX_OPS: usize = 8;

/// A repeat body made only of feeder bundles on one set of pointer registers.
struct Body {
    /// The bundles in order, then `None`.
    ops: [Option<Feeder>; MAX_OPS],
    /// The two load pointers and the store pointer: distinct, none `$m15`.
    regs: [MReg; 3],
    /// The stride register of the strided bundles (not a pointer register, so
    /// constant through the body).
    stride: Option<MReg>,
    start: u32,
    end: u32,
}

impl Body {
    fn decode(prog: &Program, start: u32, end: u32) -> Option<Body> {
        if !start.is_multiple_of(8) || end <= start || !(end - start).is_multiple_of(8) {
            return None;
        }
        let len = ((end - start) / 8) as usize;
        if len > MAX_OPS {
            return None;
        }
        let mut body = Body {
            ops: [None; MAX_OPS],
            regs: [MReg(0); 3],
            stride: None,
            start,
            end,
        };
        for k in 0..len {
            let Ok(Word::Bundle(main, aux)) = prog.fetch(start + 8 * k as u32) else {
                return None;
            };
            let f = Feeder::of(main, aux)?;
            let (regs, stride) = (f.p, f.stride);
            if k == 0 {
                body.regs = regs;
            } else if regs != body.regs {
                return None;
            }
            if let Some(r) = stride {
                if body.stride.is_some_and(|b| b != r) {
                    return None;
                }
                body.stride = Some(r);
            }
            body.ops[k] = Some(f);
        }
        let [p0, p1, ps] = body.regs.map(|r| r.0 & 15);
        let distinct = p0 != p1 && p0 != ps && p1 != ps;
        let stride_ok = body
            .stride
            .is_none_or(|r| ![p0, p1, ps].contains(&(r.0 & 15)));
        (distinct && stride_ok && ![p0, p1, ps].contains(&15)).then_some(body)
    }
}

/// Runs `body` from the start of its current iteration until the repeat ends or
/// an issue must be left to the general path. Returns the issues made and the pc
/// to go on from; the repeat count and the registers are left as those issues
/// left them.
///
/// Its issue is `feeder_bundle`'s with the pointers in locals: the same checks
/// and effects, written again because calling `feeder_bundle`'s per-issue code
/// here instead (pointers read from and written to the context each issue, the
/// store's code check through `Shared::wr`) measured 14.65 s against 13.73 s
/// on the 2-layer batch-1 package (one thread, min of three). The unit tests
/// compare both with the general path.
#[inline(always)]
fn body_run<const F16C: bool>(
    sh: &mut Shared,
    ctx: &mut Ctx,
    amp: &mut Amp,
    env: &Env,
    body: &Body,
    clock: &mut u64,
    last: &mut u64,
) -> (u64, u32) {
    let [r0, r1, rs] = body.regs.map(|r| usize::from(r.0 & 15));
    let (mut a0, mut a1, mut a2) = (ctx.m[r0], ctx.m[r1], ctx.m[rs]);
    let stride = body.stride.map_or(8, |r| stride_bytes(ctx, r));
    let l = &env.layout;
    let (lo, hi) = (l.start, l.end - 8);
    let inside = |a: u32| lo <= a && a <= hi;
    let step = env.interval + env.amp_extra;
    let mut issued = 0u64;
    loop {
        for (k, op) in body.ops.iter().flatten().enumerate() {
            let t = *clock;
            let inc0 = if op.stride.is_some() { stride } else { 8 };
            let stop = t >= env.budget
                || (a0 | a1 | a2) & 7 != 0
                || !inside(a0)
                || !inside(a1)
                || !inside(a2)
                || sh.prog.overlaps(a2, 8);
            let n0 = u32::try_from(i64::from(a0) + inc0).ok();
            let stop = stop || n0.is_none() || {
                let (e0, e1, e2) = (l.element(a0), l.element(a1), l.element(a2));
                e0 == e1 || e0 == e2 || e1 == e2
            };
            if stop || sh.hz.worker_amp(t).is_err() {
                return (issued, body.start + 8 * k as u32);
            }
            sh.hz.feed(&ctx.m, body.regs, [a0, a1, a2], inc0, t, *last);
            let sv = ar2(ctx, op.s);
            let result = amp_step::<F16C>(
                amp,
                &sh.weights,
                ar2(ctx, op.inp),
                ar2(ctx, op.pin),
                op.phase,
            );
            let (o0, o1, os) = ((a0 - lo) as usize, (a1 - lo) as usize, (a2 - lo) as usize);
            let v0 = u64::from_le_bytes(sh.mem[o0..o0 + 8].try_into().expect("8 bytes"));
            let v1 = u64::from_le_bytes(sh.mem[o1..o1 + 8].try_into().expect("8 bytes"));
            sh.mem[os..os + 8].copy_from_slice(&sv.to_le_bytes());
            set_a2(ctx, op.d[0], v0);
            set_a2(ctx, op.d[1], v1);
            set_a2(ctx, op.out, result);
            ctx.a[15] = 0;
            a0 = n0.unwrap_or_default();
            a1 += 8;
            a2 += 8;
            ctx.m[r0] = a0;
            ctx.m[r1] = a1;
            ctx.m[rs] = a2;
            *last = t;
            *clock = t + step;
            issued += 1;
        }
        ctx.rpt_left -= 1;
        if ctx.rpt_left == 0 {
            return (issued, body.end);
        }
    }
}
