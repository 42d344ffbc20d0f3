#!/usr/bin/env python3
"""Regenerate the ONNX backend *node* test cases from the pinned onnx package.

Usage: gen_onnx_cases.py OUT_DIR        (needs: pip install onnx==1.23.2 numpy)

Writes OUT_DIR/<case>/model.onnx and OUT_DIR/<case>/test_data_set_N/{input,output}_K.pb,
the layout `aim test-onnx` reads (the same as onnx's own `backend-test-tools generate-data`).
The cases are produced by `onnx.backend.test.case.node.collect_testcases()`, so the set is
exactly the one of the installed onnx version; the script refuses any other version.
"""
import os
import shutil
import sys
import warnings

import onnx
from onnx import TensorProto, numpy_helper
from onnx.backend.test.case.node import collect_testcases

PINNED = "1.23.2"


def write_value(path, value, value_info):
    """Write one input or output the way onnx's generate-data does."""
    t = value_info.type
    if t.HasField("sequence_type"):
        proto = numpy_helper.from_list(value, value_info.name)
    elif t.HasField("optional_type"):
        proto = numpy_helper.from_optional(value, value_info.name)
    elif t.HasField("map_type"):
        proto = numpy_helper.from_dict(value, value_info.name)
    elif isinstance(value, TensorProto):
        proto = value
    else:
        proto = numpy_helper.from_array(value, value_info.name)
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    if onnx.__version__ != PINNED:
        sys.exit(f"onnx {onnx.__version__} is installed; the case list is pinned to {PINNED}")
    out = sys.argv[1]
    warnings.simplefilter("ignore")
    cases = collect_testcases()
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    for case in cases:
        case_dir = os.path.join(out, case.name)
        os.makedirs(case_dir)
        with open(os.path.join(case_dir, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        graph = case.model.graph
        for i, (inputs, outputs) in enumerate(case.data_sets):
            ds = os.path.join(case_dir, f"test_data_set_{i}")
            os.makedirs(ds)
            for j, value in enumerate(inputs):
                write_value(os.path.join(ds, f"input_{j}.pb"), value, graph.input[j])
            for j, value in enumerate(outputs):
                write_value(os.path.join(ds, f"output_{j}.pb"), value, graph.output[j])
    print(f"wrote {len(cases)} node cases to {out}")


if __name__ == "__main__":
    main()
