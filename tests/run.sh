#!/usr/bin/env bash
# The whole test suite: unit and snapshot tests, the fuzz corpus replay, ONNX node
# conformance (cases regenerated from the pinned onnx package), and the benchmark models
# compared against ONNX Runtime, the `aim explore` page in headless Chromium, and the
# AArch64 build under QEMU. Needs Rust (rustup), Python 3 with pip and apt-get; installs the
# Python packages it uses (tests/requirements.txt), Debian's chromium, and the AArch64
# toolchain and qemu-user (tests/cross_aarch64.sh) where they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each section starts with the seconds elapsed so far, so a slow CI run shows where it went.
section() { echo "== [${SECONDS}s] $*"; }

# `tests/run.sh quick`: what to run before a commit (a few minutes after a build): formatting,
# clippy, the unit tests and pass filetests of the core crates, the library's fast
# integration tests, and three benchmark models against ONNX Runtime. CI runs everything.
if [ "${1:-}" = "quick" ]; then
    section "quick: formatting"
    cargo fmt --all -- --check
    (cd fuzz && cargo fmt -- --check)
    section "quick: release build and clippy (warnings are errors)"
    cargo build --release --locked
    cargo clippy --workspace --release --all-targets --locked -- -D warnings
    section "quick: unit tests and pass filetests (aim-ir, aim-kernels, aim-runtime, aim-onnx, aim-compiler, aim-cuda)"
    cargo test --release --locked -p aim-ir -p aim-kernels -p aim-runtime -p aim-onnx -p aim-compiler -p aim-cuda
    if [ ! -f target/models/mobilenetv2.onnx ]; then
        python3 -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt
        python3 tests/models/make_models.py target/models
    fi
    section "quick: the library's unit tests, the command line, levels, custom ops, logging, .aim files, explore snapshots"
    # One invocation for both packages: the library is then built once, with the
    # command line's features.
    AIM_MODELS="$PWD/target/models" cargo test --release --locked -p aim -p aim-cli --lib --test doc_paths \
        --test cli --test opt_levels --test custom_ops --test logging --test aim_files --test explore
    section "quick: three models against ONNX Runtime"
    python3 tests/compare_ort.py target/release/aim target/models mlp mobilenetv2 bert_l6 --backend cpu
    section "quick: done"
    exit 0
fi

python3 -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt
# ptxas (from NVIDIA's PyPI package, no CUDA toolkit or GPU needed) checks every PTX kernel
# the cuda backend generates, for sm_80 and sm_90 (cuda/src/tests.rs).
python3 -m pip install --quiet --disable-pip-version-check nvidia-cuda-nvcc-cu12
PTXAS="$(python3 -c 'import nvidia.cuda_nvcc, os; print(os.path.join(list(nvidia.cuda_nvcc.__path__)[0], "bin", "ptxas"))')"
export PTXAS
if ! command -v chromium >/dev/null; then
    section "installing chromium (for the explore page test)"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi

section "generating ONNX node test cases (onnx $(python3 -c 'import onnx; print(onnx.__version__)'))"
python3 tests/conformance/gen_onnx_cases.py target/onnx-cases
section "generating the benchmark models"
python3 tests/models/make_models.py target/models

section "formatting (cargo fmt --check)"
cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
cargo fmt --all -- --check
(cd fuzz && cargo fmt -- --check)

section "feature sets: the builds below share every dependency they have in common (tools/workspace-hack)"
python3 tests/feature_sets.py
section "release build"
cargo build --release --locked
section "clippy (warnings are errors)"
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
cargo clippy --workspace --release --all-targets --locked -- -D warnings

section "benchmark models: aim against ONNX Runtime (reference and cpu backends)"
MODELS="mlp mlp_b64 mobilenetv2 bert_l6 resnet50 yolo_like dbnet_like crnn_like crnn_unrolled vad_like mobilenetv3 bert_hf gpt2_step"
python3 tests/compare_ort.py target/release/aim target/models $MODELS --backend reference
python3 tests/compare_ort.py target/release/aim target/models $MODELS --backend cpu
echo "   and at -O1 and -O2 (fewer passes: the same answers)"
python3 tests/compare_ort.py target/release/aim target/models $MODELS --backend cpu --opt-level 1
python3 tests/compare_ort.py target/release/aim target/models $MODELS --backend cpu --opt-level 2
section "quantized models (ONNX Runtime's quantize_static QDQ and QOperator, quantize_dynamic): aim within ORT's own spread"
QUANT="resnet50_qdq mobilenetv2_qdq resnet50_qop mobilenetv2_qop bert_l6_dyn bert_l6_qdq dq_int4"
python3 tests/compare_ort.py target/release/aim target/models $QUANT --backend reference --quantized
python3 tests/compare_ort.py target/release/aim target/models $QUANT --backend cpu --quantized
# quantize_dynamic on a CNN (ConvInteger): its integer sums are exact on aim's integer kernels
# (VNNI's byte one, AVX2's 16-bit one) and in its f32 convolutions elsewhere, so the cpu backend
# matches ORT to f32 rounding (ORT's optimised and unoptimised runs agree
# exactly, which leaves --quantized no spread to measure against). The reference backend's f64
# arithmetic flips roundings of the per-run activation quantization, so it is not compared here.
python3 tests/compare_ort.py target/release/aim target/models mobilenetv2_dyn --backend cpu
QOPS="ms_qlinear ms_qgemm ms_dynamic_matmul ms_matmul_nbits ms_dynamic_lstm ms_qattention ms_qembed_ln"
python3 tests/compare_ort.py target/release/aim target/models $QOPS --backend reference --one-quantum
python3 tests/compare_ort.py target/release/aim target/models $QOPS --backend cpu --one-quantum
section "half-precision models (f16 weights and activations): computed in f32 by the cpu backend, per op in f16 by the reference"
python3 tests/compare_ort.py target/release/aim target/models mobilenetv2_f16 bert_l6_f16 --backend reference --half
python3 tests/compare_ort.py target/release/aim target/models mobilenetv2_f16 bert_l6_f16 --backend cpu --half
section "aim quantize: static (each calibration method) and dynamic, run by ONNX Runtime and by aim's integer kernels"
python3 tests/aim_quantize.py target/release/aim target/models
section "com.microsoft ops (ONNX Runtime's transformer optimizer output and one model per op form)"
CONTRIB="bert_hf_ort gpt2_step_ort ms_gelu ms_bias_gelu ms_skip_ln ms_embed_ln ms_attention ms_attention_causal
  ms_attention_sizes ms_mha ms_mha_causal ms_gqa ms_gqa_rotary ms_rotary ms_fused_conv ms_fused_matmul"
python3 tests/compare_ort.py target/release/aim target/models $CONTRIB --backend reference
python3 tests/compare_ort.py target/release/aim target/models $CONTRIB --backend cpu
echo "   decoders as onnxruntime-genai writes them at int4 (MatMulNBits, GroupQueryAttention, SimplifiedLayerNormalization,"
echo "   GatherBlockQuantized): equal to ORT at accuracy level 0, within ORT's own level 0-vs-4 spread at level 4"
GENAI="genai_int4_l0 genai_int4_tied_l0"
python3 tests/compare_ort.py target/release/aim target/models $GENAI --backend reference
python3 tests/compare_ort.py target/release/aim target/models $GENAI --backend cpu
for m in genai_int4 genai_int4_tied; do
  python3 tests/bench/nbits_spread.py target/release/aim target/models/$m.onnx target/models/$m.inputs.npz
done

section "aim serve: KServe v2 with Triton's clients (tritonclient[http,grpc]): metadata, JSON and binary inference equal"
echo "   to aim run, malformed requests, 16 concurrent clients with dynamic batching, SIGTERM in flight, deploy.yml"
python3 tests/serve.py target/release/aim target/models

section "the C API: examples/c/run_model.c built with gcc against libaim.so and libaim_runtime.so; .onnx, .aim and"
echo "   compiled shared objects (aim compile --target), outputs identical to aim run"
cargo build --release --locked -p aim-capi -p aim-runtime-capi
python3 tests/c_api.py target/release/aim target/release target/models resnet50 mobilenetv2 bert_l6 mlp yolo_like dbnet_like --threads 2

section "the Python package: pip install ./python in a fresh virtualenv, pytest against ONNX Runtime"
rm -rf target/pyenv
python3 -m venv target/pyenv
target/pyenv/bin/python -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt pytest ./python
(cd target && AIM_MODELS="$PWD/models" pyenv/bin/python -c "import aimc; print('aimc', aimc.__version__, 'from', aimc.__file__)" \
    && AIM_MODELS="$PWD/models" pyenv/bin/python -m pytest -q ../python/tests)

section "aim explore: the HTML page in headless Chromium (hover, highlight, search, screenshot)"
python3 tests/explore_html.py target/release/aim target/models/mobilenetv2.onnx target/explore

section "unit, snapshot, fuzz-corpus, explore and conformance tests"
AIM_ONNX_CASES="$PWD/target/onnx-cases" AIM_MODELS="$PWD/target/models" AIM_REQUIRE_CONFORMANCE=1 AIM_REQUIRE_PTXAS=1 cargo test --workspace --release --locked

section "the thread pool's handshake under loom's memory model"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p aim-loom-check --release --locked

section "the AArch64 build (NEON) under QEMU: unit, conformance, differential and fuzz-corpus tests, and"
echo "   shared objects cross-compiled by aim compile --target aarch64-unknown-linux-gnu run from C"
bash tests/cross_aarch64.sh "$PWD/target/onnx-cases" "$PWD/target/models"

section "done"
