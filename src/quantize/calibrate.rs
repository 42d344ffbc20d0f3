//! Calibration: the range of each activation to quantize, from the values it takes over a
//! calibration set, by one of three methods — the observed minimum and maximum, a
//! percentile of the observed values (outliers clipped), or the threshold that keeps the
//! quantized distribution closest to the observed one (KL divergence over a histogram of
//! magnitudes, as TensorRT's entropy calibrator does) — and the scale and zero point that
//! range gives.

/// How a tensor's range is chosen from its observed values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// The observed minimum and maximum.
    MinMax,
    /// The 0.001st and 99.999th percentiles (outliers clipped).
    Percentile,
    /// The magnitude threshold whose 128-level quantization of the histogram of |x| has the
    /// least KL divergence from the histogram itself.
    Entropy,
}

impl std::str::FromStr for Method {
    type Err = String;
    fn from_str(s: &str) -> Result<Method, String> {
        match s {
            "minmax" => Ok(Method::MinMax),
            "percentile" => Ok(Method::Percentile),
            "entropy" => Ok(Method::Entropy),
            _ => Err(format!("unknown calibration method '{s}' (minmax, entropy or percentile)")),
        }
    }
}

/// Bins of the histograms the percentile and entropy methods build.
pub const BINS: usize = 2048;

/// The percentile kept at each end by [`Method::Percentile`].
const PERCENTILE: f64 = 99.999;

/// What calibration has seen of one tensor: its range (first pass) and, for the methods
/// that need it, a histogram over that range (second pass): of the values for the
/// percentile method, of their magnitudes for the entropy method.
#[derive(Clone, Debug)]
pub struct Stats {
    /// The smallest and largest finite values seen.
    pub min: f32,
    pub max: f32,
    /// Counts per bin over `[min, max]` (percentile) or `[0, max |x|]` (entropy).
    pub hist: Vec<u64>,
}

impl Default for Stats {
    fn default() -> Stats {
        Stats { min: f32::INFINITY, max: f32::NEG_INFINITY, hist: Vec::new() }
    }
}

impl Stats {
    /// Takes in the range of `v` (non-finite values ignored).
    pub fn observe_range(&mut self, v: &[f32]) {
        for &x in v.iter().filter(|x| x.is_finite()) {
            self.min = self.min.min(x);
            self.max = self.max.max(x);
        }
    }

    /// Adds `v` to the histogram `method` needs (after every range has been observed).
    pub fn observe_histogram(&mut self, v: &[f32], method: Method) {
        if method == Method::MinMax || self.min > self.max {
            return;
        }
        self.hist.resize(BINS, 0);
        let (lo, width) = match method {
            Method::Entropy => (0.0, self.min.abs().max(self.max.abs()) as f64 / BINS as f64),
            _ => (self.min as f64, (self.max as f64 - self.min as f64) / BINS as f64),
        };
        if width <= 0.0 {
            self.hist[0] += v.len() as u64;
            return;
        }
        // Exact zeros (half of a Relu's output) are exact at every threshold: left out of
        // the magnitudes, where their spike would make every merged level look wrong and
        // pull the entropy threshold down to the first candidate.
        let skip_zeros = method == Method::Entropy;
        for &x in v.iter().filter(|x| x.is_finite() && !(skip_zeros && **x == 0.0)) {
            let x = if method == Method::Entropy { x.abs() as f64 } else { x as f64 };
            let b = (((x - lo) / width) as usize).min(BINS - 1);
            self.hist[b] += 1;
        }
    }

    /// The range to quantize to, by `method` (always holding 0, as quantization needs).
    pub fn range(&self, method: Method) -> (f32, f32) {
        if self.min > self.max {
            return (0.0, 0.0);
        }
        let (lo, hi) = match method {
            Method::MinMax => (self.min, self.max),
            Method::Percentile if !self.hist.is_empty() => {
                let width = (self.max as f64 - self.min as f64) / BINS as f64;
                let at = |bin: usize| (self.min as f64 + width * bin as f64) as f32;
                let (a, b) = percentile_bins(&self.hist, PERCENTILE);
                (at(a), at(b + 1))
            }
            Method::Entropy if !self.hist.is_empty() => {
                let width = self.min.abs().max(self.max.abs()) as f64 / BINS as f64;
                let t = (entropy_threshold(&self.hist) as f64 * width) as f32;
                // Non-negative tensors (after a Relu) keep their lower end.
                (if self.min >= 0.0 { 0.0 } else { -t }, t)
            }
            _ => (self.min, self.max),
        };
        (lo.min(0.0), hi.max(0.0))
    }
}

/// The first and last bins inside the central `pct` percent of the counts.
fn percentile_bins(hist: &[u64], pct: f64) -> (usize, usize) {
    let total: u64 = hist.iter().sum();
    let cut = ((100.0 - pct) / 100.0 / 2.0 * total as f64) as u64;
    let (mut lo, mut acc) = (0, 0u64);
    while lo + 1 < hist.len() && acc + hist[lo] <= cut {
        acc += hist[lo];
        lo += 1;
    }
    let (mut hi, mut acc) = (hist.len() - 1, 0u64);
    while hi > lo && acc + hist[hi] <= cut {
        acc += hist[hi];
        hi -= 1;
    }
    (lo, hi)
}

/// The number of bins (of the magnitude histogram `hist`) to keep: the threshold whose
/// distribution, clipped there and quantized to 128 levels, is closest (least KL
/// divergence) to the clipped one.
pub fn entropy_threshold(hist: &[u64]) -> usize {
    const LEVELS: usize = 128;
    let n = hist.len();
    if n <= LEVELS {
        return n;
    }
    let (mut best, mut best_kl) = (n, f64::INFINITY);
    for i in LEVELS..=n {
        // The reference: the first i bins, everything beyond folded into the last.
        let mut p: Vec<f64> = hist[..i].iter().map(|&c| c as f64).collect();
        p[i - 1] += hist[i..].iter().sum::<u64>() as f64;
        // The candidate: those i bins merged into LEVELS levels, each spread back evenly
        // over the bins of its level that were not empty.
        let mut q = vec![0f64; i];
        for l in 0..LEVELS {
            let (a, b) = (l * i / LEVELS, ((l + 1) * i / LEVELS).max(l * i / LEVELS + 1));
            let sum: f64 = hist[a..b].iter().map(|&c| c as f64).sum();
            let nonzero = hist[a..b].iter().filter(|&&c| c > 0).count();
            if nonzero > 0 {
                for k in a..b {
                    if hist[k] > 0 {
                        q[k] = sum / nonzero as f64;
                    }
                }
            }
        }
        let kl = kl_divergence(&p, &q);
        if kl < best_kl {
            (best, best_kl) = (i, kl);
        }
    }
    best
}

/// KL(p ‖ q) of two unnormalised distributions over the same bins (bins where p is 0 add
/// nothing; where q is 0 and p is not, a small floor stands in for q).
fn kl_divergence(p: &[f64], q: &[f64]) -> f64 {
    let (sp, sq): (f64, f64) = (p.iter().sum(), q.iter().sum());
    if sp == 0.0 || sq == 0.0 {
        return 0.0;
    }
    p.iter()
        .zip(q)
        .filter(|(&a, _)| a > 0.0)
        .map(|(&a, &b)| {
            let (a, b) = (a / sp, (b / sq).max(1e-12));
            a * (a / b).ln()
        })
        .sum()
}

/// A tensor's quantization: scale, zero point, and whether it is s8 (else u8).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    pub scale: f32,
    pub zero: i32,
    pub signed: bool,
}

/// The parameters of the range `(lo, hi)` (holding 0): u8 with a zero point covering it
/// (asymmetric), or s8 around 0 (symmetric, zero point 0, ±127).
pub fn params(lo: f32, hi: f32, symmetric: bool) -> Params {
    if symmetric {
        let m = lo.abs().max(hi.abs());
        let scale = if m > 0.0 { m / 127.0 } else { 1.0 };
        Params { scale, zero: 0, signed: true }
    } else {
        let span = hi - lo;
        if span <= 0.0 {
            return Params { scale: 1.0, zero: 0, signed: false };
        }
        let scale = span / 255.0;
        let zero = (-lo / scale).round_ties_even().clamp(0.0, 255.0) as i32;
        Params { scale, zero, signed: false }
    }
}

/// Weights quantized to s8, symmetric (zero point 0, values in ±127): one scale, or one
/// per slice along `axis` of the weights' `dims`. Returns the integers and the scales.
pub fn quantize_weights(w: &[f32], dims: &[usize], axis: Option<usize>) -> (Vec<i8>, Vec<f32>) {
    let (outer, n, inner) = match axis {
        Some(a) => (dims[..a].iter().product::<usize>(), dims[a], dims[a + 1..].iter().product::<usize>()),
        None => (1, 1, w.len()),
    };
    let mut scale = vec![0f32; n];
    for o in 0..outer {
        for (c, s) in scale.iter_mut().enumerate() {
            let at = (o * n + c) * inner;
            *s = w[at..at + inner].iter().fold(*s, |m, v| m.max(v.abs()));
        }
    }
    for s in &mut scale {
        *s = if *s > 0.0 { *s / 127.0 } else { 1.0 };
    }
    let q = w
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let c = (i / inner) % n;
            (v / scale[c]).round_ties_even().clamp(-127.0, 127.0) as i8
        })
        .collect();
    (q, scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asymmetric_and_symmetric_parameters() {
        let p = params(-1.0, 3.0, false);
        assert!((p.scale - 4.0 / 255.0).abs() < 1e-7);
        assert_eq!((p.zero, p.signed), (64, false));
        assert_eq!(params(0.0, 2.54, true), Params { scale: 0.02, zero: 0, signed: true });
        // An empty range still quantizes (zero maps to zero).
        assert_eq!(params(0.0, 0.0, false).zero, 0);
    }

    #[test]
    fn percentile_clips_outliers_and_minmax_keeps_them() {
        // A million values: the 99.999th percentile leaves out five at each end.
        let mut v: Vec<f32> = (0..1_000_000).map(|i| (i % 1000) as f32 / 1000.0).collect();
        v.push(1000.0);
        let mut s = Stats::default();
        s.observe_range(&v);
        assert_eq!(s.range(Method::MinMax), (0.0, 1000.0));
        s.observe_histogram(&v, Method::Percentile);
        let (_, hi) = s.range(Method::Percentile);
        assert!(hi < 2.0, "the outlier is clipped: {hi}");
    }

    #[test]
    fn entropy_threshold_stops_before_a_sparse_tail() {
        // Most mass in the first quarter of the range, a few outliers at the end.
        let mut hist = vec![0u64; BINS];
        for (i, h) in hist.iter_mut().enumerate().take(BINS / 4) {
            *h = 1000 - (i as u64 * 1000 / (BINS as u64 / 4));
        }
        hist[BINS - 1] = 3;
        let t = entropy_threshold(&hist);
        assert!(t > BINS / 8 && t < BINS, "threshold {t}");
    }

    #[test]
    fn weights_per_channel_keep_each_channels_largest_magnitude() {
        let w = [1.0, -2.0, 0.5, 0.25, 0.0, -0.125];
        let (q, s) = quantize_weights(&w, &[2, 3], Some(0));
        assert_eq!(s, vec![2.0 / 127.0, 0.25 / 127.0]);
        assert_eq!(q, vec![64, -127, 32, 127, 0, -64]);
        let (q, s) = quantize_weights(&w, &[2, 3], None);
        assert_eq!(s, vec![2.0 / 127.0]);
        assert_eq!(q[1], -127);
    }
}
