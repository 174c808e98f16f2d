// Drawing the next token from a language model's logits (dtrain generate).
#pragma once

#include <cstdint>

#include "util/rng.h"

namespace dtrain {

// The next token given the last position's `logits` [vocab]:
// - temperature 0, or top_k 1: the argmax (the lowest index among equal maxima); draws nothing;
// - otherwise softmax(logits / temperature) over the top_k largest logits (0 = all of them;
//   ties at the k-th value are broken towards lower indices, so exactly top_k stay), drawn with
//   one 53-bit uniform from `rng`: the same logits, settings and rng state give the same token.
// temperature >= 0, 0 <= top_k <= vocab and vocab >= 1 are the caller's to check (DT_CHECK);
// a non-finite logit is a UserError (a diverged checkpoint produces them).
int64_t sample_next(const float* logits, int64_t vocab, double temperature, int64_t top_k,
                    Rng& rng);

}  // namespace dtrain
