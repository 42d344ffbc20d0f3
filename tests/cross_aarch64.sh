#!/usr/bin/env bash
# The AArch64 build (NEON microkernels, portable kernels, Cranelift's AArch64 backend) under
# user-mode QEMU: the kernel, runtime and compiler unit tests, ONNX conformance on both
# backends, the differential tests (under the NEON and baseline caps), the fuzz corpus and
# the quantized models on the integer kernels (NEON `sdot`: QEMU's CPU has FEAT_DotProd), and
# a package of every target (`aim compile --target all`) picking and running its AArch64 program;
# then, given MODELS_DIR, shared objects cross-compiled on this machine by `aim compile
# --target aarch64-unknown-linux-gnu` (target/release/aim) run from the C example against
# the AArch64 libaim_runtime.so. Installs the AArch64 Rust standard library (rustup),
# Debian's cross linker and qemu-user where they are missing.
# Usage: bash tests/cross_aarch64.sh [ONNX_CASES_DIR [MODELS_DIR]]
set -euo pipefail
cd "$(dirname "$0")/.."
cases="${1:-$PWD/target/onnx-cases}"
models="${2:-}"

rustup target list --installed | grep -qx aarch64-unknown-linux-gnu || rustup target add aarch64-unknown-linux-gnu
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null
fi
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
target=(--release --locked --target aarch64-unknown-linux-gnu)
echo "== [${SECONDS}s] aarch64: unit tests of the libraries, conformance, differential, fuzz corpus"
# One cargo command, so that its compilations overlap. Without aim's default features: the
# tests need neither `aim serve` (tokio, axum, tonic would be compiled for AArch64 for
# nothing), the cuda runtime, nor code generation for x86-64 (`cross`: Cranelift's largest
# backend). aim-ir's unit tests (the IR's text, shapes and checks) do not depend on the
# architecture and run in the x86-64 build only. The cuda backend's kernels in the PTX interpreter are the
# same arithmetic on any host: the x86-64 run covers them, and under QEMU they would take
# minutes more.
AIM_SKIP_PTX_INTERPRETER=1 AIM_ONNX_CASES="$cases" AIM_REQUIRE_CONFORMANCE=1 \
    cargo test "${target[@]}" --no-default-features -p aim-kernels -p aim-runtime -p aim-onnx -p aim-compiler -p aim \
    --lib --test kernels --test conformance --test differential --test fuzz_corpus --test quantized_kernels --test package
if [ -n "$models" ]; then
    echo "== [${SECONDS}s] aarch64 shared objects from C"
    cargo build "${target[@]}" -p aim-runtime-capi
    python3 tests/c_api.py target/release/aim target/aarch64-unknown-linux-gnu/release "$models" \
        resnet50 mobilenetv2 bert_l6 mlp --threads 2 --cross aarch64
fi
