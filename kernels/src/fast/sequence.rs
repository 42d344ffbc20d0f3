//! What the recurrent fast kernels (LSTM, GRU, RNN) share: reading a node's operands into
//! one description of the sequence — steps, batch, sizes, directions, layout — with the
//! checks that send other configurations to the reference kernel, and where each step's
//! state goes in the outputs.

use aim_ir::{DType, Node, Tensor};

/// A recurrent node's operands and sizes.
pub(super) struct Seq<'a> {
    pub x: &'a Tensor,
    pub w: &'a Tensor,
    pub r: &'a Tensor,
    /// `[dirs, 2·gates·hidden]`, if given.
    pub bias: Option<&'a Tensor>,
    pub t_len: usize,
    pub batch: usize,
    pub input: usize,
    pub dirs: usize,
    pub hidden: usize,
    /// `layout = 1`: X and Y batch-major.
    pub batch_first: bool,
    direction: String,
}

impl<'a> Seq<'a> {
    /// X, W `[dirs, gates·h, input]`, R `[dirs, gates·h, h]` and B `[dirs, 2·gates·h]` of
    /// f32 (W and R of 8 bits with `dynamic_quantize`), sequence lengths (if given) all the whole sequence; None otherwise.
    pub fn parse(n: &Node, ins: &'a [Option<Tensor>], gates: usize) -> Option<Seq<'a>> {
        let f32_at = |i: usize| ins.get(i).and_then(|t| t.as_ref()).filter(|t| t.dtype() == DType::F32);
        // An LSTM of DynamicQuantizeLSTM's holds its weights in 8 bits (see `qrecurrent`).
        let weight_at = |i: usize| {
            if crate::qrecurrent::dynamic_quantize(n) {
                ins.get(i).and_then(|t| t.as_ref()).filter(|t| matches!(t.dtype(), DType::I8 | DType::U8))
            } else {
                f32_at(i)
            }
        };
        let (x, w, r) = (f32_at(0)?, weight_at(1)?, weight_at(2)?);
        if x.rank() != 3 || w.rank() != 3 || r.rank() != 3 {
            return None;
        }
        let batch_first = n.int("layout", 0) != 0;
        let (t_len, batch, input) = if batch_first {
            (x.shape()[1], x.shape()[0], x.shape()[2])
        } else {
            (x.shape()[0], x.shape()[1], x.shape()[2])
        };
        let (dirs, hidden) = (w.shape()[0], r.shape()[2]);
        let direction = n.string("direction", "forward").to_string();
        let fits = (direction == "bidirectional") == (dirs == 2)
            && w.shape()[1..] == [gates * hidden, input]
            && r.shape() == [dirs, gates * hidden, hidden]
            && n.opt_int("hidden_size").is_none_or(|h| h as usize == hidden);
        if !fits {
            return None;
        }
        if let Some(lens) = ins.get(4).and_then(|t| t.as_ref()) {
            if lens.len() != batch || lens.to_i64_vec().iter().any(|&l| l != t_len as i64) {
                return None;
            }
        }
        let bias = f32_at(3).filter(|b| b.shape() == [dirs, 2 * gates * hidden]);
        if ins.get(3).is_some_and(|b| b.is_some()) && bias.is_none() {
            return None;
        }
        Some(Seq { x, w, r, bias, t_len, batch, input, dirs, hidden, batch_first, direction })
    }

    /// Initial state input `i`: absent, or f32 `[dirs, batch, hidden]`; None for another
    /// shape (the reference kernel takes those).
    pub fn state<'b>(&self, ins: &'b [Option<Tensor>], i: usize) -> Option<Option<&'b Tensor>> {
        match ins.get(i).and_then(|t| t.as_ref()) {
            None => Some(None),
            Some(t) => {
                (t.dtype() == DType::F32 && t.shape() == [self.dirs, self.batch, self.hidden]).then_some(Some(t))
            }
        }
    }

    /// Direction `d`'s initial state (zeros if none was given).
    pub fn initial(&self, t: Option<&Tensor>, d: usize) -> Vec<f32> {
        let n = self.batch * self.hidden;
        t.map_or(vec![0.0; n], |t| t.data::<f32>()[d * n..(d + 1) * n].to_vec())
    }

    /// Whether direction `d` runs from the last step to the first.
    pub fn reverse(&self, d: usize) -> bool {
        self.direction == "reverse" || d == 1
    }

    /// The shape of Y.
    pub fn y_shape(&self) -> Vec<usize> {
        let (t, b, d, h) = (self.t_len, self.batch, self.dirs, self.hidden);
        if self.batch_first {
            vec![b, t, d, h]
        } else {
            vec![t, d, b, h]
        }
    }

    /// The shape of the final states.
    pub fn state_shape(&self) -> Vec<usize> {
        if self.batch_first {
            vec![self.batch, self.dirs, self.hidden]
        } else {
            vec![self.dirs, self.batch, self.hidden]
        }
    }

    /// The row of X (and of the input projection) of step `t`, sequence `bi`.
    pub fn x_row(&self, t: usize, bi: usize) -> usize {
        if self.batch_first {
            bi * self.t_len + t
        } else {
            t * self.batch + bi
        }
    }

    /// Where step `t`'s state of sequence `bi`, direction `d`, starts in Y.
    pub fn y_at(&self, t: usize, bi: usize, d: usize) -> usize {
        let h = self.hidden;
        if self.batch_first {
            ((bi * self.t_len + t) * self.dirs + d) * h
        } else {
            ((t * self.dirs + d) * self.batch + bi) * h
        }
    }

    /// Where the final state of sequence `bi`, direction `d`, starts in a state output.
    pub fn state_at(&self, bi: usize, d: usize) -> usize {
        if self.batch_first {
            (bi * self.dirs + d) * self.hidden
        } else {
            (d * self.batch + bi) * self.hidden
        }
    }
}

/// The multiply-adds of a product (a step's, or a short sequence's input projection)
/// below which it runs on the calling thread: waking the other threads costs more than it
/// saves (a 2-thread speech VAD step measured 0.029 ms against 0.021 ms on one).
pub(super) const STEP_PARALLEL_MACS: usize = 1 << 20;

/// `par` for a product of `macs` multiply-adds, or the calling thread alone below
/// [`STEP_PARALLEL_MACS`].
pub(super) fn parallel_for(macs: usize, par: &dyn crate::gemm::Parallel) -> &dyn crate::gemm::Parallel {
    if macs < STEP_PARALLEL_MACS {
        &crate::gemm::Sequential
    } else {
        par
    }
}

/// Runs `f(d, step_par)` for each of `dirs` directions and returns the results in order.
/// When a step (`step_macs` multiply-adds) is too small to share between threads (see
/// [`parallel_for`]) and there are two directions and two threads, the directions run side
/// by side, each on one thread with its steps sequential; otherwise one after the other,
/// with `step_par` from [`parallel_for`].
pub(super) fn by_direction<T: Send>(
    dirs: usize,
    step_macs: usize,
    par: &dyn crate::gemm::Parallel,
    f: &(dyn Fn(usize, &dyn crate::gemm::Parallel) -> T + Sync),
) -> Vec<T> {
    if dirs == 2 && par.threads() >= 2 && step_macs < STEP_PARALLEL_MACS {
        let slots: [std::sync::Mutex<Option<T>>; 2] = Default::default();
        par.for_each(2, &|d| {
            let r = f(d, &crate::gemm::Sequential);
            *slots[d].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        });
        slots.into_iter().filter_map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner())).collect()
    } else {
        let step_par = parallel_for(step_macs, par);
        (0..dirs).map(|d| f(d, step_par)).collect()
    }
}

/// Y's values, which the directions' recurrences write at disjoint places (each its own
/// direction's states), perhaps from two threads at once.
#[derive(Clone, Copy)]
pub(super) struct SharedY(*mut f32, usize);
// SAFETY: writers keep to disjoint places (see `write`).
unsafe impl Send for SharedY {}
unsafe impl Sync for SharedY {}

impl SharedY {
    /// Y's values.
    pub fn new(y: &mut [f32]) -> SharedY {
        SharedY(y.as_mut_ptr(), y.len())
    }

    /// Copies `src` to Y from `at` on. Panics outside Y.
    ///
    /// # Safety
    /// No other thread reads or writes `at..at + src.len()` meanwhile, and Y outlives the
    /// call.
    pub unsafe fn write(&self, at: usize, src: &[f32]) {
        assert!(at + src.len() <= self.1, "Y holds every step's state");
        std::slice::from_raw_parts_mut(self.0.add(at), src.len()).copy_from_slice(src);
    }
}
