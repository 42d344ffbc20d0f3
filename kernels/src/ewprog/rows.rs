//! Inputs of a fused elementwise loop that broadcast: how each maps onto rows of the output
//! ([`Rows`]). The fusion pass asks whether the rows are long enough to be worth a loop;
//! the runtime runs the loop row by row.

/// How the inputs of a loop map onto its output when some of them broadcast (the fusion
/// pass lets `Add(x[1,64,1,512], y[1,1,64,512])` and what follows it into one loop): the
/// output is cut into rows of its trailing dims, which every input holds either whole
/// (contiguous, as the output) or as one value (a per-channel scale over a feature map);
/// each row runs the loop with every input's pointer at that row's place.
#[derive(Debug, Clone, PartialEq)]
pub struct Rows {
    /// Output elements per row.
    len: usize,
    /// The output's leading dims, over which the rows run.
    outer: Vec<usize>,
    /// Per input: its element stride along each leading dim (0 where it broadcasts), and
    /// whether it holds one value per row (else a whole row).
    inputs: Vec<(Vec<usize>, bool)>,
}

impl Rows {
    /// The rows of `out` for inputs of shapes `ins`, or why they do not broadcast to it.
    pub fn new(ins: &[&[usize]], out: &[usize]) -> Result<Rows, String> {
        let rank = out.len();
        let mut dims = Vec::with_capacity(ins.len());
        for s in ins {
            if s.len() > rank {
                return Err(format!("input of shape {s:?} has more dims than the output {out:?}"));
            }
            let d: Vec<usize> = std::iter::repeat_n(1, rank - s.len()).chain(s.iter().copied()).collect();
            if d.iter().zip(out).any(|(&a, &b)| a != b && a != 1) {
                return Err(format!("input of shape {s:?} does not broadcast to the output {out:?}"));
            }
            dims.push(d);
        }
        // The longest run of trailing dims that each input holds whole or not at all.
        let (mut whole, mut ones) = (vec![true; ins.len()], vec![true; ins.len()]);
        let mut a = rank;
        while a > 0 {
            let i = a - 1;
            let w: Vec<bool> = dims.iter().zip(&whole).map(|(d, &w)| w && d[i] == out[i]).collect();
            let o: Vec<bool> = dims.iter().zip(&ones).map(|(d, &o)| o && d[i] == 1).collect();
            if w.iter().zip(&o).any(|(&w, &o)| !w && !o) {
                break;
            }
            (whole, ones) = (w, o);
            a = i;
        }
        let inputs = dims
            .iter()
            .zip(&whole)
            .map(|(d, &w)| {
                let strides = (0..a).map(|i| if d[i] == 1 { 0 } else { d[i + 1..].iter().product() }).collect();
                (strides, !w)
            })
            .collect();
        Ok(Rows { len: out[a..].iter().product(), outer: out[..a].to_vec(), inputs })
    }

    /// Whether every input has the output's shape: one flat loop does it all.
    pub fn flat(&self) -> bool {
        self.outer.iter().all(|&d| d == 1) && self.inputs.iter().all(|(_, splat)| !splat)
    }

    /// Output elements per row.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether a row is empty (the output has no elements).
    pub fn is_empty(&self) -> bool {
        self.len == 0 || self.count() == 0
    }

    /// Rows.
    pub fn count(&self) -> usize {
        self.outer.iter().product()
    }

    /// The output's leading dims, over which the rows run.
    pub fn outer(&self) -> &[usize] {
        &self.outer
    }

    /// Input `k`'s element stride along each leading dim (0 where it broadcasts), and
    /// whether it holds one value per row.
    pub fn input(&self, k: usize) -> (&[usize], bool) {
        (&self.inputs[k].0, self.inputs[k].1)
    }

    /// Inputs that hold one value per row.
    pub fn splats(&self) -> usize {
        self.inputs.iter().filter(|(_, s)| *s).count()
    }

    /// The rows and their length, for the schedule's text.
    pub fn describe(&self) -> String {
        let splats = self.inputs.iter().filter(|(_, s)| *s).count();
        let mut text = format!("{} rows of {}", self.outer.iter().product::<usize>(), self.len);
        if splats > 0 {
            text += &format!(", {splats} input(s) one value per row");
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::Rows;

    /// Rows run over the trailing dims every input holds whole or as one value; the other
    /// dims give each input's strides (0 where it broadcasts).
    #[test]
    fn rows_of_broadcast_inputs() {
        let r = Rows::new(&[&[1, 4, 1, 64], &[1, 1, 4, 64]], &[1, 4, 4, 64]).unwrap();
        assert_eq!((r.len(), r.count(), r.outer()), (64, 16, &[1, 4, 4][..]));
        assert_eq!(r.input(0), (&[0, 64, 0][..], false));
        assert_eq!(r.input(1), (&[0, 0, 64][..], false));
        let r = Rows::new(&[&[2, 3, 5, 7], &[3, 1, 1]], &[2, 3, 5, 7]).unwrap();
        assert_eq!((r.len(), r.splats()), (35, 1));
        assert_eq!(r.input(1), (&[0, 1][..], true));
        assert!(Rows::new(&[&[2, 3], &[2, 3]], &[2, 3]).unwrap().flat());
        assert!(!r.flat());
        assert!(Rows::new(&[&[2, 4]], &[2, 3]).is_err());
        assert!(Rows::new(&[&[1, 2, 3]], &[2, 3]).is_err());
    }
}
