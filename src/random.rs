//! Seeded random inputs, for running a model without data (`aim run` with no `--inputs`).

use aim_ir::{DType, Tensor, ValueInfo};

/// SplitMix64: tiny, seedable, and good enough for test data.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Random tensors for every input whose shape is fully known: floats uniform in [-1, 1),
/// integers in [0, 10), bools fair. Errors name the inputs whose dims are symbolic or
/// unknown, and the dims to provide.
pub fn random_inputs(inputs: &[ValueInfo], seed: u64) -> Result<Vec<(String, Tensor)>, String> {
    let mut rng = SplitMix(seed);
    let mut out = Vec::new();
    let mut missing = Vec::new();
    for i in inputs {
        let (Some(dt), Some(shape)) = (i.ty.dtype, i.ty.concrete_shape()) else {
            missing.push(format!("'{}' has type {}", i.name, i.ty));
            continue;
        };
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n)
            .map(|_| match dt {
                d if d.is_float() => rng.unit() * 2.0 - 1.0,
                DType::Bool => (rng.next() & 1) as f64,
                _ => (rng.next() % 10) as f64,
            })
            .collect();
        out.push((i.name.clone(), Tensor::from_f64(dt, &shape, &v)));
    }
    if !missing.is_empty() {
        return Err(format!(
            "cannot make random inputs: {}; pass --inputs with an .npz holding these arrays",
            missing.join(", ")
        ));
    }
    Ok(out)
}
