// Token + position embedding, as nanoGPT's GPT.forward computes it before the blocks:
// x[b, t, :] = wte[tokens[b, t], :] + wpe[t, :]. Free functions on raw pointers (row-major).
//
// Tokens are int32, not integer-valued floats: a token id indexes a row, so an exact integer type
// is what the kernel needs, it cannot carry a fractional or rounded id by accident (floats are
// exact only up to 2^24, larger vocabularies would silently alias), and the Batch type of the
// redesigned lib/nn carries integer token inputs. A loader that stores windows as float rows (see
// data/text.h) converts once per batch (B * T values).
#pragma once

#include <cstdint>

namespace dtrain {

struct EmbeddingDims {
  int64_t batch = 0;       // B >= 0
  int64_t seq = 0;         // T, 1 <= T <= block_size
  int64_t vocab = 0;       // V >= 1: wte's rows
  int64_t block_size = 0;  // wpe's rows
  int64_t embd = 0;        // C >= 1
};

// out [B, T, C] = wte[tokens] + wpe[0..T) (overwritten). tokens [B, T], each in [0, V): a token
// outside is a broken invariant (DT_CHECK), since the data and the prompt are checked before.
void embedding_forward(const EmbeddingDims& d, const int32_t* tokens, const float* wte,
                       const float* wpe, float* out);

// Accumulates (+=) the gradients from dout [B, T, C]: dwte[tokens[b, t]] += dout[b, t] (a token
// repeated in the batch gets the sum of its rows), dwpe[t] += sum over b of dout[b, t]. Either
// gradient may be nullptr (not wanted, e.g. a frozen table). Tokens have no gradient.
void embedding_backward(const EmbeddingDims& d, const int32_t* tokens, const float* dout,
                        float* dwte, float* dwpe);

}  // namespace dtrain
