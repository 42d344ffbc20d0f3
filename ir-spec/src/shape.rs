//! Shapes whose dimensions may be symbolic, as graph inputs often are (`batch`, `seq`).

use std::fmt;

/// One dimension of a value's static type: a known size, a named symbol (the same name
/// means the same size everywhere in the graph), or unknown.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dim {
    /// A size known at compile time.
    Known(usize),
    /// A size bound at run time; equal names are equal sizes.
    Sym(String),
    /// A size nothing is known about.
    Unknown,
}

impl Dim {
    /// The size, if known.
    pub fn known(&self) -> Option<usize> {
        match self {
            Dim::Known(n) => Some(*n),
            _ => None,
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Known(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
            Dim::Unknown => f.write_str("?"),
        }
    }
}

/// The static type of a value: its dtype and, when known, its rank and dimensions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ValueType {
    /// Element type; `None` when inference could not tell.
    pub dtype: Option<crate::DType>,
    /// Dimensions; `None` when even the rank is unknown.
    pub shape: Option<Vec<Dim>>,
}

impl ValueType {
    /// A fully known type.
    pub fn known(dtype: crate::DType, dims: &[usize]) -> ValueType {
        ValueType { dtype: Some(dtype), shape: Some(dims.iter().map(|&d| Dim::Known(d)).collect()) }
    }

    /// A type nothing is known about.
    pub fn unknown() -> ValueType {
        ValueType { dtype: None, shape: None }
    }

    /// The dims as plain sizes when every one is known.
    pub fn concrete_shape(&self) -> Option<Vec<usize>> {
        self.shape.as_ref()?.iter().map(|d| d.known()).collect()
    }

    /// Whether `t` is fully static and one of the types `self` allows (its dtype where given,
    /// its rank and known dims where given): a declared symbolic type that inference,
    /// from static inputs, has made exact.
    pub fn is_made_static_by(&self, t: &ValueType) -> bool {
        t.concrete_shape().is_some()
            && self.dtype.is_none_or(|d| t.dtype == Some(d))
            && t.dtype.is_some()
            && match (&t.shape, &self.shape) {
                (_, None) => true,
                (Some(s), Some(d)) => {
                    s.len() == d.len() && s.iter().zip(d).all(|(a, b)| !matches!(b, Dim::Known(_)) || a == b)
                }
                (None, Some(_)) => false,
            }
    }

    /// The names of the symbolic dims, in order of appearance.
    pub fn symbols(&self) -> Vec<String> {
        let mut out = Vec::new();
        for d in self.shape.iter().flatten() {
            if let Dim::Sym(s) = d {
                if !out.contains(s) {
                    out.push(s.clone());
                }
            }
        }
        out
    }
}

impl fmt::Display for ValueType {
    /// `f32[1,3,224,224]`, `f32[batch,?]`, `f32[*]` (unknown rank) or `?[*]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.dtype {
            Some(d) => write!(f, "{d}")?,
            None => f.write_str("?")?,
        }
        match &self.shape {
            None => f.write_str("[*]"),
            Some(dims) => {
                f.write_str("[")?;
                for (i, d) in dims.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{d}")?;
                }
                f.write_str("]")
            }
        }
    }
}
