#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# scripts/onnx/check_fixtures.py: reads every ONNX `Attention` fixture back and checks it:
# each safetensors file parses (strict layout), inputs.safetensors holds the tensors and
# dtypes case.json lists, expected.safetensors holds exactly the outputs case.json names with
# the operator's shapes, recomputing them with scripts/onnx/reference.py gives the same
# float32 values bit for bit, a refusal case has no expected outputs, the reference refuses
# it too and ONNX Runtime's error text is recorded (or that ONNX Runtime accepts it), and
# every ONNX Runtime output file present parses with the shapes of the operator's outputs.
#
# Usage: /usr/bin/python3 scripts/onnx/check_fixtures.py [tests/fixtures/onnx]

import glob
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402
import safetensors_np as st  # noqa: E402


def output_shapes(case):
    sh, layout = case["shapes"], case["layout"]
    B, Sq, T, Hq, Hkv = sh["B"], sh["S_q"], sh["total"], sh["q_num_heads"], sh["kv_num_heads"]
    y = [B, Sq, Hq * sh["v_head_size"]] if layout == "3d" else [B, Hq, Sq, sh["v_head_size"]]
    return {"Y": y, "present_key": [B, Hkv, T, sh["head_size"]],
            "present_value": [B, Hkv, T, sh["v_head_size"]], "qk_matmul_output": [B, Hq, Sq, T]}


def check(d):
    errors = []
    with open(os.path.join(d, "case.json")) as f:
        case = json.load(f)
    inputs, _ = st.read(os.path.join(d, "inputs.safetensors"))
    listed = {k: (v["dtype"], v["shape"]) for k, v in case["inputs"].items()}
    found = {k: (st.dtype_name(v), list(v.shape)) for k, v in inputs.items()}
    if listed != found:
        errors.append(f"inputs {found} differ from case.json {listed}")
    bad = set(inputs) - set(reference.INPUT_NAMES)
    if bad:
        errors.append(f"inputs with names the operator does not have: {sorted(bad)}")
    expected_path = os.path.join(d, "expected.safetensors")
    try:
        ref = reference.run_case(inputs, case)
    except reference.SpecError as e:
        ref = None
        if not case["expect_error"]:
            errors.append(f"the reference refuses it: {e}")
    if case["expect_error"]:
        if ref is not None:
            errors.append("a refusal case the reference accepts")
        if os.path.exists(expected_path):
            errors.append("a refusal case with expected.safetensors")
        if not case["ort"].get("error") and not case["ort"].get("accepts_invalid_input"):
            errors.append("a refusal case without ONNX Runtime's error text")
        return errors
    expected, _ = st.read(expected_path)
    if list(expected) != case["outputs"]:
        errors.append(f"expected outputs {list(expected)} are not case.json's {case['outputs']}")
    shapes = output_shapes(case)
    for k, v in expected.items():
        if v.dtype != np.float32 or list(v.shape) != shapes[k]:
            errors.append(f"expected {k}: {v.dtype} {list(v.shape)}, want float32 {shapes[k]}")
        elif ref is not None and not np.array_equal(v, ref[k].astype(np.float32), equal_nan=True):
            errors.append(f"expected {k} is not what the reference computes")
        if np.isnan(v).any():
            errors.append(f"expected {k} holds NaN")
    for name in ("ort.safetensors", "ort_equivalent.safetensors"):
        p = os.path.join(d, name)
        if os.path.exists(p):
            got, _ = st.read(p)
            for k, v in got.items():
                if k not in shapes or list(v.shape) != shapes[k]:
                    errors.append(f"{name} {k}: shape {list(v.shape)}")
    if case["ort"]["ok"] != os.path.exists(os.path.join(d, "ort.safetensors")):
        errors.append("ort.safetensors present / absent against case.json's ort.ok")
    return errors


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "..", "..", "tests", "fixtures", "onnx")
    dirs = sorted(glob.glob(os.path.join(root, "case[0-9][0-9][0-9]")))
    failed = 0
    files = 0
    for d in dirs:
        files += len(os.listdir(d))
        try:
            errs = check(d)
        except (ValueError, KeyError, OSError) as e:
            errs = [f"cannot be read: {e}"]
        for e in errs:
            print(f"{os.path.basename(d)}: {e}")
        failed += bool(errs)
    refusals = sum(1 for d in dirs if json.load(open(os.path.join(d, "case.json")))["expect_error"])
    print(f"check_fixtures: {len(dirs)} cases ({refusals} refusals), {files} files read back, "
          f"{failed} with problems")
    return 1 if failed or not dirs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
