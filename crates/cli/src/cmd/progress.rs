//! The driver's progress as bars and spinners on stderr: hidden under `--json`,
//! and by indicatif itself when stderr is not a terminal.

use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tessera_driver::{Progress, Step};

/// Draws one step at a time.
pub struct Bars {
    json: bool,
    bar: Mutex<Option<(Step, ProgressBar)>>,
    /// The encoder layer the running simulation is in, as `layer i of N`.
    layer: Mutex<Option<String>>,
}

impl Bars {
    pub fn new(json: bool) -> Bars {
        Bars {
            json,
            bar: Mutex::new(None),
            layer: Mutex::new(None),
        }
    }

    fn layer_text(&self) -> Option<String> {
        self.layer.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn with_bar(&self, f: impl FnOnce(&mut Option<(Step, ProgressBar)>)) {
        // A panic elsewhere while the lock was held leaves a bar to clear, not a
        // reason to stop reporting.
        let mut bar = self.bar.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut bar);
    }
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_spinner())
}

impl Progress for Bars {
    fn start(&self, step: Step, total: Option<u64>) {
        let pb = match (self.json, total) {
            (true, _) => ProgressBar::hidden(),
            (false, Some(n)) => {
                let pb = ProgressBar::new(n);
                pb.set_style(style("{msg} {pos}/{len} ({elapsed})"));
                pb
            }
            (false, None) => {
                let pb = ProgressBar::new_spinner();
                pb.set_style(style("{spinner} {msg} ({elapsed})"));
                pb
            }
        };
        pb.set_message(step.label());
        *self.layer.lock().unwrap_or_else(|e| e.into_inner()) = None;
        pb.enable_steady_tick(Duration::from_millis(120));
        self.with_bar(|bar| {
            if let Some((_, old)) = bar.replace((step, pb)) {
                old.finish_and_clear();
            }
        });
    }

    fn advance(&self, done: u64, total: Option<u64>) {
        self.with_bar(|bar| {
            if let Some((_, pb)) = bar {
                if let Some(n) = total {
                    pb.set_length(n);
                }
                pb.set_position(done);
            }
        });
    }

    fn detail(&self, what: &str) {
        let layer = self.layer_text();
        self.with_bar(|bar| {
            if let Some((step, pb)) = bar {
                pb.set_message(match &layer {
                    Some(l) => format!("{}: {l}, {what}", step.label()),
                    None => format!("{}: {what}", step.label()),
                });
            }
        });
    }

    fn layer(&self, layer: Option<u32>, layers: u32) {
        // Numbered as the operations' names and the reports number them, from 0.
        *self.layer.lock().unwrap_or_else(|e| e.into_inner()) =
            layer.map(|l| format!("layer {l} of {layers}"));
    }

    fn finish(&self) {
        self.with_bar(|bar| {
            if let Some((_, pb)) = bar.take() {
                pb.finish_and_clear();
            }
        });
    }

    fn finalist_simulated(&self, done: usize, total: usize, rank: usize, cycles: u64) {
        if !self.json {
            eprintln!("simulated finalist {done}/{total} (rank {rank}): {cycles} cycles");
        }
    }
}
