//! Inference rules of network ops beyond the elementwise and matrix ones: ConvTranspose,
//! the recurrent ops (LSTM, GRU, RNN), RoiAlign, GridSample, NonMaxSuppression, the
//! quantisation ops and the window functions.

use super::{dtype_of, shape_of, Ins};
use crate::{DType, Dim, Graph, Node, ValueType};

/// The ops [`infer`] has rules for.
pub(super) const OPS: &[&str] = &[
    "ConvTranspose",
    "LSTM",
    "GRU",
    "RNN",
    "RoiAlign",
    "GridSample",
    "NonMaxSuppression",
    "QuantizeLinear",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
    "HannWindow",
    "HammingWindow",
    "BlackmanWindow",
];

/// The output types of `n`, one of [`OPS`] (other ops: unknown).
pub(super) fn infer(g: &Graph, n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    let dt = dtype_of(ins, 0);
    let ty = |dtype: Option<DType>, shape: Option<Vec<Dim>>| ValueType { dtype, shape };
    match n.op.as_str() {
        "ConvTranspose" => conv_transpose(n, ins).map(|s| vec![ty(dt, s)]),
        "LSTM" | "GRU" | "RNN" => Ok(recurrent(n, ins).into_iter().map(|s| ty(dt, s)).collect()),
        "RoiAlign" => {
            let (x, rois) = (shape_of(ins, 0), shape_of(ins, 1));
            let (oh, ow) = (n.int("output_height", 1).max(1) as usize, n.int("output_width", 1).max(1) as usize);
            let r = rois.and_then(|r| r.first().cloned()).unwrap_or(Dim::Unknown);
            let c = x.and_then(|x| x.get(1).cloned()).unwrap_or(Dim::Unknown);
            Ok(vec![ty(dt, Some(vec![r, c, Dim::Known(oh), Dim::Known(ow)]))])
        }
        "GridSample" => match (shape_of(ins, 0), shape_of(ins, 1)) {
            (Some(x), Some(grid)) if x.len() >= 3 && grid.len() == x.len() => {
                let mut out = vec![x[0].clone(), x[1].clone()];
                out.extend_from_slice(&grid[1..grid.len() - 1]);
                Ok(vec![ty(dt, Some(out))])
            }
            _ => Ok(vec![ty(dt, None)]),
        },
        "NonMaxSuppression" => Ok(vec![ty(Some(DType::I64), Some(vec![Dim::Unknown, Dim::Known(3)]))]),
        "QuantizeLinear" => {
            let out = dtype_of(ins, 2)
                .or_else(|| n.opt_int("output_dtype").and_then(|c| DType::from_onnx_code(c as i32)))
                .or(Some(DType::U8));
            Ok(vec![ty(out, shape_of(ins, 0))])
        }
        "DequantizeLinear" => Ok(vec![ty(dtype_of(ins, 1).or(Some(DType::F32)), shape_of(ins, 0))]),
        "DynamicQuantizeLinear" => {
            let s = shape_of(ins, 0);
            Ok(vec![ty(Some(DType::U8), s), ty(Some(DType::F32), Some(vec![])), ty(Some(DType::U8), Some(vec![]))])
        }
        "HannWindow" | "HammingWindow" | "BlackmanWindow" => {
            let len = g
                .initializers
                .get(n.input(0).unwrap_or_default())
                .filter(|t| t.len() == 1)
                .map(|t| t.to_i64_vec()[0])
                .filter(|v| *v >= 0)
                .map_or(Dim::Unknown, |v| Dim::Known(v as usize));
            let out = DType::from_onnx_code(n.int("output_datatype", 1) as i32);
            Ok(vec![ty(out, Some(vec![len]))])
        }
        _ => Ok(vec![ValueType::unknown(); n.outputs.len()]),
    }
}

/// A ConvTranspose's output: `M = W[1]·group` channels, and per spatial dim the explicit
/// `output_shape`, or `stride·(in − 1) + output_padding + (k − 1)·dilation + 1 − pads`.
fn conv_transpose(n: &Node, ins: Ins) -> Result<Option<Vec<Dim>>, String> {
    let (Some(x), Some(w)) = (shape_of(ins, 0), shape_of(ins, 1)) else { return Ok(None) };
    if x.len() < 3 || w.len() != x.len() {
        return Err(format!(
            "ConvTranspose needs X of rank ≥ 3 and W of the same rank, got {} and {}",
            x.len(),
            w.len()
        ));
    }
    let sp = x.len() - 2;
    for (name, per) in [("strides", 1), ("dilations", 1), ("kernel_shape", 1), ("output_padding", 1), ("pads", 2)] {
        if let Some(v) = n.ints(name).filter(|v| v.len() != per * sp) {
            return Err(format!("attribute '{name}' has {} values for {sp} spatial dims", v.len()));
        }
    }
    let group = n.int("group", 1).max(1) as usize;
    if let (Some(c), Some(wc)) = (x[1].known(), w[0].known()) {
        if c != wc {
            return Err(format!("the input has {c} channels, the weight {wc}"));
        }
    }
    let m = w[1].known().map_or(Dim::Unknown, |v| Dim::Known(v * group));
    let list = |name: &str, d: i64| n.ints(name).map_or(vec![d; sp], |v| v.to_vec());
    let (s, dil, op) = (list("strides", 1), list("dilations", 1), list("output_padding", 0));
    let pads = n.ints("pads").map_or(vec![0; 2 * sp], |v| v.to_vec());
    let auto = n.string("auto_pad", "NOTSET");
    let mut out = vec![x[0].clone(), m];
    for i in 0..sp {
        if let Some(os) = n.ints("output_shape") {
            out.push(os.get(os.len().wrapping_sub(sp) + i).map_or(Dim::Unknown, |&v| Dim::Known(v.max(0) as usize)));
            continue;
        }
        let (Some(inp), Some(k)) = (x[2 + i].known(), w[2 + i].known()) else {
            out.push(Dim::Unknown);
            continue;
        };
        let (inp, k) = (inp as i128, k as i128);
        let full = s[i] as i128 * (inp - 1) + op[i] as i128 + (k - 1) * dil[i] as i128 + 1;
        let o =
            if auto.starts_with("SAME") { inp * s[i] as i128 } else { full - pads[i] as i128 - pads[sp + i] as i128 };
        if o < 0 {
            return Err(format!("the padding exceeds the output ({o})"));
        }
        out.push(usize::try_from(o).map_or(Dim::Unknown, Dim::Known));
    }
    Ok(Some(out))
}

/// LSTM/GRU/RNN outputs: `Y [T, dirs, B, H]`, `Y_h` (and LSTM's `Y_c`) `[dirs, B, H]`, or
/// batch first with `layout = 1`.
fn recurrent(n: &Node, ins: Ins) -> Vec<Option<Vec<Dim>>> {
    let outs = n.outputs.len();
    let Some(x) = shape_of(ins, 0).filter(|x| x.len() == 3) else { return vec![None; outs] };
    let dirs = Dim::Known(if n.string("direction", "forward") == "bidirectional" { 2 } else { 1 });
    let h = n.opt_int("hidden_size").filter(|&v| v > 0).map_or(Dim::Unknown, |v| Dim::Known(v as usize));
    let batch_first = n.int("layout", 0) != 0;
    let (t, b) = if batch_first { (x[1].clone(), x[0].clone()) } else { (x[0].clone(), x[1].clone()) };
    let y = if batch_first {
        vec![b.clone(), t, dirs.clone(), h.clone()]
    } else {
        vec![t, dirs.clone(), b.clone(), h.clone()]
    };
    let state = if batch_first { vec![b, dirs, h] } else { vec![dirs, b, h] };
    (0..outs).map(|i| Some(if i == 0 { y.clone() } else { state.clone() })).collect()
}
