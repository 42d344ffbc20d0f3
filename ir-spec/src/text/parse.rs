//! Parsing the text format back into a [`Model`] or [`Graph`].

use super::plain_name_char;
use crate::{Attr, DType, Dim, Graph, Model, Node, Tensor, ValueInfo, ValueType};
use std::collections::BTreeMap;

/// A syntax error, with the line and column where it was found.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("line {line}, column {col}: {msg}")]
pub struct ParseError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub col: usize,
    /// What was wrong.
    pub msg: String,
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Value(String),
    Str(String),
    Num(String),
    Comment(String),
    Newline,
    Punct(char),
    Eof,
}

struct Lexer<'a> {
    src: &'a [u8],
    text: &'a str,
    pos: usize,
    line: usize,
    col: usize,
}

impl<'a> Lexer<'a> {
    fn err(&self, msg: impl Into<String>) -> ParseError {
        ParseError { line: self.line, col: self.col, msg: msg.into() }
    }

    fn peek_char(&self) -> Option<char> {
        self.text[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek_char()?;
        self.pos += c.len_utf8();
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    fn string(&mut self) -> Result<String, ParseError> {
        self.bump();
        let mut out = String::new();
        loop {
            match self.bump() {
                None => return Err(self.err("unterminated string")),
                Some('"') => return Ok(out),
                Some('\\') => match self.bump() {
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some('r') => out.push('\r'),
                    Some('"') => out.push('"'),
                    Some('\\') => out.push('\\'),
                    Some('u') => {
                        if self.bump() != Some('{') {
                            return Err(self.err("expected { after \\u"));
                        }
                        let mut hex = String::new();
                        loop {
                            match self.bump() {
                                Some('}') => break,
                                Some(c) if c.is_ascii_hexdigit() => hex.push(c),
                                _ => return Err(self.err("bad \\u{...} escape")),
                            }
                        }
                        let c = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32);
                        out.push(c.ok_or_else(|| self.err("bad \\u{...} escape"))?);
                    }
                    _ => return Err(self.err("unknown escape in string")),
                },
                Some(c) => out.push(c),
            }
        }
    }

    fn next(&mut self) -> Result<(Tok, usize, usize), ParseError> {
        while let Some(c) = self.peek_char() {
            if c == ' ' || c == '\t' || c == '\r' {
                self.bump();
            } else {
                break;
            }
        }
        let (line, col) = (self.line, self.col);
        let Some(c) = self.peek_char() else { return Ok((Tok::Eof, line, col)) };
        let tok = match c {
            '\n' => {
                self.bump();
                Tok::Newline
            }
            '#' => {
                self.bump();
                let start = self.pos;
                while self.peek_char().is_some_and(|c| c != '\n') {
                    self.bump();
                }
                Tok::Comment(self.text[start..self.pos].trim().to_string())
            }
            '"' => Tok::Str(self.string()?),
            '%' => {
                self.bump();
                if self.peek_char() == Some('"') {
                    Tok::Value(self.string()?)
                } else {
                    let start = self.pos;
                    while self.peek_char().is_some_and(plain_name_char) {
                        self.bump();
                    }
                    if start == self.pos {
                        return Err(self.err("expected a value name after %"));
                    }
                    Tok::Value(self.text[start..self.pos].to_string())
                }
            }
            c if c.is_ascii_digit()
                || (c == '-' && self.src.get(self.pos + 1).is_some_and(|b| b.is_ascii_digit() || *b == b'i')) =>
            {
                let start = self.pos;
                self.bump();
                while let Some(c) = self.peek_char() {
                    let prev = self.src[self.pos - 1];
                    if c.is_ascii_alphanumeric()
                        || c == '.'
                        || ((c == '-' || c == '+') && (prev == b'e' || prev == b'E'))
                    {
                        self.bump();
                    } else {
                        break;
                    }
                }
                Tok::Num(self.text[start..self.pos].to_string())
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let start = self.pos;
                while self.peek_char().is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.')) {
                    self.bump();
                }
                Tok::Ident(self.text[start..self.pos].to_string())
            }
            '(' | ')' | '[' | ']' | '{' | '}' | ',' | '=' | ':' | '?' | '*' | '<' | '>' | '@' => {
                self.bump();
                Tok::Punct(c)
            }
            c => return Err(self.err(format!("unexpected character {c:?}"))),
        };
        Ok((tok, line, col))
    }
}

/// Resolves a `@k` tensor reference: the `k`-th tensor of a data table, which must have
/// the dtype and shape the text gives (the error says why not).
pub type DataResolver<'a> = &'a dyn Fn(usize, DType, &[usize]) -> Result<Tensor, String>;

struct Parser<'a> {
    toks: Vec<(Tok, usize, usize)>,
    i: usize,
    /// Where `@k` references point (none: they are errors).
    data: Option<DataResolver<'a>>,
}

impl<'a> Parser<'a> {
    fn new(text: &str) -> Result<Parser<'a>, ParseError> {
        let mut lx = Lexer { src: text.as_bytes(), text, pos: 0, line: 1, col: 1 };
        let mut toks = Vec::new();
        loop {
            let t = lx.next()?;
            let eof = t.0 == Tok::Eof;
            toks.push(t);
            if eof {
                break;
            }
        }
        Ok(Parser { toks, i: 0, data: None })
    }

    fn peek(&self) -> &Tok {
        &self.toks[self.i].0
    }

    fn err(&self, msg: impl Into<String>) -> ParseError {
        let (_, line, col) = &self.toks[self.i];
        ParseError { line: *line, col: *col, msg: msg.into() }
    }

    fn next(&mut self) -> Tok {
        let t = self.toks[self.i].0.clone();
        if self.i + 1 < self.toks.len() {
            self.i += 1;
        }
        t
    }

    fn skip_newlines(&mut self) {
        while matches!(self.peek(), Tok::Newline | Tok::Comment(_)) {
            self.next();
        }
    }

    fn punct(&mut self, c: char) -> Result<(), ParseError> {
        match self.peek() {
            Tok::Punct(p) if *p == c => {
                self.next();
                Ok(())
            }
            t => Err(self.err(format!("expected '{c}', found {t:?}"))),
        }
    }

    fn eat_punct(&mut self, c: char) -> bool {
        if *self.peek() == Tok::Punct(c) {
            self.next();
            true
        } else {
            false
        }
    }

    fn ident(&mut self) -> Result<String, ParseError> {
        match self.next() {
            Tok::Ident(s) => Ok(s),
            t => {
                self.i -= 1;
                Err(self.err(format!("expected a word, found {t:?}")))
            }
        }
    }

    fn keyword(&mut self, k: &str) -> Result<(), ParseError> {
        match self.peek() {
            Tok::Ident(s) if s == k => {
                self.next();
                Ok(())
            }
            t => Err(self.err(format!("expected '{k}', found {t:?}"))),
        }
    }

    fn value(&mut self) -> Result<String, ParseError> {
        match self.peek().clone() {
            Tok::Value(s) => {
                self.next();
                Ok(s)
            }
            t => Err(self.err(format!("expected a %value, found {t:?}"))),
        }
    }

    fn string(&mut self) -> Result<String, ParseError> {
        match self.peek().clone() {
            Tok::Str(s) => {
                self.next();
                Ok(s)
            }
            t => Err(self.err(format!("expected a string, found {t:?}"))),
        }
    }

    fn model(&mut self) -> Result<Model, ParseError> {
        self.skip_newlines();
        self.keyword("opset")?;
        let opset = match self.next() {
            Tok::Num(n) => n.parse().map_err(|_| self.err("bad opset number"))?,
            _ => return Err(self.err("expected the opset number")),
        };
        self.skip_newlines();
        let mut producer = String::new();
        if *self.peek() == Tok::Ident("producer".into()) {
            self.next();
            producer = self.string()?;
            self.skip_newlines();
        }
        let mut doc = String::new();
        if *self.peek() == Tok::Ident("doc".into()) {
            self.next();
            doc = self.string()?;
            self.skip_newlines();
        }
        let mut metadata = Vec::new();
        while *self.peek() == Tok::Ident("meta".into()) {
            self.next();
            let k = self.string()?;
            self.punct('=')?;
            metadata.push((k, self.string()?));
            self.skip_newlines();
        }
        let graph = self.graph()?;
        self.skip_newlines();
        if *self.peek() != Tok::Eof {
            return Err(self.err("text after the end of the graph"));
        }
        Ok(Model { graph, opset, producer, doc, metadata })
    }

    fn graph(&mut self) -> Result<Graph, ParseError> {
        self.keyword("graph")?;
        let mut g = Graph { name: self.string()?, ..Graph::default() };
        self.punct('{')?;
        loop {
            self.skip_newlines();
            match self.peek().clone() {
                Tok::Punct('}') => {
                    self.next();
                    return Ok(g);
                }
                Tok::Ident(k) if k == "input" || k == "output" => {
                    self.next();
                    let name = self.value()?;
                    self.punct(':')?;
                    let ty = self.value_type()?;
                    let list = if k == "input" { &mut g.inputs } else { &mut g.outputs };
                    list.push(ValueInfo { name, ty });
                }
                Tok::Ident(k) if k == "init" => {
                    self.next();
                    let name = self.value()?;
                    self.punct('=')?;
                    let t = self.tensor()?;
                    if g.initializers.insert(name.clone(), t).is_some() {
                        return Err(self.err(format!("initializer %{name} defined twice")));
                    }
                }
                Tok::Value(_) | Tok::Ident(_) => self.node(&mut g)?,
                t => return Err(self.err(format!("expected a node, input, output or init line, found {t:?}"))),
            }
        }
    }

    fn node(&mut self, g: &mut Graph) -> Result<(), ParseError> {
        let mut outputs = Vec::new();
        loop {
            if *self.peek() == Tok::Ident("_".into()) {
                self.next();
                outputs.push(String::new());
            } else {
                let name = self.value()?;
                if self.eat_punct(':') {
                    let ty = self.value_type()?;
                    g.value_types.insert(name.clone(), ty);
                }
                outputs.push(name);
            }
            if !self.eat_punct(',') {
                break;
            }
        }
        self.punct('=')?;
        let mut op = self.ident()?;
        let mut domain = String::new();
        if self.eat_punct(':') {
            domain = op;
            op = self.ident()?;
        }
        self.punct('(')?;
        let mut inputs = Vec::new();
        if !self.eat_punct(')') {
            loop {
                if *self.peek() == Tok::Ident("_".into()) {
                    self.next();
                    inputs.push(String::new());
                } else {
                    inputs.push(self.value()?);
                }
                if self.eat_punct(')') {
                    break;
                }
                self.punct(',')?;
            }
        }
        let mut attrs = BTreeMap::new();
        if self.eat_punct('{') {
            loop {
                self.skip_newlines();
                let k = self.ident()?;
                self.punct('=')?;
                let a = self.attr()?;
                attrs.insert(k, a);
                self.skip_newlines();
                if self.eat_punct('}') {
                    break;
                }
                self.punct(',')?;
            }
        }
        let name = match self.peek().clone() {
            Tok::Comment(c) => {
                self.next();
                c
            }
            _ => return Err(self.err("expected '# node name' at the end of the node line")),
        };
        g.nodes.push(Node { name, op, domain, inputs, outputs, attrs });
        Ok(())
    }

    fn attr(&mut self) -> Result<Attr, ParseError> {
        match self.peek().clone() {
            Tok::Num(n) => {
                self.next();
                if n.contains(['.', 'e', 'E']) || n.contains("inf") {
                    Ok(Attr::Float(parse_float(&n).ok_or_else(|| self.err("bad float"))? as f32))
                } else {
                    Ok(Attr::Int(n.parse().map_err(|_| self.err(format!("bad integer {n}")))?))
                }
            }
            Tok::Ident(k) if k == "NaN" || k == "inf" => {
                self.next();
                Ok(Attr::Float(parse_float(&k).unwrap_or(f64::NAN) as f32))
            }
            Tok::Str(s) => {
                self.next();
                Ok(Attr::String(s))
            }
            Tok::Ident(k) if k == "graph" => Ok(Attr::Graph(Box::new(self.graph()?))),
            Tok::Ident(k) if matches!(k.as_str(), "ints" | "floats" | "strings") => {
                self.next();
                self.punct('[')?;
                self.punct(']')?;
                Ok(match k.as_str() {
                    "ints" => Attr::Ints(vec![]),
                    "floats" => Attr::Floats(vec![]),
                    _ => Attr::Strings(vec![]),
                })
            }
            Tok::Ident(_) => Ok(Attr::Tensor(self.tensor()?)),
            Tok::Punct('[') => {
                self.next();
                let mut items = Vec::new();
                loop {
                    items.push(self.next());
                    if self.eat_punct(']') {
                        break;
                    }
                    self.punct(',')?;
                }
                if items.iter().all(|t| matches!(t, Tok::Str(_))) {
                    return Ok(Attr::Strings(
                        items.into_iter().map(|t| if let Tok::Str(s) = t { s } else { unreachable!() }).collect(),
                    ));
                }
                let nums: Vec<String> = items
                    .into_iter()
                    .map(|t| match t {
                        Tok::Num(n) | Tok::Ident(n) => Ok(n),
                        t => Err(self.err(format!("bad list item {t:?}"))),
                    })
                    .collect::<Result<_, _>>()?;
                if nums.iter().any(|n| n.contains(['.', 'e', 'E', 'i', 'N'])) {
                    let v: Option<Vec<f32>> = nums.iter().map(|n| parse_float(n).map(|x| x as f32)).collect();
                    Ok(Attr::Floats(v.ok_or_else(|| self.err("bad float in list"))?))
                } else {
                    let v: Result<Vec<i64>, _> = nums.iter().map(|n| n.parse()).collect();
                    Ok(Attr::Ints(v.map_err(|_| self.err("bad integer in list"))?))
                }
            }
            t => Err(self.err(format!("expected an attribute value, found {t:?}"))),
        }
    }

    fn value_type(&mut self) -> Result<ValueType, ParseError> {
        let dtype = if self.eat_punct('?') {
            None
        } else {
            let d = self.ident()?;
            Some(DType::from_name(&d).ok_or_else(|| self.err(format!("unknown dtype {d}")))?)
        };
        self.punct('[')?;
        if self.eat_punct('*') {
            self.punct(']')?;
            return Ok(ValueType { dtype, shape: None });
        }
        let mut dims = Vec::new();
        if !self.eat_punct(']') {
            loop {
                let d = match self.next() {
                    Tok::Num(n) => Dim::Known(n.parse().map_err(|_| self.err(format!("bad dimension {n}")))?),
                    Tok::Ident(s) => Dim::Sym(s),
                    Tok::Punct('?') => Dim::Unknown,
                    t => return Err(self.err(format!("bad dimension {t:?}"))),
                };
                dims.push(d);
                if self.eat_punct(']') {
                    break;
                }
                self.punct(',')?;
            }
        }
        Ok(ValueType { dtype, shape: Some(dims) })
    }

    fn tensor(&mut self) -> Result<Tensor, ParseError> {
        let ty = self.value_type()?;
        let (Some(dtype), Some(shape)) = (ty.dtype, ty.concrete_shape()) else {
            return Err(self.err("a tensor literal needs a dtype and a known shape"));
        };
        if self.eat_punct('<') {
            return Err(
                self.err("tensor data was elided when this text was printed; print with full detail to parse it back")
            );
        }
        if self.eat_punct('@') {
            let k = match self.next() {
                Tok::Num(n) => n.parse::<usize>().map_err(|_| self.err(format!("bad tensor reference @{n}")))?,
                t => return Err(self.err(format!("expected a tensor index after @, found {t:?}"))),
            };
            let Some(resolve) = self.data else {
                return Err(self.err(format!("tensor @{k} refers to a data table, and this text has none")));
            };
            return resolve(k, dtype, &shape).map_err(|e| self.err(format!("tensor @{k}: {e}")));
        }
        self.punct('[')?;
        let mut items = Vec::new();
        if !self.eat_punct(']') {
            loop {
                match self.next() {
                    Tok::Num(n) | Tok::Ident(n) => items.push(n),
                    t => return Err(self.err(format!("bad tensor element {t:?}"))),
                }
                if self.eat_punct(']') {
                    break;
                }
                self.punct(',')?;
            }
        }
        let n: usize = shape.iter().product();
        if items.len() != n {
            return Err(self.err(format!("tensor {ty} needs {n} values, found {}", items.len())));
        }
        let bad = |p: &Parser| p.err("bad tensor element");
        Ok(match dtype {
            DType::Bool => {
                let v: Option<Vec<bool>> = items
                    .iter()
                    .map(|s| match s.as_str() {
                        "true" => Some(true),
                        "false" => Some(false),
                        _ => None,
                    })
                    .collect();
                Tensor::from_bools(&shape, &v.ok_or_else(|| bad(self))?)
            }
            DType::U64 => {
                let v: Result<Vec<u64>, _> = items.iter().map(|s| s.parse()).collect();
                Tensor::from_vec(&shape, v.map_err(|_| bad(self))?)
            }
            DType::I64 => {
                let v: Result<Vec<i64>, _> = items.iter().map(|s| s.parse()).collect();
                Tensor::from_vec(&shape, v.map_err(|_| bad(self))?)
            }
            d if d.is_float() => {
                let v: Option<Vec<f64>> = items.iter().map(|s| parse_float(s)).collect();
                Tensor::from_f64(d, &shape, &v.ok_or_else(|| bad(self))?)
            }
            d => {
                let v: Result<Vec<i64>, _> = items.iter().map(|s| s.parse::<i64>()).collect();
                let v: Vec<f64> = v.map_err(|_| bad(self))?.into_iter().map(|x| x as f64).collect();
                Tensor::from_f64(d, &shape, &v)
            }
        })
    }
}

fn parse_float(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        _ => s.parse().ok(),
    }
}

/// Parses a model printed by [`super::print_model`] with full tensor detail.
pub fn parse_model(text: &str) -> Result<Model, ParseError> {
    Parser::new(text)?.model()
}

/// Parses a model printed by [`super::print_model_with_data`]: each `@k` tensor is what
/// `data` gives for `k` (with the dtype and shape the text declares).
pub fn parse_model_with_data(text: &str, data: DataResolver<'_>) -> Result<Model, ParseError> {
    let mut p = Parser::new(text)?;
    p.data = Some(data);
    p.model()
}

/// Parses a graph printed by [`super::print_graph`] with full tensor detail.
pub fn parse_graph(text: &str) -> Result<Graph, ParseError> {
    let mut p = Parser::new(text)?;
    p.skip_newlines();
    let g = p.graph()?;
    p.skip_newlines();
    if *p.peek() != Tok::Eof {
        return Err(p.err("text after the end of the graph"));
    }
    Ok(g)
}
