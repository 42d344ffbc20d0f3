//! Row reductions: an `aim:Reduce` node (ReduceSum/Mean/Max/Min over trailing axes) becomes
//! `fn(x: *const f32, out: *mut f32, len: usize, row0: usize, row1: usize)`, computing
//! `out[r] = reduce(x[r·len .. (r+1)·len])` for `row0 <= r < row1`: four f32x4 accumulators
//! (sixteen lanes, so that additions of consecutive vectors do not wait on each other), a
//! horizontal combine, a scalar tail, and for the mean a division by `len`. Max and min
//! propagate NaN (Cranelift's `fmax`/`fmin` are IEEE maximum/minimum).

use super::CodegenError;
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{types, BlockArg, Function, InstBuilder, MemFlagsData, Value};
use cranelift_codegen::isa::TargetFrontendConfig;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Module};

/// What a reduction computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceMode {
    /// Σ.
    Sum,
    /// Σ / len.
    Mean,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

impl ReduceMode {
    /// The mode for an ONNX op name.
    pub fn from_op(op: &str) -> Option<ReduceMode> {
        Some(match op {
            "ReduceSum" => ReduceMode::Sum,
            "ReduceMean" => ReduceMode::Mean,
            "ReduceMax" => ReduceMode::Max,
            "ReduceMin" => ReduceMode::Min,
            _ => return None,
        })
    }

    /// Its name in the `mode` attribute of `aim:Reduce`.
    pub fn name(self) -> &'static str {
        match self {
            ReduceMode::Sum => "sum",
            ReduceMode::Mean => "mean",
            ReduceMode::Max => "max",
            ReduceMode::Min => "min",
        }
    }

    /// The mode a `mode` attribute names.
    pub fn parse(s: &str) -> Option<ReduceMode> {
        [ReduceMode::Sum, ReduceMode::Mean, ReduceMode::Max, ReduceMode::Min].into_iter().find(|m| m.name() == s)
    }
}

/// Accumulators of four lanes each.
const ACCS: usize = 4;

/// Builds the CLIF function of a reduction.
pub fn lower_reduce(mode: ReduceMode, func: &mut Function, cfg: TargetFrontendConfig) {
    let ptr = types::I64;
    let mut fbc = FunctionBuilderContext::new();
    let (mut b, _, p) = super::begin(func, &mut fbc, 5);
    let [row_head, row_body, vec_head, vec_body, tail_head, tail_body, row_end, exit] =
        std::array::from_fn(|_| b.create_block());
    let (x, out, len, row0, row1) = (p[0], p[1], p[2], p[3], p[4]);
    // Reads stay inside rows [row0, row1) of x and writes inside out[row0..row1] (checked by
    // the caller): no access traps; none needs alignment.
    let flags = MemFlagsData::new().with_notrap();
    let identity = match mode {
        ReduceMode::Sum | ReduceMode::Mean => 0.0,
        ReduceMode::Max => f32::NEG_INFINITY,
        ReduceMode::Min => f32::INFINITY,
    };
    let combine = |b: &mut FunctionBuilder, a: Value, v: Value| match mode {
        ReduceMode::Sum | ReduceMode::Mean => b.ins().fadd(a, v),
        ReduceMode::Max => b.ins().fmax(a, v),
        ReduceMode::Min => b.ins().fmin(a, v),
    };
    let row_bytes = b.ins().ishl_imm_u(len, 2);
    b.ins().jump(row_head, &[row0.into()]);

    // for r in row0..row1
    b.append_block_param(row_head, ptr);
    b.switch_to_block(row_head);
    let r = b.block_params(row_head)[0];
    let more_rows = b.ins().icmp(IntCC::UnsignedLessThan, r, row1);
    b.ins().brif(more_rows, row_body, &[r.into()], exit, &[]);

    b.append_block_param(row_body, ptr);
    b.switch_to_block(row_body);
    let r = b.block_params(row_body)[0];
    let off = b.ins().imul(r, row_bytes);
    let base = b.ins().iadd(x, off);
    let init = b.ins().f32const(identity);
    let vinit = b.ins().splat(types::F32X4, init);
    let zero = b.ins().iconst(ptr, 0);
    let mut args: Vec<BlockArg> = vec![zero.into()];
    args.extend((0..ACCS).map(|_| BlockArg::from(vinit)));
    b.ins().jump(vec_head, &args);

    // The vector loop: ACCS vectors of four per step.
    b.append_block_param(vec_head, ptr);
    for blk in [vec_head, vec_body] {
        if blk == vec_body {
            b.append_block_param(blk, ptr);
        }
        for _ in 0..ACCS {
            b.append_block_param(blk, types::F32X4);
        }
    }
    b.switch_to_block(vec_head);
    let hp = b.block_params(vec_head).to_vec();
    let step = (4 * ACCS) as i64;
    let i_next = b.ins().iadd_imm_s(hp[0], step);
    let fits = b.ins().icmp(IntCC::UnsignedLessThanOrEqual, i_next, len);
    // Leaving the vector loop: combine the accumulators' lanes into one scalar.
    let vec_done = b.create_block();
    for _ in 0..ACCS {
        b.append_block_param(vec_done, types::F32X4);
    }
    b.append_block_param(vec_done, ptr);
    let body_args: Vec<BlockArg> = hp.iter().map(|&v| v.into()).collect();
    let mut done_args: Vec<BlockArg> = hp[1..].iter().map(|&v| v.into()).collect();
    done_args.push(hp[0].into());
    b.ins().brif(fits, vec_body, &body_args, vec_done, &done_args);

    b.switch_to_block(vec_body);
    let bp = b.block_params(vec_body).to_vec();
    let byte = b.ins().ishl_imm_u(bp[0], 2);
    let addr = b.ins().iadd(base, byte);
    let mut next: Vec<BlockArg> = vec![b.ins().iadd_imm_s(bp[0], step).into()];
    for k in 0..ACCS {
        let v = b.ins().load(types::F32X4, flags, addr, (16 * k) as i32);
        next.push(combine(&mut b, bp[1 + k], v).into());
    }
    b.ins().jump(vec_head, &next);

    b.switch_to_block(vec_done);
    let dp = b.block_params(vec_done).to_vec();
    let mut acc = dp[0];
    for &v in &dp[1..ACCS] {
        acc = combine(&mut b, acc, v);
    }
    let mut s = b.ins().extractlane(acc, 0);
    for lane in 1..4u8 {
        let l = b.ins().extractlane(acc, lane);
        s = combine(&mut b, s, l);
    }
    b.ins().jump(tail_head, &[dp[ACCS].into(), s.into()]);

    // The scalar tail.
    for blk in [tail_head, tail_body] {
        b.append_block_param(blk, ptr);
        b.append_block_param(blk, types::F32);
    }
    b.switch_to_block(tail_head);
    let tp = b.block_params(tail_head).to_vec();
    let more = b.ins().icmp(IntCC::UnsignedLessThan, tp[0], len);
    b.append_block_param(row_end, types::F32);
    b.ins().brif(more, tail_body, &[tp[0].into(), tp[1].into()], row_end, &[tp[1].into()]);

    b.switch_to_block(tail_body);
    let tb = b.block_params(tail_body).to_vec();
    let byte = b.ins().ishl_imm_u(tb[0], 2);
    let addr = b.ins().iadd(base, byte);
    let v = b.ins().load(types::F32, flags, addr, 0);
    let s = combine(&mut b, tb[1], v);
    let i = b.ins().iadd_imm_s(tb[0], 1);
    b.ins().jump(tail_head, &[i.into(), s.into()]);

    // Store the row's result (divided by len for the mean) and go to the next row.
    b.switch_to_block(row_end);
    let mut s = b.block_params(row_end)[0];
    if mode == ReduceMode::Mean {
        let n = b.ins().fcvt_from_uint(types::F32, len);
        s = b.ins().fdiv(s, n);
    }
    let byte = b.ins().ishl_imm_u(r, 2);
    let addr = b.ins().iadd(out, byte);
    b.ins().store(flags, s, addr, 0);
    let r1 = b.ins().iadd_imm_s(r, 1);
    b.ins().jump(row_head, &[r1.into()]);

    b.switch_to_block(exit);
    b.ins().return_(&[]);
    b.seal_all_blocks();
    b.finalize(cfg);
}

/// Compiles one reduction into `module` under `name` (see [`super::compile_elementwise`]).
pub fn compile_reduce<M: Module>(
    module: &mut M,
    node: &str,
    name: &str,
    export: bool,
    mode: ReduceMode,
) -> Result<FuncId, CodegenError> {
    super::define(module, node, name, export, |f, cfg| lower_reduce(mode, f, cfg))
}

#[cfg(test)]
mod tests {
    use super::ReduceMode;
    use crate::codegen::generate;
    use crate::target::Target;
    use aim_ir::{Attr, Graph, Node};

    /// The generated loop against a plain f64 reduction, for row lengths around the vector
    /// and accumulator widths, NaN and infinities included, for the host and the SSE4.2
    /// baseline.
    #[test]
    fn generated_reductions_match_the_definition() {
        for mode in [ReduceMode::Sum, ReduceMode::Mean, ReduceMode::Max, ReduceMode::Min] {
            let mut g = Graph::default();
            g.nodes.push(Node {
                name: "r".into(),
                op: "Reduce".into(),
                domain: "aim".into(),
                inputs: vec!["x".into()],
                outputs: vec!["y".into()],
                attrs: [("mode".to_string(), Attr::String(mode.name().into())), ("axis".to_string(), Attr::Int(1))]
                    .into_iter()
                    .collect(),
            });
            for cpu in ["native", "x86-64-v2"] {
                let code = generate(&g, &Target::host().with_cpu(cpu).unwrap()).unwrap();
                let f = code.reduce[&0];
                for len in [1usize, 3, 4, 5, 15, 16, 17, 33, 100] {
                    let rows = 3;
                    let mut x: Vec<f32> = (0..rows * len).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
                    if len > 4 {
                        x[len + 2] = f32::NAN;
                    }
                    let mut y = vec![0f32; rows + 1];
                    // SAFETY: x holds rows·len floats, y rows (+1 that must stay untouched).
                    unsafe { f(x.as_ptr(), y.as_mut_ptr(), len, 0, rows) };
                    assert_eq!(y[rows], 0.0, "wrote past the rows");
                    for r in 0..rows {
                        let s = &x[r * len..(r + 1) * len];
                        let want = match mode {
                            ReduceMode::Sum => s.iter().map(|&v| v as f64).sum::<f64>(),
                            ReduceMode::Mean => s.iter().map(|&v| v as f64).sum::<f64>() / len as f64,
                            ReduceMode::Max => s.iter().fold(f64::NEG_INFINITY, |m, &v| {
                                if v.is_nan() || m.is_nan() {
                                    f64::NAN
                                } else {
                                    m.max(v as f64)
                                }
                            }),
                            ReduceMode::Min => s.iter().fold(f64::INFINITY, |m, &v| {
                                if v.is_nan() || m.is_nan() {
                                    f64::NAN
                                } else {
                                    m.min(v as f64)
                                }
                            }),
                        };
                        let got = y[r] as f64;
                        assert!(
                            (got.is_nan() && want.is_nan()) || (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "{mode:?} [{cpu}] len {len} row {r}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
