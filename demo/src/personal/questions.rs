//! The personal scenario's bank of everyday questions (`questions.txt`, written for the demo),
//! split by position: every fifth question is held out — asked only by the probes that measure
//! a tenant's rate, never in a session the trainer learns from.

use std::sync::LazyLock;

/// Every fifth question (the 5th, 10th, ...) is held out.
const HOLD_OUT_EVERY: usize = 5;

static BANK: LazyLock<(Vec<&'static str>, Vec<&'static str>)> = LazyLock::new(|| {
    let (held_out, asked): (Vec<_>, Vec<_>) = include_str!("questions.txt")
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .enumerate()
        .partition(|(i, _)| (i + 1) % HOLD_OUT_EVERY == 0);
    let strip = |v: Vec<(usize, &'static str)>| v.into_iter().map(|(_, q)| q).collect();
    (strip(asked), strip(held_out))
});

/// The questions the users ask in their sessions.
pub fn asked() -> &'static [&'static str] {
    &BANK.0
}

/// The questions only the probes ask.
pub fn held_out() -> &'static [&'static str] {
    &BANK.1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bank_is_a_few_hundred_distinct_questions_split_four_to_one() {
        let (asked, held_out) = (asked(), held_out());
        assert!(asked.len() + held_out.len() >= 250, "{}", asked.len());
        assert_eq!(held_out.len(), (asked.len() + held_out.len()) / 5);
        let mut all: Vec<_> = asked.iter().chain(held_out).collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), asked.len() + held_out.len(), "a question twice");
        assert!(asked.iter().all(|q| !held_out.contains(q)));
        assert!(all.iter().all(|q| q.ends_with('?')));
    }
}
