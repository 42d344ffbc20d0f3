//! One `.aim` file for every target (`aim::package`): a package of every level loads, under
//! each ISA cap this machine has, the program of that level, and runs it bit for bit as the
//! single-target file compiled for the level does; the programs share their weights; a
//! package with no program for this CPU is a clear error. Runs under QEMU too, where the
//! AArch64 program is the one picked.

mod common;

use aim::{Model, Options, Tensor};
use common::*;

/// Convolutions (a 3×3 one, which takes the Winograd or direct kernel, and a 1×1) and a
/// dense layer, with weights large enough to land in the data section, as ONNX.
fn net(dir: &std::path::Path) -> std::path::PathBuf {
    let mut r = Rng(0x5eed);
    let list = |v: Vec<f32>| v.iter().map(|x| format!("{x:.4}")).collect::<Vec<_>>().join(", ");
    let text = format!(
        "opset 17\ngraph \"g\" {{\n  input %x: f32[1,8,12,12]\n  init %w1 = f32[16,8,3,3] [{}]\n  init %b1 = f32[16] [{}]\n  init %w2 = f32[24,16,1,1] [{}]\n  init %wd = f32[24,10] [{}]\n  %c1 = Conv(%x, %w1, %b1) {{pads=[1, 1, 1, 1]}}  # c1\n  %r1 = Relu(%c1)  # r1\n  %c2 = Conv(%r1, %w2) {{strides=[2, 2]}}  # c2\n  %p = GlobalAveragePool(%c2)  # gap\n  %f = Flatten(%p)  # flat\n  %y = MatMul(%f, %wd)  # fc\n  output %y: f32[1,10]\n}}\n",
        list(r.values(16 * 8 * 9)),
        list(r.values(16)),
        list(r.values(24 * 16)),
        list(r.values(24 * 10)),
    );
    let p = dir.join("net.onnx");
    std::fs::write(&p, aim_onnx::export_bytes(&aim_ir::text::parse_model(&text).unwrap())).unwrap();
    p
}

/// The ISA caps to try here, with the level of the program each should pick.
fn caps() -> Vec<(&'static str, &'static str)> {
    #[cfg(target_arch = "x86_64")]
    {
        use aim_kernels::gemm::{Isa, IsaKind};
        let mut c = vec![("baseline", "baseline"), ("x86-64-v2", "x86-64-v2")];
        if Isa::new(IsaKind::Avx2).is_some() {
            c.push(("x86-64-v3", "x86-64-v3"));
        }
        let best = if Isa::new(IsaKind::Avx512).is_some() { "x86-64-v4" } else { c.last().unwrap().1 };
        c.push(("native", best));
        c
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        vec![("native", "aarch64-neon")]
    }
}

fn run(m: &Model) -> Vec<u8> {
    let mut r = Rng(7);
    let x = Tensor::from_slice(&[1, 8, 12, 12], &r.values(8 * 144));
    m.run(vec![("x".into(), x)]).unwrap()[0].1.bytes().to_vec()
}

#[test]
fn each_cap_loads_its_level_and_runs_as_the_single_target_file() {
    let d = tempdir("package-levels");
    let onnx = net(&d);
    let all = d.join("all.aim");
    let s = aim::package::compile_package(&onnx, &all, "all", &Options::default()).unwrap();
    let levels: Vec<&str> = s.programs.iter().map(|p| p.level.as_str()).collect();
    assert_eq!(levels, ["baseline", "x86-64-v2", "x86-64-v3", "x86-64-v4", "aarch64-neon"]);
    // The optimizer leaves every weight in one layout for every level: all are shared.
    let first = s.programs[0].bytes.read;
    assert!(first > 16 * 8 * 9 * 4, "{s:?}");
    assert!(s.programs.iter().all(|p| p.bytes.read == first && p.bytes.own == 0), "{s:?}");
    for (cap, level) in caps() {
        let opts = Options { cpu: cap.to_string(), ..Options::default() };
        let (headers, chosen) = aim::package::programs(&all, cap).unwrap();
        assert_eq!(headers[chosen.unwrap()].target["level"], level, "--cpu {cap}");
        let single = d.join(format!("{cap}.aim"));
        let one = aim::compiled::compile_to_file(&onnx, &single, &opts).unwrap();
        assert_eq!(one.level, level);
        let want = run(&Model::load_with_options(&single, &opts).unwrap());
        assert_eq!(run(&Model::load_with_options(&all, &opts).unwrap()), want, "--cpu {cap}: bit for bit");
    }
}

#[test]
fn a_package_without_a_program_for_this_cpu_is_a_clear_error() {
    let d = tempdir("package-none");
    let onnx = net(&d);
    let two = d.join("two.aim");
    aim::package::compile_package(&onnx, &two, "x86-64-v3,aarch64-unknown-linux-gnu", &Options::default()).unwrap();
    // Capped below both programs' levels on x86-64; not NEON on AArch64.
    let cap = if cfg!(target_arch = "x86_64") { "x86-64-v2" } else { "baseline" };
    let opts = Options { cpu: cap.to_string(), ..Options::default() };
    let e = Model::load_with_options(&two, &opts).err().expect("refused").to_string();
    for want in ["two.aim", "none of its programs (x86_64 x86-64-v3, aarch64 aarch64-neon) runs on this CPU", cap] {
        assert!(e.contains(want), "wanted {want:?} in: {e}");
    }
    let bad = aim::package::compile_package(&onnx, &two, "x86-64-v3,riscv64", &Options::default());
    assert!(bad.expect_err("refused").to_string().contains("'riscv64' is not a target"));
}
