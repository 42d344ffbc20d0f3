//! Seeded random inputs, for running a model without data (`aim run` with no `--inputs`).

use aim_ir::{DType, Tensor, ValueInfo, ValueType};

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
    random_inputs_shaped(inputs, &[], seed)
}

/// As [`random_inputs`], with the shapes of `shapes` (`--shape NAME=DIMS`, as for compiling
/// a specialised program) for the inputs they name: an input with symbolic dims gets random
/// data of the shape given for it, which must keep its rank and its known dims.
pub fn random_inputs_shaped(
    inputs: &[ValueInfo],
    shapes: &[(String, Vec<usize>)],
    seed: u64,
) -> Result<Vec<(String, Tensor)>, String> {
    let mut rng = SplitMix(seed);
    let mut out = Vec::new();
    let mut missing = Vec::new();
    for i in inputs {
        let shape = match (shapes.iter().find(|(n, _)| *n == i.name), i.ty.dtype) {
            (Some((_, s)), Some(dt)) if i.ty.is_made_static_by(&ValueType::known(dt, s)) => Some(s.clone()),
            (Some((_, s)), _) => return Err(format!("--shape {}={s:?} does not fit its type {}", i.name, i.ty)),
            (None, _) => i.ty.concrete_shape(),
        };
        let (Some(dt), Some(shape)) = (i.ty.dtype, shape) else {
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
            "cannot make random inputs: {}; pass --inputs with an .npz holding these arrays, or --shape NAME=DIMS",
            missing.join(", ")
        ));
    }
    Ok(out)
}
