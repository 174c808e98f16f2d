// Token + position embedding: row gathers forward, row scatter-adds backward.
#include "nn/kernels/embedding.h"

#include "util/check.h"

namespace dtrain {
namespace {

void check_dims(const EmbeddingDims& d) {
  DT_CHECK_GE(d.batch, 0);
  DT_CHECK_GE(d.seq, 1);
  DT_CHECK_GE(d.vocab, 1);
  DT_CHECK_GE(d.embd, 1);
  DT_CHECK_MSG(d.seq <= d.block_size,
               "sequence length " << d.seq << " above block_size " << d.block_size);
}

int64_t checked_token(const EmbeddingDims& d, int32_t tok) {
  DT_CHECK_MSG(tok >= 0 && tok < d.vocab, "token " << tok << " outside [0, " << d.vocab << ")");
  return tok;
}

}  // namespace

void embedding_forward(const EmbeddingDims& d, const int32_t* tokens, const float* wte,
                       const float* wpe, float* out) {
  check_dims(d);
  const int64_t T = d.seq, C = d.embd;
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const float* te = wte + checked_token(d, tokens[b * T + t]) * C;
      const float* pe = wpe + t * C;
      float* o = out + (b * T + t) * C;
      for (int64_t c = 0; c < C; ++c) o[c] = te[c] + pe[c];
    }
  }
}

void embedding_backward(const EmbeddingDims& d, const int32_t* tokens, const float* dout,
                        float* dwte, float* dwpe) {
  check_dims(d);
  const int64_t T = d.seq, C = d.embd;
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const float* g = dout + (b * T + t) * C;
      if (dwte != nullptr) {
        float* row = dwte + checked_token(d, tokens[b * T + t]) * C;
        for (int64_t c = 0; c < C; ++c) row[c] += g[c];
      }
      if (dwpe != nullptr) {
        float* row = dwpe + t * C;
        for (int64_t c = 0; c < C; ++c) row[c] += g[c];
      }
    }
  }
}

}  // namespace dtrain
