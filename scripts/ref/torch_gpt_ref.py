#!/usr/bin/python3
"""PyTorch reference for dtrain's GPT, as llm.c's test_gpt2 does it: a tiny nanoGPT-style GPT
with fixed weights and tokens, and its logits, loss and every parameter's gradient, written to a
small text file that is committed (tests/nn/data/torch_gpt_ref.txt), so dtrain's tests compare
against PyTorch without needing it. Also two cases of the attention core alone (between c_attn
and c_proj), for nn/kernels/attention.h.

Usage (only where python3-torch is installed; Debian's /usr/bin/python3 here has it):
  scripts/ref/torch_gpt_ref.py [OUT]        # OUT defaults to tests/nn/data/torch_gpt_ref.txt

The model is scripts/torch_load.py's GPT, the one dtrain's checkpoints load into: nanoGPT's
model.py (github.com/karpathy/nanoGPT), written out there because nanoGPT is not a package: pre-LayerNorm blocks x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)); fused
c_attn [3C, C] (q, k, v in that order, head h at rows h*C/n_head ... of each), c_proj, a 4x MLP
(c_fc, GELU, c_proj), ln_f, lm_head tied to transformer.wte, biases on, LayerNorm eps 1e-5, the
"manual" causal attention (masked_fill -inf, softmax), dropout 0. One deliberate difference:
nanoGPT's MLP uses nn.GELU() (exact, erf); dtrain's GPT uses the tanh approximation (issue 13,
llm.c, GPT-2), so the model uses nn.GELU(approximate="tanh").

Precision: weights and inputs are float32 values (so dtrain holds them exactly), the reference is
computed in float64 from them, and the results are written with 10 significant digits. A float32
implementation then differs from the file by its own rounding only (~1e-6 relative), not by
PyTorch's float32 rounding as well.

File format (text, version 1; every line is one record, fields separated by single spaces):
  line 1:   dtrain-torch-ref 1
  # ...     comment lines (anywhere; skipped, as are empty lines)
  config SECTION KEY VALUE [KEY VALUE ...]
            the integer sizes of a section. Sections: "gpt" (keys vocab_size n_layer n_head n_embd
            block_size batch seq) and "attn1", "attn2" (keys batch seq n_head n_embd).
  tensor NAME NDIM D0 ... D(NDIM-1)
            followed by exactly one line of prod(D) numbers, row-major (NDIM 0: one number).
            Integers are written as integers; the float32 inputs (gpt/param/*, attnK/qkv,
            attnK/dy) as %.9g, which round-trips a float32 exactly; the float64 results as %.10g.
  end       last line (a truncated file is detectable)
Tensor names:
  gpt/tokens [B, T], gpt/targets [B, T]    token ids in [0, 256)
  gpt/param/<name>                         every parameter, nanoGPT's name and shape, in
                                           named_parameters() order: transformer.wte.weight
                                           [256, C], transformer.wpe.weight [block_size, C],
                                           transformer.h.<i>.ln_1.weight [C], .ln_1.bias,
                                           .attn.c_attn.weight [3C, C], .attn.c_attn.bias [3C],
                                           .attn.c_proj.weight [C, C], .attn.c_proj.bias,
                                           .ln_2.weight, .ln_2.bias, .mlp.c_fc.weight [4C, C],
                                           .mlp.c_fc.bias, .mlp.c_proj.weight [C, 4C],
                                           .mlp.c_proj.bias, transformer.ln_f.weight,
                                           transformer.ln_f.bias (the tied lm_head.weight is
                                           transformer.wte.weight and is not listed again)
  gpt/logits [B, T, 256]                   lm_head(ln_f(x)) at every position
  gpt/loss []                              mean cross-entropy over all B*T positions
  gpt/grad/<name>                          d(loss)/d(parameter) for every gpt/param/<name>;
                                           transformer.wte.weight's includes the tied head's part
  attnK/qkv [B, T, 3C]                     the attention core's input (c_attn's output)
  attnK/y [B, T, C]                        its output, heads side by side (before c_proj)
  attnK/dy [B, T, C]                       a fixed upstream gradient
  attnK/dqkv [B, T, 3C]                    d(sum(y * dy))/d(qkv)
"""
import os
import sys

import torch
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_load  # noqa: E402  (scripts/torch_load.py: the GPT dtrain's checkpoints load into)

VERSION = 1
GPT = dict(vocab_size=256, n_layer=2, n_head=2, n_embd=16, block_size=8, batch=2, seq=8)
ATTN = {"attn1": dict(batch=2, seq=5, n_head=2, n_embd=8),
        "attn2": dict(batch=1, seq=8, n_head=4, n_embd=16)}


def tiny_gpt(c):
    """torch_load.py's nanoGPT (the model dtrain's checkpoints load into), tied, dropout 0."""
    return torch_load.GPT(c["n_layer"], c["n_head"], c["n_embd"], c["block_size"],
                          tie_embeddings=True, dropout=0.0, vocab_size=c["vocab_size"])


def fixed_weights(model, gen):
    """Float32 weights drawn from a seeded generator, larger than nanoGPT's init (std 0.02) so the
    attention is far from uniform and every term of every gradient matters; biases and LayerNorm
    offsets are non-zero so a dropped bias shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if ".ln_" in name or "ln_f" in name:
                p.copy_(1.0 + 0.1 * r if name.endswith("weight") else 0.05 * r)
            elif name.endswith("bias"):
                p.copy_(0.05 * r)
            elif "c_attn" in name:
                p.copy_(0.3 * r)
            else:
                p.copy_(0.1 * r)


def fmt(t, digits):
    t = t.detach().reshape(-1)
    if t.dtype in (torch.int64, torch.int32):
        return " ".join(str(int(v)) for v in t.tolist())
    return " ".join("%.*g" % (digits, v) for v in t.tolist())


def record(out, name, t, exact=False):
    """exact: t holds float32 values, written with the 9 digits that round-trip them exactly;
    otherwise a float64 result, written with 10 digits (1e-10 relative: ample for 1e-5 tests)."""
    out.append("tensor %s %d%s" % (name, t.dim(), "".join(" %d" % s for s in t.shape)))
    out.append(fmt(t, 9 if exact else 10))


def config_line(section, c):
    return "config " + section + "".join(" %s %d" % kv for kv in c.items())


def gpt_records(out, gen):
    c = GPT
    out.append(config_line("gpt", c))
    model = tiny_gpt(c)
    fixed_weights(model, gen)
    model = model.double()
    tokens = torch.randint(0, c["vocab_size"], (c["batch"], c["seq"]), generator=gen)
    tokens[0, 5] = tokens[0, 2]  # a repeated token (its wte gradient sums rows) in one sequence
    tokens[1, 7] = tokens[0, 2]  # ... and across sequences
    targets = torch.randint(0, c["vocab_size"], (c["batch"], c["seq"]), generator=gen)
    targets[1, 3] = tokens[1, 4]  # a target that is also an input: head and wte gradients meet
    record(out, "gpt/tokens", tokens)
    record(out, "gpt/targets", targets)
    params = list(model.named_parameters())
    for name, p in params:
        record(out, "gpt/param/" + name, p, exact=True)
    logits = model(tokens)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
    loss.backward()
    record(out, "gpt/logits", logits)
    record(out, "gpt/loss", loss)
    for name, p in params:
        record(out, "gpt/grad/" + name, p.grad)


def attention_records(out, gen, section, c):
    out.append(config_line(section, c))
    B, T, C = c["batch"], c["seq"], c["n_embd"]
    qkv = torch.randn(B, T, 3 * C, generator=gen, dtype=torch.float32).double()
    dy = torch.randn(B, T, C, generator=gen, dtype=torch.float32).double()
    qkv.requires_grad_(True)
    y = torch_load.causal_attention(qkv, c["n_head"])
    (y * dy).sum().backward()
    record(out, section + "/qkv", qkv, exact=True)
    record(out, section + "/y", y)
    record(out, section + "/dy", dy, exact=True)
    record(out, section + "/dqkv", qkv.grad)


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        root, "tests", "nn", "data", "torch_gpt_ref.txt")
    gen = torch.Generator().manual_seed(1337)
    out = ["dtrain-torch-ref %d" % VERSION,
           "# Written by scripts/ref/torch_gpt_ref.py (torch %s); its docstring is the format."
           % torch.__version__]
    gpt_records(out, gen)
    for section, c in ATTN.items():
        attention_records(out, gen, section, c)
    out.append("end")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(out) + "\n")
    os.replace(tmp, path)  # atomic: a reader never sees half a file
    print("wrote %s (%d bytes)" % (path, os.path.getsize(path)))


if __name__ == "__main__":
    main()
