//! The interpreter turns out-of-bounds accesses, misalignment and threads waiting for each
//! other forever into errors, and runs shuffles and barriers as the hardware orders them.

use aim_ptx_interp::{Arg, ExecError, Launch, Memory, Module};

const HEADER: &str = ".version 7.8\n.target sm_80\n.address_size 64\n";

fn module(body: &str) -> Module {
    Module::parse(&format!("{HEADER}\n{body}")).unwrap()
}

/// y[tid + offset] = tid, for a buffer of 32 floats.
const STORE: &str = "
.visible .entry store(
	.param .u64 y,
	.param .u32 offset
)
{
	.reg .b32 %r<4>;
	.reg .b64 %rd<4>;
	.reg .f32 %f<2>;
	ld.param.u64 %rd0, [y];
	ld.param.u32 %r0, [offset];
	mov.u32 %r1, %tid.x;
	add.u32 %r2, %r1, %r0;
	mul.wide.u32 %rd1, %r2, 4;
	add.s64 %rd2, %rd0, %rd1;
	cvt.rn.f32.u32 %f0, %r1;
	st.global.f32 [%rd2], %f0;
	ret;
}
";

#[test]
fn stores_inside_the_buffer_land_and_outside_fail() {
    let m = module(STORE);
    let mut mem = Memory::new();
    let y = mem.alloc(32 * 4);
    let one_warp = Launch { grid: [1, 1, 1], block: [32, 1, 1] };
    m.launch("store", one_warp, &[Arg::U64(y), Arg::U32(0)], &mut mem).unwrap();
    assert_eq!(mem.download(y), (0..32).map(|i| i as f32).collect::<Vec<_>>());
    let e = m.launch("store", one_warp, &[Arg::U64(y), Arg::U32(1)], &mut mem).unwrap_err();
    assert!(matches!(&e, ExecError::Fault { thread: [31, 0, 0], .. }), "{e}");
    assert!(e.to_string().contains("outside every buffer"), "{e}");
    let e = m.launch("store", one_warp, &[Arg::U64(y + 2), Arg::U32(0)], &mut mem).unwrap_err();
    assert!(e.to_string().contains("misaligned"), "{e}");
    let e = m.launch("store", one_warp, &[Arg::U64(y)], &mut mem).unwrap_err();
    assert!(matches!(e, ExecError::Args { .. }), "{e}");
}

/// Lane sums by butterfly shuffles; thread 0 of each warp writes them to shared memory,
/// and after a barrier thread 0 adds the warps' sums.
const SUM: &str = "
.visible .entry sum(
	.param .u64 y
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<8>;
	.reg .b64 %rd<2>;
	.reg .f32 %f<8>;
	.shared .align 16 .b8 part[64];
	ld.param.u64 %rd0, [y];
	mov.u32 %r0, %tid.x;
	cvt.rn.f32.u32 %f0, %r0;
	shfl.sync.bfly.b32 %f1, %f0, 16, 31, -1;
	add.f32 %f0, %f0, %f1;
	shfl.sync.bfly.b32 %f1, %f0, 8, 31, -1;
	add.f32 %f0, %f0, %f1;
	shfl.sync.bfly.b32 %f1, %f0, 4, 31, -1;
	add.f32 %f0, %f0, %f1;
	shfl.sync.bfly.b32 %f1, %f0, 2, 31, -1;
	add.f32 %f0, %f0, %f1;
	shfl.sync.bfly.b32 %f1, %f0, 1, 31, -1;
	add.f32 %f0, %f0, %f1;
	and.b32 %r1, %r0, 31;
	shr.u32 %r2, %r0, 5;
	mov.u32 %r3, part;
	mad.lo.u32 %r4, %r2, 4, %r3;
	setp.eq.u32 %p0, %r1, 0;
	@%p0 st.shared.f32 [%r4], %f0;
	bar.sync 0;
	setp.ne.u32 %p1, %r0, 0;
	@%p1 bra $L_end;
	ld.shared.v4.f32 {%f2, %f3, %f4, %f5}, [%r3];
	add.f32 %f2, %f2, %f3;
	add.f32 %f2, %f2, %f4;
	add.f32 %f2, %f2, %f5;
	st.global.f32 [%rd0], %f2;
$L_end:
	ret;
}
";

#[test]
fn shuffles_and_barriers_combine_four_warps() {
    let m = module(SUM);
    let mut mem = Memory::new();
    let y = mem.alloc(4);
    m.launch("sum", Launch { grid: [1, 1, 1], block: [128, 1, 1] }, &[Arg::U64(y)], &mut mem).unwrap();
    assert_eq!(mem.download(y), vec![(0..128).sum::<u32>() as f32]);
}

/// Lane 0 waits at a barrier while the others wait at a shuffle: neither can go on.
const STUCK: &str = "
.visible .entry stuck(
)
{
	.reg .pred %p<1>;
	.reg .b32 %r<3>;
	mov.u32 %r0, %tid.x;
	setp.eq.u32 %p0, %r0, 0;
	@%p0 bra $L_bar;
	shfl.sync.bfly.b32 %r1, %r0, 1, 31, -1;
$L_bar:
	bar.sync 0;
	ret;
}
";

#[test]
fn threads_waiting_for_each_other_forever_are_an_error() {
    let m = module(STUCK);
    let e = m.launch("stuck", Launch { grid: [1, 1, 1], block: [32, 1, 1] }, &[], &mut Memory::new()).unwrap_err();
    assert!(matches!(e, ExecError::Stuck { .. }), "{e}");
}

#[test]
fn instructions_outside_the_subset_are_parse_errors() {
    let bad = STORE.replace("cvt.rn.f32.u32 %f0, %r1;", "tex.2d.v4.f32.f32 %f0, [%rd0];");
    let e = Module::parse(&format!("{HEADER}\n{bad}")).unwrap_err();
    assert!(e.to_string().contains("unsupported instruction 'tex.2d.v4.f32.f32'"), "{e}");
}
