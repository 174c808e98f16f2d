#!/usr/bin/python3
"""Reads a dtrain checkpoint (a safetensors file) with numpy alone: no safetensors package.
(Run by Debian's /usr/bin/python3, for which scripts/setup.sh installs python3-numpy.)

Usage: scripts/read_checkpoint.py FILE.safetensors [TENSOR]
  lists every tensor (name, dtype, shape) and the metadata, or prints one tensor's values.
As a module: tensors, metadata = load("runs/x/checkpoints/step-10.safetensors")

The format: 8 bytes little-endian header length N, N bytes of JSON header ({name: {dtype, shape,
data_offsets: [begin, end]}} plus "__metadata__": {str: str}), then the raw little-endian data.
A sharded checkpoint (a folder) is first made one file with `dtrain checkpoint consolidate`.
"""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I64": "<i8", "I32": "<i4", "U8": "u1",
          "I8": "i1", "U64": "<u8", "U32": "<u4"}


def load(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        begin, end = t["data_offsets"]
        tensors[name] = np.frombuffer(data[begin:end], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
    return tensors, metadata


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    tensors, metadata = load(sys.argv[1])
    if len(sys.argv) == 3:
        np.set_printoptions(threshold=20)
        print(tensors[sys.argv[2]])
        return
    for name, t in tensors.items():
        print(f"{name}\t{t.dtype}\t{list(t.shape)}")
    for k, v in metadata.items():
        print(f"__metadata__.{k}\t{v if len(v) < 120 else v[:117] + '...'}")


if __name__ == "__main__":
    main()
