//! The plan's text form: what a person reads to see how a model was spread over
//! the tiles, and what golden tests compare. One line per step, buffer, call, copy
//! and binding slice, in plan order, so that a change to the lowering shows as a
//! readable diff.

use std::fmt;

use crate::ir::{BindingDir, Loc, StepKind, TilePlan};

struct At(Loc);

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}+{}", self.0.buf, self.0.offset)
    }
}

impl fmt::Display for TilePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "plan: {} tiles, {} steps, {} buffers, {} calls, {} exchanges, {} bindings",
            self.tiles,
            self.steps.len(),
            self.buffers.len(),
            self.calls.len(),
            self.exchanges.len(),
            self.bindings.len()
        )?;
        if let Some(lp) = &self.layer_loop {
            writeln!(
                f,
                "loop: steps {}..={} run {} times, as `{}<i>.`",
                lp.first, lp.last, lp.count, lp.prefix
            )?;
        }
        for (name, scale, factor) in &self.fp8_weights {
            writeln!(f, "fp8: `{name}` times {factor} at 2^{scale}")?;
        }
        for d in &self.decisions {
            writeln!(f, "decision: {d}")?;
        }
        for o in &self.ops {
            if o.fused.is_empty() {
                writeln!(f, "op {} ({})", o.name, o.kind)?;
            } else {
                writeln!(
                    f,
                    "op {} ({}) fusing {}",
                    o.name,
                    o.kind,
                    o.fused.join(", ")
                )?;
            }
        }
        for (i, s) in self.steps.iter().enumerate() {
            let kind = match s {
                StepKind::HostIn => "host in".to_string(),
                StepKind::Compute => "compute".to_string(),
                StepKind::Exchange(id) => format!("exchange #{id}"),
                StepKind::HostOut => "host out".to_string(),
            };
            match self.step_ops.get(i).filter(|o| !o.is_empty()) {
                Some(op) => writeln!(f, "step {i}: {kind} ({op})")?,
                None => writeln!(f, "step {i}: {kind}")?,
            }
        }
        for b in &self.buffers {
            writeln!(
                f,
                "{} tile{} `{}` {} B align {} {:?} tail {} steps {}..={} {}",
                b.id,
                b.tile,
                b.name,
                b.bytes,
                b.align,
                b.class,
                b.tail,
                b.first,
                b.last,
                b.category.name()
            )?;
            if b.instances > 1 {
                writeln!(f, "  x{} instances, stride {}", b.instances, b.stride())?;
            }
        }
        for (a, b) in &self.separations {
            writeln!(f, "separate {a} {b}")?;
        }
        for c in &self.calls {
            write!(
                f,
                "call step {} tile{} {}:",
                c.step,
                c.tile,
                c.kernel.kernel().symbol()
            )?;
            for (name, loc) in &c.operands {
                write!(f, " {name}={}", At(*loc))?;
            }
            writeln!(f, " state={}", c.state)?;
        }
        for x in &self.exchanges {
            writeln!(
                f,
                "exchange #{} `{}` step {}: {} copies",
                x.id,
                x.name,
                x.step,
                x.copies.len()
            )?;
            for c in &x.copies {
                let dsts: Vec<String> = c.dsts.iter().map(|d| At(*d).to_string()).collect();
                writeln!(f, "  {} B {} -> {}", c.bytes, At(c.src), dsts.join(" "))?;
            }
        }
        for b in &self.bindings {
            let dir = match b.dir {
                BindingDir::Input => "input",
                BindingDir::Output => "output",
                BindingDir::Weight => "weight",
            };
            writeln!(
                f,
                "binding {dir} `{}` {} B, {} slices",
                b.name,
                b.bytes,
                b.slices.len()
            )?;
            for s in &b.slices {
                write!(
                    f,
                    "  host {}..{} at {}",
                    s.offset,
                    s.offset + s.bytes,
                    At(s.loc)
                )?;
                if s.instance > 0 {
                    write!(f, " instance {}", s.instance)?;
                }
                writeln!(f)?;
            }
        }
        Ok(())
    }
}
