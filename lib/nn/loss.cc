// Losses. exp runs in float (libm expf), row sums and the returned totals accumulate in double.
// grad must not alias the input tensor.
#include "nn/loss.h"
#include "nn/layer_util.h"

#include <cmath>
#include <cstdint>

#include "util/check.h"

namespace dtrain {
namespace {

void check_label(int32_t label, int64_t classes) {
  DT_CHECK_MSG(label >= 0 && label < classes,
               "label " << label << " out of range [0, " << classes << ")");
}

// Scores are rows of the last dimension: [B, C] or [B, T, C] (one row, and one label, per
// position).
int64_t class_count(const Tensor& t) {
  DT_CHECK_GE(t.ndim(), 2u);
  return t.shape().back();
}

int64_t row_count(const Tensor& t) {
  const int64_t c = class_count(t);
  return c == 0 ? 0 : t.numel() / c;
}

// Gives out t's shape, without allocating when it already has it.
void resize_like(Tensor& out, const Tensor& t) {
  if (out.shape() != t.shape()) out.resize(t.shape());
}

}  // namespace

double softmax_cross_entropy(const Tensor& logits, const int32_t* labels, Tensor* grad,
                             float grad_scale) {
  const int64_t batch = row_count(logits);
  const int64_t c = class_count(logits);
  DT_CHECK_GT(c, 0);
  if (grad != nullptr) resize_like(*grad, logits);
  double total = 0.0;
  for (int64_t r = 0; r < batch; ++r) {
    const float* z = logits.data() + r * c;
    const int32_t label = labels[r];
    check_label(label, c);
    // loss = logsumexp(z) - z[label], with the row max subtracted so every exp is <= 1.
    float m = z[0];
    for (int64_t j = 1; j < c; ++j) m = z[j] > m ? z[j] : m;
    double s = 0.0;
    if (grad == nullptr) {
      for (int64_t j = 0; j < c; ++j) s += std::exp(z[j] - m);
    } else {
      // Keep exp(z - m) in the gradient row, then normalise in place: one exp per element.
      float* gr = grad->data() + r * c;
      for (int64_t j = 0; j < c; ++j) {
        gr[j] = std::exp(z[j] - m);
        s += gr[j];
      }
      const float k = static_cast<float>(grad_scale / s);
      for (int64_t j = 0; j < c; ++j) gr[j] *= k;
      gr[label] -= grad_scale;
    }
    total += static_cast<double>(m) + std::log(s) - static_cast<double>(z[label]);
  }
  return total;
}

double mse_onehot(const Tensor& pred, const int32_t* labels, Tensor* grad, float grad_scale) {
  const int64_t batch = row_count(pred);
  const int64_t c = class_count(pred);
  DT_CHECK_GT(c, 0);
  if (grad != nullptr) resize_like(*grad, pred);
  const double inv_c = 1.0 / static_cast<double>(c);
  double total = 0.0;
  for (int64_t r = 0; r < batch; ++r) {
    const float* y = pred.data() + r * c;
    const int32_t label = labels[r];
    check_label(label, c);
    double row = 0.0;
    for (int64_t j = 0; j < c; ++j) {
      const double d = static_cast<double>(y[j]) - (j == label ? 1.0 : 0.0);
      row += d * d;
    }
    total += row * inv_c;
    if (grad != nullptr) {
      float* gr = grad->data() + r * c;
      const double k = 2.0 * inv_c * grad_scale;
      for (int64_t j = 0; j < c; ++j) {
        gr[j] = static_cast<float>(k * (static_cast<double>(y[j]) - (j == label ? 1.0 : 0.0)));
      }
    }
  }
  return total;
}

int64_t count_correct(const Tensor& logits, const int32_t* labels) {
  const int64_t batch = row_count(logits);
  const int64_t c = class_count(logits);
  int64_t correct = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const float* z = logits.data() + r * c;
    check_label(labels[r], c);
    int64_t best = 0;  // first maximum wins ties, like torch.argmax
    for (int64_t j = 1; j < c; ++j) {
      if (z[j] > z[best]) best = j;
    }
    correct += best == labels[r] ? 1 : 0;
  }
  return correct;
}

void softmax_rows(const Tensor& logits, Tensor& probs) {
  const int64_t batch = row_count(logits);
  const int64_t c = class_count(logits);
  resize_like(probs, logits);
  for (int64_t r = 0; r < batch; ++r) {
    const float* z = logits.data() + r * c;
    float* pr = probs.data() + r * c;
    float m = z[0];
    for (int64_t j = 1; j < c; ++j) m = z[j] > m ? z[j] : m;
    double s = 0.0;
    for (int64_t j = 0; j < c; ++j) {
      pr[j] = std::exp(z[j] - m);
      s += pr[j];
    }
    const float k = static_cast<float>(1.0 / s);
    for (int64_t j = 0; j < c; ++j) pr[j] *= k;
  }
}

}  // namespace dtrain
