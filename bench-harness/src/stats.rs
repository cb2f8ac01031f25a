//! The few statistics the benchmark scripts report (through `fleet stats`), so no script keeps
//! its own in awk or Python: [`median`], [`mean`], [`min`], [`max`], [`sum`], [`ratio`] and
//! [`share`].

/// The median of `values` (the mean of the middle two for an even count); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// The arithmetic mean of `values`; `None` when empty.
pub fn mean(values: &[f64]) -> Option<f64> {
    ratio(sum(values), values.len() as f64)
}

/// The smallest of `values`; `None` when empty.
pub fn min(values: &[f64]) -> Option<f64> {
    values.iter().copied().min_by(f64::total_cmp)
}

/// The largest of `values`; `None` when empty.
pub fn max(values: &[f64]) -> Option<f64> {
    values.iter().copied().max_by(f64::total_cmp)
}

/// `numerator / denominator`; `None` when the denominator is 0 (a run that did nothing).
pub fn ratio(numerator: f64, denominator: f64) -> Option<f64> {
    (denominator != 0.0).then(|| numerator / denominator)
}

/// The sum of `values`.
pub fn sum(values: &[f64]) -> f64 {
    values.iter().sum()
}

/// `part` as a percentage of `whole`; `None` when `whole` is 0.
pub fn share(part: f64, whole: f64) -> Option<f64> {
    ratio(100.0 * part, whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn mean_min_and_max() {
        assert_eq!(mean(&[1.0, 2.0, 6.0]), Some(3.0));
        assert_eq!(min(&[2.0, -1.0, 6.0]), Some(-1.0));
        assert_eq!(max(&[2.0, -1.0, 6.0]), Some(6.0));
        assert_eq!((mean(&[]), min(&[]), max(&[])), (None, None, None));
    }

    #[test]
    fn ratios_and_shares_refuse_a_zero_denominator() {
        assert_eq!(ratio(3.0, 2.0), Some(1.5));
        assert_eq!(ratio(3.0, 0.0), None);
        assert_eq!(share(1.0, 4.0), Some(25.0));
        assert_eq!(share(1.0, 0.0), None);
        assert_eq!(sum(&[1.5, 2.5]), 4.0);
    }
}
