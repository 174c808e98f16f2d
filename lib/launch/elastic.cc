#include "launch/elastic.h"

#include <algorithm>
#include <charconv>
#include <string>

#include "util/check.h"

namespace dtrain {

BatchPlan keep_global_batch(int64_t batch_size, int64_t grad_accum, int world, int new_world) {
  DT_CHECK(batch_size >= 1 && grad_accum >= 1 && world >= 1 && new_world >= 1);
  // Beyond 2^50 samples per step no run is real, and the search below stays short (2^25 steps).
  constexpr int64_t kMaxGlobal = int64_t{1} << 50;
  int64_t global = 0;
  const std::string what = " (" + std::to_string(world) +
                           " data-parallel ranks x data.batch_size " + std::to_string(batch_size) +
                           " x train.grad_accum_steps " + std::to_string(grad_accum) + ")";
  if (__builtin_mul_overflow(batch_size, int64_t{world}, &global) ||
      __builtin_mul_overflow(global, grad_accum, &global) || global > kMaxGlobal)
    throw UserError("cannot keep the global batch" + what + " on " + std::to_string(new_world) +
                    " data-parallel ranks: it is above 2^50 samples");
  const auto refuse = [&](const std::string& why) {
    return UserError("cannot keep the global batch " + std::to_string(global) + what + " on " +
                     std::to_string(new_world) + " data-parallel ranks: " + why);
  };
  if (global % new_world != 0)
    throw refuse("it is not a multiple of " + std::to_string(new_world) +
                 "; choose a global batch every allowed rank count divides");
  const int64_t per_rank = global / new_world;  // = per-rank batch x accumulation
  if (per_rank % grad_accum == 0) return {per_rank / grad_accum, grad_accum};
  // The smallest accumulation a > grad_accum dividing per_rank: first among a <= sqrt(per_rank),
  // then as per_rank / b for the largest b < sqrt(per_rank) that leaves a > grad_accum.
  for (int64_t a = grad_accum + 1; a <= per_rank / a; ++a)
    if (per_rank % a == 0) return {per_rank / a, a};
  int64_t b = 1;
  while ((b + 1) <= per_rank / (b + 1)) ++b;  // floor(sqrt(per_rank)), <= 2^25 steps
  for (b = std::min(b, (per_rank - 1) / grad_accum); b >= 1; --b)
    if (per_rank % b == 0) return {b, per_rank / b};
  throw refuse("each of the " + std::to_string(new_world) + " ranks would get " +
               std::to_string(per_rank) + " samples, fewer than train.grad_accum_steps " +
               std::to_string(grad_accum) + " micro-batches of one");
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

std::vector<std::string> resize_settings(const BatchPlan& plan, double lr, bool scale_lr_linear,
                                         int64_t first_dp, int64_t new_dp) {
  std::vector<std::string> sets = {"data.batch_size=" + std::to_string(plan.batch_size),
                                   "train.grad_accum_steps=" + std::to_string(plan.grad_accum)};
  if (scale_lr_linear && first_dp != new_dp) {
    char buf[64];
    const double rate = lr * static_cast<double>(first_dp);  // as plan_steps computes base_lr
    const auto res = std::to_chars(buf, buf + sizeof buf, rate);
    DT_CHECK(res.ec == std::errc());
    sets.push_back("optimizer.scale_lr=none");
    sets.push_back("optimizer.lr=" + std::string(buf, res.ptr));
  }
  return sets;
}

}  // namespace dtrain
