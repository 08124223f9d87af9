//! The minimalloc CSV format: `id,lower,upper,size` with half-open lifetimes
//! `[lower, upper)`, optionally an `alignment` column. One arena, no other rules.

use crate::PlaceError;

/// One buffer of a flat (single arena, lifetimes only) problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlatBuffer {
    pub id: String,
    /// Half-open lifetime `[lower, upper)`.
    pub lower: i64,
    pub upper: i64,
    pub size: u64,
    pub align: u64,
}

/// A flat problem: buffers in one arena starting at offset 0.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FlatProblem {
    pub buffers: Vec<FlatBuffer>,
}

impl FlatProblem {
    /// Largest total size live at one instant (half-open rule): no placement is lower.
    pub fn live_lower_bound(&self) -> u64 {
        let mut events: Vec<(i64, i8, u64)> = Vec::with_capacity(self.buffers.len() * 2);
        for b in &self.buffers {
            if b.lower < b.upper && b.size > 0 {
                events.push((b.lower, 1, b.size));
                events.push((b.upper, -1, b.size));
            }
        }
        // Ends sort before starts at the same instant: half-open lifetimes.
        events.sort_unstable_by_key(|&(t, kind, _)| (t, kind));
        let (mut live, mut best) = (0u64, 0u64);
        for (_, kind, size) in events {
            if kind > 0 {
                live += size;
                best = best.max(live);
            } else {
                live -= size;
            }
        }
        best
    }
}

/// Parses minimalloc CSV text. `origin` names the input in errors.
pub fn parse_csv(text: &str, origin: &str) -> Result<FlatProblem, PlaceError> {
    let err = |line: usize, message: String| PlaceError::Parse {
        what: format!("{origin}:{line}"),
        message,
    };
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((_, header)) = lines.next() else {
        return Err(err(
            1,
            "empty file: expected a header `id,lower,upper,size`".into(),
        ));
    };
    let cols: Vec<String> = header
        .split(',')
        .map(|c| c.trim().to_ascii_lowercase())
        .collect();
    let find = |name: &str| cols.iter().position(|c| c == name);
    let id_col = find("id").ok_or_else(|| err(1, "header lacks `id`".into()))?;
    let lower_col = find("lower")
        .or_else(|| find("start"))
        .or_else(|| find("begin"))
        .ok_or_else(|| err(1, "header lacks `lower`".into()))?;
    // The older `start,end` header has an inclusive end.
    let (upper_col, inclusive) = match find("upper") {
        Some(c) => (c, false),
        None => (
            find("end").ok_or_else(|| err(1, "header lacks `upper`".into()))?,
            true,
        ),
    };
    let size_col = find("size").ok_or_else(|| err(1, "header lacks `size`".into()))?;
    let align_col = find("alignment");
    if find("offset").is_some() {
        return Err(err(
            1,
            "an `offset` column marks an IREE export with inclusive lifetimes; use the \
             `.halfopen.csv` rewrite"
                .into(),
        ));
    }
    let mut buffers = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, line) in lines {
        let n = i + 1;
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != cols.len() {
            return Err(err(
                n,
                format!("expected {} fields, found {}", cols.len(), fields.len()),
            ));
        }
        let int = |col: usize, what: &str| -> Result<i64, PlaceError> {
            fields[col]
                .parse::<i64>()
                .map_err(|e| err(n, format!("{what} `{}`: {e}", fields[col])))
        };
        let lower = int(lower_col, "lower")?;
        // Lifetimes count steps from 0; a negative one is a broken export, not a
        // problem to place.
        if lower < 0 {
            return Err(err(
                n,
                format!("lower {lower} is negative: steps start at 0"),
            ));
        }
        let mut upper = int(upper_col, "upper")?;
        if inclusive {
            upper = upper
                .checked_add(1)
                .ok_or_else(|| err(n, "upper overflows".into()))?;
        }
        if upper < lower {
            return Err(err(n, format!("upper {upper} is below lower {lower}")));
        }
        // Lifetime lengths are differences: bounded here, they cannot overflow.
        if lower.unsigned_abs() > 1 << 60 || upper.unsigned_abs() > 1 << 60 {
            return Err(err(n, "a lifetime bound is beyond +-2^60".into()));
        }
        let size = int(size_col, "size")?;
        let size = u64::try_from(size).map_err(|_| err(n, format!("negative size {size}")))?;
        if size > 1 << 50 {
            return Err(err(n, format!("size {size} is beyond 2^50")));
        }
        let align = match align_col {
            Some(c) => {
                let a = int(c, "alignment")?;
                let a = u64::try_from(a).unwrap_or(0);
                if a == 0 || !a.is_power_of_two() || a > 1 << 40 {
                    return Err(err(n, format!("alignment {a} is not a power of two")));
                }
                a
            }
            None => 1,
        };
        let id = fields[id_col].to_string();
        if !seen.insert(id.clone()) {
            return Err(err(n, format!("duplicate id `{id}`")));
        }
        buffers.push(FlatBuffer {
            id,
            lower,
            upper,
            size,
            align,
        });
    }
    Ok(FlatProblem { buffers })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_bounds() {
        let p = parse_csv("id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\nb3,0,9,4\n", "t").unwrap();
        assert_eq!(p.buffers.len(), 3);
        assert_eq!(p.live_lower_bound(), 8);
    }

    #[test]
    fn errors_are_typed() {
        assert!(parse_csv("", "t").is_err());
        assert!(parse_csv("id,lower,upper,size\n1,2,x,4\n", "t").is_err());
        assert!(parse_csv("id,lower,upper,size\n1,5,2,4\n", "t").is_err());
        assert!(parse_csv("id,lower,upper,size\n1,0,2,-4\n", "t").is_err());
        assert!(parse_csv("id,lower,upper,size\n1,0,2\n", "t").is_err());
        assert!(parse_csv("id,lower,upper,size,offset\n1,0,2,4,0\n", "t").is_err());
        assert!(parse_csv("id,lower,upper,size\n1,0,2,4\n1,0,2,4\n", "t").is_err());
        let e = parse_csv("id,lower,upper,size\na,0,2,4\nb,-1,2,4\n", "p.csv").unwrap_err();
        assert!(
            e.to_string().contains("p.csv:3") && e.to_string().contains("lower -1"),
            "{e}"
        );
    }

    #[test]
    fn inclusive_header() {
        let p = parse_csv("id,start,end,size\na,0,2,4\n", "t").unwrap();
        assert_eq!(p.buffers[0].upper, 3);
    }
}
