//! `Machine::from_toml`, the text path of `Machine::load`; an accepted description
//! must survive `to_toml` and a second read unchanged, and the derived figures the
//! later stages compute from it must not overflow.

use crate::targets::tree::mutate_toml;
use crate::{Rng, Seed, Target, corpus};
use rand::Rng as _;
use tessera_machine::{ExchangeLoad, Machine};

pub struct MachineTarget;

impl Target for MachineTarget {
    fn name(&self) -> &'static str {
        "machine"
    }
    fn about(&self) -> &'static str {
        "Machine::from_toml, the to_toml round trip and derived figures"
    }
    fn corpus(&self) -> &'static [Seed] {
        corpus::MACHINE
    }
    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        let seeds = self.corpus();
        let seed = seeds[rng.random_range(0..seeds.len())];
        mutate_toml(std::str::from_utf8(seed.bytes).unwrap_or(""), rng).into_bytes()
    }
    fn execute(&self, input: &[u8]) -> Result<String, String> {
        let text = std::str::from_utf8(input).map_err(|_| "input is not UTF-8".to_string())?;
        let m = Machine::from_toml(text, "fuzz.toml").map_err(|e| format!("machine: {e}"))?;
        let again = Machine::from_toml(&m.to_toml(), "round trip");
        assert!(
            again.as_ref().is_ok_and(|a| *a == m),
            "an accepted machine does not survive to_toml and from_toml: {again:?}"
        );
        // What placement, the plan estimate and the simulator read first.
        let _ = (m.sram_bytes(), m.peak_f16_flop_per_cycle());
        for addr in [m.sram_start(), m.loader_limit, m.sram_end() - 1] {
            let _ = (
                m.element_of(addr),
                m.element_span_of(addr),
                m.is_executable(addr),
            );
        }
        let _ = m.host_phase_cycles(1 << 30, 1 << 30);
        let _ = m.cycles_to_seconds(u64::MAX);
        let mut load = ExchangeLoad::new(&m);
        load.add(0, 1 << 20, [m.tiles - 1]);
        let _ = load.cycles();
        Ok("accepted".into())
    }
}
