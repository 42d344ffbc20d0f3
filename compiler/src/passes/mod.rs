//! Graph passes: each a named function over the graph that the pass manager runs in order,
//! timing each and (on request) keeping the graph after each for printing.

mod attention;
mod byte_tables;
pub mod coded_weights;
mod const_fold;
mod cse;
mod dce;
mod dense_split;
mod epilogue_programs;
mod fold_batchnorm;
pub mod fuse;
mod fuse_elementwise;
mod gelu;
mod half;
mod int8;
mod layernorm;
pub mod layout;
mod layout_ops;
mod levels;
mod one_hot;
mod pool_pads;
mod qconv;
mod qdense;
mod qdense_static;
mod qdq;
mod qmatmul;
pub mod quantize_weights;
mod reduce;
mod rename;
mod reshaped_residual;
mod simplify;
mod softmax;
mod transpose;
mod uses;

pub use fuse::{sources_of, ACTIVATION, ACT_ALPHA, ACT_BETA, CLIP_MAX, CLIP_MIN, SOURCES};
pub use levels::{min_level, OptLevel, Optimization, REQUIRED};

use aim_ir::Graph;
use aim_kernels::gemm::IsaKind;
use std::time::{Duration, Instant};

/// Why a pass failed (a node it evaluated at compile time failed on its constants).
#[derive(Debug, thiserror::Error)]
#[error("pass {pass}: {msg}")]
pub struct PassError {
    /// The pass.
    pub pass: &'static str,
    /// What went wrong, naming the node.
    pub msg: String,
}

/// A pass's rewrite of the graph.
pub type PassFn = Box<dyn Fn(&mut Graph) -> Result<(), PassError>>;

/// A pass: a name and a function that rewrites the graph in place.
pub struct Pass {
    /// Its name, as `aim explore --passes` prints it.
    pub name: &'static str,
    /// The rewrite.
    pub run: PassFn,
}

impl Pass {
    fn new(name: &'static str, run: impl Fn(&mut Graph) -> Result<(), PassError> + 'static) -> Pass {
        Pass { name, run: Box::new(run) }
    }
}

/// The CPU pipeline for a target, in order: the passes its optimisation level and disabled
/// passes (`target.optimization`) let run.
///
/// Elementwise fusion takes every op the programs have, exp/erf/tanh/sigmoid included: the
/// generated loops are Cranelift's, whose vectors are 128 bits wide on x86-64, but where the
/// CPU has AVX2 or AVX-512 the runtime runs the longer ones at the full width
/// (`aim_kernels::ewprog::wide`), with the same bits. (Before that, a 4-lane fused GELU
/// measured 3.7 ms against 2 ms as separate 16-lane kernels on bert_l6.)
pub fn cpu_pipeline(target: &crate::target::Target) -> Vec<Pass> {
    target.optimization.select(every_cpu_pass(target))
}

/// The names of every pass the cpu pipeline has for `target` at `-O3` (those
/// `--disable-pass` may name, with the required ones), in order, repeats included.
pub fn cpu_pass_names(target: &crate::target::Target) -> Vec<&'static str> {
    let mut full = target.clone();
    full.optimization = Optimization::default();
    full.half_weights = true;
    full.int4_weights = Some(32);
    full.int8_weights = true;
    every_cpu_pass(&full).iter().map(|p| p.name).collect()
}

/// The whole cpu pipeline for `target`, before the level selects from it.
fn every_cpu_pass(target: &crate::target::Target) -> Vec<Pass> {
    let lanes = aim_kernels::nchwc::lanes_of(target.isa_kind());
    let blocks = match target.isa_kind() {
        IsaKind::Avx512 => layout::Blocks {
            wide: lanes,
            narrow: Some(aim_kernels::nchwc::lanes_of(IsaKind::Avx2)),
            wide_speedup: if target.split_512 { 1.12 } else { 2.0 },
        },
        _ => layout::Blocks::only(lanes),
    };
    let tile = aim_kernels::gemm::Isa::new(target.isa_kind()).map_or((4, 16), |i| (i.mr(), i.nr()));
    // Cranelift rounds vectors with SSE4.1's roundps or NEON's frintn.
    let round = target.features.sse41 || target.level == crate::target::Level::Neon;
    // Integer kernels where the target has instructions that make them pay (AVX-512 VNNI:
    // four times the products per instruction of f32; AVX2: `vpmaddubsw`, twice, exact
    // with the plain or sign kernel of `aim_kernels::int8`); elsewhere quantized layers run as f32
    // kernels (the quantize-dequantize pass).
    // NEON's `sdot` (FEAT_DotProd) multiplies four times the bytes per instruction of f32
    // `fmla`, as VNNI does.
    let neon_dot = target.features.dotprod && target.isa_kind() == IsaKind::Neon;
    let int8 = (target.features.avx512vnni && target.isa_kind() == IsaKind::Avx512)
        || (target.features.avx2 && target.isa_kind() == IsaKind::Avx2)
        || neon_dot;
    // Quantized dense layers (dynamic and static) also run as integer GEMMs on AVX2 (exact
    // 16-bit products, `aim_kernels::qgemm`): their weights then stay bytes, a quarter of
    // the f32 emulation's, and their sums are ORT's exact ones.
    let integer_dense = int8 || (target.features.avx2 && matches!(target.isa_kind(), IsaKind::Avx2 | IsaKind::Avx512));
    let mut passes = graph_passes(
        Some(integer_dense),
        int8,
        round,
        Some(aim_kernels::gemm::coded::panel_width(target.isa_kind())),
        true,
        target.optimization.runs("quantize-dequantize"),
        // Dynamically quantized convolutions on the integer kernels with VNNI, and on AVX2
        // those of one group (exact 16-bit products through `vpmaddwd`: 1.6 of them per
        // cycle against two 8-lane f32 FMAs on AMD Zen 3); products of two quantized
        // activations with VNNI only (AVX2's `vpmaddubsw` multiplies no faster than f32).
        match target.isa_kind() {
            IsaKind::Avx512 if target.features.avx512vnni => qdq::IntegerConv::Vnni,
            IsaKind::Neon if neon_dot => qdq::IntegerConv::Vnni,
            IsaKind::Avx512 | IsaKind::Avx2 if target.features.avx2 => qdq::IntegerConv::OneGroup,
            _ => qdq::IntegerConv::Off,
        },
    );
    // Before the coded-weights pass, which keeps what these make in their bits.
    let at = passes.iter().position(|p| p.name == "coded-weights").unwrap_or(passes.len());
    if target.int8_weights {
        passes.insert(at, Pass::new("int8-weights", |g| quantize_weights::run(g, quantize_weights::Scheme::Int8)));
    }
    if let Some(block) = target.int4_weights {
        let scheme = quantize_weights::Scheme::Int4 { block };
        passes.insert(at, Pass::new("int4-weights", move |g| quantize_weights::run(g, scheme)));
    }
    passes.extend([
        Pass::new("byte-tables", byte_tables::run),
        Pass::new("explicit-pool-pads", pool_pads::run),
        Pass::new("layout-nchwc", move |g| layout::run(g, blocks)),
        // After the layout: a chain whose inputs broadcast (a per-channel gate over a feature
        // map) is left to the blocked layout's per-channel operands where that takes it.
        Pass::new("fuse-broadcast-elementwise", move |g| fuse_elementwise::run(g, round, true)),
        Pass::new("select-kernels", move |g| crate::select::run(g, lanes, tile)),
        Pass::new("fuse-epilogue-programs", epilogue_programs::run),
        Pass::new("dead-code-elimination", dce::run),
        Pass::new("infer-types", infer),
    ]);
    if target.half_weights {
        passes.push(Pass::new("half-weights", half::mark_weights));
    }
    passes
}

/// The passes for the cuda backend: the cpu pipeline's graph optimisations (folding,
/// fusion of epilogues, reductions, transposes, softmax), with every elementwise chain
/// fused — transcendental functions included: on a GPU one kernel per chain is what pays —
/// and no blocked layout or integer kernels (the GPU kernels read NCHW and f32).
pub fn cuda_pipeline() -> Vec<Pass> {
    let mut passes = graph_passes(None, false, true, None, false, true, qdq::IntegerConv::Off);
    passes.extend([Pass::new("dead-code-elimination", dce::run), Pass::new("infer-types", infer)]);
    passes
}

/// The graph optimisations both backends run, in order: half to f32, folding,
/// simplification, quantization (`quantize_dense`: whether the dynamic-int8 dense pass runs
/// and, inside it, whether integer kernels are used; `None`: not at all; `int8`: whether
/// quantize-dequantize pairs become integer kernels), epilogue, GELU,
/// layer norm, reduction, transpose and softmax fusion, and elementwise fusion (`round`:
/// whether Round joins fused loops; `q4_panels`: the panel width dense layers with 4-bit
/// weights are laid out for, or None to fold those weights into f32; `attention`: whether
/// attention chains become `aim:Attention`, which the cpu backend runs; `qdq`: whether the
/// quantize-dequantize pass will run, which folding then leaves the weights'
/// DequantizeLinear nodes to; `integer_conv`: which ConvInteger stay on bytes as
/// `aim:ConvInteger`, and whether products of two quantized activations become
/// `aim:QMatMul`, see [`qdq::IntegerConv`]).
fn graph_passes(
    quantize_dense: Option<bool>,
    int8: bool,
    round: bool,
    q4_panels: Option<usize>,
    attention: bool,
    qdq: bool,
    integer_conv: qdq::IntegerConv,
) -> Vec<Pass> {
    // Dense layers, dynamically or statically quantized, on the integer GEMM.
    let integer_gemm = quantize_dense.unwrap_or(false);
    let mut passes = vec![
        Pass::new("half-to-float", half::run),
        Pass::new("infer-types", infer),
        // The dequantization of constant weights waits for the quantize-dequantize pass,
        // which reads the integers (and folds them then).
        Pass::new("constant-folding", move |g| {
            const_fold::run_deferring(g, if qdq { &["DequantizeLinear"] } else { &[] })
        }),
        Pass::new("simplify", simplify::run),
        Pass::new("common-subexpressions", cse::run),
        Pass::new("dead-code-elimination", dce::run),
        Pass::new("one-hot-lookups", one_hot::run),
    ];
    if quantize_dense.is_some() {
        passes.push(Pass::new("quantize-dense", move |g| if integer_gemm { qdense::run(g) } else { Ok(()) }));
    }
    if let Some(nr) = q4_panels {
        passes.push(Pass::new("coded-weights", move |g| coded_weights::run(g, nr)));
    }
    passes.extend([
        Pass::new("quantize-dequantize", move |g| qdq::run(g, int8, integer_gemm, integer_conv)),
        Pass::new("common-subexpressions", cse::run),
        Pass::new("fold-batchnorm", fold_batchnorm::run),
        Pass::new("fuse-gelu", gelu::run),
        Pass::new("fuse-layer-norm", layernorm::run),
        Pass::new("fuse-epilogues", fuse::run),
        Pass::new("infer-types", infer),
        Pass::new("fuse-softmax", softmax::run),
    ]);
    if attention {
        passes.push(Pass::new("fuse-attention", attention::run));
    }
    passes.extend([
        Pass::new("lower-reductions", reduce::run),
        Pass::new("lower-transposes", transpose::run),
        Pass::new("fuse-elementwise", move |g| fuse_elementwise::run(g, round, false)),
    ]);
    passes
}

fn infer(g: &mut Graph) -> Result<(), PassError> {
    aim_ir::infer::infer_types(g).map_err(|e| PassError { pass: "infer-types", msg: e.to_string() })
}

/// What one pass did.
#[derive(Debug, Clone)]
pub struct PassRecord {
    /// The pass.
    pub name: &'static str,
    /// Wall time it took.
    pub time: Duration,
    /// The graph after it, when asked for.
    pub after: Option<Graph>,
}

/// Runs `passes` over `g`, returning a record per pass (with snapshots if `keep`).
pub fn run_pipeline(g: &mut Graph, passes: &[Pass], keep: bool) -> Result<Vec<PassRecord>, PassError> {
    let mut out = Vec::new();
    for p in passes {
        let t = Instant::now();
        // A pass that panics has a bug; the user gets an error naming it instead.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (p.run)(g))) {
            Ok(r) => r?,
            Err(e) => {
                let msg =
                    e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
                return Err(PassError { pass: p.name, msg: format!("internal error: {}", msg.unwrap_or_default()) });
            }
        }
        // What the pass freed (weights it rewrote) leaves the process now, not as holes in
        // the heap that the next pass's allocations add to.
        aim_ir::mapped::trim_heap();
        out.push(PassRecord { name: p.name, time: t.elapsed(), after: keep.then(|| g.clone()) });
    }
    make_outputs_static(g);
    // What the passes wrote must be a graph the runtime and `.aim` files accept: an `aim`
    // node that does not fit its row of the op table is a pass's bug, reported here by
    // name rather than as a kernel's misreading later.
    aim_ir::verify_nodes(g)
        .map_err(|e| PassError { pass: "verify", msg: format!("internal error: the optimized graph: {e}") })?;
    Ok(out)
}

/// Gives each graph output the static type inference found for it where its declared type
/// is symbolic (a graph specialised to static input shapes), for the printer and the runtime.
fn make_outputs_static(g: &mut Graph) {
    for o in &mut g.outputs {
        if let Some(t) =
            g.value_types.get(&o.name).filter(|t| o.ty.concrete_shape().is_none() && o.ty.is_made_static_by(t))
        {
            o.ty = t.clone();
        }
    }
}
