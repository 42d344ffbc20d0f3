//! A JSON tensor's `data` decoded as it is read: the leaves of the (possibly nested) array
//! go straight into one compact vector, 16 bytes a number, without the tree of
//! `serde_json::Value`s (about 80 bytes a number with the flattening pass, and most of the
//! server's memory for a large JSON request). NaN and the infinities, which JSON has no
//! numbers for, come as the strings `"NaN"`, `"Infinity"` and `"-Infinity"`.

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// One leaf of a `data` array, as JSON wrote it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Leaf {
    /// A number with a fraction or exponent.
    F(f64),
    /// A negative integer.
    I(i64),
    /// A non-negative integer.
    U(u64),
    /// `true` or `false`.
    B(bool),
}

impl Leaf {
    /// The number as f64 (integers converted), None for a boolean.
    pub fn as_f64(self) -> Option<f64> {
        match self {
            Leaf::F(x) => Some(x),
            Leaf::I(x) => Some(x as f64),
            Leaf::U(x) => Some(x as f64),
            Leaf::B(_) => None,
        }
    }

    /// An integer leaf's value; None for a fraction or a boolean.
    pub fn as_int(self) -> Option<i128> {
        match self {
            Leaf::I(x) => Some(x as i128),
            Leaf::U(x) => Some(x as i128),
            _ => None,
        }
    }
}

impl fmt::Display for Leaf {
    /// As JSON writes it (a float through serde_json's shortest form).
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Leaf::F(x) => match serde_json::Number::from_f64(*x) {
                Some(n) => write!(f, "{n}"),
                None => write!(f, "{x}"),
            },
            Leaf::I(x) => write!(f, "{x}"),
            Leaf::U(x) => write!(f, "{x}"),
            Leaf::B(b) => write!(f, "{b}"),
        }
    }
}

/// The leaves of a `data` array in row-major order, and the first leaf that is neither a
/// number nor a boolean (its index and JSON), which makes the tensor invalid.
#[derive(Debug, Default)]
pub struct Leaves {
    /// The numbers and booleans.
    pub values: Vec<Leaf>,
    /// The first other leaf (a string, null or object): where it is and what it was.
    pub invalid: Option<(usize, String)>,
}

/// Decodes `raw` (the JSON of a `data` field) into its leaves.
pub fn decode(raw: &serde_json::value::RawValue) -> Result<Leaves, String> {
    let mut leaves = Leaves::default();
    let mut de = serde_json::Deserializer::from_str(raw.get());
    Seed(&mut leaves).deserialize(&mut de).map_err(|e| format!("'data' is not valid: {e}"))?;
    Ok(leaves)
}

/// Pushes the leaves of one JSON value (recursing into arrays) onto the vector.
struct Seed<'a>(&'a mut Leaves);

impl<'de> DeserializeSeed<'de> for Seed<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl Seed<'_> {
    fn push(self, l: Leaf) {
        self.0.values.push(l);
    }
    fn other(self, json: String) {
        if self.0.invalid.is_none() {
            self.0.invalid = Some((self.0.values.len(), json));
        }
        // Counted as a leaf, so that the element count (and later indices) stay right.
        self.0.values.push(Leaf::B(false));
    }
}

impl<'de> Visitor<'de> for Seed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("numbers, booleans or arrays of them")
    }
    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.push(Leaf::B(v));
        Ok(())
    }
    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        self.push(if v < 0 { Leaf::I(v) } else { Leaf::U(v as u64) });
        Ok(())
    }
    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        self.push(Leaf::U(v));
        Ok(())
    }
    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        self.push(Leaf::F(v));
        Ok(())
    }
    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        // JSON has no numbers for these; the server writes them as strings, and reads them.
        match v {
            "NaN" => self.push(Leaf::F(f64::NAN)),
            "Infinity" => self.push(Leaf::F(f64::INFINITY)),
            "-Infinity" => self.push(Leaf::F(f64::NEG_INFINITY)),
            _ => self.other(serde_json::Value::from(v).to_string()),
        }
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        self.other("null".into());
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        self.other("an object".into());
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Seed(&mut *self.0))?.is_some() {}
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaves(json: &str) -> Leaves {
        decode(&serde_json::from_str::<Box<serde_json::value::RawValue>>(json).unwrap()).unwrap()
    }

    /// Nested arrays flatten in row-major order; each kind of number keeps its kind.
    #[test]
    fn nested_arrays_flatten() {
        let l = leaves("[[1, -2], [3.5, true], [18446744073709551615]]");
        assert_eq!(l.values, [Leaf::U(1), Leaf::I(-2), Leaf::F(3.5), Leaf::B(true), Leaf::U(u64::MAX)]);
        assert!(l.invalid.is_none());
        assert_eq!(leaves("7").values, [Leaf::U(7)]);
    }

    /// The first leaf that is not a number or boolean is named with its index.
    #[test]
    fn other_leaves_are_named() {
        let l = leaves(r#"[1, [null, "x"], {"a": 1}]"#);
        assert_eq!(l.values.len(), 4);
        assert_eq!(l.invalid, Some((1, "null".to_string())));
        assert_eq!(leaves(r#"["x"]"#).invalid, Some((0, "\"x\"".to_string())));
        let l = leaves(r#"["Infinity", "-Infinity"]"#);
        assert_eq!((l.values, l.invalid), (vec![Leaf::F(f64::INFINITY), Leaf::F(f64::NEG_INFINITY)], None));
        assert!(matches!(leaves(r#"["NaN"]"#).values[..], [Leaf::F(x)] if x.is_nan()));
        assert_eq!(Leaf::F(3.5e38).to_string(), "3.5e+38");
    }
}
