#!/usr/bin/env bash
# The whole test suite: unit and snapshot tests, the fuzz corpus replay, ONNX node
# conformance (cases regenerated from the pinned onnx package), and the benchmark models
# compared against ONNX Runtime. Needs Rust, Python 3 with pip; installs the Python
# packages it uses (tests/requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt

echo "== generating ONNX node test cases (onnx $(python3 -c 'import onnx; print(onnx.__version__)'))"
python3 tests/conformance/gen_onnx_cases.py target/onnx-cases
echo "== generating the benchmark models"
python3 tests/models/make_models.py target/models

cargo build --release --locked

echo "== benchmark models: aim against ONNX Runtime (reference and cpu backends)"
python3 tests/compare_ort.py target/release/aim target/models mlp mlp_b64 mobilenetv2 bert_l6 resnet50 --backend reference
python3 tests/compare_ort.py target/release/aim target/models mlp mlp_b64 mobilenetv2 bert_l6 resnet50 --backend cpu

echo "== unit, snapshot, fuzz-corpus and conformance tests"
AIM_ONNX_CASES="$PWD/target/onnx-cases" AIM_REQUIRE_CONFORMANCE=1 cargo test --workspace --release --locked
