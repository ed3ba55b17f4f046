//! A set's rule: whether a candidate passed too few of a set's prompts against a version it is
//! compared with (the live one, or the base).
//!
//! The count alone (`max_drop`) cannot tell a version that forgot from one whose greedy replies
//! moved a little: on 40 factual questions a version that did not forget anything still answers
//! two or three fewer, or more, than the one before it. With `significance`, a drop beyond
//! `max_drop` holds a candidate back only where it is also unlikely for a version no worse than
//! the other: a one-sided sign test on the prompts where the two disagree (McNemar's exact
//! test). Each prompt is asked of both, so the prompts both pass or both fail say nothing about
//! which is better; of those one passes and the other fails, a version no worse loses at most
//! half.

use super::SideScore;

/// How a candidate compares with one version on one set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Paired {
    /// Prompts the other version passed and the candidate did not.
    pub lost: usize,
    /// Prompts the candidate passed and the other version did not.
    pub gained: usize,
}

impl Paired {
    /// Compares prompt by prompt (both sides' `each` in the set's order).
    pub fn of(candidate: &SideScore, other: &SideScore) -> Self {
        let (mut lost, mut gained) = (0, 0);
        for (&mine, &theirs) in candidate.each.iter().zip(&other.each) {
            lost += usize::from(theirs && !mine);
            gained += usize::from(mine && !theirs);
        }
        Self { lost, gained }
    }

    /// The chance that a candidate no worse than the other loses at least `lost` of the
    /// `lost + gained` prompts the two disagree on: the binomial tail P(X ≥ lost), X ~ B(n, ½).
    pub fn p_value(&self) -> f64 {
        binomial_half_tail(self.lost + self.gained, self.lost)
    }
}

/// Why a candidate that passed `candidate.passed` prompts of `prompts` is held back against
/// `other` (named `other_name`), or `None` where it is not: it passed more than `max_drop`
/// fewer and, with `significance`, the drop's p-value is below it.
pub fn held_back(
    set: &str,
    prompts: usize,
    candidate: &SideScore,
    other: &SideScore,
    other_name: &str,
    max_drop: usize,
    significance: Option<f64>,
) -> Option<String> {
    if candidate.passed + max_drop >= other.passed {
        return None;
    }
    let counts = format!(
        "{set}: {} of {prompts} passed, {other_name} {}: more than {max_drop} fewer",
        candidate.passed, other.passed
    );
    let Some(alpha) = significance else {
        return Some(counts);
    };
    let paired = Paired::of(candidate, other);
    let p = paired.p_value();
    (p < alpha).then(|| {
        format!(
            "{counts} (lost {}, gained {}; p = {p:.3} < {alpha})",
            paired.lost, paired.gained
        )
    })
}

/// P(X ≥ k) for X ~ Binomial(n, ½), summed in log space (no underflow for large n).
fn binomial_half_tail(n: usize, k: usize) -> f64 {
    if k == 0 {
        return 1.0;
    }
    if k > n {
        return 0.0;
    }
    // ln C(n, j) - n ln 2, built up from j = 0.
    let mut ln_pmf = -(n as f64) * std::f64::consts::LN_2;
    let mut tail = 0.0;
    for j in 0..=n {
        if j > 0 {
            ln_pmf += ((n - j + 1) as f64).ln() - (j as f64).ln();
        }
        if j >= k {
            tail += ln_pmf.exp();
        }
    }
    tail.min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(each: &[bool]) -> SideScore {
        SideScore {
            passed: each.iter().filter(|&&p| p).count(),
            checks: Default::default(),
            each: each.to_vec(),
        }
    }

    #[test]
    fn the_binomial_tail_is_exact() {
        assert_eq!(binomial_half_tail(0, 0), 1.0);
        assert_eq!(binomial_half_tail(5, 0), 1.0);
        assert_eq!(binomial_half_tail(5, 6), 0.0);
        assert!((binomial_half_tail(1, 1) - 0.5).abs() < 1e-12);
        // P(X ≥ 5 | n = 7) = (21 + 7 + 1) / 128.
        assert!((binomial_half_tail(7, 5) - 29.0 / 128.0).abs() < 1e-12);
        // P(X ≥ 5 | n = 5) = 1 / 32.
        assert!((binomial_half_tail(5, 5) - 1.0 / 32.0).abs() < 1e-12);
        // Symmetric: P(X ≥ 1000 | n = 2000) is a little over a half, and no underflow.
        let half = binomial_half_tail(2000, 1000);
        assert!(half > 0.5 && half < 0.52, "{half}");
    }

    #[test]
    fn a_drop_within_max_drop_passes_whatever_the_test() {
        let other = side(&[true, true, true, false]);
        let candidate = side(&[true, false, true, false]);
        assert_eq!(
            held_back("retention", 4, &candidate, &other, "the base", 1, None),
            None
        );
    }

    #[test]
    fn without_significance_the_count_decides() {
        let other = side(&[true, true, true, false]);
        let candidate = side(&[false, false, true, true]);
        let reason = held_back("retention", 4, &candidate, &other, "v3", 0, None);
        assert_eq!(
            reason.as_deref(),
            Some("retention: 2 of 4 passed, v3 3: more than 0 fewer")
        );
    }

    #[test]
    fn with_significance_a_drop_that_noise_explains_passes_and_a_real_one_does_not() {
        // 26 of 40 against 23 of 40, where the two disagree on 7 (lost 5, gained 2): a version
        // no worse does that with p = 0.23.
        let mut base = vec![true; 26];
        base.extend(vec![false; 14]);
        let mut moved = base.clone();
        for lost in moved.iter_mut().take(5) {
            *lost = false;
        }
        moved[30] = true;
        moved[31] = true;
        let (base, moved) = (side(&base), side(&moved));
        assert_eq!(moved.passed, 23);
        assert_eq!(Paired::of(&moved, &base), Paired { lost: 5, gained: 2 });
        assert_eq!(
            held_back("retention", 40, &moved, &base, "the base", 2, Some(0.05)),
            None
        );
        assert!(held_back("retention", 40, &moved, &base, "the base", 2, None).is_some());
        // 26 against 7 (the run that lost the answers): lost 19, gained 0.
        let mut forgot = vec![true; 7];
        forgot.extend(vec![false; 33]);
        let reason = held_back(
            "retention",
            40,
            &side(&forgot),
            &base,
            "the base",
            2,
            Some(0.05),
        )
        .expect("held back");
        assert!(reason.contains("lost 19, gained 0"), "{reason}");
    }
}
