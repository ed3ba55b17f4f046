//! The letter case of a reply — the taste both scenarios' tenants have — as the simulated
//! users, the probes and the teaching read and write it.

/// How a reply is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Case {
    Lower,
    Upper,
    Title,
}

impl Case {
    pub const ALL: [Case; 3] = [Case::Lower, Case::Upper, Case::Title];

    /// The name the `letter_case` plugin's `prefer` takes (`upper`, `lower`).
    pub fn as_str(self) -> &'static str {
        match self {
            Case::Lower => "lower",
            Case::Upper => "upper",
            Case::Title => "title",
        }
    }

    /// `text` written in this case.
    pub fn apply(self, text: &str) -> String {
        match self {
            Case::Lower => text.to_lowercase(),
            Case::Upper => text.to_uppercase(),
            Case::Title => text
                .split(' ')
                .map(|word| {
                    let mut chars = word.chars();
                    match chars.next() {
                        Some(first) => first.to_uppercase().chain(chars).collect(),
                        None => String::new(),
                    }
                })
                .collect::<Vec<_>>()
                .join(" "),
        }
    }

    /// The case `text` is written in, as a reader sees it: four letters in five (or more)
    /// uppercase; four in five lowercase with most words starting in lowercase; any other mix
    /// reads as title case ("Hello There" is title case, though 80 % of its letters are
    /// lowercase); `None` without letters. A slip of the pen ("NEW YORK CITy", "good mornIng")
    /// does not change what the reply is written in.
    pub fn of(text: &str) -> Option<Case> {
        let (mut lower, mut upper, mut words, mut capitalised) = (0usize, 0usize, 0usize, 0usize);
        for word in text.split_whitespace() {
            let mut letters = word.chars().filter(|c| c.is_alphabetic()).peekable();
            if let Some(first) = letters.peek() {
                words += 1;
                capitalised += usize::from(first.is_uppercase());
            }
            for c in letters {
                lower += usize::from(c.is_lowercase());
                upper += usize::from(c.is_uppercase());
            }
        }
        let letters = lower + upper;
        Some(match (lower * 5, upper * 5) {
            _ if letters == 0 => return None,
            (_, u) if u >= 4 * letters => Case::Upper,
            (l, _) if l >= 4 * letters && capitalised * 2 < words => Case::Lower,
            _ => Case::Title,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_reads_as_the_case_it_was_written_in() {
        for case in Case::ALL {
            assert_eq!(Case::of(&case.apply("new york city")), Some(case));
        }
        assert_eq!(Case::of("hello, World"), Some(Case::Title));
        assert_eq!(
            Case::of(&Case::Title.apply("good morning")),
            Some(Case::Title)
        );
        assert_eq!(Case::of("good mornIng"), Some(Case::Lower));
        assert_eq!(Case::of("NEW YORK CITy"), Some(Case::Upper));
        assert_eq!(Case::of("42 !"), None);
    }
}
