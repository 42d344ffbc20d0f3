//! Layout assignment: chains of 2-D convolutions move to the blocked channel layout NCHWc
//! (`[n][ceil(c/L)][h][w][L]`, `L` = the target's vector width in floats), where a vector
//! holds one pixel of `L` channels: depthwise convolutions and convolutions over small
//! images become dense vector work (see `aim_kernels::nchwc`).
//!
//! Every `aim:Conv` with a 2-D kernel that is a plain (group 1) or a depthwise convolution
//! gets `layout = "NCHWc"` and `block = L`; its output value is renamed `<name>.nchwc` and
//! carries the blocked shape. Its input is read blocked when another blocked convolution
//! made it, read as NCHW directly when it has fewer channels than a block (a network's
//! first layer: `in_layout = "NCHW"`), and otherwise goes through an `aim:ToBlocked` node;
//! a residual input is always blocked. MaxPool and AveragePool of a blocked value stay
//! blocked (`aim:MaxPool` / `aim:AveragePool` with `layout`), and GlobalAveragePool of one
//! reads it blocked and writes NCHW (`aim:GlobalAveragePool`, `channels`). Readers that are not blocked convolutions (and graph
//! outputs) get the NCHW value back from an `aim:FromBlocked` node placed right after the
//! producer, under the original name.
//!
//! Measured on this project's benchmark models (`aim bench`, one thread, AVX-512):
//! MobileNetV2 6.3 → 4.2 ms and ResNet-50 52.5 → 41.5 ms against the GEMM convolutions over
//! NCHW, which remain for the convolutions this pass does not take (grouped, 1-D, 3-D).

use super::fuse::{sources_of, SOURCES};
use super::uses::readers;
use super::PassError;
use aim_ir::{Attr, DType, Dim, Graph, Node, ValueType};
use std::collections::{HashMap, HashSet};

/// Attribute of a blocked `aim:Conv`: `"NCHWc"`.
pub const LAYOUT: &str = "layout";
/// Attribute: the channel block `L`, on blocked convolutions and reorders.
pub const BLOCK: &str = "block";
/// Attribute of a blocked `aim:Conv`: how its input is laid out, `"NCHW"` or `"NCHWc"`.
pub const IN_LAYOUT: &str = "in_layout";
/// Attribute of `aim:FromBlocked`: the true channel count.
pub const CHANNELS: &str = "channels";

/// What kind of convolution a node is, if the blocked kernels take it.
fn blockable(g: &Graph, n: &Node) -> Option<Kind> {
    if n.domain != "aim" || n.op != "Conv" {
        return None;
    }
    let w = g.initializers.get(n.input(1)?)?;
    if w.dtype() != DType::F32 || w.rank() != 4 {
        return None;
    }
    let (cout, cg) = (w.shape()[0], w.shape()[1]);
    let group = n.int("group", 1).max(1) as usize;
    if cout == 0 || cg == 0 {
        return None; // no channels to block (the output, or every sum, is empty)
    }
    if group == 1 {
        Some(Kind::Dense { cin: cg })
    } else if group == cout && cg == 1 {
        Some(Kind::Depthwise)
    } else {
        None
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Dense { cin: usize },
    Depthwise,
}

/// Whether a pooling node has a form the blocked kernel takes: MaxPool or AveragePool, 2-D,
/// no dilation, no ceil mode, explicit (or no) padding, one output.
pub(super) fn poolable(n: &Node) -> bool {
    n.domain.is_empty()
        && matches!(n.op.as_str(), "MaxPool" | "AveragePool")
        && n.ints("kernel_shape").is_some_and(|k| k.len() == 2 && k.iter().all(|&v| v >= 1))
        && n.ints("strides").is_none_or(|s| s.len() == 2 && s.iter().all(|&v| v >= 1))
        && n.ints("pads").is_none_or(|p| p.len() == 4 && p.iter().all(|&v| v >= 0))
        && n.ints("dilations").is_none_or(|d| d.iter().all(|&v| v == 1))
        && n.int("ceil_mode", 0) == 0
        && matches!(n.string("auto_pad", "NOTSET"), "NOTSET" | "VALID")
        && n.outputs.iter().skip(1).all(|o| o.is_empty())
}

/// The blocked type of an NCHW value's type.
fn blocked_type(t: Option<&ValueType>, lanes: usize) -> Option<ValueType> {
    let t = t?;
    let s = t.shape.as_ref()?;
    if s.len() != 4 {
        return None;
    }
    let Dim::Known(c) = s[1] else { return None };
    Some(ValueType {
        dtype: t.dtype,
        shape: Some(vec![s[0].clone(), Dim::Known(c.div_ceil(lanes)), s[2].clone(), s[3].clone(), Dim::Known(lanes)]),
    })
}

/// The pass's bookkeeping.
pub(super) struct State {
    /// Every value name in use.
    taken: HashSet<String>,
    /// NCHW name -> blocked name, for the outputs of blocked nodes.
    pub(super) blocked: HashMap<String, String>,
    /// NCHW value -> its `aim:ToBlocked` copy.
    reordered: HashMap<String, String>,
    /// Blocked value -> its true channel count.
    pub(super) channels: HashMap<String, usize>,
    pub(super) lanes: usize,
}

impl State {
    /// A fresh value name derived from `base`, now taken.
    pub(super) fn fresh(&mut self, g: &Graph, base: &str) -> String {
        let mut name = base.to_string();
        let mut i = 1;
        while self.taken.contains(&name) || g.value_types.contains_key(&name) || g.initializers.contains_key(&name) {
            name = format!("{base}.{i}");
            i += 1;
        }
        self.taken.insert(name.clone());
        name
    }

    /// `name` in the blocked layout for `reader`: a blocked convolution's output, or a copy
    /// made by an `aim:ToBlocked` node (one per value) appended to `out`.
    pub(super) fn blocked_name(&mut self, g: &mut Graph, reader: &Node, name: &str, out: &mut Vec<Node>) -> String {
        if let Some(b) = self.blocked.get(name).or_else(|| self.reordered.get(name)) {
            return b.clone();
        }
        let b = self.fresh(g, &format!("{name}.nchwc"));
        // `value_type`, not `value_types`: a graph input's type is on the input.
        if let Some(t) = blocked_type(g.value_type(name).as_ref(), self.lanes) {
            g.value_types.insert(b.clone(), t);
        }
        let mut attrs = std::collections::BTreeMap::new();
        attrs.insert(BLOCK.to_string(), Attr::Int(self.lanes as i64));
        attrs.insert(SOURCES.to_string(), Attr::Strings(sources_of(reader)));
        out.push(Node {
            name: format!("{}/to_nchwc", reader.name),
            op: "ToBlocked".into(),
            domain: "aim".into(),
            inputs: vec![name.to_string()],
            outputs: vec![b.clone()],
            attrs,
        });
        self.reordered.insert(name.to_string(), b.clone());
        b
    }

    /// Renames `n`'s output `k` to a blocked value of `channels` channels, typed from the
    /// NCHW one, and records it.
    pub(super) fn block_output(&mut self, g: &mut Graph, n: &mut Node, k: usize, channels: usize) {
        let y = n.outputs[k].clone();
        let yb = self.fresh(g, &format!("{y}.nchwc"));
        if let Some(t) = blocked_type(g.value_types.get(&y), self.lanes) {
            g.value_types.insert(yb.clone(), t);
        }
        n.outputs[k] = yb.clone();
        n.attrs.insert(LAYOUT.into(), Attr::String("NCHWc".into()));
        n.attrs.insert(BLOCK.into(), Attr::Int(self.lanes as i64));
        self.channels.insert(yb.clone(), channels);
        self.blocked.insert(y, yb);
    }
}

/// The channel blocks a target's kernels offer, and what the wider one is worth.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Blocks {
    /// The target's vector of floats (16 on AVX-512, 8 on AVX2 and NEON).
    pub wide: usize,
    /// A narrower block whose kernels the target also runs (AVX2's 8 on AVX-512), if any.
    pub narrow: Option<usize>,
    /// How many times the multiply-adds per second the wide block's kernels do over the
    /// narrow one's: 2 where 512-bit FMAs run at full width; 1.12 where they run as two
    /// 256-bit halves (AMD Zen 4: the same arithmetic per cycle, AVX-512's 32 registers and
    /// larger tiles ahead by 6–7% on layers that fill both blocks — text_orientation and
    /// MobileNetV3 measured with each block, the latter padded 1.10× more by 16 — and
    /// behind on models padded 1.14× (ppocr_mobile_cls, 6%) and 1.24× (oww_embedding, 7%)).
    pub wide_speedup: f64,
}

impl Blocks {
    /// One block width and no choice.
    pub fn only(lanes: usize) -> Blocks {
        Blocks { wide: lanes, narrow: None, wide_speedup: 1.0 }
    }

    /// The block for `g`: the one whose convolutions cost least, counting the
    /// multiply-adds each does with its channels rounded up to the block (a 24-channel layer
    /// does 1.78× its arithmetic in blocks of 16, none more in blocks of 8) divided by the
    /// block's speed. `AIM_CHANNEL_BLOCK` (a width the target offers) overrides it, for
    /// comparisons.
    pub fn choose(&self, g: &Graph) -> usize {
        let Some(narrow) = self.narrow else { return self.wide };
        if let Some(forced) = std::env::var("AIM_CHANNEL_BLOCK").ok().and_then(|v| v.parse().ok()) {
            if forced == self.wide || forced == narrow {
                return forced;
            }
        }
        let wide_cost = padded_macs(g, self.wide) / self.wide_speedup;
        if padded_macs(g, narrow) < wide_cost {
            narrow
        } else {
            self.wide
        }
    }
}

/// Multiply-adds per image of `g`'s blocked convolutions with their channels rounded up to
/// blocks of `lanes` (an output of unknown size counts as one pixel).
fn padded_macs(g: &Graph, lanes: usize) -> f64 {
    let pad = |c: usize| c.div_ceil(lanes) * lanes;
    let mut total = 0.0;
    for n in &g.nodes {
        let Some(kind) = blockable(g, n) else { continue };
        let Some(w) = n.input(1).and_then(|w| g.initializers.get(w)) else { continue };
        let (cout, window) = (w.shape()[0], w.shape()[2] * w.shape()[3]);
        let pixels: usize = match g.value_types.get(&n.outputs[0]).and_then(|t| t.shape.clone()) {
            Some(s) => s.iter().skip(2).map(|d| if let Dim::Known(v) = d { *v } else { 1 }).product(),
            None => 1,
        };
        let per_pixel = match kind {
            // A first layer with fewer channels than a block reads them as NCHW, unpadded.
            Kind::Dense { cin } if cin < lanes => cin * pad(cout),
            Kind::Dense { cin } => pad(cin) * pad(cout),
            Kind::Depthwise => pad(cout),
        };
        total += (pixels * window * per_pixel) as f64;
    }
    total
}

/// Runs the pass with the block [`Blocks::choose`] picks for `g`.
pub fn run(g: &mut Graph, blocks: Blocks) -> Result<(), PassError> {
    let kinds: Vec<Option<Kind>> = g.nodes.iter().map(|n| blockable(g, n)).collect();
    if kinds.iter().all(Option::is_none) {
        return Ok(());
    }
    let lanes = blocks.choose(g);
    let mut st = State {
        taken: g.nodes.iter().flat_map(|n| n.outputs.iter().cloned()).collect(),
        blocked: HashMap::new(),
        reordered: HashMap::new(),
        channels: HashMap::new(),
        lanes,
    };
    st.taken.extend(g.inputs.iter().map(|v| v.name.clone()));
    let mut out: Vec<Node> = Vec::with_capacity(g.nodes.len());
    let nodes = std::mem::take(&mut g.nodes);
    for (mut n, kind) in nodes.into_iter().zip(kinds) {
        let Some(kind) = kind else {
            // Ops that can run on blocked values keep them blocked.
            super::layout_ops::propagate(g, &mut st, &mut n, &mut out);
            out.push(n);
            continue;
        };
        let x = n.inputs[0].clone();
        let direct = matches!(kind, Kind::Dense { cin } if cin < lanes) && !st.blocked.contains_key(&x);
        if direct {
            n.attrs.insert(IN_LAYOUT.into(), Attr::String("NCHW".into()));
        } else {
            n.inputs[0] = st.blocked_name(g, &n, &x, &mut out);
            n.attrs.insert(IN_LAYOUT.into(), Attr::String("NCHWc".into()));
        }
        if let Some(r) = n.inputs.get(3).filter(|r| !r.is_empty()).cloned() {
            n.inputs[3] = st.blocked_name(g, &n, &r, &mut out);
        }
        let cout = n.input(1).and_then(|w| g.initializers.get(w)).map_or(0, |w| w.shape()[0]);
        st.block_output(g, &mut n, 0, cout);
        out.push(n);
    }
    let unblocked: HashMap<String, String> = st.blocked.into_iter().map(|(y, b)| (b, y)).collect();
    let channels = st.channels;
    g.nodes = out;
    // NCHW copies for every other reader of a blocked value, right after its producer.
    let r = readers(g);
    let mut i = 0;
    while i < g.nodes.len() {
        let n = g.nodes[i].clone();
        if !n.attrs.contains_key(LAYOUT) {
            i += 1;
            continue;
        }
        let mut at = i + 1;
        for (k, yb) in n.outputs.iter().enumerate() {
            let Some(y) = unblocked.get(yb).cloned() else { continue };
            // Readers of the NCHW name still: anything that is not a rewritten blocked input.
            if r.get(&y).is_none_or(|v| v.is_empty()) {
                continue;
            }
            let mut attrs = std::collections::BTreeMap::new();
            attrs.insert(CHANNELS.to_string(), Attr::Int(channels[yb] as i64));
            attrs.insert(BLOCK.to_string(), Attr::Int(lanes as i64));
            attrs.insert(SOURCES.to_string(), Attr::Strings(sources_of(&n)));
            let name = if k == 0 { format!("{}/from_nchwc", n.name) } else { format!("{}/from_nchwc.{k}", n.name) };
            let from = Node {
                name,
                op: "FromBlocked".into(),
                domain: "aim".into(),
                inputs: vec![yb.clone()],
                outputs: vec![y],
                attrs,
            };
            g.nodes.insert(at, from);
            at += 1;
        }
        i = at;
    }
    Ok(())
}
