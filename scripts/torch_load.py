#!/usr/bin/python3
"""Loads a dtrain checkpoint into the PyTorch model it names, with a strict load_state_dict, and
optionally evaluates it on the config's test data -- the proof that dtrain's checkpoints are
PyTorch's models (README "Models"). Needs python3-torch and python3-numpy (Debian), and runs
with /usr/bin/python3.

Usage:
  scripts/torch_load.py CHECKPOINT            # builds the model, loads it strictly, lists it
  scripts/torch_load.py CHECKPOINT --eval     # and prints {"test_loss", "test_accuracy", ...}
                                              # on the config's test data as one JSON line
As a module:
  model, config = torch_load.load("runs/x/checkpoints/step-100.safetensors")

CHECKPOINT is one safetensors file (a sharded checkpoint is first made one with `dtrain
checkpoint consolidate`). The model is built from the config the checkpoint carries:
  - model.type mlp: nn.Sequential of Linear -> [LayerNorm] -> activation -> [Dropout] per hidden
    width, then Linear (names layers.<i>.*);
  - model.type sequential: nn.Sequential over model.layers (Conv2d, MaxPool2d, AvgPool2d,
    Flatten, Linear, activations, Dropout, LayerNorm over the last dimension);
  - model.type gpt: nanoGPT's GPT (transformer.wte, .wpe, .h.<i>.{ln_1, attn.c_attn, attn.c_proj,
    ln_2, mlp.c_fc, mlp.c_proj}, .ln_f, lm_head), GELU with the tanh approximation as dtrain's.
The checkpoint's training state (optimizer "optim.*", compression "comp.*", Local SGD's other
ranks' optimizer state "replica.*") is not part of the model and is left out; every other tensor must be one of the model's and every model tensor must
be in the file (strict). nanoGPT's own GPT under PyTorch < 2.0 also registers a causal-mask
buffer `attn.bias` per block, which is not a parameter and is in no checkpoint: load into it with
strict=False and check that only those are missing (nanoGPT's from_pretrained skips them too).

--eval reads the data the way dtrain does: IDX images scaled to 0..1 (normalize auto or scale),
text as bytes with the last round(test_fraction * n) bytes held out unless data.test.path is
given, read as windows of block_size + 1 bytes at stride block_size; the loss is the mean
cross-entropy over all samples (text: all target positions), as `dtrain eval` prints it.
"""
import glob
import gzip
import json
import math
import os
import struct
import sys
from collections import OrderedDict

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import read_checkpoint  # noqa: E402

# dtrain's defaults for keys its config.json omits while they are at their default
# (lib/nn/options.h GptOptions; a drift fails tests/cli/torch_load_test.sh's eval comparison).
GPT_DEFAULTS = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, tie_embeddings=True,
                    dropout=0.0)
MLP_PRESETS = {"simple": [128], "medium": [512, 512], "complex": [1024, 1024, 512, 256]}
ACTIVATIONS = {"relu": nn.ReLU, "gelu": lambda: nn.GELU(approximate="tanh"), "tanh": nn.Tanh,
               "sigmoid": nn.Sigmoid}
TRAINING_STATE_PREFIXES = ("optim.", "comp.", "replica.")


# ---- nanoGPT's GPT (github.com/karpathy/nanoGPT model.py, bias on, written out again since
# nanoGPT is not a package); attention as its "manual" path, no causal-mask buffer ----

def causal_attention(qkv, n_head, attn_dropout=None):
    """The attention core between c_attn and c_proj: qkv [B, T, 3C] (q, k, v in that order) ->
    y [B, T, C], heads side by side. scripts/ref/torch_gpt_ref.py tests dtrain's against it."""
    B, T, C3 = qkv.size()
    C = C3 // 3
    hs = C // n_head
    q, k, v = (t.view(B, T, n_head, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=qkv.device))
    att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
    if attn_dropout is not None:
        att = attn_dropout(att)
    return (att @ v).transpose(1, 2).contiguous().view(B, T, C)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x):
        y = causal_attention(self.c_attn(x), self.n_head, self.attn_dropout)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd, dropout):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = MLP(n_embd, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """idx [B, T] int64 -> logits [B, T, 256]."""

    def __init__(self, n_layer, n_head, n_embd, block_size, tie_embeddings, dropout,
                 vocab_size=256):
        super().__init__()
        self.block_size = block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            drop=nn.Dropout(dropout),
            h=nn.ModuleList([Block(n_embd, n_head, dropout) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd, eps=1e-5),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_embeddings:
            self.transformer.wte.weight = self.lm_head.weight  # nanoGPT's tie

    def forward(self, idx):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


# ---- building the model from the checkpoint's config ----

def build_mlp(m, tensors):
    hidden = MLP_PRESETS[m["complexity"]] if m.get("complexity") else list(m["hidden"])
    first = tensors["layers.0.weight"]
    widths = [first.shape[1]] + hidden
    mods = []
    for i, h in enumerate(hidden):
        mods.append(nn.Linear(widths[i], h))
        if m.get("layer_norm"):
            mods.append(nn.LayerNorm(h, eps=1e-5))
        mods.append(ACTIVATIONS[m.get("activation", "relu")]())
        if m.get("dropout", 0) > 0:
            mods.append(nn.Dropout(m["dropout"]))
    last = max(int(k.split(".")[1]) for k in tensors if k.startswith("layers."))
    mods.append(nn.Linear(widths[-1], tensors[f"layers.{last}.weight"].shape[0]))
    return nn.Sequential(*mods)


def layer_kind(entry):
    """A model.layers entry, "relu" or {"linear": 128}, as (kind, value or None)."""
    return (entry, None) if isinstance(entry, str) else next(iter(entry.items()))


def build_sequential(m, in_shape):
    """in_shape: the per-sample input shape ([C, H, W] or [F]); each layer is sized for the shape
    the one before it gives, as dtrain builds the list."""
    mods = []
    shape = list(in_shape)
    for i, e in enumerate(m["layers"]):
        kind, v = layer_kind(e)
        if kind == "linear":
            mods.append(nn.Linear(shape[-1], v))
            shape[-1] = v
        elif kind == "conv2d":
            k, s, p = v["kernel"], v.get("stride", 1), v.get("padding", 0)
            mods.append(nn.Conv2d(shape[0], v["out_channels"], k, stride=s, padding=p))
            shape = [v["out_channels"]] + [(d + 2 * p - k) // s + 1 for d in shape[1:]]
        elif kind in ("max_pool2d", "avg_pool2d"):
            k, s = (v, v) if isinstance(v, int) else (v["kernel"], v.get("stride", v["kernel"]))
            mods.append((nn.MaxPool2d if kind == "max_pool2d" else nn.AvgPool2d)(k, stride=s))
            shape = [shape[0]] + [(d - k) // s + 1 for d in shape[1:]]
        elif kind == "flatten":
            mods.append(nn.Flatten())
            shape = [int(np.prod(shape))]
        elif kind == "dropout":
            mods.append(nn.Dropout(v))
        elif kind == "layer_norm":
            mods.append(nn.LayerNorm(shape[-1], eps=1e-5))
        elif kind in ACTIVATIONS:
            mods.append(ACTIVATIONS[kind]())
        else:
            raise SystemExit(f"model.layers[{i}]: unknown layer kind '{kind}'")
    return nn.Sequential(*mods)


def sequential_input_shape(config, tensors, normalizer):
    """The per-sample input shape dtrain built the list for: [1, H, W] for IDX images (H, W from
    the training images' header; whatever the first layer is, as dtrain's data gives it), else
    (CSV rows) the flat width of the first Linear."""
    if "sample_shape" in normalizer:  # (recorded since 2026-12-07: no data file needed)
        return list(normalizer["sample_shape"])
    if config["data"].get("format", "idx") == "idx":
        with open_maybe_gzip(config["data"]["train"]["images"]) as f:
            head = f.read(16)
        return [1] + list(struct.unpack(">II", head[8:16]))
    weights = [tensors[k] for k in sorted(tensors, key=lambda k: int(k.split(".")[1]))
               if k.startswith("layers.") and k.endswith(".weight") and tensors[k].ndim <= 2]
    if not weights:
        raise SystemExit("the checkpoint records no input shape and its layer list has no weight "
                         "to read one from: write it again with a dtrain of 2026-12-07 or later")
    return [weights[0].shape[-1]]


def open_maybe_gzip(path):
    """The file's bytes, inflated if it starts with gzip's magic (as dtrain detects it)."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path) if gz else open(path, "rb")


def build(config, tensors, normalizer=None):
    normalizer = normalizer or {}
    m = config["model"]
    kind = m.get("type", "mlp")
    # dtrain names a list's entries layers.<i>, as a module whose `layers` is the nn.Sequential
    # (a bare nn.Sequential's keys are <i>.weight: strip "layers." to load into one).
    if kind == "mlp":
        return nn.Sequential(OrderedDict(layers=build_mlp(m, tensors)))
    if kind == "sequential":
        seq = build_sequential(m, sequential_input_shape(config, tensors, normalizer))
        return nn.Sequential(OrderedDict(layers=seq))
    if kind == "gpt":
        g = {k: m.get(k, d) for k, d in GPT_DEFAULTS.items()}
        return GPT(**g)
    raise SystemExit(f"model.type '{kind}' is not one this script builds")


def load(path, strict=True):
    """Returns (model in eval mode, the checkpoint's config). Raises on a strict mismatch."""
    tensors, meta = read_checkpoint.load(path)
    if meta.get("format") == "dtrain-checkpoint-shard":
        folder = os.path.dirname(os.path.abspath(path))
        raise read_checkpoint.NotACheckpointFile(f"{path} is one rank's shard of a sharded checkpoint: "
                         + read_checkpoint.consolidate_hint(folder))
    if "config" not in meta:
        raise SystemExit(f"{path}: no config in its metadata (not a dtrain training checkpoint?)")
    config = json.loads(meta["config"])
    model_tensors = {k: v for k, v in tensors.items()
                     if not k.startswith(TRAINING_STATE_PREFIXES)}
    model = build(config, model_tensors, json.loads(meta.get("normalizer", "{}") or "{}"))
    state = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in model_tensors.items()}
    model.load_state_dict(state, strict=strict)
    model.eval()
    return model, config


# ---- evaluation on the config's test data, as `dtrain eval` ----

def read_maybe_gzip(path):
    with open_maybe_gzip(path) as f:
        return f.read()


def paths(spec):
    """The text files as dtrain reads them: each entry a file or a glob (sorted), a glob's matches
    that are not regular files left out, a file named twice (by any path) read once, where it
    first appears; a named file that is not a regular one refused (a FIFO would block)."""
    out, seen = [], set()
    for s in spec if isinstance(spec, list) else [spec]:
        pattern = any(c in s for c in "*?[") and not os.path.isfile(s)
        for p in sorted(glob.glob(s)) if pattern else [s]:
            if not os.path.isfile(p):
                if pattern:
                    continue
                raise SystemExit(f"--eval: {p} is not a regular file")
            st = os.stat(p)
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                out.append(p)
    return out


def read_idx(path):
    data = read_maybe_gzip(path)
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def eval_images(model, config):
    d = config["data"]
    if config["model"].get("loss", "cross_entropy") != "cross_entropy":
        raise SystemExit("--eval reports cross-entropy; this model was trained with loss "
                         f"{config['model']['loss']}: use `dtrain eval` for its loss")
    if d.get("normalize", "auto") not in ("auto", "scale"):
        raise SystemExit("--eval reads IDX images scaled to 0..1 (data.normalize auto or scale)")
    test = d.get("test") or {}
    if not test.get("images") or not test.get("labels"):
        raise SystemExit("--eval reads the test images of data.test.images and data.test.labels; "
                         "this config holds out part of the training images instead "
                         "(data.test_fraction, a seeded draw): use `dtrain eval` for that split")
    x = torch.from_numpy(read_idx(d["test"]["images"]).astype(np.float32) / 255.0)
    y = torch.from_numpy(read_idx(d["test"]["labels"]).astype(np.int64))
    if config["model"].get("type") == "sequential":
        x = x.unsqueeze(1)  # [N, 1, 28, 28], the shape dtrain gives a layer list
    else:
        x = x.reshape(x.shape[0], -1)
    loss, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, x.shape[0], 1000):
            logits = model(x[i:i + 1000]).double()
            loss += F.cross_entropy(logits, y[i:i + 1000], reduction="sum").item()
            correct += (logits.argmax(1) == y[i:i + 1000]).sum().item()
    return {"test_loss": loss / x.shape[0], "test_accuracy": correct / x.shape[0],
            "samples": int(x.shape[0])}


def eval_text(model, config):
    d, T = config["data"], model.block_size
    test_path = d["test"].get("path")
    if test_path:
        text = b"".join(read_maybe_gzip(p) for p in paths(test_path))
    else:
        train = b"".join(read_maybe_gzip(p) for p in paths(d["train"]["path"]))
        fraction = d.get("test_fraction", -1.0)
        if fraction < 0:
            fraction = 0.1  # dtrain's default for text (-1 in config.json means "default")
        n_test = int(math.floor(fraction * len(train) + 0.5))  # llround
        text = train[len(train) - n_test:]
    rows = (len(text) - 1) // T if len(text) > T else 0
    if rows == 0:
        raise SystemExit("--eval: no test set to evaluate (the checkpoint's data.test.path and "
                         "data.test_fraction give no window of block_size + 1 bytes)")
    u = np.frombuffer(text, dtype=np.uint8).astype(np.int64)
    windows = torch.from_numpy(np.stack([u[i * T:i * T + T + 1] for i in range(rows)]))
    loss, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, rows, 256):
            w = windows[i:i + 256]
            logits = model(w[:, :-1]).double()
            tgt = w[:, 1:]
            loss += F.cross_entropy(logits.reshape(-1, 256), tgt.reshape(-1), reduction="sum").item()
            correct += (logits.argmax(-1) == tgt).sum().item()
    n = rows * T
    return {"test_loss": loss / n, "test_bpb": loss / n / math.log(2),
            "test_accuracy": correct / n, "positions": n}


def main():
    args = sys.argv[1:]
    if not args or len(args) > 2 or (len(args) == 2 and args[1] != "--eval"):
        sys.exit(__doc__)
    try:
        model, config = load(args[0])
    except (read_checkpoint.CorruptCheckpoint, read_checkpoint.NotACheckpointFile) as e:
        sys.exit(f"error: {e}")
    if len(args) == 1:
        for name, p in model.state_dict().items():
            print(f"{name}\t{list(p.shape)}")
        print(f"loaded strictly into {type(model).__name__} "
              f"({sum(p.numel() for p in model.parameters())} parameters)")
        return
    fmt = config["data"].get("format", "idx")
    if fmt == "text":
        print(json.dumps(eval_text(model, config)))
    elif fmt == "idx":
        print(json.dumps(eval_images(model, config)))
    else:
        sys.exit(f"--eval reads idx and text data, not data.format {fmt}")


if __name__ == "__main__":
    main()
