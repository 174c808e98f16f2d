#include "checkpoint/compare.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <system_error>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_internal.h"
#include "checkpoint/safetensors.h"
#include "util/check.h"

namespace dtrain {

namespace fs = std::filesystem;

namespace {

// Per-rank training state: compression's and Local SGD's replicas' own optimizer state, which
// one process has no counterpart of.
bool is_rank_state(const std::string& name) {
  return name.rfind("comp.", 0) == 0 || checkpoint_internal::is_replica_tensor(name);
}

TensorMap from_stfile(StFile&& f) {
  TensorMap m;
  for (auto& [name, t] : f.tensors) m[name] = NamedTensor{std::move(t.shape), std::move(t.data)};
  return m;
}

const NamedTensor& counterpart(const TensorMap& got, const std::string& name,
                               const NamedTensor& want) {
  const auto it = got.find(name);
  if (it == got.end()) throw UserError("tensor '" + name + "' is missing from the compared state");
  if (it->second.shape != want.shape)
    throw UserError("tensor '" + name + "' has shape " + format_index(it->second.shape, -1) +
                    " in the compared state, " + format_index(want.shape, -1) +
                    " in the reference");
  return it->second;
}

}  // namespace

StFile read_checkpoint_file(const std::string& path, const std::string& tmp_dir,
                            const StReadOptions& options) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return read_safetensors(path, options);
  // A sharded folder: consolidated into a temporary file beside it (the same file system, so the
  // space is where the checkpoint already is), read, removed.
  std::string name = ".";  // (appended piecewise: GCC 12's -Wrestrict misfires on "." + s)
  name += fs::path(path).filename().string();
  name += ".compare." + std::to_string(::getpid()) + ".safetensors";
  const fs::path tmp = (tmp_dir.empty() ? fs::path(path).parent_path() : fs::path(tmp_dir)) / name;
  try {
    consolidate_checkpoint(path, tmp.string());
    StFile f = read_safetensors(tmp.string(), options);
    fs::remove(tmp, ec);
    return f;
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
}

TensorMap read_checkpoint_tensors(const std::string& path, const std::string& tmp_dir) {
  return from_stfile(read_checkpoint_file(path, tmp_dir, {}));
}

std::string format_index(const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size());
  if (flat < 0) {
    idx = shape;  // the shape itself
  } else {
    for (size_t d = shape.size(); d-- > 0;) {
      const int64_t n = std::max<int64_t>(1, shape[d]);
      idx[d] = flat % n;
      flat /= n;
    }
  }
  std::string s = "[";
  for (size_t d = 0; d < idx.size(); ++d) s += (d ? ", " : "") + std::to_string(idx[d]);
  return s + "]";
}

namespace {

// Accumulates one tensor's comparison of got against want (both already offset by the common
// starting value for updates); `value` is want's own value, the fallback scale.
struct DiffAcc {
  TensorDiff d;
  double diff2 = 0.0, want2 = 0.0, value2 = 0.0, max_diff = 0.0, max_want = 0.0, max_value = 0.0;

  void add(size_t i, double want, double got, double value) {
    const double e = std::fabs(got - want);
    diff2 += e * e;
    want2 += want * want;
    value2 += value * value;
    max_want = std::max(max_want, std::fabs(want));
    max_value = std::max(max_value, std::fabs(value));
    if (e > max_diff || (std::isnan(e) && d.index < 0) || (d.index < 0 && e > 0)) {
      max_diff = std::isnan(e) ? INFINITY : e;
      d.index = static_cast<int64_t>(i);
      d.want = want;
      d.got = got;
    }
  }
  static double ratio(double num, double den) {
    return num == 0.0 ? 0.0 : den > 0.0 ? num / den : INFINITY;
  }
  // floor2: the squared scale floor of this tensor (kind_floor2 below).
  TensorDiff finish(double floor2) {
    const bool fallback = want2 == 0.0;
    if (std::isnan(diff2)) diff2 = INFINITY;
    const double own2 = fallback ? value2 : want2;
    d.scale = std::sqrt(std::max(own2, floor2));
    d.rel = ratio(std::sqrt(diff2), d.scale);
    const double own_max = fallback ? max_value : max_want;
    d.max_rel = ratio(max_diff, own2 >= floor2 ? own_max : std::sqrt(floor2 / n));
    return std::move(d);
  }
  double n = 0.0;  // elements
};

// The kind of a tensor, whose tensors share a scale: the parameters, or one optimizer state
// ("optim.momentum.layers.0.weight" -> "optim.momentum").
std::string kind_of(const std::string& name) {
  if (name.rfind("optim.", 0) != 0) return "";
  const size_t dot = name.find('.', 6);
  return dot == std::string::npos ? name : name.substr(0, dot);
}

// Finishes every accumulator with its floor: kScaleFloor times the RMS value of its kind's
// reference (over all of the kind's elements) times sqrt(its own elements), squared.
std::vector<TensorDiff> finish_all(std::vector<DiffAcc>& accs) {
  std::map<std::string, std::pair<double, double>> kinds;  // kind -> (sum of want2, elements)
  for (const DiffAcc& a : accs) {
    auto& k = kinds[kind_of(a.d.name)];
    k.first += a.want2 == 0.0 ? a.value2 : a.want2;
    k.second += a.n;
  }
  std::vector<TensorDiff> out;
  for (DiffAcc& a : accs) {
    const auto& k = kinds[kind_of(a.d.name)];
    const double mean2 = k.second > 0 ? k.first / k.second : 0.0;
    out.push_back(a.finish(kScaleFloor * kScaleFloor * mean2 * a.n));
  }
  return out;
}

}  // namespace

std::vector<TensorDiff> tensor_diffs(const TensorMap& want, const TensorMap& got) {
  std::vector<DiffAcc> accs;
  for (const auto& [name, w] : want) {
    if (is_rank_state(name)) continue;
    const NamedTensor& g = counterpart(got, name, w);
    DiffAcc& acc = accs.emplace_back();
    acc.d.name = name;
    acc.d.shape = w.shape;
    acc.n = static_cast<double>(w.data.size());
    for (size_t i = 0; i < w.data.size(); ++i) acc.add(i, w.data[i], g.data[i], w.data[i]);
  }
  return finish_all(accs);
}

std::vector<TensorDiff> update_diffs(const TensorMap& from, const TensorMap& want,
                                     const TensorMap& got, double slack_ulps) {
  std::vector<DiffAcc> accs;
  for (const auto& [name, w] : want) {
    if (is_rank_state(name)) continue;
    const NamedTensor& g = counterpart(got, name, w);
    const auto f = from.find(name);
    const NamedTensor* base = f == from.end() ? nullptr : &counterpart(from, name, w);
    DiffAcc& acc = accs.emplace_back();
    acc.d.name = name;
    acc.d.shape = w.shape;
    acc.n = static_cast<double>(w.data.size());
    for (size_t i = 0; i < w.data.size(); ++i) {
      const double b = base ? base->data[i] : 0.0;
      double gv = g.data[i];
      if (slack_ulps > 0) {
        const float a = std::fabs(w.data[i]);
        const double slack = slack_ulps * (std::nextafter(a, INFINITY) - a);
        const double e = gv - w.data[i];
        gv = w.data[i] + std::copysign(std::max(0.0, std::fabs(e) - slack), e);
      }
      acc.add(i, w.data[i] - b, gv - b, w.data[i]);
    }
  }
  return finish_all(accs);
}

TensorDiff worst(const std::vector<TensorDiff>& diffs) {
  TensorDiff w;
  for (const TensorDiff& d : diffs)
    if (d.rel > w.rel || (w.name.empty() && !d.name.empty())) w = d;
  return w;
}

double max_rel_diff(const TensorMap& a, const TensorMap& b) {
  const auto compared = [](const TensorMap& m) {
    size_t n = 0;
    for (const auto& kv : m) n += !is_rank_state(kv.first);
    return n;
  };
  if (compared(a) != compared(b))
    throw UserError("the compared states hold " + std::to_string(compared(b)) + " tensors, the " +
                    "reference " + std::to_string(compared(a)));
  double max_diff = 0.0, max_abs = 0.0;
  for (const auto& [name, t] : a) {
    if (is_rank_state(name)) continue;
    const NamedTensor& u = counterpart(b, name, t);
    for (size_t i = 0; i < t.data.size(); ++i) {
      const double e = std::fabs(static_cast<double>(t.data[i]) - u.data[i]);
      max_diff = std::max(max_diff, std::isnan(e) ? INFINITY : e);
      max_abs = std::max(max_abs, static_cast<double>(std::fabs(t.data[i])));
    }
  }
  return max_diff == 0.0 ? 0.0 : max_diff / max_abs;
}

}  // namespace dtrain
