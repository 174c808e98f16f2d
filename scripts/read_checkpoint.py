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


def not_safetensors(path, why):
    return NotACheckpointFile(f"'{path}' is not a safetensors file ({why})")


def read_parts(path):
    """(header, data) of a safetensors file, its header checked before anything is trusted: the
    length against the file's size, a JSON object, every tensor's dtype, shape and byte range."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise not_safetensors(path, f"{size} bytes, shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", f.read(8))
            if n < 2 or n > size - 8:
                raise not_safetensors(path, f"a header length of {n} bytes in a file of {size}")
            try:
                header = json.loads(f.read(n))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise not_safetensors(path, f"its header is not JSON: {e}") from None
            data = f.read()
    except OSError as e:
        raise NotACheckpointFile(f"cannot read '{path}': {e.strerror or e}") from None
    if not isinstance(header, dict):
        raise not_safetensors(path, "its header is not a JSON object")
    for name, t in header.items():
        if name == "__metadata__":
            if not isinstance(t, dict) or not all(isinstance(v, str) for v in t.values()):
                raise not_safetensors(path, "__metadata__ is not an object of strings")
            continue
        ok = (isinstance(t, dict) and t.get("dtype") in DTYPES
              and isinstance(t.get("shape"), list)
              and all(isinstance(d, int) and d >= 0 for d in t["shape"])
              and isinstance(t.get("data_offsets"), list) and len(t["data_offsets"]) == 2
              and all(isinstance(o, int) for o in t["data_offsets"]))
        if not ok:
            raise not_safetensors(path, f"tensor '{name}' has no valid dtype, shape and offsets")
        begin, end = t["data_offsets"]
        count = 1
        for d in t["shape"]:
            count *= d
        if not 0 <= begin <= end <= len(data) or end - begin != count * np.dtype(
                DTYPES[t["dtype"]]).itemsize:
            raise not_safetensors(path, f"tensor '{name}': its bytes {begin}..{end} do not fit "
                                  f"its shape {t['shape']} or the file's {len(data)} data bytes "
                                  "(truncated?)")
    return header, data


def load(path, verify=True):
    """(tensors, metadata). verify: check every tensor against the CRC-32 table dtrain writes in
    __metadata__["crc32"] (zlib's CRC-32 of its bytes, 8 hex digits) and the header against
    __metadata__["crc32_header"], as dtrain's own loads do; files without them (written before
    they existed, or by other tools) load unverified."""
    if os.path.isdir(path):
        raise NotACheckpointFile(f"{path} is a folder, not a checkpoint file: " + folder_hint(path))
    header, data = read_parts(path)
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
        if sys.argv[2] not in tensors:
            sys.exit(f"error: {sys.argv[1]} has no tensor '{sys.argv[2]}'; it has: "
                     + ", ".join(tensors))
        np.set_printoptions(threshold=20)
        print(tensors[sys.argv[2]])
        return
    for name, t in tensors.items():
        print(f"{name}\t{t.dtype}\t{list(t.shape)}")
    for k, v in metadata.items():
        print(f"__metadata__.{k}\t{v if len(v) < 120 else v[:117] + '...'}")


if __name__ == "__main__":
    main()
