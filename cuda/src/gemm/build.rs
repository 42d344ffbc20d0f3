//! The PTX of one GEMM kernel, phase by phase: the operands' addresses, each thread's
//! share of a slice's copies into shared memory, the copies of one slice (`cp.async`), the
//! thread's accumulators and fragment addresses, the double-buffered loop over slices with
//! each inner product, and the epilogue. [`build`] calls them in that order; the order of
//! the calls is the order of the instructions.

use super::{activation_program, ALayout, BLayout, Gemm, Inner, YLayout, BK, BM, BN};
use crate::elementwise::program;
use crate::ptx::{Class, Kernel as Builder, Reg};

/// One element of a slice copy.
enum Copy {
    /// Contiguous along k: the thread's source address before the slice offset, whether
    /// its row (A) or column (W) is inside the matrix, its k within the slice, its shared
    /// destination before the buffer offset, and the slice's byte step per unit of k0.
    Linear { src: Reg, inside: Reg, k: Reg, dst: Reg, step: u32 },
    /// An im2col element: whether its row is inside, its image's first input element, the
    /// top-left input row and column of its window, its k within the slice, its
    /// destination.
    Im2col { inside: Reg, base: Reg, ih0: Reg, iw0: Reg, k: Reg, dst: Reg },
}

/// The kernel's operands (this batch's, after the block's offsets) and the thread's
/// coordinates.
struct Operands {
    a: Reg,
    w: Reg,
    y: Reg,
    bias: Option<Reg>,
    res: Option<Reg>,
    /// The two slice buffers in shared memory, A's part of each and B's.
    smem: Reg,
    b_smem: Reg,
    /// Bytes of one buffer (A's and B's slices).
    buf_bytes: u32,
    tid: Reg,
    /// The block's first row and column of Y.
    bm: Reg,
    bn: Reg,
}

/// The thread's accumulators: their registers, the (row, column) each holds relative to
/// the thread's first, that first row and column in the tile, and the shared addresses
/// its A and B fragments are read from.
struct Fragment {
    accs: Vec<Reg>,
    places: Vec<(u32, u32)>,
    row0: Reg,
    col0: Reg,
    a_rd: Reg,
    b_rd: Reg,
}

/// The kernel `name` for `g` with the inner product `inner`.
pub(super) fn build(name: &str, g: &Gemm, inner: Inner) -> Builder {
    let mut k = Builder::new(name);
    let ops = operands(&mut k, g, inner);
    // Slice copies: A's BM×BK and B's BK×BN elements spread over the threads.
    k.comment("slice copies: each thread's elements of A and B");
    let copies_a = copies_a(&mut k, g, inner, &ops);
    let copies_b = copies_b(&mut k, g, inner, &ops);
    // Accumulators and the thread's place in the tile.
    let frag = fragment(&mut k, inner, &ops);
    slices(&mut k, g, inner, &ops, &copies_a, &copies_b, &frag);
    epilogue(&mut k, g, &ops, &frag);
    k.ins("ret;");
    k
}

/// The parameters, the shared buffers, the thread's and block's indices, and the batch's
/// operands.
fn operands(k: &mut Builder, g: &Gemm, inner: Inner) -> Operands {
    let a = k.ptr_param("a");
    let w = k.ptr_param("w");
    let y = k.ptr_param("y");
    let bias = g.bias.then(|| k.ptr_param("bias"));
    let res = g.residual.then(|| k.ptr_param("r"));
    let buf_bytes = inner.a_bytes() + inner.b_bytes();
    let smem = k.shared("tiles", 2 * buf_bytes as usize);
    let b_smem = k.op2(Class::B32, "add.u32", smem, inner.a_bytes());
    let tid = k.op1(Class::B32, "mov.u32", "%tid.x");
    let bx = k.op1(Class::B32, "mov.u32", "%ctaid.x");
    let by = k.op1(Class::B32, "mov.u32", "%ctaid.y");
    let bz = k.op1(Class::B32, "mov.u32", "%ctaid.z");
    let bm = k.op2(Class::B32, "mul.lo.u32", by, BM);
    let bn = k.op2(Class::B32, "mul.lo.u32", bx, BN);
    // This batch's operands.
    let offset = |k: &mut Builder, base: Reg, stride: u64| -> Reg {
        if stride == 0 {
            return base;
        }
        let e = k.op2(Class::B32, "mul.lo.u32", bz, stride as u32);
        let bytes = k.op2(Class::B64, "mul.wide.u32", e, 4);
        k.op2(Class::B64, "add.s64", base, bytes)
    };
    let a = match g.a {
        ALayout::Rows { batch_stride } => offset(k, a, batch_stride),
        ALayout::Im2col(_) => a,
    };
    let w = match g.b {
        BLayout::Rows { batch_stride } | BLayout::Cols { batch_stride } => offset(k, w, batch_stride),
        BLayout::Half(_) => w,
    };
    let (y, res) = match g.y {
        YLayout::Rows { batch_stride } => (offset(k, y, batch_stride), res.map(|r| offset(k, r, batch_stride))),
        YLayout::Nchw { .. } => (y, res),
    };
    Operands { a, w, y, bias, res, smem, b_smem, buf_bytes, tid, bm, bn }
}

/// The thread's elements of A's BM×BK slice.
fn copies_a(k: &mut Builder, g: &Gemm, inner: Inner, ops: &Operands) -> Vec<Copy> {
    let threads = inner.threads();
    let mut copies_a = Vec::new();
    for j in 0..(BM * BK) / threads {
        let e = k.op2(Class::B32, "add.u32", ops.tid, j * threads);
        let ml = k.op2(Class::B32, "shr.u32", e, BK.trailing_zeros());
        let kl = k.op2(Class::B32, "and.b32", e, BK - 1);
        let row = k.op2(Class::B32, "add.u32", ops.bm, ml);
        let inside = k.op2(Class::Pred, "setp.lt.u32", row, g.m);
        let sidx = match inner {
            Inner::Ffma => k.op3(Class::B32, "mad.lo.u32", kl, inner.a_stride(), ml),
            Inner::Tf32 | Inner::Half(_) => k.op3(Class::B32, "mad.lo.u32", ml, inner.a_stride(), kl),
        };
        let dst = k.op3(Class::B32, "mad.lo.u32", sidx, 4, ops.smem);
        copies_a.push(match g.a {
            ALayout::Rows { .. } => {
                let idx = k.op3(Class::B32, "mad.lo.u32", row, g.k, kl);
                let off = k.op2(Class::B64, "mul.wide.u32", idx, 4);
                let src = k.op2(Class::B64, "add.s64", ops.a, off);
                Copy::Linear { src, inside, k: kl, dst, step: 4 }
            }
            ALayout::Im2col(c) => {
                let hw = c.oh * c.ow;
                let img = k.op2(Class::B32, "div.u32", row, hw);
                let p = k.op2(Class::B32, "rem.u32", row, hw);
                let oh = k.op2(Class::B32, "div.u32", p, c.ow);
                let ow = k.op2(Class::B32, "rem.u32", p, c.ow);
                let ih = k.op2(Class::B32, "mul.lo.s32", oh, c.stride[0]);
                let ih0 = k.op2(Class::B32, "sub.s32", ih, c.pad[0]);
                let iw = k.op2(Class::B32, "mul.lo.s32", ow, c.stride[1]);
                let iw0 = k.op2(Class::B32, "sub.s32", iw, c.pad[1]);
                let base = k.op2(Class::B32, "mul.lo.u32", img, c.c * c.h * c.w);
                Copy::Im2col { inside, base, ih0, iw0, k: kl, dst }
            }
        });
    }
    copies_a
}

/// The thread's elements of B's BK×BN slice (words of two halves for half weights).
fn copies_b(k: &mut Builder, g: &Gemm, inner: Inner, ops: &Operands) -> Vec<Copy> {
    let threads = inner.threads();
    let mut copies_b = Vec::new();
    if let BLayout::Half(_) = g.b {
        // Words of two halves along k: BN columns × BK/2 words, from [N][K'] halves.
        let kp = g.k.next_multiple_of(2);
        for j in 0..(BK / 2 * BN) / threads {
            let e = k.op2(Class::B32, "add.u32", ops.tid, j * threads);
            let nl = k.op2(Class::B32, "shr.u32", e, (BK / 2).trailing_zeros());
            let kw = k.op2(Class::B32, "and.b32", e, BK / 2 - 1);
            let kl = k.op2(Class::B32, "shl.b32", kw, 1);
            let col = k.op2(Class::B32, "add.u32", ops.bn, nl);
            let inside = k.op2(Class::Pred, "setp.lt.u32", col, g.n);
            let idx = k.op3(Class::B32, "mad.lo.u32", col, kp, kl);
            let off = k.op2(Class::B64, "mul.wide.u32", idx, 2);
            let src = k.op2(Class::B64, "add.s64", ops.w, off);
            let sidx = k.op3(Class::B32, "mad.lo.u32", nl, inner.b_stride(), kw);
            let dst = k.op3(Class::B32, "mad.lo.u32", sidx, 4, ops.b_smem);
            copies_b.push(Copy::Linear { src, inside, k: kl, dst, step: 2 });
        }
    }
    for j in 0..if matches!(g.b, BLayout::Half(_)) { 0 } else { (BK * BN) / threads } {
        let e = k.op2(Class::B32, "add.u32", ops.tid, j * threads);
        let kl = k.op2(Class::B32, "shr.u32", e, BN.trailing_zeros());
        let nl = k.op2(Class::B32, "and.b32", e, BN - 1);
        let col = k.op2(Class::B32, "add.u32", ops.bn, nl);
        let inside = k.op2(Class::Pred, "setp.lt.u32", col, g.n);
        let (idx, step) = match g.b {
            BLayout::Rows { .. } => (k.op3(Class::B32, "mad.lo.u32", kl, g.n, col), 4 * g.n),
            BLayout::Cols { .. } | BLayout::Half(_) => (k.op3(Class::B32, "mad.lo.u32", col, g.k, kl), 4),
        };
        let off = k.op2(Class::B64, "mul.wide.u32", idx, 4);
        let src = k.op2(Class::B64, "add.s64", ops.w, off);
        let sidx = k.op3(Class::B32, "mad.lo.u32", kl, inner.b_stride(), nl);
        let dst = k.op3(Class::B32, "mad.lo.u32", sidx, 4, ops.b_smem);
        copies_b.push(Copy::Linear { src, inside, k: kl, dst, step });
    }
    copies_b
}

/// Issues the copies of the slice starting at k0 into the buffer at byte offset `buf`.
fn issue(k: &mut Builder, g: &Gemm, ops: &Operands, copies_a: &[Copy], copies_b: &[Copy], k0: Reg, buf: Reg) {
    for (copies, base) in [(copies_a, ops.a), (copies_b, ops.w)] {
        for c in copies {
            let (ok, src, dst) = match *c {
                Copy::Linear { src, inside, k: kl, dst, step } => {
                    let kk = k.op2(Class::B32, "add.u32", k0, kl);
                    let in_k = k.op2(Class::Pred, "setp.lt.u32", kk, g.k);
                    let ok = k.op2(Class::Pred, "and.pred", in_k, inside);
                    let delta = k.op2(Class::B64, "mul.wide.u32", k0, step);
                    (ok, k.op2(Class::B64, "add.s64", src, delta), dst)
                }
                Copy::Im2col { inside, base: img_base, ih0, iw0, k: kl, dst } => {
                    let ALayout::Im2col(cg) = g.a else { unreachable!("im2col copies come from im2col layouts") };
                    let taps = cg.kh * cg.kw;
                    let kk = k.op2(Class::B32, "add.u32", k0, kl);
                    let in_k = k.op2(Class::Pred, "setp.lt.u32", kk, g.k);
                    let ok = k.op2(Class::Pred, "and.pred", in_k, inside);
                    let ic = k.op2(Class::B32, "div.u32", kk, taps);
                    let t = k.op2(Class::B32, "rem.u32", kk, taps);
                    let kh = k.op2(Class::B32, "div.u32", t, cg.kw);
                    let kw = k.op2(Class::B32, "rem.u32", t, cg.kw);
                    let ih = k.op3(Class::B32, "mad.lo.s32", kh, cg.dilation[0], ih0);
                    let iw = k.op3(Class::B32, "mad.lo.s32", kw, cg.dilation[1], iw0);
                    // Negative rows and columns compare as large unsigned values.
                    let in_h = k.op2(Class::Pred, "setp.lt.u32", ih, cg.h);
                    let in_w = k.op2(Class::Pred, "setp.lt.u32", iw, cg.w);
                    let ok = k.op2(Class::Pred, "and.pred", ok, in_h);
                    let ok = k.op2(Class::Pred, "and.pred", ok, in_w);
                    let row = k.op3(Class::B32, "mad.lo.u32", ic, cg.h, ih);
                    let idx = k.op3(Class::B32, "mad.lo.u32", row, cg.w, iw);
                    let idx = k.op2(Class::B32, "add.u32", idx, img_base);
                    let off = k.op2(Class::B64, "mul.wide.u32", idx, 4);
                    (ok, k.op2(Class::B64, "add.s64", ops.a, off), dst)
                }
            };
            // Outside the matrix nothing is read (size 0) from an address inside it.
            let src = k.op3(Class::B64, "selp.b64", src, base, ok);
            let size = k.op3(Class::B32, "selp.b32", 4, 0, ok);
            let dst = k.op2(Class::B32, "add.u32", dst, buf);
            k.ins(format!("cp.async.ca.shared.global [{dst}], [{src}], 4, {size};"));
        }
    }
    k.ins("cp.async.commit_group;");
}

/// The thread's accumulators and where its fragments are read.
fn fragment(k: &mut Builder, inner: Inner, ops: &Operands) -> Fragment {
    match inner {
        Inner::Ffma => {
            let ty = k.op2(Class::B32, "shr.u32", ops.tid, 4);
            let tx = k.op2(Class::B32, "and.b32", ops.tid, 15);
            let row0 = k.op2(Class::B32, "shl.b32", ty, 2);
            let col0 = k.op2(Class::B32, "shl.b32", tx, 2);
            let a_rd = k.op3(Class::B32, "mad.lo.u32", row0, 4, ops.smem);
            let b_rd = k.op3(Class::B32, "mad.lo.u32", col0, 4, ops.b_smem);
            let accs: Vec<Reg> = (0..16).map(|_| k.fconst(0.0)).collect();
            let places: Vec<(u32, u32)> = (0..16).map(|e| (e / 4, e % 4)).collect();
            Fragment { accs, places, row0, col0, a_rd, b_rd }
        }
        Inner::Tf32 | Inner::Half(_) => {
            let half = matches!(inner, Inner::Half(_));
            let warp = k.op2(Class::B32, "shr.u32", ops.tid, 5);
            let lane = k.op2(Class::B32, "and.b32", ops.tid, 31);
            let g = k.op2(Class::B32, "shr.u32", lane, 2);
            let q = k.op2(Class::B32, "and.b32", lane, 3);
            let wm = k.op2(Class::B32, "shr.u32", warp, 1);
            let wm = k.op2(Class::B32, "shl.b32", wm, 5);
            let wn = k.op2(Class::B32, "and.b32", warp, 1);
            let wn = k.op2(Class::B32, "shl.b32", wn, 5);
            let row0 = k.op2(Class::B32, "add.u32", wm, g);
            let q2 = k.op2(Class::B32, "shl.b32", q, 1);
            let col0 = k.op2(Class::B32, "add.u32", wn, q2);
            // Fragment bases: A[row0][q], W[q][wn + g] (halves: A[row0][2q], the word of
            // W's column wn + g holding k = 2q, 2q + 1).
            let ak = if half { q2 } else { q };
            let ai = k.op3(Class::B32, "mad.lo.u32", row0, inner.a_stride(), ak);
            let a_rd = k.op3(Class::B32, "mad.lo.u32", ai, 4, ops.smem);
            let bcol = k.op2(Class::B32, "add.u32", wn, g);
            let bi = if half {
                k.op3(Class::B32, "mad.lo.u32", bcol, inner.b_stride(), q)
            } else {
                k.op3(Class::B32, "mad.lo.u32", q, inner.b_stride(), bcol)
            };
            let b_rd = k.op3(Class::B32, "mad.lo.u32", bi, 4, ops.b_smem);
            let accs: Vec<Reg> = (0..32).map(|_| k.fconst(0.0)).collect();
            // Tile (i, j), register r: row i·16 + 8·(r/2), column j·8 + r%2.
            let places: Vec<(u32, u32)> =
                (0..32).map(|e| ((e / 16) * 16 + 8 * ((e % 4) / 2), ((e / 4) % 4) * 8 + e % 2)).collect();
            Fragment { accs, places, row0, col0, a_rd, b_rd }
        }
    }
}

/// The loop over k slices, double-buffered: the next slice's copies issued, this one's
/// awaited, its products accumulated.
#[allow(clippy::too_many_arguments)]
fn slices(
    k: &mut Builder,
    g: &Gemm,
    inner: Inner,
    ops: &Operands,
    copies_a: &[Copy],
    copies_b: &[Copy],
    frag: &Fragment,
) {
    let tiles = g.k.div_ceil(BK);
    let t = k.op1(Class::B32, "mov.u32", 0);
    let zero = k.op1(Class::B32, "mov.u32", 0);
    issue(k, g, ops, copies_a, copies_b, zero, zero);
    let (head, last, sync) = (k.label("slice"), k.label("last_slice"), k.label("slice_ready"));
    k.place(&head);
    let t1 = k.op2(Class::B32, "add.u32", t, 1);
    let cur_sel = k.op2(Class::B32, "and.b32", t, 1);
    let cur = k.op2(Class::B32, "mul.lo.u32", cur_sel, ops.buf_bytes);
    let more = k.op2(Class::Pred, "setp.lt.u32", t1, tiles);
    k.ins(format!("@!{more} bra {last};"));
    let nxt_sel = k.op2(Class::B32, "and.b32", t1, 1);
    let nxt = k.op2(Class::B32, "mul.lo.u32", nxt_sel, ops.buf_bytes);
    let k0 = k.op2(Class::B32, "mul.lo.u32", t1, BK);
    issue(k, g, ops, copies_a, copies_b, k0, nxt);
    k.ins("cp.async.wait_group 1;");
    k.ins(format!("bra.uni {sync};"));
    k.place(&last);
    k.ins("cp.async.wait_group 0;");
    k.place(&sync);
    k.ins("bar.sync 0;");
    let a_cur = k.op2(Class::B32, "add.u32", frag.a_rd, cur);
    let b_cur = k.op2(Class::B32, "add.u32", frag.b_rd, cur);
    match inner {
        Inner::Ffma => ffma(k, &frag.accs, a_cur, b_cur),
        Inner::Tf32 => tf32(k, inner, &frag.accs, a_cur, b_cur),
        Inner::Half(h) => half(k, inner, h, &frag.accs, a_cur, b_cur),
    }
    k.ins("bar.sync 0;");
    k.ins(format!("mov.u32 {t}, {t1};"));
    let again = k.op2(Class::Pred, "setp.lt.u32", t, tiles);
    k.ins(format!("@{again} bra {head};"));
}

/// Bias, residual, activation, one store per element inside Y.
fn epilogue(k: &mut Builder, g: &Gemm, ops: &Operands, frag: &Fragment) {
    k.comment("epilogue");
    let row_base = k.op2(Class::B32, "add.u32", ops.bm, frag.row0);
    let col_base = k.op2(Class::B32, "add.u32", ops.bn, frag.col0);
    let act = activation_program(g.activation);
    for (acc, &(dr, dc)) in frag.accs.iter().zip(&frag.places) {
        let skip = k.label("skip");
        let row = k.op2(Class::B32, "add.u32", row_base, dr);
        let col = k.op2(Class::B32, "add.u32", col_base, dc);
        let out_r = k.op2(Class::Pred, "setp.ge.u32", row, g.m);
        k.ins(format!("@{out_r} bra {skip};"));
        let out_c = k.op2(Class::Pred, "setp.ge.u32", col, g.n);
        k.ins(format!("@{out_c} bra {skip};"));
        let mut v = *acc;
        if let Some(bp) = ops.bias {
            let off = k.op2(Class::B64, "mul.wide.u32", col, 4);
            let addr = k.op2(Class::B64, "add.s64", bp, off);
            let bv = k.reg(Class::F32);
            k.ins(format!("ld.global.nc.f32 {bv}, [{addr}];"));
            v = k.op2(Class::F32, "add.rn.f32", v, bv);
        }
        let idx = match g.y {
            YLayout::Rows { .. } => k.op3(Class::B32, "mad.lo.u32", row, g.n, col),
            YLayout::Nchw { hw } => {
                let img = k.op2(Class::B32, "div.u32", row, hw);
                let p = k.op2(Class::B32, "rem.u32", row, hw);
                let ch = k.op3(Class::B32, "mad.lo.u32", img, g.n, col);
                k.op3(Class::B32, "mad.lo.u32", ch, hw, p)
            }
        };
        let off = k.op2(Class::B64, "mul.wide.u32", idx, 4);
        if let Some(rp) = ops.res {
            let addr = k.op2(Class::B64, "add.s64", rp, off);
            let rv = k.reg(Class::F32);
            k.ins(format!("ld.global.f32 {rv}, [{addr}];"));
            v = k.op2(Class::F32, "add.rn.f32", v, rv);
        }
        let v = program(k, &act, &[v]);
        let addr = k.op2(Class::B64, "add.s64", ops.y, off);
        k.ins(format!("st.global.f32 [{addr}], {v};"));
        k.place(&skip);
    }
}

/// One slice's products on FFMA: per k, four values of A and four of B from shared memory
/// (vector loads), sixteen multiply-adds.
fn ffma(k: &mut Builder, accs: &[Reg], a_cur: Reg, b_cur: Reg) {
    for kk in 0..BK {
        let av: Vec<Reg> = (0..4).map(|_| k.reg(Class::F32)).collect();
        let bv: Vec<Reg> = (0..4).map(|_| k.reg(Class::F32)).collect();
        let list = |v: &[Reg]| v.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ");
        k.ins(format!("ld.shared.v4.f32 {{{}}}, [{a_cur}+{}];", list(&av), 4 * kk * BM));
        k.ins(format!("ld.shared.v4.f32 {{{}}}, [{b_cur}+{}];", list(&bv), 4 * kk * BN));
        for (i, a) in av.iter().enumerate() {
            for (j, b) in bv.iter().enumerate() {
                let c = accs[i * 4 + j];
                k.ins(format!("fma.rn.f32 {c}, {a}, {b}, {c};"));
            }
        }
    }
}

/// One slice's products on TF32 tensor cores: per eight of k, the warp's A and B fragments
/// rounded to TF32 as they leave shared memory, and 2×4 `mma.sync.m16n8k8`.
fn tf32(k: &mut Builder, inner: Inner, accs: &[Reg], a_cur: Reg, b_cur: Reg) {
    let (sa, sb) = (inner.a_stride(), inner.b_stride());
    for kk in (0..BK).step_by(8) {
        let mut afr = Vec::new();
        for i in 0..2 {
            let base = 4 * (i * 16 * sa + kk);
            let offs = [base, base + 4 * 8 * sa, base + 16, base + 4 * 8 * sa + 16];
            let regs: Vec<Reg> = offs
                .iter()
                .map(|o| {
                    let f = k.reg(Class::F32);
                    k.ins(format!("ld.shared.f32 {f}, [{a_cur}+{o}];"));
                    k.op1(Class::B32, "cvt.rna.tf32.f32", f)
                })
                .collect();
            afr.push(regs);
        }
        let mut bfr = Vec::new();
        for j in 0..4 {
            let base = 4 * (kk * sb + j * 8);
            let regs: Vec<Reg> = [base, base + 4 * 4 * sb]
                .iter()
                .map(|o| {
                    let f = k.reg(Class::F32);
                    k.ins(format!("ld.shared.f32 {f}, [{b_cur}+{o}];"));
                    k.op1(Class::B32, "cvt.rna.tf32.f32", f)
                })
                .collect();
            bfr.push(regs);
        }
        let list = |v: &[Reg]| v.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ");
        for (i, a) in afr.iter().enumerate() {
            for (j, b) in bfr.iter().enumerate() {
                let c = &accs[(i * 4 + j) * 4..(i * 4 + j) * 4 + 4];
                k.ins(format!(
                    "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {{{}}}, {{{}}}, {{{}}}, {{{}}};",
                    list(c),
                    list(a),
                    list(b),
                    list(c)
                ));
            }
        }
    }
}

/// One slice's products on f16 / bf16 tensor cores: A's fragments converted to pairs of
/// halves, B's read as stored, and 2×4 `mma.sync.m16n8k16` over the slice's 16 of k.
fn half(k: &mut Builder, inner: Inner, h: crate::Half, accs: &[Reg], a_cur: Reg, b_cur: Reg) {
    let (sa, sb) = (inner.a_stride(), inner.b_stride());
    let list = |v: &[Reg]| v.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ");
    let mut afr = Vec::new();
    for i in 0..2 {
        let base = 4 * (i * 16 * sa);
        // a0a1 (row g, k 2q..), a2a3 (row g + 8), a4a5 (k + 8), a6a7 (both).
        let offs = [base, base + 4 * 8 * sa, base + 32, base + 4 * 8 * sa + 32];
        let regs: Vec<Reg> = offs
            .iter()
            .map(|o| {
                let (x0, x1) = (k.reg(Class::F32), k.reg(Class::F32));
                k.ins(format!("ld.shared.v2.f32 {{{x0}, {x1}}}, [{a_cur}+{o}];"));
                k.op2(Class::B32, &format!("cvt.rn.{}x2.f32", h.ptx()), x1, x0)
            })
            .collect();
        afr.push(regs);
    }
    let mut bfr = Vec::new();
    for j in 0..4 {
        let base = 4 * (j * 8 * sb);
        let regs: Vec<Reg> = [base, base + 16]
            .iter()
            .map(|o| {
                let r = k.reg(Class::B32);
                k.ins(format!("ld.shared.b32 {r}, [{b_cur}+{o}];"));
                r
            })
            .collect();
        bfr.push(regs);
    }
    for (i, a) in afr.iter().enumerate() {
        for (j, b) in bfr.iter().enumerate() {
            let c = &accs[(i * 4 + j) * 4..(i * 4 + j) * 4 + 4];
            k.ins(format!(
                "mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {{{}}}, {{{}}}, {{{}}}, {{{}}};",
                list(c),
                list(a),
                list(b),
                list(c),
                t = h.ptx()
            ));
        }
    }
}
