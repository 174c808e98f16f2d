// Synthetic classification data: separable Gaussian clusters, a pure function of (opts, seed).
//
// Definition (the random draws happen in exactly this order, from Rng(seed, kSyntheticStream)):
//  1. centres: classes x features values, each 2 * N(0, 1) (row-major, class by class);
//  2. labels: sample i gets class i % classes (balanced), then a Fisher-Yates shuffle
//     (for i = n-1 .. 1: swap(i, below(i + 1)));
//  3. features: x[i][j] = centre[label_i][j] + noise * N(0, 1), row-major.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "data/dataset.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/rng.h"

namespace dtrain {
namespace {

constexpr uint64_t kSyntheticStream = 0x73796e7468ULL;  // "synth"
constexpr float kCentreScale = 2.0f;
// Guards against a config typo allocating tens of GiB (4 Gi floats = 16 GiB).
constexpr int64_t kMaxValues = int64_t{1} << 32;

}  // namespace

void check_synthetic_options(const SyntheticOptions& opts) {
  if (opts.samples < 1) throw UserError("data.synthetic.samples must be >= 1");
  if (opts.features < 1) throw UserError("data.synthetic.features must be >= 1");
  if (opts.classes < 1) throw UserError("data.synthetic.classes must be >= 1");
  if (opts.classes > (int64_t{1} << 20)) throw UserError("data.synthetic.classes is too large");
  if (!(opts.noise >= 0)) throw UserError("data.synthetic.noise must be >= 0");
  // (the class centres, classes x features, are generated as well)
  if (opts.features > kMaxValues / (opts.samples + opts.classes)) {
    throw UserError("data.synthetic: (samples + classes) x features = (" +
                    std::to_string(opts.samples) + " + " + std::to_string(opts.classes) + ") x " +
                    std::to_string(opts.features) + " is too large");
  }
  // The values and labels, twice while the held-out split copies its rows out, and the class
  // centres: refused here rather than grown into until the kernel's OOM killer ends the run.
  const double bytes =
      2.0 * static_cast<double>(opts.samples) * (4.0 * static_cast<double>(opts.features) + 4.0) +
      4.0 * static_cast<double>(opts.classes) * static_cast<double>(opts.features);
  if (const int64_t avail = available_memory_bytes();
      avail >= 0 && bytes > static_cast<double>(avail)) {
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    throw UserError(fmt::format(
        "data.synthetic: samples x features = {} x {} needs about {:.1f} GiB to generate (with "
        "its held-out split and {} class centres), more than the {:.1f} GiB this process can "
        "allocate: use fewer samples, classes or features",
        opts.samples, opts.features, bytes / kGiB, opts.classes,
        static_cast<double>(avail) / kGiB));
  }
}

Dataset make_synthetic(const SyntheticOptions& opts, int64_t seed) {
  check_synthetic_options(opts);
  const uint64_t s = static_cast<uint64_t>(opts.seed == -1 ? seed : opts.seed);
  Rng rng(s, kSyntheticStream);

  const int64_t n = opts.samples, f = opts.features, k = opts.classes;
  std::vector<float> centres(static_cast<size_t>(k * f));
  for (float& c : centres) c = kCentreScale * rng.normal();

  Dataset d;
  d.rows = n;
  d.features = f;
  d.num_classes = k;
  d.y.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) d.y[i] = static_cast<int32_t>(i % k);
  for (int64_t i = n - 1; i > 0; --i) {
    std::swap(d.y[i], d.y[rng.below(static_cast<uint64_t>(i) + 1)]);
  }
  d.x.resize(static_cast<size_t>(n * f));
  const auto noise = static_cast<float>(opts.noise);
  for (int64_t i = 0; i < n; ++i) {
    const float* c = centres.data() + d.y[i] * f;
    float* x = d.x.data() + i * f;
    for (int64_t j = 0; j < f; ++j) x[j] = c[j] + noise * rng.normal();
  }
  return d;
}

}  // namespace dtrain
