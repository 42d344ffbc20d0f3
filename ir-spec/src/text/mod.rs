//! The IR's text format: a printer and a parser that read each other's output.
//! The grammar is written down in `ir-spec/SPEC.md`.

mod parse;
mod print;

pub use parse::{parse_graph, parse_model, parse_model_with_data, DataResolver, ParseError};
pub use print::{
    print_graph, print_model, print_model_with_data, print_models_with_data, print_node, quote_str, tensor_literal,
    ConstantTable, TensorDetail, INLINE_MAX,
};

/// True for characters a value name may use without quotes.
fn plain_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-')
}

/// A value name as printed: `%x`, or `%"odd name:0"` when it holds other characters.
pub fn quote_name(name: &str) -> String {
    if !name.is_empty() && name.chars().all(plain_name_char) {
        format!("%{name}")
    } else {
        format!("%{}", quote_str(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Attr, DType, Graph, Model, Node, Tensor, ValueInfo, ValueType};
    use std::collections::BTreeMap;

    fn sample() -> Model {
        let mut then_g = Graph { name: "then".into(), ..Graph::default() };
        then_g.nodes.push(Node {
            name: "t".into(),
            op: "Identity".into(),
            domain: String::new(),
            inputs: vec!["x".into()],
            outputs: vec!["y_then".into()],
            attrs: BTreeMap::new(),
        });
        then_g.outputs.push(ValueInfo { name: "y_then".into(), ty: ValueType::known(DType::F32, &[2]) });
        let mut attrs = BTreeMap::new();
        attrs.insert("alpha".into(), Attr::Float(0.1));
        attrs.insert("axes".into(), Attr::Ints(vec![0, -1]));
        attrs.insert("empty".into(), Attr::Floats(vec![]));
        attrs.insert("mode".into(), Attr::String("a \"q\"\n".into()));
        attrs.insert("names".into(), Attr::Strings(vec!["p".into(), "q".into()]));
        attrs.insert("scales".into(), Attr::Floats(vec![1.5, f32::INFINITY, -0.0]));
        attrs.insert("then_branch".into(), Attr::Graph(Box::new(then_g)));
        attrs.insert("value".into(), Attr::Tensor(Tensor::from_slice(&[2], &[f32::NAN, 1e-30])));
        let mut g = Graph { name: "main".into(), ..Graph::default() };
        g.inputs.push(ValueInfo {
            name: "x".into(),
            ty: ValueType {
                dtype: Some(DType::F32),
                shape: Some(vec![crate::Dim::Sym("N".into()), crate::Dim::Unknown]),
            },
        });
        g.initializers.insert("w:0".into(), Tensor::from_slice(&[2, 2], &[1i64, -2, 3, i64::MIN]));
        g.initializers.insert("b".into(), Tensor::from_bools(&[2], &[true, false]));
        g.nodes.push(Node {
            name: "odd node/1".into(),
            op: "Custom".into(),
            domain: "com.example".into(),
            inputs: vec!["x".into(), String::new(), "w:0".into()],
            outputs: vec!["y".into(), String::new()],
            attrs,
        });
        g.value_types.insert("y".into(), ValueType::known(DType::F32, &[2]));
        g.outputs.push(ValueInfo { name: "y".into(), ty: ValueType { dtype: Some(DType::F32), shape: None } });
        Model { graph: g, opset: 17, producer: "test".into(), ..Model::default() }
    }

    #[test]
    fn text_round_trips() {
        let m = sample();
        let text = print_model(&m, TensorDetail::Full);
        let back = parse_model(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(print_model(&back, TensorDetail::Full), text);
        // NaN != NaN, so compare everything but the NaN-holding attribute structurally.
        assert_eq!(back.graph.initializers, m.graph.initializers);
        assert_eq!(back.graph.inputs, m.graph.inputs);
        assert_eq!(back.graph.nodes[0].attrs.get("scales"), m.graph.nodes[0].attrs.get("scales"));
    }

    #[test]
    fn printed_form_is_readable() {
        insta::assert_snapshot!(print_model(&sample(), TensorDetail::Summary(8)));
    }

    /// Large constants leave the text for a table (at every depth), small ones stay, and
    /// the text parses back against the table; doc and metadata lines round-trip too.
    #[test]
    fn text_with_a_data_table_round_trips() {
        let mut m = sample();
        m.doc = "a \"doc\"".into();
        m.metadata = vec![("k".into(), "v".into()), ("a".into(), "".into())];
        let big: Vec<f32> = (0..40).map(|i| i as f32 * 0.5).collect();
        m.graph.initializers.insert("big".into(), Tensor::from_slice(&[4, 10], &big));
        if let Some(Attr::Graph(then_g)) = m.graph.nodes[0].attrs.get_mut("then_branch") {
            then_g.initializers.insert("inner".into(), Tensor::from_slice(&[20], &[7i32; 20]));
        }
        let (text, table) = print_model_with_data(&m);
        assert_eq!(table.len(), 2, "{text}");
        assert!(text.contains("f32[4,10] @0") && text.contains("i32[20] @1"), "{text}");
        assert!(text.contains("[1, -2, 3, -9223372036854775808]"), "small tensors stay inline: {text}");
        let resolve = |k: usize, d: DType, s: &[usize]| -> Result<Tensor, String> {
            let t = table.get(k).ok_or("no such tensor")?;
            if t.dtype() != d || t.shape() != s {
                return Err("wrong type".into());
            }
            Ok(t.clone())
        };
        let back = parse_model_with_data(&text, &resolve).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(print_model(&back, TensorDetail::Full), print_model(&m, TensorDetail::Full));
        assert_eq!((back.doc.as_str(), back.metadata.as_slice()), (m.doc.as_str(), m.metadata.as_slice()));
        let e = parse_model_with_data(&text.replace("@1", "@7"), &resolve).unwrap_err();
        assert!(e.msg.contains("tensor @7: no such tensor"), "{e}");
        let e = parse_model(&text).unwrap_err();
        assert!(e.msg.contains("has none"), "{e}");
    }

    #[test]
    fn elided_tensors_do_not_parse() {
        let e = parse_graph("graph \"g\" {\n  init %w = f32[100] <100 values>\n}\n").unwrap_err();
        assert!(e.msg.contains("elided"), "{e}");
    }

    #[test]
    fn syntax_errors_have_positions() {
        let e = parse_graph("graph \"g\" {\n  %y = Relu(%x\n}\n").unwrap_err();
        assert_eq!(e.line, 2);
    }
}
