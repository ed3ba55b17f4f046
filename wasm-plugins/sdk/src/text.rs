//! Reading model answers: `\boxed{...}` values, judge scores, marked spans.

/// The content of the last `\boxed{...}` in `text` (nested braces balanced), trimmed.
pub fn last_boxed(text: &str) -> Option<&str> {
    let start = text.rfind("\\boxed{")? + "\\boxed{".len();
    let mut depth = 1usize;
    for (offset, c) in text[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(text[start..start + offset].trim());
                }
            }
            _ => {}
        }
    }
    None
}

/// A judge's score: the last `\boxed{1}`, `\boxed{-1}` or `\boxed{0}` of its answer (`+1` too).
/// Anything else is unparsable.
pub fn boxed_score(answer: &str) -> Option<i8> {
    match last_boxed(answer)? {
        "1" | "+1" => Some(1),
        "-1" => Some(-1),
        "0" => Some(0),
        _ => None,
    }
}

/// The text between the last `start` marker and the `end` marker after it, trimmed.
pub fn between<'a>(text: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let from = text.rfind(start)? + start.len();
    let len = text[from..].find(end)?;
    Some(text[from..from + len].trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_boxed_value_wins_and_nested_braces_are_kept() {
        assert_eq!(
            last_boxed(r"first \boxed{1}, then \boxed{\frac{1}{2}}"),
            Some(r"\frac{1}{2}")
        );
        assert_eq!(last_boxed(r"\boxed{ 42 }"), Some("42"));
        assert_eq!(last_boxed(r"unclosed \boxed{42"), None);
        assert_eq!(last_boxed("no box"), None);
    }

    #[test]
    fn a_judge_score_is_one_of_three_values() {
        assert_eq!(boxed_score(r"The step helps. \boxed{1}"), Some(1));
        assert_eq!(boxed_score(r"\boxed{+1}"), Some(1));
        assert_eq!(boxed_score(r"It failed: \boxed{-1}"), Some(-1));
        assert_eq!(boxed_score(r"\boxed{0}"), Some(0));
        assert_eq!(boxed_score(r"\boxed{yes}"), None);
        assert_eq!(boxed_score("I think it is good"), None);
    }

    #[test]
    fn a_marked_span_is_found() {
        assert_eq!(
            between(
                "x [HINT_START] Check the path. [HINT_END] y",
                "[HINT_START]",
                "[HINT_END]"
            ),
            Some("Check the path.")
        );
        assert_eq!(
            between("[HINT_START] open", "[HINT_START]", "[HINT_END]"),
            None
        );
    }
}
