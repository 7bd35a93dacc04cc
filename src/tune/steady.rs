//! Judging repeated timings of one measurement: which repetitions are outliers, and whether the
//! measurement as a whole looks disturbed. Other work on the machine only ever makes a timing
//! slower, so the fastest repetition is the reference: repetitions more than `OUTLIER` times
//! slower are dropped, and the median of the rest is the measurement. When fewer than half the
//! repetitions are near the fastest (the machine was busy for most of them), the measurement is
//! disturbed: the caller uses it, says so in the log, and does not keep it for
//! later communicators, so that a busy moment cannot poison the cost model of a whole run.
#![forbid(unsafe_code)]

/// A repetition this many times slower than the fastest is an outlier.
pub const OUTLIER: f64 = 1.5;

/// A measurement from repeated timings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Steady {
    /// The median of the repetitions within `OUTLIER` of the fastest.
    pub value: f64,
    /// How many repetitions were kept, of how many.
    pub kept: usize,
    pub of: usize,
    /// Fewer than half the repetitions were kept: the machine was busy during the
    /// measurement, and the value may be too.
    pub disturbed: bool,
}

/// The measurement of `samples` (times of the same thing, any unit; none negative).
/// None without samples.
pub fn steady(samples: &[f64]) -> Option<Steady> {
    let fastest = samples
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .reduce(f64::min)?;
    let mut kept: Vec<f64> = samples
        .iter()
        .copied()
        .filter(|&x| x.is_finite() && x <= fastest * OUTLIER)
        .collect();
    kept.sort_by(f64::total_cmp);
    let value = super::fit::median(&kept)?;
    Some(Steady {
        value,
        kept: kept.len(),
        of: samples.len(),
        disturbed: 2 * kept.len() < samples.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_repetition_is_dropped_and_does_not_disturb() {
        let s = steady(&[10.0, 11.0, 10.5, 40.0, 10.2]).unwrap();
        assert_eq!((s.kept, s.of), (4, 5));
        assert_eq!(s.value, (10.2 + 10.5) / 2.0);
        assert!(!s.disturbed);
    }

    #[test]
    fn mostly_slow_repetitions_are_disturbed() {
        // One quiet moment among busy ones: 35 us against 1.7 ms, as a loaded machine showed.
        let s = steady(&[1700.0, 35.0, 1500.0, 900.0, 1650.0]).unwrap();
        assert_eq!((s.kept, s.of), (1, 5));
        assert_eq!(s.value, 35.0);
        assert!(s.disturbed);
    }

    #[test]
    fn equal_repetitions_are_steady_and_nothing_is_none() {
        let s = steady(&[7.0; 3]).unwrap();
        assert_eq!((s.value, s.kept, s.disturbed), (7.0, 3, false));
        assert_eq!(steady(&[]), None);
        assert_eq!(steady(&[f64::NAN]), None);
    }
}
