// The GPT of `model.type: gpt`: nanoGPT's model (Karpathy's model.py) over bytes, built as a
// Model whose top-level elements are the units buckets, FSDP units and pipeline stages cut along:
//
//   transformer      token + position embedding: wte.weight [V, C], wpe.weight [block_size, C]
//   transformer.h.i  one pre-LayerNorm block (i < n_layer): x += attn(ln_1(x)); x += mlp(ln_2(x))
//                    ln_1, attn.c_attn [3C, C] (q, k, v; head h at rows h*C/n_head.. of each),
//                    attn.c_proj [C, C], ln_2, mlp.c_fc [4C, C], GELU (tanh), mlp.c_proj [C, 4C]
//   transformer.ln_f the final LayerNorm
//   lm_head          weight [V, C], no bias
//
// Names and shapes are nanoGPT's, so a state dict loads into its GPT (vocabulary 256, bias on;
// its MLP with nn.GELU(approximate="tanh")). Init as nanoGPT: normal(0, 0.02) weights and
// embeddings, zero biases, LayerNorm 1/0, the residual projections (c_proj) normal(0, 0.02 /
// sqrt(2 n_layer)).
//
// Tied embeddings (tie_embeddings, nanoGPT's default): lm_head.weight is a second copy of
// transformer.wte.weight in the flat layout (Model::ties()), initialised from the same stream so
// the copies start equal; the training loop gives both copies the sum of their gradients every
// step, so they stay equal under any elementwise optimizer, and each element is counted once in
// the gradient norm. (A state dict of nanoGPT's tied GPT also lists both names.)
//
// Dropout (model.dropout = p, nanoGPT's placement): after the token + position embedding
// (transformer.drop), on the attention probabilities (attn_dropout), after attn.c_proj
// (resid_dropout) and after mlp.c_proj (the MLP's dropout); inverted (kept values scaled by
// 1 / (1 - p)), in training only: evaluation and generation run the p = 0 model, bitwise. Masks
// come from nn_detail::dropout_mask (keyed on the sample in training: W ranks draw what one
// process draws).
//
// Input: x [B, T] token ids as exact floats (data/dataset.h's token windows); output: logits
// [B, T, V].
#pragma once

#include <cstdint>
#include <memory>

#include "nn/model.h"
#include "nn/options.h"

namespace dtrain {

// cfg's gpt keys; `seq` positions per sample (T <= block_size: generate runs shorter contexts on
// the same parameters, whose shapes do not depend on T). UserError for n_head not dividing
// n_embd, seq above block_size, or dropout outside [0, 1).
// tp_size > 1: the same model with tensor-parallel blocks (nn/tp_gpt.h), tensor rank tp_rank's
// shards; element list, names and initial values (sliced) as the tp_size 1 model's.
Model build_gpt(const ModelConfig& cfg, int64_t vocab, int64_t seq, int tp_rank = 0,
                int tp_size = 1);

// One transformer block as build_gpt builds it (the tensor-parallel block draws its initial
// values from one, then keeps its shards).
std::unique_ptr<Layer> make_gpt_block(int64_t seq, int64_t embd, int64_t n_head, int64_t n_layer,
                                      double dropout);

}  // namespace dtrain
