//! The graph's text form read back: what [`Graph`]'s `Display` prints parses to
//! the same graph, so a test (or a model importer's debugging session) can state
//! a graph as a few lines of text instead of builder calls.
//!
//! One line per operation, `label: dtype[dims] = mnemonic operands  # name`, then
//! `output "name" = label` lines; `//` starts a comment line. Labels are any
//! identifiers (the printer writes `t0`, `t1`, ...), each defined once before it is
//! read. The declared type is the parameter's or input's own, a reshape's target,
//! and for every other operation a check: it must be what the operation infers.
//! The `# name` is the operation's scoped name (the label when it is missing).

use std::collections::HashMap;

use crate::builder::GraphBuilder;
use crate::error::GraphError;
use crate::ir::{DType, Graph, Init, OpKind, Shape, TensorId};

impl Graph {
    /// Parses the text form (see the module docs); every builder check applies.
    pub fn parse(text: &str) -> Result<Graph, GraphError> {
        let mut p = Parser::default();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with("//") {
                continue;
            }
            p.line(line)
                .map_err(|e| GraphError::Malformed(format!("line {}: {e}", i + 1)))?;
        }
        p.b.finish()
    }
}

#[derive(Default)]
struct Parser {
    b: GraphBuilder,
    labels: HashMap<String, TensorId>,
}

impl Parser {
    fn line(&mut self, line: &str) -> Result<(), String> {
        if let Some(rest) = line.strip_prefix("output ") {
            let (name, label) = rest.split_once('=').ok_or("an output needs `= label`")?;
            let t = self.tensor(label.trim())?;
            return self
                .b
                .output(&unquote(name.trim())?, t)
                .map_err(|e| e.to_string());
        }
        let (body, name) = match line.split_once('#') {
            Some((body, name)) => (body.trim(), Some(name.trim())),
            None => (line, None),
        };
        let (label, rest) = body.split_once(':').ok_or("expected `label: type = op`")?;
        let label = label.trim();
        if self.labels.contains_key(label) {
            return Err(format!("`{label}` is defined twice"));
        }
        let (ty, op) = rest
            .split_once('=')
            .ok_or("expected `= op` after the type")?;
        let (dtype, shape) = parse_type(ty.trim())?;
        let (mnemonic, args) = op.trim().split_once(' ').unwrap_or((op.trim(), ""));
        let args = split_args(args);
        let kind = self.kind(mnemonic, &args, dtype, &shape)?;
        let name = name.unwrap_or(label).to_string();
        let t = self.b.push_named(name, kind).map_err(|e| e.to_string())?;
        let got_shape = self.b.shape(t).map_err(|e| e.to_string())?.clone();
        let got_dtype = self.b.dtype(t).map_err(|e| e.to_string())?;
        if got_shape != shape || got_dtype != dtype {
            return Err(format!(
                "`{label}` is declared {dtype}{shape} but the operation gives {got_dtype}{got_shape}"
            ));
        }
        self.labels.insert(label.to_string(), t);
        Ok(())
    }

    fn tensor(&self, label: &str) -> Result<TensorId, String> {
        self.labels
            .get(label)
            .copied()
            .ok_or_else(|| format!("`{label}` is not defined above"))
    }

    fn kind(
        &self,
        mnemonic: &str,
        args: &[&str],
        dtype: DType,
        shape: &Shape,
    ) -> Result<OpKind, String> {
        let t = |i: usize| -> Result<TensorId, String> {
            self.tensor(
                args.get(i)
                    .ok_or(format!("`{mnemonic}` needs operand {}", i + 1))?,
            )
        };
        let attr = |key: &str| -> Result<&str, String> {
            args.iter()
                .find_map(|a| a.strip_prefix(key)?.strip_prefix('='))
                .ok_or(format!("`{mnemonic}` needs `{key}=`"))
        };
        let num = |s: &str| -> Result<f32, String> {
            s.trim()
                .parse()
                .map_err(|_| format!("`{s}` is not a number"))
        };
        let int = |s: &str| -> Result<usize, String> {
            s.trim()
                .parse()
                .map_err(|_| format!("`{s}` is not a count"))
        };
        Ok(match mnemonic {
            "param" => {
                let (name, init) = args
                    .first()
                    .and_then(|a| a.split_once(' '))
                    .ok_or("`param` needs a quoted name and an init")?;
                OpKind::Parameter {
                    name: unquote(name)?,
                    shape: shape.clone(),
                    dtype,
                    init: parse_init(init.trim(), &args[1..])?,
                }
            }
            "input" => OpKind::Input {
                name: unquote(args.first().ok_or("`input` needs a quoted name")?)?,
                shape: shape.clone(),
                dtype,
            },
            "matmul" => OpKind::MatMul {
                a: t(0)?,
                b: t(1)?,
                transpose_b: args.contains(&"transpose_b"),
                bias: attr("bias").ok().map(|b| self.tensor(b)).transpose()?,
            },
            "add" => OpKind::Add { a: t(0)?, b: t(1)? },
            "scale" => OpKind::Scale {
                x: t(0)?,
                factor: num(args.get(1).ok_or("`scale` needs a factor")?)?,
            },
            "layer_norm" => OpKind::LayerNorm {
                x: t(0)?,
                gamma: self.tensor(attr("gamma")?)?,
                beta: self.tensor(attr("beta")?)?,
                eps: num(attr("eps")?)?,
            },
            "softmax" => OpKind::Softmax { x: t(0)? },
            "gelu" => OpKind::Gelu { x: t(0)? },
            "reshape" => OpKind::Reshape {
                x: t(0)?,
                shape: shape.clone(),
            },
            "transpose" => OpKind::Transpose {
                x: t(0)?,
                perm: parse_list(
                    attr("perm")?
                        .strip_prefix('[')
                        .and_then(|p| p.strip_suffix(']'))
                        .ok_or("`perm=` needs a list")?,
                )?,
            },
            "split_heads" => OpKind::SplitHeads {
                x: t(0)?,
                heads: int(attr("heads")?)?,
            },
            "merge_heads" => OpKind::MergeHeads { x: t(0)? },
            "slice" => {
                let (start, end) = args
                    .get(2)
                    .and_then(|r| r.split_once(".."))
                    .ok_or("`slice` needs `start..end`")?;
                OpKind::Slice {
                    x: t(0)?,
                    axis: int(attr("axis")?)?,
                    start: int(start)?,
                    end: int(end)?,
                }
            }
            "concat" => OpKind::Concat {
                xs: args
                    .iter()
                    .filter(|a| !a.contains('='))
                    .map(|a| self.tensor(a))
                    .collect::<Result<_, _>>()?,
                axis: int(attr("axis")?)?,
            },
            "cast" => {
                let (x, to) = args
                    .first()
                    .and_then(|a| a.split_once(" to "))
                    .ok_or("`cast` needs `x to dtype`")?;
                OpKind::Cast {
                    x: self.tensor(x.trim())?,
                    to: parse_dtype(to.trim())?,
                }
            }
            other => return Err(format!("unknown operation `{other}`")),
        })
    }
}

/// Arguments split at the commas outside brackets and parentheses.
fn split_args(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if !s[start..].trim().is_empty() {
        out.push(s[start..].trim());
    }
    out
}

fn unquote(s: &str) -> Result<String, String> {
    s.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .map(str::to_string)
        .ok_or_else(|| format!("expected a quoted name, found `{s}`"))
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    match s {
        "f16" => Ok(DType::F16),
        "f32" => Ok(DType::F32),
        other => Err(format!("unknown element type `{other}`")),
    }
}

fn parse_list(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|d| {
            d.trim()
                .parse()
                .map_err(|_| format!("`{d}` is not a dimension"))
        })
        .collect()
}

/// `f16[2, 3]`.
fn parse_type(s: &str) -> Result<(DType, Shape), String> {
    let (dtype, dims) = s.split_once('[').ok_or("a type is `dtype[dims]`")?;
    let dims = dims.strip_suffix(']').ok_or("a type is `dtype[dims]`")?;
    Ok((parse_dtype(dtype.trim())?, Shape::new(parse_list(dims)?)))
}

/// `normal(mean=0, std=0.02)` (split at its comma by [`split_args`] unless
/// parenthesised: `rest` holds what followed) or `constant(1)`.
fn parse_init(first: &str, rest: &[&str]) -> Result<Init, String> {
    let value = |s: &str, key: &str| -> Result<f32, String> {
        s.trim()
            .strip_prefix(key)
            .and_then(|v| v.strip_prefix('='))
            .and_then(|v| v.trim_end_matches(')').trim().parse().ok())
            .ok_or_else(|| format!("expected `{key}=` in the init"))
    };
    if let Some(c) = first.strip_prefix("constant(") {
        let c = c.strip_suffix(')').ok_or("`constant(` needs `)`")?;
        return c
            .trim()
            .parse()
            .map(Init::Constant)
            .map_err(|_| format!("`{c}` is not a number"));
    }
    let body = first
        .strip_prefix("normal(")
        .ok_or("an init is normal(..) or constant(..)")?;
    let (mean, std) = match body.split_once(',') {
        Some((m, s)) => (m, s),
        None => (body, *rest.first().ok_or("`normal(` needs `std=`")?),
    };
    Ok(Init::Normal {
        mean: value(mean, "mean")?,
        std: value(std, "std")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::{EncoderLayerConfig, MlpConfig, encoder_layer, mlp};

    fn round_trip(g: &Graph) {
        let text = g.to_string();
        let back = Graph::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(&back, g, "{text}");
        assert_eq!(back.to_string(), text);
    }

    #[test]
    fn the_built_in_models_print_and_parse_back_to_themselves() {
        round_trip(&mlp(&MlpConfig::tiny(2)).unwrap());
        round_trip(&encoder_layer(&EncoderLayerConfig::tiny(2)).unwrap());
    }

    #[test]
    fn every_operation_round_trips() {
        let text = "\
// every mnemonic once
x: f16[2, 4, 8] = input \"x\"
w: f16[8, 8] = param \"w\" normal(mean=0, std=0.5)
g: f32[8] = param \"g\" constant(1)
t: f16[2, 4, 8] = transpose x, perm=[0, 1, 2]  # t
s: f16[2, 2, 8] = slice t, axis=1, 0..2  # s
c: f16[2, 4, 8] = concat s, s, axis=1  # c
k: f32[2, 4, 8] = cast c to f32  # k
h: f16[2, 4, 8] = cast k to f16  # h
r: f16[8, 8] = reshape h  # r
m: f16[8, 8] = matmul r, w, transpose_b  # m
a: f16[8, 8] = scale m, 0.125  # a
";
        let text = format!("{text}output \"a\" = a\noutput \"g\" = g\n");
        let g = Graph::parse(&text).unwrap();
        round_trip(&g);
        assert_eq!(g.ops().len(), 11);
        assert_eq!(g.ops()[3].name, "t");
    }

    #[test]
    fn errors_name_their_line() {
        let e = Graph::parse("x: f16[2] = input \"x\"\ny: f16[3] = gelu x  # y\n").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = Graph::parse("y: f16[2] = gelu x\n").unwrap_err();
        assert!(e.to_string().contains("not defined"), "{e}");
        assert!(
            Graph::parse("x: f16[2] = input \"x\"\n").is_err(),
            "no outputs"
        );
    }
}
