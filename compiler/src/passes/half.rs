//! Half-precision models (f16 or bf16 weights and activations) computed in f32: the cpu
//! backend's kernels are f32 (no half kernel would pay on a CPU without half arithmetic),
//! so every half constant is widened once at load, every half value becomes f32 and a
//! Cast to half becomes a Cast to f32, with the conversions only at the graph's edges — a
//! half input cast to f32 where it enters, a half output cast back where it leaves. The
//! model then gets the whole f32 pipeline (fusion, layouts, packed kernels). Results are
//! the f32 computation of the half model: closer to exact than a computation rounding every
//! intermediate to half, as ONNX Runtime's half kernels do (the tests state the difference).

use super::PassError;
use aim_ir::{Attr, DType, Graph, Node, Tensor, ValueType};
use std::collections::HashMap;

fn half(d: Option<DType>) -> bool {
    matches!(d, Some(DType::F16 | DType::BF16))
}

/// Widens `g` (see the module doc); does nothing to a graph without half values.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let any = g.inputs.iter().chain(&g.outputs).any(|v| half(v.ty.dtype))
        || g.initializers.values().any(|t| half(Some(t.dtype())))
        || g.value_types.values().any(|t| half(t.dtype))
        || g.nodes.iter().any(|n| n.op == "Cast" && half_code(n.int("to", 0)));
    if !any {
        return Ok(());
    }
    // Half inputs: cast once where they enter; every reader takes the f32 copy.
    let mut renamed: HashMap<String, String> = HashMap::new();
    let mut first: Vec<Node> = Vec::new();
    for v in g.inputs.iter().filter(|v| half(v.ty.dtype)) {
        let wide = fresh(g, &format!("{}/f32", v.name));
        first.push(cast(&format!("{}/widen", v.name), &v.name, &wide, DType::F32));
        renamed.insert(v.name.clone(), wide);
    }
    // Half outputs: the f32 value under another name, cast back under the output's.
    // (An output that is an input as well stays as it is.)
    let mut last: Vec<Node> = Vec::new();
    let outputs: Vec<(String, DType)> = g
        .outputs
        .iter()
        .filter(|v| half(v.ty.dtype) && !renamed.contains_key(&v.name))
        .map(|v| (v.name.clone(), v.ty.dtype.expect("half")))
        .collect();
    for (name, dtype) in outputs {
        let wide = fresh(g, &format!("{name}/f32"));
        renamed.insert(name.clone(), wide.clone());
        last.push(cast(&format!("{name}/narrow"), &wide, &name, dtype));
    }
    widen_body(g, &renamed);
    let mut nodes = first;
    nodes.append(&mut g.nodes);
    nodes.extend(last);
    g.nodes = nodes;
    // The edges keep their half types; the f32 copies are inferred.
    for v in g.inputs.iter().chain(&g.outputs) {
        g.value_types.insert(v.name.clone(), v.ty.clone());
    }
    Ok(())
}

/// Widens the constants, value types and Casts of `g` and (recursively) of its subgraphs,
/// reading and writing `renamed` values under their new names.
fn widen_body(g: &mut Graph, renamed: &HashMap<String, String>) {
    for t in g.initializers.values_mut() {
        widen_tensor(t);
    }
    for t in g.value_types.values_mut() {
        widen_type(t);
    }
    for n in &mut g.nodes {
        for s in n.inputs.iter_mut().chain(n.outputs.iter_mut()) {
            if let Some(r) = renamed.get(s.as_str()) {
                *s = r.clone();
            }
        }
        for (k, a) in n.attrs.iter_mut() {
            match a {
                Attr::Int(code) if (k == "to" || k == "dtype") && half_code(*code) => {
                    *code = DType::F32.onnx_code() as i64
                }
                Attr::Tensor(t) => widen_tensor(t),
                Attr::Graph(sub) => {
                    for v in sub.inputs.iter_mut().chain(sub.outputs.iter_mut()) {
                        widen_type(&mut v.ty);
                    }
                    widen_body(sub, renamed);
                }
                _ => {}
            }
        }
    }
}

fn half_code(code: i64) -> bool {
    code == DType::F16.onnx_code() as i64 || code == DType::BF16.onnx_code() as i64
}

/// A half tensor as f32 (the `half` crate's slice conversion: F16C where the CPU has it).
fn widen_tensor(t: &mut Tensor) {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    let dtype = t.dtype();
    if !half(Some(dtype)) {
        return;
    }
    let bytes = t.bytes();
    let bits: Vec<u16> = bytes.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
    let mut out = vec![0f32; bits.len()];
    match dtype {
        DType::F16 => bits.reinterpret_cast::<half::f16>().convert_to_f32_slice(&mut out),
        _ => bits.reinterpret_cast::<half::bf16>().convert_to_f32_slice(&mut out),
    }
    *t = Tensor::from_vec(t.shape(), out);
}

fn widen_type(t: &mut ValueType) {
    if half(t.dtype) {
        t.dtype = Some(DType::F32);
    }
}

fn cast(name: &str, x: &str, y: &str, to: DType) -> Node {
    Node {
        name: name.to_string(),
        op: "Cast".into(),
        domain: String::new(),
        inputs: vec![x.to_string()],
        outputs: vec![y.to_string()],
        attrs: [("to".to_string(), Attr::Int(to.onnx_code() as i64))].into_iter().collect(),
    }
}

/// A value name `g` does not use.
fn fresh(g: &Graph, base: &str) -> String {
    let used = |s: &str| {
        g.value_types.contains_key(s)
            || g.initializers.contains_key(s)
            || g.nodes.iter().any(|n| n.outputs.iter().any(|o| o == s))
            || g.inputs.iter().any(|v| v.name == s)
    };
    let mut name = base.to_string();
    let mut k = 1;
    while used(&name) {
        name = format!("{base}_{k}");
        k += 1;
    }
    name
}

/// `--weights f16`: every dense layer (`aim:Dense`) keeps its weights as f16, half the
/// memory, widened to f32 panel by panel as its GEMM reads them (`weights = "f16"`, read
/// when the program packs them). Each weight is rounded to the nearest f16: a relative
/// error of at most 2^-11 in f16's normal range.
pub fn mark_weights(g: &mut Graph) -> Result<(), PassError> {
    // Layers already holding 4-bit weights keep them.
    for n in g.nodes.iter_mut().filter(|n| n.domain == "aim" && n.op == "Dense" && !n.attrs.contains_key("weights")) {
        n.attrs.insert("weights".into(), Attr::String("f16".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use aim_ir::text::parse_graph;

    #[test]
    fn half_values_become_f32_between_casts_at_the_edges() {
        let mut g = parse_graph(
            "graph \"g\" {\n  input %x: f16[2,3]\n  init %w = f16[3] [1.0, 2.0, 0.5]\n  %m = Mul(%x, %w)  # mul\n  %c = Cast(%m) {to=10}  # cast\n  %y = Relu(%c)  # relu\n  output %y: f16[2,3]\n}\n",
        )
        .unwrap();
        aim_ir::infer::infer_types(&mut g).unwrap();
        run(&mut g).unwrap();
        let ops: Vec<&str> = g.nodes.iter().map(|n| n.op.as_str()).collect();
        assert_eq!(ops, ["Cast", "Mul", "Cast", "Relu", "Cast"]);
        assert_eq!(g.initializers["w"].dtype(), DType::F32);
        assert_eq!(g.initializers["w"].data::<f32>(), &[1.0, 2.0, 0.5]);
        // The inner Cast now keeps f32; the edges convert.
        assert_eq!(g.nodes[2].int("to", 0), 1);
        assert_eq!((g.nodes[0].inputs[0].as_str(), g.nodes[4].outputs[0].as_str()), ("x", "y"));
        assert_eq!(g.nodes[4].int("to", 0), 10);
        assert_eq!(g.nodes[1].inputs[0], g.nodes[0].outputs[0]);
        aim_ir::infer::infer_types(&mut g).unwrap();
        assert_eq!(g.value_type(&g.nodes[3].outputs[0]).unwrap().dtype, Some(DType::F32));
        // The interpreter runs it: f16 in, f16 out, the f32 values in between.
        let x = Tensor::from_slice(&[2, 3], &[1.0f32, -2.0, 3.0, 0.5, 4.0, -1.0]);
        let x = aim_kernels::cast(&x, DType::F16);
        let y = aim_runtime::run_graph(&g, [("x".to_string(), x)].into_iter().collect()).unwrap();
        assert_eq!(y[0].dtype(), DType::F16);
        assert_eq!(aim_kernels::cast(&y[0], DType::F32).data::<f32>(), &[1.0, 0.0, 1.5, 0.5, 8.0, 0.0]);
    }

    #[test]
    fn f32_graphs_are_left_alone() {
        let text = "graph \"g\" {\n  input %x: f32[2]\n  %y = Relu(%x)  # relu\n  output %y: f32[2]\n}\n";
        let mut g = parse_graph(text).unwrap();
        let before = g.clone();
        run(&mut g).unwrap();
        assert_eq!(g, before);
    }
}
