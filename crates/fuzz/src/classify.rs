//! Error texts to outcome classes. Two inputs rejected for the same reason with
//! different numbers or names must count as one distinct error, so the class keeps
//! the words and drops the values.

/// The class of an error text: values (numbers, quoted names) replaced by
/// placeholders, TOML source snippets and positions dropped, at most 120 characters.
pub fn classify(text: &str) -> String {
    let words: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !is_snippet(l))
        .collect();
    let joined = words.join("; ");
    let mut out = String::with_capacity(joined.len());
    let mut chars = joined.chars().peekable();
    let mut prev: Option<char> = None;
    while let Some(c) = chars.next() {
        match c {
            '`' | '"' | '\'' => {
                // A quoted value: skip to the matching quote (or the end).
                for d in chars.by_ref() {
                    if d == c {
                        break;
                    }
                }
                out.push(c);
                out.push('_');
                out.push(c);
            }
            c if c.is_ascii_digit() && !prev.is_some_and(|p| p.is_alphanumeric() || p == '_') => {
                while chars
                    .peek()
                    .is_some_and(|d| d.is_ascii_hexdigit() || matches!(d, 'x' | '_' | '.'))
                {
                    chars.next();
                }
                out.push('N');
            }
            c => out.push(c),
        }
        prev = Some(c);
    }
    let mut class: String = out.chars().take(120).collect();
    if class.is_empty() {
        class.push_str("(no message)");
    }
    class
}

/// Lines a TOML or JSON error prints around the offending source: positions, `|`
/// gutters and carets carry the input, not the reason.
fn is_snippet(line: &str) -> bool {
    let rest = line
        .trim_start_matches(|c: char| c.is_ascii_digit())
        .trim_start();
    rest.starts_with('|')
        || rest.starts_with('^')
        || line.starts_with("-->")
        || line.starts_with("TOML parse error at line")
}

#[cfg(test)]
mod tests {
    use super::classify;

    #[test]
    fn values_and_names_do_not_split_classes() {
        assert_eq!(
            classify("tile 3: segment `code`: ends at 0x9a000"),
            classify("tile 12: segment `data`: ends at 0x4c010")
        );
        assert_eq!(
            classify("tile 3: segment `code`: ends at 0x9a000"),
            "tile N: segment `_`: ends at N"
        );
        // Digits inside words stay: they name things, not values.
        assert_eq!(classify("f32add needs $a0"), "f32add needs $a0");
    }

    #[test]
    fn toml_snippets_are_dropped() {
        let text = "TOML parse error at line 3, column 9\n  |\n3 | tiles = -1\n  |         ^^\ninvalid value: integer `-1`, expected u32\n";
        assert_eq!(classify(text), "invalid value: integer `_`, expected u32");
    }
}
