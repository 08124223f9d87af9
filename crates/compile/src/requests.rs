//! Tile plan -> placement problems: every buffer, every kernel's code and the
//! supervisor program become requests; kernel separation needs become separation
//! groups. Names are unique per tile so the placement's answer maps back.

use std::collections::BTreeMap;

use tessera_place::{MemClass, Request, TileProblem};
use tessera_plan::{BufId, TilePlan};

use crate::emit::SizedCode;

/// What a request stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Buffer(BufId),
    Kernel(String),
    Supervisor,
    ExchangeCode,
}

/// The placement problems of a plan and the way back from request names.
#[derive(Debug, Clone)]
pub struct Problems {
    pub problems: Vec<TileProblem>,
    /// Per problem: request name -> item.
    pub items: Vec<BTreeMap<String, Item>>,
}

pub fn buffer_request_name(plan: &TilePlan, id: BufId) -> String {
    format!("{}@{id}", plan.buffer(id).name)
}

fn buffer_request(b: &tessera_plan::Buffer, name: String) -> Request {
    // Vertex state is the loader's; weights arrive through host transfers.
    let loaded = b.category == tessera_plan::Category::VertexState;
    Request {
        name,
        // A layer loop's store holds every layer's instance, `stride` apart.
        size: b.total_bytes(),
        align: u64::from(b.align),
        end_round: 4,
        first: u64::from(b.first),
        last: u64::from(b.last),
        class: b.class,
        tail: u64::from(b.tail),
        loaded,
        category: Some(b.category.name().to_string()),
    }
}

/// One placement problem per tile that holds anything.
pub fn tile_problems(plan: &TilePlan, sized: &SizedCode) -> Problems {
    let last = u64::from(plan.last_step());
    let mut problems: Vec<TileProblem> = (0..plan.tiles)
        .map(|tile| TileProblem {
            tile,
            ..TileProblem::default()
        })
        .collect();
    let mut items: Vec<BTreeMap<String, Item>> = vec![BTreeMap::new(); plan.tiles as usize];
    // Weight stores come after the code: they live as long, so lifetime order
    // places them in input order, and a store of many layers placed first would
    // fill the executable region the code needs (any other region serves it).
    let store = |b: &&tessera_plan::Buffer| b.category == tessera_plan::Category::WeightStore;
    for b in plan.buffers.iter().filter(|b| !store(b)) {
        let name = buffer_request_name(plan, b.id);
        problems[b.tile as usize]
            .requests
            .push(buffer_request(b, name.clone()));
        items[b.tile as usize].insert(name, Item::Buffer(b.id));
    }
    for (tile, code) in sized.tiles.iter().enumerate() {
        let code_request = |name: String, bytes: u32| Request {
            name,
            size: u64::from(bytes),
            align: 8,
            end_round: 8,
            first: 0,
            last,
            class: MemClass::Executable,
            tail: 0,
            loaded: true,
            category: Some("code".into()),
        };
        if code.supervisor_bytes > 0 {
            problems[tile].requests.push(code_request(
                "code:supervisor".into(),
                code.supervisor_bytes,
            ));
            items[tile].insert("code:supervisor".into(), Item::Supervisor);
        }
        if code.exchange_bytes > 0 {
            let name = format!("code:{}", crate::emit::EXCHANGE_SYMBOL);
            let mut r = code_request(name.clone(), code.exchange_bytes);
            r.category = Some("exchange_code".into());
            problems[tile].requests.push(r);
            items[tile].insert(name, Item::ExchangeCode);
        }
        for (symbol, bytes) in &code.kernels {
            let name = format!("code:{symbol}");
            problems[tile]
                .requests
                .push(code_request(name.clone(), *bytes));
            items[tile].insert(name, Item::Kernel(symbol.clone()));
        }
    }
    for b in plan.buffers.iter().filter(store) {
        let name = buffer_request_name(plan, b.id);
        problems[b.tile as usize]
            .requests
            .push(buffer_request(b, name.clone()));
        items[b.tile as usize].insert(name, Item::Buffer(b.id));
    }
    for &(a, b) in &plan.separations {
        let tile = plan.buffer(a).tile as usize;
        problems[tile].separation.push(vec![
            buffer_request_name(plan, a),
            buffer_request_name(plan, b),
        ]);
    }
    Problems { problems, items }
}
