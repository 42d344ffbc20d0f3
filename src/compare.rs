//! `aim compare`: where the cpu backend's numbers part from the reference backend's (or
//! from values computed elsewhere, such as ONNX Runtime's), node by node.
//!
//! Both runs keep every intermediate value ([`Model::run_capture`]). Rows follow the ONNX
//! graph's order, one per node output: the error of the cpu value against the reference
//! value of the same name. A node the cpu backend fused into another has no value of its
//! own there; its row says which node it went into (the fused node's output is the value
//! of its last source, compared in that row).

use crate::{Backend, Error, Model, Options, Tensor};
use std::collections::HashMap;
use std::path::Path;

/// What the cpu backend is compared with.
#[derive(Debug, Clone)]
pub enum Against {
    /// The reference backend, run on the same inputs.
    Reference,
    /// Values computed elsewhere (an `.npz` keyed by value name), with where they came from.
    Values { what: String, values: HashMap<String, Tensor> },
}

/// The errors of one value.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// Largest `|cpu - reference|`.
    pub max_abs: f64,
    /// Largest `|cpu - reference| / |reference|`, with the denominator at least a
    /// thousandth of the scale (so values near zero do not dominate).
    pub max_rel: f64,
    /// Mean squared error.
    pub mse: f64,
    /// Largest finite `|reference|`: what the tolerance is relative to.
    pub scale: f64,
    /// Whether `max_abs` exceeds the tolerance times the scale.
    pub over: bool,
}

/// One row of the report: a node output and how it compares.
#[derive(Debug, Clone)]
pub struct Row {
    /// The ONNX node.
    pub node: String,
    /// Its op.
    pub op: String,
    /// The output value.
    pub output: String,
    /// The comparison, or why there is none.
    pub result: Result<Stats, String>,
}

/// The whole comparison.
#[derive(Debug, Clone)]
pub struct Report {
    /// One row per node output, in graph order.
    pub rows: Vec<Row>,
    /// The tolerance, relative to each value's scale.
    pub tolerance: f64,
    /// What the cpu backend was compared with.
    pub against: String,
}

impl Report {
    /// The first row whose error exceeds the tolerance.
    pub fn first_over(&self) -> Option<&Row> {
        self.rows.iter().find(|r| r.result.as_ref().is_ok_and(|s| s.over))
    }

    /// Rows compared, rows without a comparison, rows over the tolerance.
    pub fn counts(&self) -> (usize, usize, usize) {
        let compared = self.rows.iter().filter(|r| r.result.is_ok()).count();
        let over = self.rows.iter().filter(|r| r.result.as_ref().is_ok_and(|s| s.over)).count();
        (compared, self.rows.len() - compared, over)
    }
}

/// Compares `cpu` with `reference`.
pub fn stats(cpu: &Tensor, reference: &Tensor, tolerance: f64) -> Result<Stats, String> {
    if cpu.dtype() != reference.dtype() || cpu.shape() != reference.shape() {
        return Err(format!(
            "cpu gives {}{:?}, the reference {}{:?}",
            cpu.dtype(),
            cpu.shape(),
            reference.dtype(),
            reference.shape()
        ));
    }
    let (a, b) = (cpu.to_f64_vec(), reference.to_f64_vec());
    let scale = b.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
    let floor = (scale * 1e-3).max(f64::MIN_POSITIVE);
    let (mut max_abs, mut max_rel, mut sq) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(&b) {
        let d = if x == y || (x.is_nan() && y.is_nan()) { 0.0 } else { (x - y).abs() };
        let d = if d.is_nan() { f64::INFINITY } else { d };
        max_abs = max_abs.max(d);
        max_rel = max_rel.max(d / y.abs().max(floor));
        sq += d * d;
    }
    let mse = if a.is_empty() { 0.0 } else { sq / a.len() as f64 };
    Ok(Stats { max_abs, max_rel, mse, scale, over: max_abs > tolerance * scale.max(f64::MIN_POSITIVE) })
}

/// Runs `path` on the cpu backend (with `opts`) and compares every node output with
/// `against`.
pub fn compare(
    path: &Path,
    inputs: Vec<(String, Tensor)>,
    against: &Against,
    tolerance: f64,
    opts: &Options,
) -> Result<Report, Error> {
    let cpu = Model::load_with_options(path, &Options { backend: Backend::Cpu, ..opts.clone() })?;
    let cpu_values: HashMap<String, Tensor> = cpu.run_capture(inputs.clone())?.values.into_iter().collect();
    let (what, ref_values, graph) = match against {
        Against::Reference => {
            let r = Model::load_with_options(path, &Options { backend: Backend::Reference, ..opts.clone() })?;
            let values: HashMap<String, Tensor> = r.run_capture(inputs)?.values.into_iter().collect();
            ("the reference backend".to_string(), values, r.ir().graph.clone())
        }
        Against::Values { what, values } => {
            let ir = aim_onnx::import_file(path)?;
            (what.clone(), values.clone(), ir.graph)
        }
    };
    // Which cpu node each ONNX node went into, for the rows without a cpu value.
    let mut fused_into: HashMap<String, (String, String)> = HashMap::new();
    if let Some(g) = cpu.optimized_graph() {
        for n in &g.nodes {
            for s in aim_compiler::passes::sources_of(n) {
                let out = n.outputs.first().cloned().unwrap_or_default();
                fused_into.entry(s).or_insert_with(|| (n.name.clone(), out));
            }
        }
    }
    let mut rows = Vec::new();
    for n in &graph.nodes {
        for o in n.outputs.iter().filter(|o| !o.is_empty()) {
            let unblocked = ref_values.get(o).and_then(|r| unblock(cpu_values.get(&format!("{o}.nchwc"))?, r.shape()));
            let result = match (cpu_values.get(o).or(unblocked.as_ref()), ref_values.get(o)) {
                (_, None) => Err(format!("no value in {what}")),
                (None, Some(_)) => Err(match fused_into.get(&n.name) {
                    Some((f, out)) if out != o => {
                        format!("fused into cpu node '{f}' (making '{out}')")
                    }
                    _ => "not computed on its own by the cpu backend (folded, or in a blocked layout)".to_string(),
                }),
                (Some(c), Some(r)) => stats(c, r, tolerance),
            };
            rows.push(Row { node: n.name.clone(), op: n.op.clone(), output: o.clone(), result });
        }
    }
    Ok(Report { rows, tolerance, against: what })
}

/// A value the cpu backend holds in the blocked layout (`[N, C/L, H, W, L]`, channels padded
/// to whole blocks) back in NCHW of `shape`, to compare with the reference.
fn unblock(t: &Tensor, shape: &[usize]) -> Option<Tensor> {
    let (&[n, c, h, w], &[bn, cb, bh, bw, l]) = (shape, t.shape()) else { return None };
    if t.dtype() != aim_ir::DType::F32 || bn != n || bh != h || bw != w || cb * l < c {
        return None;
    }
    let src = t.data::<f32>();
    let mut out = vec![0f32; n * c * h * w];
    for ((((b, ch), y), x), o) in (0..n)
        .flat_map(|b| (0..c).map(move |ch| (b, ch)))
        .flat_map(|bc| (0..h).map(move |y| (bc, y)))
        .flat_map(|bcy| (0..w).map(move |x| (bcy, x)))
        .zip(0..)
    {
        out[o] = src[(((b * cb + ch / l) * h + y) * w + x) * l + ch % l];
    }
    Some(Tensor::from_slice(shape, &out))
}

/// The report as text: a header, one line per row, and a summary naming the first value
/// over the tolerance.
pub fn render_text(r: &Report, model: &str) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "compare {model}: cpu backend against {}, tolerance {:e} of each value's scale",
        r.against, r.tolerance
    );
    let _ = writeln!(
        s,
        "{:>4}  {:<28} {:<18} {:<24} {:>10} {:>10} {:>10} {:>10}",
        "#", "node", "op", "output", "max abs", "max rel", "mse", "scale"
    );
    let first = r.first_over().map(|f| (f.node.clone(), f.output.clone()));
    for (i, row) in r.rows.iter().enumerate() {
        let head = format!("{:>4}  {:<28} {:<18} {:<24}", i + 1, row.node, row.op, row.output);
        match &row.result {
            Ok(st) => {
                let mark = if first.as_ref() == Some(&(row.node.clone(), row.output.clone())) {
                    "  <- first over tolerance"
                } else if st.over {
                    "  over"
                } else {
                    ""
                };
                let _ = writeln!(
                    s,
                    "{head} {:>10.3e} {:>10.3e} {:>10.3e} {:>10.3e}{mark}",
                    st.max_abs, st.max_rel, st.mse, st.scale
                );
            }
            Err(why) => {
                let _ = writeln!(s, "{head} ({why})");
            }
        }
    }
    let (compared, missing, over) = r.counts();
    let _ = write!(s, "{compared} values compared, {missing} without a value to compare, {over} over tolerance");
    match r.first_over() {
        Some(f) => {
            let _ = writeln!(s, "; first over tolerance: node '{}' ({}), output '{}'", f.node, f.op, f.output);
        }
        None => s.push('\n'),
    }
    s
}

/// The report as one JSON object.
pub fn render_json(r: &Report, model: &str) -> String {
    let q = |s: &str| serde_json::Value::String(s.to_string());
    let num = |v: f64| if v.is_finite() { serde_json::json!(v) } else { q(&v.to_string()) };
    let rows: Vec<serde_json::Value> = r
        .rows
        .iter()
        .map(|row| {
            let mut o = serde_json::json!({"node": row.node, "op": row.op, "output": row.output});
            match &row.result {
                Ok(st) => {
                    o["max_abs"] = num(st.max_abs);
                    o["max_rel"] = num(st.max_rel);
                    o["mse"] = num(st.mse);
                    o["scale"] = num(st.scale);
                    o["over"] = serde_json::json!(st.over);
                }
                Err(why) => o["skipped"] = q(why),
            }
            o
        })
        .collect();
    let (compared, missing, over) = r.counts();
    serde_json::json!({
        "model": model,
        "against": r.against,
        "tolerance": r.tolerance,
        "compared": compared,
        "without_value": missing,
        "over_tolerance": over,
        "first_over": r.first_over().map(|f| serde_json::json!({"node": f.node, "output": f.output})),
        "rows": rows,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_measure_errors_against_the_scale() {
        let r = Tensor::from_slice(&[4], &[1.0f32, -2.0, 0.0, 4.0]);
        let c = Tensor::from_slice(&[4], &[1.0f32, -2.0, 0.001, 4.002]);
        let s = stats(&c, &r, 1e-4).unwrap();
        assert!((s.max_abs - 0.002).abs() < 1e-6, "{s:?}");
        assert_eq!(s.scale, 4.0);
        assert!(s.over, "0.002 > 1e-4 × 4");
        assert!(!stats(&c, &r, 1e-3).unwrap().over);
        // Near zero the denominator is a thousandth of the scale: 0.001 / 0.004.
        assert!((s.max_rel - 0.25).abs() < 1e-3, "{s:?}");
        assert!(stats(&Tensor::from_slice(&[2], &[1.0f32, 2.0]), &r, 1e-4).is_err());
        let nan = Tensor::from_slice(&[1], &[f32::NAN]);
        assert_eq!(stats(&nan, &nan, 1e-4).unwrap().max_abs, 0.0);
    }
}
