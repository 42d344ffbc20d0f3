//! The portable GEMM microkernel in Cranelift: the contract of the portable Rust kernel in
//! `aim_kernels::gemm` (a 4×16 tile, `C (=|+=) Σ_p A[:, p] ⊗ B[p, :]` over packed panels of
//! 4 and 16 floats per step), in f32x4 vectors: the 16 columns in two halves of two vectors,
//! so that 8 accumulators, 2 B vectors and 1 broadcast stay in the 16 registers SSE has.
//!
//! `fn(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, acc: usize)`.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{types, BlockArg, Function, InstBuilder, MemFlagsData, Value};
use cranelift_codegen::isa::TargetFrontendConfig;
use cranelift_frontend::FunctionBuilderContext;

/// Rows and columns of the tile (those of the portable kernel's packing).
pub const MR: usize = 4;
/// Columns of the tile.
pub const NR: usize = 16;

/// Builds the CLIF function of the microkernel; `fma` uses fused multiply-adds (only where
/// the target has them: elsewhere Cranelift would call a library routine).
pub fn lower_micro(func: &mut Function, cfg: TargetFrontendConfig, fma: bool) {
    let ptr = types::I64;
    let mut fbc = FunctionBuilderContext::new();
    let (mut b, entry, p) = super::begin(func, &mut fbc, 6);
    let (kc, a, bp, c, ldc, acc) = (p[0], p[1], p[2], p[3], p[4], p[5]);
    // Packed panels and the C tile are in bounds (the caller's contract): no trap.
    let flags = MemFlagsData::new().with_notrap();
    let ldc_bytes = b.ins().ishl_imm_u(ldc, 2);
    let mut next = entry;
    // Two halves: columns 0..8 and 8..16.
    for half in 0..2i64 {
        let (head, body, done) = (b.create_block(), b.create_block(), b.create_block());
        let zero = b.ins().f32const(0.0);
        let vz = b.ins().splat(types::F32X4, zero);
        let i0 = b.ins().iconst(ptr, 0);
        let mut args: Vec<BlockArg> = vec![i0.into()];
        args.extend((0..8).map(|_| BlockArg::from(vz)));
        b.ins().jump(head, &args);
        for blk in [head, body, done] {
            if blk != done {
                b.append_block_param(blk, ptr);
            }
            for _ in 0..8 {
                b.append_block_param(blk, types::F32X4);
            }
        }
        // head: p < kc ?
        b.switch_to_block(head);
        let hp = b.block_params(head).to_vec();
        let more = b.ins().icmp(IntCC::UnsignedLessThan, hp[0], kc);
        let body_args: Vec<BlockArg> = hp.iter().map(|&v| v.into()).collect();
        let done_args: Vec<BlockArg> = hp[1..].iter().map(|&v| v.into()).collect();
        b.ins().brif(more, body, &body_args, done, &done_args);
        // body: one k step.
        b.switch_to_block(body);
        let q = b.block_params(body).to_vec();
        let boff = b.ins().imul_imm_s(q[0], (NR * 4) as i64);
        let baddr = b.ins().iadd(bp, boff);
        let b0 = b.ins().load(types::F32X4, flags, baddr, (half * 32) as i32);
        let b1 = b.ins().load(types::F32X4, flags, baddr, (half * 32 + 16) as i32);
        let aoff = b.ins().imul_imm_s(q[0], (MR * 4) as i64);
        let aaddr = b.ins().iadd(a, aoff);
        let mut nexts: Vec<BlockArg> = vec![b.ins().iadd_imm_s(q[0], 1).into()];
        let mut accs: Vec<Value> = Vec::with_capacity(8);
        for r in 0..MR {
            let av = b.ins().load(types::F32, flags, aaddr, (r * 4) as i32);
            let av = b.ins().splat(types::F32X4, av);
            for (j, bv) in [b0, b1].into_iter().enumerate() {
                let old = q[1 + 2 * r + j];
                let v = if fma {
                    b.ins().fma(av, bv, old)
                } else {
                    let m = b.ins().fmul(av, bv);
                    b.ins().fadd(old, m)
                };
                accs.push(v);
            }
        }
        nexts.extend(accs.iter().map(|&v| BlockArg::from(v)));
        b.ins().jump(head, &nexts);
        // done: store (or add into) the half tile.
        b.switch_to_block(done);
        let d = b.block_params(done).to_vec();
        let (add_blk, store_blk) = (b.create_block(), b.create_block());
        b.ins().brif(acc, add_blk, &[], store_blk, &[]);
        let after = b.create_block();
        for (blk, add) in [(add_blk, true), (store_blk, false)] {
            b.switch_to_block(blk);
            for r in 0..MR {
                let roff = b.ins().imul_imm_s(ldc_bytes, r as i64);
                let row = b.ins().iadd(c, roff);
                for j in 0..2 {
                    let off = (half * 32 + 16 * j as i64) as i32;
                    let mut v = d[2 * r + j];
                    if add {
                        let old = b.ins().load(types::F32X4, flags, row, off);
                        v = b.ins().fadd(v, old);
                    }
                    b.ins().store(flags, v, row, off);
                }
            }
            b.ins().jump(after, &[]);
        }
        b.switch_to_block(after);
        next = after;
    }
    let _ = next;
    b.ins().return_(&[]);
    b.seal_all_blocks();
    b.finalize(cfg);
}

#[cfg(test)]
mod tests {
    use aim_kernels::gemm::{gemm, Blocking, Epilogue, Isa, PackedA, PackedB, Sequential};

    /// Installed, the generated kernel computes what the Rust one does (exactly: the same
    /// operations in the same order) on sizes with partial tiles and k blocks, and adds into
    /// C across k blocks.
    #[test]
    fn the_generated_kernel_matches_the_rust_one() {
        let target = crate::target::Target::host().with_cpu("baseline").unwrap();
        let sizes = [(1, 1, 1), (4, 16, 16), (13, 7, 33), (25, 300, 70), (9, 129, 17)];
        let blocking = Blocking { kc: 64, mc: 8 };
        let run = |m: usize, k: usize, n: usize| {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 11) as f32 / 3.0).collect();
            let pa = PackedA::from_slice(Isa::PORTABLE, blocking, &a, m, k, false);
            let pb = PackedB::from_slice(Isa::PORTABLE, blocking, &b, k, n, false);
            let mut c = vec![f32::NAN; m * n];
            gemm(&pa, &pb, &mut c, n, &Epilogue::default(), &Sequential);
            c
        };
        let before: Vec<Vec<f32>> = sizes.iter().map(|&(m, k, n)| run(m, k, n)).collect();
        assert!(crate::codegen::install_portable_microkernel(&target).unwrap());
        assert!(aim_kernels::gemm::portable_is_generated());
        for (&(m, k, n), want) in sizes.iter().zip(&before) {
            let got = run(m, k, n);
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{m}x{k}x{n} at {i}: {g} vs {w}");
            }
        }
    }
}
