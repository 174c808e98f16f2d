#!/usr/bin/env python3
"""PyTorch reference for dtrain's CNN kernels, the way llm.c checks itself against PyTorch.

Builds the first layers of cnn-ref (bench/peers/torch_cnn_fmnist.py): conv 3x3 1->32 padding 1,
ReLU, max-pool 2, conv 3x3 32->64 padding 1, ReLU, then both max-pool 2 (cnn-ref's) and avg-pool
2 (to cover average pooling too) on a batch of 2 images of 28x28, with fixed inputs and weights
from a formula dtrain's test computes the same way (below). The loss is
    L = sum(c_max * max_pool(r2)) + sum(c_avg * avg_pool(r2))
with fixed coefficient tensors from the same formula. Runs in float64, so the file holds the exact
answer (rounded to float32) and the test measures dtrain's float32 error alone.

Writes tests/nn/data/torch_cnn_ref.bin (atomically):
    line 1: "dtrain torch_cnn_ref 1"  (format name and version)
    line 2: "seed S"                  (the formula's seed, see below)
    then one line per tensor: "NAME D1 D2 ...", then the line "end",
    then the tensors' values as little-endian float32, in the order listed.

The formula: element i of the tensor with id T (x 0, conv1.weight 1, conv1.bias 2, conv2.weight 3,
conv2.bias 4, c_max 5, c_avg 6) is (k / 2^24 + offset) * scale with k = mix(i, 16 S + T) >> 8,
where mix is the 32-bit hash of tests/nn/torch_cnn_ref_test.cc (all arithmetic mod 2^32) and
(offset, scale) = (0, 1) for x, (-0.5, 0.5) for conv1, (-0.5, 0.125) for conv2, (-0.5, 2) for the
coefficients. Every such value is exact in float32.

Seed: the first S >= 0 for which no ReLU input lies within 1e-5 of its tensor's max |value| of
zero, and no max-pool window's two largest (nonzero) values lie within 1e-5 of that of each other:
dtrain's float32 rounding (~1e-6 of the scale) then cannot flip a ReLU or move an argmax, so the
comparison can be tight everywhere.

Usage: /usr/bin/python3 scripts/ref/torch_cnn_ref.py [OUT]   (needs python3-torch; the test does not)
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

N = 2
MARGIN = 1e-5
SHAPES = {
    "x": (N, 1, 28, 28),
    "conv1.weight": (32, 1, 3, 3),
    "conv1.bias": (32,),
    "conv2.weight": (64, 32, 3, 3),
    "conv2.bias": (64,),
    "c_max": (N, 64, 7, 7),
    "c_avg": (N, 64, 7, 7),
}
SCALE = {"x": (0.0, 1.0), "conv1.weight": (-0.5, 0.5), "conv1.bias": (-0.5, 0.5),
         "conv2.weight": (-0.5, 0.125), "conv2.bias": (-0.5, 0.125),
         "c_max": (-0.5, 2.0), "c_avg": (-0.5, 2.0)}
M32 = np.uint64(0xFFFFFFFF)


def mix(i, salt):
    """The 32-bit hash (lowbias32 of i * golden + salt * c), as uint64 holding 32-bit values."""
    x = (i * np.uint64(0x9E3779B1) + np.uint64(salt) * np.uint64(0x85EBCA77)) & M32
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x7FEB352D)) & M32
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x846CA68B)) & M32
    x ^= x >> np.uint64(16)
    return x


def tensor(name, seed):
    shape = SHAPES[name]
    tid = list(SHAPES).index(name)
    n = int(np.prod(shape))
    k = mix(np.arange(n, dtype=np.uint64), 16 * seed + tid) >> np.uint64(8)
    offset, scale = SCALE[name]
    v = (k.astype(np.float64) / 2.0**24 + offset) * scale
    assert np.array_equal(v.astype(np.float32).astype(np.float64), v)  # exact in float32
    return torch.tensor(v.reshape(shape), dtype=torch.float64)


def windows_ok(r):
    """No 2x2 max-pool window whose two largest values are nearly equal (unless both are 0)."""
    n, c, h, w = r.shape
    win = r[:, :, : h // 2 * 2, : w // 2 * 2].reshape(n, c, h // 2, 2, w // 2, 2)
    win = win.permute(0, 1, 2, 4, 3, 5).reshape(-1, 4)
    top = torch.sort(win, dim=1, descending=True).values
    gap = top[:, 0] - top[:, 1]
    return bool(((top[:, 0] == 0) | (gap > MARGIN * r.abs().max())).all())


def run(seed):
    t = {name: tensor(name, seed) for name in SHAPES}
    for name in ("x", "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"):
        t[name].requires_grad_(True)
    a1 = F.conv2d(t["x"], t["conv1.weight"], t["conv1.bias"], padding=1)
    r1 = F.relu(a1)
    p1 = F.max_pool2d(r1, 2)
    a2 = F.conv2d(p1, t["conv2.weight"], t["conv2.bias"], padding=1)
    r2 = F.relu(a2)
    pmax = F.max_pool2d(r2, 2)
    pavg = F.avg_pool2d(r2, 2)
    loss = (t["c_max"] * pmax).sum() + (t["c_avg"] * pavg).sum()
    ok = all(bool((a.abs() > MARGIN * a.abs().max()).all()) for a in (a1, a2))
    ok = ok and windows_ok(r1.detach()) and windows_ok(r2.detach())
    if not ok:
        return None
    loss.backward()
    out = [("pool1", p1), ("pool2_max", pmax), ("pool2_avg", pavg), ("loss", loss.reshape(1))]
    for name in ("x", "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"):
        out.append(("grad." + name, t[name].grad))
    return out


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "nn", "data", "torch_cnn_ref.bin")
    for seed in range(1000):
        out = run(seed)
        if out is not None:
            break
    else:
        sys.exit("no seed below 1000 meets the margins")
    header = ["dtrain torch_cnn_ref 1", f"seed {seed}"]
    header += [" ".join([name] + [str(d) for d in v.shape]) for name, v in out] + ["end"]
    data = b"".join(v.detach().numpy().astype("<f4").tobytes() for _, v in out)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(("\n".join(header) + "\n").encode())
        f.write(data)
    os.replace(tmp, path)
    print(f"wrote {path}: seed {seed}, loss {out[3][1].item():.10g}, {len(data)} bytes of values")


if __name__ == "__main__":
    main()
