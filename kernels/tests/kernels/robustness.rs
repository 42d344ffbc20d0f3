//! Every kernel, fed inputs that do not fit it (wrong ranks, empty tensors, other dtypes,
//! missing inputs, odd attributes), must return a value or an error — never panic.
//! Generated code and the executor rely on kernels reporting bad input as errors.

use aim_ir::{Attr, DType, Node, Tensor};
use std::collections::BTreeMap;

fn tensors() -> Vec<Tensor> {
    let f = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        Tensor::from_vec(shape, (0..n).map(|i| (i as f32 * 0.37).sin() * 3.0).collect::<Vec<f32>>())
    };
    vec![
        Tensor::scalar(1.5f32),
        Tensor::scalar(2i64),
        Tensor::scalar(-1i64),
        Tensor::from_slice(&[0], &[] as &[f32]),
        f(&[3]),
        f(&[2, 3]),
        f(&[1, 2, 4, 4]),
        f(&[2, 1, 3]),
        Tensor::from_slice(&[2], &[0i64, 1]),
        Tensor::from_slice(&[3], &[5i64, -7, 100]),
        Tensor::from_slice(&[4], &[1i64, 1, 2, 2]),
        Tensor::from_bools(&[3], &[true, false, true]),
        Tensor::from_slice(&[2, 2], &[1u8, 2, 3, 4]),
        Tensor::from_f64(DType::F16, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        f(&[1, 3, 5, 5]),
        Tensor::from_slice(&[3, 1], &[1i32, -2, 3]),
        Tensor::from_slice(&[2, 2], &[0.5f64, -1.0, 2.0, 4.0]),
        Tensor::from_slice(&[2, 0, 3], &[] as &[f32]),
    ]
}

fn attr_sets() -> Vec<BTreeMap<String, Attr>> {
    let mut sets = vec![BTreeMap::new()];
    let mut a = BTreeMap::new();
    a.insert("axis".to_string(), Attr::Int(7));
    a.insert("axes".to_string(), Attr::Ints(vec![-9, 4]));
    a.insert("perm".to_string(), Attr::Ints(vec![0, 0]));
    a.insert("kernel_shape".to_string(), Attr::Ints(vec![3, 3]));
    a.insert("pads".to_string(), Attr::Ints(vec![-1, 2]));
    a.insert("strides".to_string(), Attr::Ints(vec![0]));
    a.insert("group".to_string(), Attr::Int(3));
    a.insert("to".to_string(), Attr::Int(8));
    a.insert("blocksize".to_string(), Attr::Int(3));
    a.insert("num_outputs".to_string(), Attr::Int(0));
    a.insert("hidden_size".to_string(), Attr::Int(2));
    a.insert("equation".to_string(), Attr::String("ab,bc->ac".into()));
    sets.push(a);
    let mut b = BTreeMap::new();
    b.insert("axis".to_string(), Attr::Int(-1));
    b.insert("kernel_shape".to_string(), Attr::Ints(vec![2, 2]));
    b.insert("mode".to_string(), Attr::String("nonsense".into()));
    b.insert("equation".to_string(), Attr::String("...ii->i".into()));
    b.insert("q_num_heads".to_string(), Attr::Int(0));
    b.insert("num_heads".to_string(), Attr::Int(0));
    sets.push(b);
    sets
}

#[test]
fn kernels_never_panic_on_bad_input() {
    let ts = tensors();
    let mut panics = Vec::new();
    let mut calls = 0;
    for op in aim_kernels::ops() {
        let kernel = aim_kernels::kernel(op).unwrap();
        for attrs in attr_sets() {
            let node = Node {
                name: "n".into(),
                op: op.into(),
                domain: String::new(),
                inputs: vec![],
                outputs: vec!["y".into()],
                attrs,
            };
            // Input lists: each tensor alone, pairs, and triples with a gap.
            let mut lists: Vec<Vec<Option<Tensor>>> = vec![vec![]];
            for a in &ts {
                lists.push(vec![Some(a.clone())]);
                for b in &ts {
                    lists.push(vec![Some(a.clone()), Some(b.clone())]);
                    lists.push(vec![Some(a.clone()), None, Some(b.clone())]);
                    lists.push(vec![Some(a.clone()), Some(b.clone()), Some(b.clone())]);
                }
            }
            for ins in lists {
                calls += 1;
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| kernel(&node, &ins)));
                if r.is_err() {
                    let shapes: Vec<String> = ins
                        .iter()
                        .map(|t| t.as_ref().map_or("_".into(), |t| format!("{}{:?}", t.dtype(), t.shape())))
                        .collect();
                    panics.push(format!(
                        "{op}({}) attrs {:?}",
                        shapes.join(", "),
                        node.attrs.keys().collect::<Vec<_>>()
                    ));
                }
            }
        }
    }
    let mut ops: Vec<&str> = panics.iter().map(|p| p.split('(').next().unwrap()).collect();
    ops.dedup();
    assert!(
        panics.is_empty(),
        "{} of {calls} calls panicked, in ops {ops:?}; first: {:#?}",
        panics.len(),
        &panics[..panics.len().min(15)]
    );
}
