//! Structure-aware mutation of TOML and JSON documents: a random walk down the
//! tree to one value, which becomes an extreme of its type or a value of another
//! type; keys are dropped, unknown keys added, array items dropped or repeated.
//! Text-level edits then repeat or drop whole lines (a repeated TOML key is an error
//! the tree cannot express).

use crate::Rng;
use crate::mutate::{interesting, number};
use rand::Rng as _;

/// Applies one to three tree edits to a TOML document and maybe a line edit. Text
/// that does not parse is returned unchanged.
pub fn mutate_toml(text: &str, rng: &mut Rng) -> String {
    let Ok(table) = text.parse::<toml::Table>() else {
        return text.to_string();
    };
    let mut root = toml::Value::Table(table);
    for _ in 0..1 + rng.random_range(0..3u32) {
        walk_toml(&mut root, rng);
    }
    let out = match root {
        toml::Value::Table(t) => toml::to_string(&t).unwrap_or_else(|_| text.to_string()),
        _ => text.to_string(),
    };
    line_edit(out, rng)
}

fn walk_toml(v: &mut toml::Value, rng: &mut Rng) {
    use toml::Value as V;
    match v {
        V::Table(t) if !t.is_empty() && rng.random_bool(0.85) => {
            let keys: Vec<String> = t.keys().cloned().collect();
            let k = &keys[rng.random_range(0..keys.len())];
            match rng.random_range(0..12u32) {
                0 => {
                    t.remove(k);
                }
                1 => {
                    t.insert(
                        format!("unknown_{}", rng.random_range(0..3u32)),
                        V::Integer(1),
                    );
                }
                _ => {
                    if let Some(child) = t.get_mut(k) {
                        walk_toml(child, rng);
                    }
                }
            }
        }
        V::Array(a) if !a.is_empty() && rng.random_bool(0.85) => mutate_array(a, rng, walk_toml),
        _ => *v = toml_extreme(v, rng),
    }
}

fn toml_extreme(v: &toml::Value, rng: &mut Rng) -> toml::Value {
    use toml::Value as V;
    let clamp = |x: i128| x.clamp(i64::MIN.into(), i64::MAX.into()) as i64;
    if rng.random_bool(0.15) {
        return match rng.random_range(0..6u32) {
            0 => V::Integer(clamp(number(rng))),
            1 => V::Float(rng.random_range(-10.0..10.0)),
            2 => V::String(["", "x", "small", "c600", "any"][rng.random_range(0..5)].into()),
            3 => V::Boolean(rng.random()),
            4 => V::Array(Vec::new()),
            _ => V::Table(toml::Table::new()),
        };
    }
    match v {
        V::Integer(x) => V::Integer(match rng.random_range(0..8u32) {
            0 => x.wrapping_add(1),
            1 => x.wrapping_sub(1),
            2 => x.wrapping_mul(2),
            3 => x / 2,
            4 => x.wrapping_neg(),
            5 => interesting(rng) as i64,
            _ => clamp(number(rng)),
        }),
        V::Float(x) => V::Float(
            [
                f64::NAN,
                f64::INFINITY,
                f64::NEG_INFINITY,
                0.0,
                -0.0,
                -*x,
                *x * 2.0,
                1e300,
                1e-300,
                f64::from(f32::MAX) * 2.0,
            ][rng.random_range(0..10)],
        ),
        V::String(s) => V::String(match rng.random_range(0..4u32) {
            0 => String::new(),
            1 => format!("{s}{s}"),
            2 => s.chars().rev().collect(),
            _ => " ".into(),
        }),
        V::Boolean(b) => V::Boolean(!*b),
        other => other.clone(),
    }
}

/// Applies one to three tree edits to a JSON document and maybe a line edit. Text
/// that does not parse is returned unchanged.
pub fn mutate_json(text: &str, rng: &mut Rng) -> String {
    let Ok(mut root) = serde_json::from_str::<serde_json::Value>(text) else {
        return text.to_string();
    };
    for _ in 0..1 + rng.random_range(0..3u32) {
        walk_json(&mut root, rng);
    }
    let out = if rng.random_bool(0.5) {
        serde_json::to_string_pretty(&root)
    } else {
        serde_json::to_string(&root)
    };
    line_edit(out.unwrap_or_else(|_| text.to_string()), rng)
}

fn walk_json(v: &mut serde_json::Value, rng: &mut Rng) {
    use serde_json::Value as V;
    match v {
        V::Object(o) if !o.is_empty() && rng.random_bool(0.85) => {
            let keys: Vec<String> = o.keys().cloned().collect();
            let k = &keys[rng.random_range(0..keys.len())];
            match rng.random_range(0..12u32) {
                0 => {
                    o.remove(k);
                }
                1 => {
                    o.insert(format!("unknown_{}", rng.random_range(0..3u32)), V::from(1));
                }
                _ => {
                    if let Some(child) = o.get_mut(k) {
                        walk_json(child, rng);
                    }
                }
            }
        }
        V::Array(a) if !a.is_empty() && rng.random_bool(0.85) => mutate_array(a, rng, walk_json),
        _ => *v = json_extreme(v, rng),
    }
}

fn json_extreme(v: &serde_json::Value, rng: &mut Rng) -> serde_json::Value {
    use serde_json::Value as V;
    if rng.random_bool(0.15) {
        return match rng.random_range(0..6u32) {
            0 => V::Null,
            1 => V::from(rng.random_range(-10.0..10.0)),
            2 => V::from(["", "x", "small", "c600", "any"][rng.random_range(0..5)]),
            3 => V::from(rng.random::<bool>()),
            4 => V::Array(Vec::new()),
            _ => V::Object(serde_json::Map::new()),
        };
    }
    match v {
        V::Number(n) => {
            let x = n.as_i64().map_or(0i128, i128::from);
            match rng.random_range(0..9u32) {
                0 => V::from(x.saturating_add(1) as i64),
                1 => V::from(x.saturating_sub(1) as i64),
                2 => V::from((x * 2).clamp(i64::MIN.into(), i64::MAX.into()) as i64),
                3 => V::from(-x as i64),
                4 => V::from(interesting(rng)),
                5 => V::from([1e300, 0.5, -0.0, 1e19][rng.random_range(0..4)]),
                _ => {
                    let y = number(rng);
                    if y < 0 {
                        V::from(y.max(i64::MIN.into()) as i64)
                    } else {
                        V::from(y.min(u64::MAX.into()) as u64)
                    }
                }
            }
        }
        V::String(s) => V::from(match rng.random_range(0..4u32) {
            0 => String::new(),
            1 => format!("{s}{s}"),
            2 => s.chars().rev().collect(),
            _ => "x".into(),
        }),
        V::Bool(b) => V::from(!*b),
        other => other.clone(),
    }
}

fn line_edit(text: String, rng: &mut Rng) -> String {
    if !rng.random_bool(0.15) {
        return text;
    }
    let mut lines: Vec<&str> = text.lines().collect();
    if lines.is_empty() {
        return text;
    }
    let i = rng.random_range(0..lines.len());
    if rng.random_bool(0.5) {
        lines.insert(i, lines[i]);
    } else {
        lines.remove(i);
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

/// One change to a non-empty array of a TOML or JSON tree: drop, repeat or swap an
/// element, or change inside one.
fn mutate_array<T: Clone>(a: &mut Vec<T>, rng: &mut Rng, walk: fn(&mut T, &mut Rng)) {
    let i = rng.random_range(0..a.len());
    match rng.random_range(0..8u32) {
        0 => {
            a.remove(i);
        }
        1 => a.push(a[i].clone()),
        2 => {
            let j = rng.random_range(0..a.len());
            a.swap(i, j);
        }
        _ => walk(&mut a[i], rng),
    }
}
