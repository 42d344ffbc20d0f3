//! The IR's text format: a printer and a parser that read each other's output.
//! The grammar is written down in `ir-spec/SPEC.md`.

mod parse;
mod print;

pub use parse::{parse_graph, parse_model, ParseError};
pub use print::{print_graph, print_model, print_node, quote_str, tensor_literal, TensorDetail};

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
        Model { graph: g, opset: 17, producer: "test".into() }
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
