//! Transposes: an `aim:Transpose` node of rank `r` becomes
//! `fn(x: *const f32, y: *mut f32, desc: *const usize, row0: usize, row1: usize)`, which
//! writes output rows `row0 <= o < row1` (a row: all output dims but the last). `desc`
//! holds the sizes of the `r - 1` outer output dims, then the source strides (in elements)
//! of those dims, then the row length and the source stride along it. Per row, the source
//! offset comes from the row index digit by digit (one division per outer dim); then the
//! row is copied — sixteen, then four floats per step in f32x4 vectors when the last axis
//! stays last (a contiguous source run), else gathered four elements per step at the
//! source stride — with a scalar tail. Sizes are read at run time, so one function serves
//! every shape of its rank.

use super::CodegenError;
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{types, Function, InstBuilder, MemFlagsData, Value};
use cranelift_codegen::isa::TargetFrontendConfig;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_module::{FuncId, Module};

/// Emits `while var + step <= end { body(var); var += step }` (unsigned).
fn counted_loop(
    b: &mut FunctionBuilder,
    var: Variable,
    end: Value,
    step: i64,
    body: impl FnOnce(&mut FunctionBuilder, Value),
) {
    let (head, body_blk, done) = (b.create_block(), b.create_block(), b.create_block());
    b.ins().jump(head, &[]);
    b.switch_to_block(head);
    let i = b.use_var(var);
    let next = b.ins().iadd_imm_s(i, step);
    let fits = b.ins().icmp(IntCC::UnsignedLessThanOrEqual, next, end);
    b.ins().brif(fits, body_blk, &[], done, &[]);
    b.switch_to_block(body_blk);
    let i = b.use_var(var);
    body(b, i);
    let i = b.use_var(var);
    let next = b.ins().iadd_imm_s(i, step);
    b.def_var(var, next);
    b.ins().jump(head, &[]);
    b.switch_to_block(done);
}

/// Builds the CLIF function of a transpose of `rank` dims; `contiguous` when the last input
/// axis stays last (`perm[rank-1] == rank-1`).
pub fn lower_transpose(rank: usize, contiguous: bool, func: &mut Function, cfg: TargetFrontendConfig) {
    assert!(rank >= 2, "a transpose kernel has at least two dims");
    let ptr = types::I64;
    let mut fbc = FunctionBuilderContext::new();
    let (mut b, _, p) = super::begin(func, &mut fbc, 5);
    let (x, y, desc, row0, row1) = (p[0], p[1], p[2], p[3], p[4]);
    // The descriptor and the rows [row0, row1) of y, and the source elements those rows
    // read, are in bounds (checked by the caller): no access traps; none needs alignment.
    let flags = MemFlagsData::new().with_notrap();
    let outer = rank - 1;
    let word = |b: &mut FunctionBuilder, k: usize| b.ins().load(ptr, flags, desc, (8 * k) as i32);
    let dims: Vec<Value> = (0..outer).map(|d| word(&mut b, d)).collect();
    let strides: Vec<Value> = (0..outer).map(|d| word(&mut b, outer + d)).collect();
    let inner = word(&mut b, 2 * outer);
    let inner_stride = word(&mut b, 2 * outer + 1);
    let row_bytes = b.ins().ishl_imm_u(inner, 2);
    let step_bytes = b.ins().ishl_imm_u(inner_stride, 2);
    let row = b.declare_var(ptr);
    let j = b.declare_var(ptr);
    b.def_var(row, row0);
    let row_loop_end = row1;
    // for o in row0..row1 (step 1, expressed as "o + 1 <= row1").
    counted_loop(&mut b, row, row_loop_end, 1, |b, o| {
        // The source offset of row o: its output coordinates, innermost outer dim first.
        let mut rem = o;
        let mut off = b.ins().iconst(ptr, 0);
        for d in (0..outer).rev() {
            let c = if d == 0 {
                rem
            } else {
                let c = b.ins().urem(rem, dims[d]);
                rem = b.ins().udiv(rem, dims[d]);
                c
            };
            let t = b.ins().imul(c, strides[d]);
            off = b.ins().iadd(off, t);
        }
        let off_bytes = b.ins().ishl_imm_u(off, 2);
        let src = b.ins().iadd(x, off_bytes);
        let dst_off = b.ins().imul(o, row_bytes);
        let dst = b.ins().iadd(y, dst_off);
        let zero = b.ins().iconst(ptr, 0);
        b.def_var(j, zero);
        let at = |b: &mut FunctionBuilder, base: Value, i: Value, scale_bytes: Option<Value>| -> Value {
            let bytes = match scale_bytes {
                Some(s) => b.ins().imul(i, s),
                None => b.ins().ishl_imm_u(i, 2),
            };
            b.ins().iadd(base, bytes)
        };
        if contiguous {
            for (step, vectors) in [(16i64, 4usize), (4, 1)] {
                counted_loop(b, j, inner, step, |b, i| {
                    let (s, d) = (at(b, src, i, None), at(b, dst, i, None));
                    let vs: Vec<Value> =
                        (0..vectors).map(|k| b.ins().load(types::F32X4, flags, s, (16 * k) as i32)).collect();
                    for (k, v) in vs.into_iter().enumerate() {
                        b.ins().store(flags, v, d, (16 * k) as i32);
                    }
                });
            }
            counted_loop(b, j, inner, 1, |b, i| {
                let (s, d) = (at(b, src, i, None), at(b, dst, i, None));
                let v = b.ins().load(types::F32, flags, s, 0);
                b.ins().store(flags, v, d, 0);
            });
        } else {
            counted_loop(b, j, inner, 4, |b, i| {
                let (s, d) = (at(b, src, i, Some(step_bytes)), at(b, dst, i, None));
                let mut a = s;
                let mut vs = Vec::with_capacity(4);
                for k in 0..4 {
                    if k > 0 {
                        a = b.ins().iadd(a, step_bytes);
                    }
                    vs.push(b.ins().load(types::F32, flags, a, 0));
                }
                for (k, v) in vs.into_iter().enumerate() {
                    b.ins().store(flags, v, d, (4 * k) as i32);
                }
            });
            counted_loop(b, j, inner, 1, |b, i| {
                let (s, d) = (at(b, src, i, Some(step_bytes)), at(b, dst, i, None));
                let v = b.ins().load(types::F32, flags, s, 0);
                b.ins().store(flags, v, d, 0);
            });
        }
    });
    b.ins().return_(&[]);
    b.seal_all_blocks();
    b.finalize(cfg);
}

/// Compiles one transpose into `module` under `name` (see [`super::compile_elementwise`]).
pub fn compile_transpose<M: Module>(
    module: &mut M,
    node: &str,
    name: &str,
    export: bool,
    rank: usize,
    contiguous: bool,
) -> Result<FuncId, CodegenError> {
    super::define(module, node, name, export, |f, cfg| lower_transpose(rank, contiguous, f, cfg))
}

#[cfg(test)]
mod tests {
    use crate::codegen::generate;
    use crate::target::Target;
    use aim_ir::{Attr, Graph, Node};

    /// The generated copy against the definition for every permutation of ranks 2 to 4,
    /// over sizes around the vector widths, for the host and the SSE4.2 baseline; the
    /// element after the output stays untouched.
    #[test]
    fn generated_transposes_match_the_definition() {
        fn perms(r: usize) -> Vec<Vec<usize>> {
            if r == 1 {
                return vec![vec![0]];
            }
            let mut out = Vec::new();
            for p in perms(r - 1) {
                for k in 0..r {
                    let mut q = p.clone();
                    q.insert(k, r - 1);
                    out.push(q);
                }
            }
            out
        }
        for cpu in ["native", "x86-64-v2"] {
            let target = Target::host().with_cpu(cpu).unwrap();
            for rank in 2..=4 {
                for perm in perms(rank) {
                    let mut g = Graph::default();
                    g.nodes.push(Node {
                        name: "t".into(),
                        op: "Transpose".into(),
                        domain: "aim".into(),
                        inputs: vec!["x".into()],
                        outputs: vec!["y".into()],
                        attrs: [("perm".to_string(), Attr::Ints(perm.iter().map(|&p| p as i64).collect()))]
                            .into_iter()
                            .collect(),
                    });
                    let code = generate(&g, &target).unwrap();
                    let f = code.transpose[&0];
                    for sizes in [[1usize, 2, 3, 5], [3, 17, 4, 1], [2, 5, 33, 3], [4, 3, 2, 20]] {
                        let shape = &sizes[..rank];
                        let n: usize = shape.iter().product();
                        let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
                        let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
                        let mut st = vec![1usize; rank];
                        for d in (0..rank - 1).rev() {
                            st[d] = st[d + 1] * shape[d + 1];
                        }
                        let mut desc: Vec<usize> = out_shape[..rank - 1].to_vec();
                        desc.extend(perm[..rank - 1].iter().map(|&p| st[p]));
                        desc.push(out_shape[rank - 1]);
                        desc.push(st[perm[rank - 1]]);
                        let rows: usize = out_shape[..rank - 1].iter().product();
                        let mut y = vec![-1f32; n + 1];
                        // SAFETY: x and y hold the tensor (y one more, which must stay
                        // untouched), desc describes it.
                        unsafe { f(x.as_ptr(), y.as_mut_ptr(), desc.as_ptr(), 0, rows) };
                        assert_eq!(y[n], -1.0, "{perm:?} {shape:?} [{cpu}]: wrote past the output");
                        for (o, &got) in y[..n].iter().enumerate() {
                            let mut rem = o;
                            let mut src = 0;
                            for d in (0..rank).rev() {
                                src += (rem % out_shape[d]) * st[perm[d]];
                                rem /= out_shape[d];
                            }
                            assert_eq!(got, x[src], "{perm:?} {shape:?} [{cpu}] element {o}");
                        }
                    }
                }
            }
        }
    }
}
