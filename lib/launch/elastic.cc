#include "launch/elastic.h"

#include "util/check.h"

namespace dtrain {

BatchPlan keep_global_batch(int64_t batch_size, int64_t grad_accum, int world, int new_world) {
  DT_CHECK(batch_size >= 1 && grad_accum >= 1 && world >= 1 && new_world >= 1);
  const int64_t global = batch_size * world * grad_accum;
  if (global % (new_world * grad_accum) == 0)
    return {global / (new_world * grad_accum), grad_accum};
  for (int64_t a = grad_accum + 1; a * new_world <= global; ++a)
    if (global % (new_world * a) == 0) return {global / (new_world * a), a};
  throw UserError("cannot keep the global batch " + std::to_string(global) + " (" +
                  std::to_string(world) + " ranks x data.batch_size " + std::to_string(batch_size) +
                  " x train.grad_accum_steps " + std::to_string(grad_accum) + ") on " +
                  std::to_string(new_world) + " ranks: it is not a multiple of " +
                  std::to_string(new_world) +
                  "; choose a global batch every allowed rank count divides");
}

std::string describe_batch_change(const BatchPlan& from, const BatchPlan& to) {
  std::string s;
  if (from.batch_size != to.batch_size)
    s += "data.batch_size " + std::to_string(from.batch_size) + " -> " +
         std::to_string(to.batch_size);
  if (from.grad_accum != to.grad_accum)
    s += (s.empty() ? "" : ", ") + std::string("train.grad_accum_steps ") +
         std::to_string(from.grad_accum) + " -> " + std::to_string(to.grad_accum);
  return s;
}

}  // namespace dtrain
