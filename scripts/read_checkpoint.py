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
import os
import struct
import sys
import zlib

import numpy as np

DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I64": "<i8", "I32": "<i4", "U8": "u1",
          "I8": "i1", "U64": "<u8", "U32": "<u4"}


class CorruptCheckpoint(Exception):
    """A tensor whose bytes fail the CRC-32 dtrain stored for it."""


class NotACheckpointFile(Exception):
    """A path that is no checkpoint file: a sharded checkpoint's folder, say."""


def folder_hint(folder):
    """What to read instead of a folder: a sharded checkpoint (its manifest.json) is consolidated;
    a checkpoints folder names its newest checkpoint in `latest`, a run folder holds one."""
    if os.path.isfile(os.path.join(folder, "manifest.json")):
        return consolidate_hint(folder)
    for ckpts in (folder, os.path.join(folder, "checkpoints")):
        try:
            with open(os.path.join(ckpts, "latest")) as f:
                name = f.read().strip()
        except OSError:
            continue
        target = os.path.join(ckpts, name)
        if os.path.isdir(target):
            return folder_hint(target)
        return f"read {target} (the newest checkpoint, which {ckpts}/latest names)"
    return "give a checkpoint file (.safetensors)"


def consolidate_hint(folder):
    return (f"run `dtrain checkpoint consolidate {folder} -o FILE.safetensors` and read FILE: "
            "a sharded checkpoint (zero1/zero2/fsdp, pipeline, tensor parallel) is a folder of "
            "per-rank shards")


def load(path, verify=True):
    """(tensors, metadata). verify: check every tensor against the CRC-32 table dtrain writes in
    __metadata__["crc32"] (zlib's CRC-32 of its bytes, 8 hex digits) and the header against
    __metadata__["crc32_header"], as dtrain's own loads do; files without them (written before
    they existed, or by other tools) load unverified."""
    if os.path.isdir(path):
        raise NotACheckpointFile(f"{path} is a folder, not a checkpoint file: " + folder_hint(path))
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    if verify and "crc32_header" in header.get("__metadata__", {}):
        # The header's own CRC-32, over its canonical form: keys sorted, compact, without itself.
        canon = json.loads(json.dumps(header))
        stored = canon["__metadata__"].pop("crc32_header")
        text = json.dumps(canon, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        if "%08x" % zlib.crc32(text.encode()) != stored.lower():
            raise CorruptCheckpoint(f"{path}: its header fails its CRC-32 check (stored {stored}): "
                                    "the file is corrupt")
    metadata = header.pop("__metadata__", {})
    metadata.pop("crc32_header", None)
    crcs = json.loads(metadata["crc32"]) if verify and "crc32" in metadata else {}
    tensors = {}
    for name, t in header.items():
        begin, end = t["data_offsets"]
        if name in crcs and "%08x" % zlib.crc32(data[begin:end]) != crcs[name].lower():
            raise CorruptCheckpoint(f"{path}: tensor '{name}' fails its CRC-32 check "
                                    f"(stored {crcs[name]}): the file is corrupt")
        tensors[name] = np.frombuffer(data[begin:end], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
    return tensors, metadata


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    try:
        tensors, metadata = load(sys.argv[1])
    except (CorruptCheckpoint, NotACheckpointFile) as e:
        sys.exit(f"error: {e}")
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
