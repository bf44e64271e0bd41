#!/usr/bin/env python3
"""torch.nn.utils.clip_grad_norm_ on a table of gradient sets: the reference of
gradients/clip_grad_norm_torch_test.cc (Keel's NormAlgorithm::kForeach must equal it bit for bit
on the same device).

    python clip_grad_norm_reference.py --device=cpu --out=DIR

For each case writes DIR/<case>.in.<i> and DIR/<case>.out.<i> (gradient i before and after
clipping: its raw little-endian bytes) and DIR/cases.json: the torch version, whether its
clip_grad_norm_ has the multi-tensor (foreach) path, and per case its name, dtype, norm_type,
max_norm, shapes and the returned norm (numbers as float.hex strings). One kernel thread, so that a
CPU reduction associates as in the test.
"""

import argparse
import inspect
import json
import math
import os
import sys

import torch

# name, dtype, norm_type, max_norm, [(shape, scale)]. Sizes that are no multiple of a vector
# width or of the multi-tensor kernels' chunks, an empty gradient, magnitudes far apart, and a
# non-finite value.
CASES = [
    ("clipped_float32", torch.float32, 2.0, 1.0,
     [((4099,), 1e-2), ((3, 5), 10.0), ((64, 70), 1.0), ((1,), 3.0), ((0,), 1.0)]),
    ("unclipped_float32", torch.float32, 2.0, 1e6, [((1000,), 1.0), ((7, 9), 1e-3)]),
    ("large_float32", torch.float32, 2.0, 0.5, [((1 << 20,), 1.0), ((300, 257), 1e-4)]),
    ("max_norm_float32", torch.float32, math.inf, 0.25, [((513,), 1.0), ((5, 5), 4.0)]),
    ("p3_float32", torch.float32, 3.0, 1.0, [((2049,), 1.0), ((10,), 100.0)]),
    ("clipped_bfloat16", torch.bfloat16, 2.0, 1.0, [((4099,), 1.0), ((33, 17), 1e-3)]),
    ("nonfinite_float32", torch.float32, 2.0, 1.0, [((100,), 1.0), ((3,), math.inf)]),
]


def raw_bytes(t):
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    device = torch.device(args.device)
    foreach = "foreach" in inspect.signature(torch.nn.utils.clip_grad_norm_).parameters
    os.makedirs(args.out, exist_ok=True)
    generator = torch.Generator().manual_seed(20261127)
    cases = []
    for name, dtype, norm_type, max_norm, specs in CASES:
        params = []
        for i, (shape, scale) in enumerate(specs):
            grad = (torch.randn(shape, generator=generator, dtype=torch.float64) * scale).to(dtype)
            param = torch.zeros(shape, dtype=dtype, device=device, requires_grad=True)
            param.grad = grad.to(device)
            with open(os.path.join(args.out, f"{name}.in.{i}"), "wb") as f:
                f.write(raw_bytes(param.grad))
            params.append(param)
        kwargs = {"foreach": True} if foreach else {}
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, **kwargs)
        for i, param in enumerate(params):
            with open(os.path.join(args.out, f"{name}.out.{i}"), "wb") as f:
                f.write(raw_bytes(param.grad))
        cases.append({"name": name, "dtype": str(dtype).replace("torch.", ""),
                      "norm_type": float(norm_type).hex(), "max_norm": float(max_norm).hex(),
                      "shapes": [list(shape) for shape, _ in specs],
                      "norm": float(norm).hex()})
    with open(os.path.join(args.out, "cases.json"), "w") as f:
        json.dump({"torch": torch.__version__, "foreach": foreach, "cases": cases}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
