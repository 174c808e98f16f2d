// Causal multi-head self-attention core, as nanoGPT's CausalSelfAttention computes it between
// c_attn and c_proj (no projections, no dropout): free functions on raw float pointers, so a layer
// of any interface can call them with its own buffers.
//
// Layout (row-major, nanoGPT's): qkv [B, T, 3C] is c_attn's output; along the last dimension
// q = columns [0, C), k = [C, 2C), v = [2C, 3C), and head h of each is its columns
// [h * hs, (h + 1) * hs) with hs = C / n_head. y [B, T, C] holds the heads side by side in the same
// order (nanoGPT's y.transpose(1, 2).view(B, T, C)).
//
// Per (batch b, head h): S = q k^T / sqrt(hs), P = softmax over each row of S with the causal mask
// (position t attends to positions <= t), y = P v. Each of those products is one GEMM reading q, k,
// v in place through their row stride 3C (no packing).
//
// Saved state: the probabilities P [B, n_head, T, T] (row t is zero beyond column t). Saving
// rather than recomputing in backward: recomputing costs another T x T x hs GEMM and the exps per
// (b, h) (about a quarter more attention work), while P is small next to a block's activations at
// the sizes this project trains (B 12, 4 heads, T 64: 196k floats, 786 KB per layer).
#pragma once

#include <cstdint>

namespace dtrain {

struct AttentionDims {
  int64_t batch = 0;   // B >= 0
  int64_t seq = 0;     // T >= 1
  int64_t n_head = 0;  // >= 1, divides embd
  int64_t embd = 0;    // C >= 1
  int64_t head_size() const { return embd / n_head; }
};

// Floats of the saved probabilities: B * n_head * T * T.
int64_t attention_saved_floats(const AttentionDims& d);
// Floats of backward's scratch: T * T (one (b, h) at a time).
int64_t attention_scratch_floats(const AttentionDims& d);

// y [B, T, C] = attention(qkv [B, T, 3C]); writes the probabilities into saved
// [attention_saved_floats(d)]. y and saved are overwritten and must not alias qkv.
// Attention dropout (nanoGPT's attn_dropout): `dropped`, when not null, holds a mask of
// attention_saved_floats(d) entries (0 or 1 / (1 - p)) on entry and is overwritten with the
// dropped probabilities D = P * mask; then y = D v, and saved still holds P.
void attention_forward(const AttentionDims& d, const float* qkv, float* y, float* saved,
                       float* dropped = nullptr);

// dqkv [B, T, 3C] = d(loss)/d(qkv) from dy [B, T, C], qkv and forward's saved probabilities;
// overwritten (the core has no parameters, so nothing accumulates). dqkv == nullptr computes
// nothing. scratch holds attention_scratch_floats(d) floats; contents on entry do not matter.
// `dropped`: forward's D when it ran with dropout (else null): dv = D^T dy and, with
// dD = dy v^T, dS = D * dD - P * rowsum(D * dD) (the softmax backward of dP = dD * mask).
void attention_backward(const AttentionDims& d, const float* qkv, const float* saved,
                        const float* dy, float* dqkv, float* scratch,
                        const float* dropped = nullptr);

}  // namespace dtrain
