// Reader for the PyTorch reference files that scripts/ref/*.py write (tests/nn/data/*.txt): text,
// version 1, format documented in scripts/ref/torch_gpt_ref.py's docstring. Test-only; a malformed
// file throws std::runtime_error naming the line, so a truncated commit fails loudly.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtrain::testing {

struct RefTensor {
  std::vector<int64_t> shape;
  std::vector<double> values;  // row-major, prod(shape) of them (1 for a scalar)
  std::vector<float> as_float() const { return {values.begin(), values.end()}; }
  std::vector<int32_t> as_int() const {
    std::vector<int32_t> v;
    for (double x : values) v.push_back(static_cast<int32_t>(x));
    return v;
  }
};

struct TorchRef {
  std::map<std::string, std::map<std::string, int64_t>> config;  // section -> key -> value
  std::map<std::string, RefTensor> tensors;

  const RefTensor& at(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw std::runtime_error("reference has no tensor " + name);
    return it->second;
  }
  int64_t cfg(const std::string& section, const std::string& key) const {
    auto s = config.find(section);
    if (s == config.end() || !s->second.count(key)) {
      throw std::runtime_error("reference has no config " + section + " " + key);
    }
    return s->second.at(key);
  }
};

inline TorchRef read_torch_ref(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  TorchRef ref;
  std::string line;
  int64_t lineno = 0;
  const auto fail = [&](const std::string& why) {
    throw std::runtime_error(path + ":" + std::to_string(lineno) + ": " + why);
  };
  const auto next = [&]() {
    while (std::getline(in, line)) {
      ++lineno;
      if (!line.empty() && line[0] != '#') return true;
    }
    return false;
  };
  if (!next() || line != "dtrain-torch-ref 1")
    fail("expected the version line 'dtrain-torch-ref 1'");
  bool ended = false;
  while (!ended && next()) {
    std::istringstream fields(line);
    std::string kind, name;
    fields >> kind;
    if (kind == "end") {
      ended = true;
    } else if (kind == "config") {
      std::string key;
      int64_t value = 0;
      fields >> name;
      while (fields >> key >> value) ref.config[name][key] = value;
    } else if (kind == "tensor") {
      RefTensor t;
      int64_t ndim = -1, n = 1;
      fields >> name >> ndim;
      for (int64_t i = 0; i < ndim; ++i) {
        int64_t dim = -1;
        fields >> dim;
        if (dim < 0) fail("bad shape");
        t.shape.push_back(dim);
        n *= dim;
      }
      if (ndim < 0 || !fields) fail("bad tensor header");
      if (!next()) fail("tensor " + name + " has no values line");
      std::istringstream values(line);
      double v;
      while (values >> v) t.values.push_back(v);
      if (static_cast<int64_t>(t.values.size()) != n || !values.eof()) {
        fail("tensor " + name + ": expected " + std::to_string(n) + " numbers");
      }
      ref.tensors[name] = std::move(t);
    } else {
      fail("unknown record '" + kind + "'");
    }
  }
  if (!ended) fail("no 'end' line: truncated file");
  return ref;
}

// max_i |got_i - want_i| / max_i |want_i|: a tensor's error relative to its scale (an
// element-wise relative error is meaningless for elements that happen to be near zero).
inline double max_rel_error(const float* got, const RefTensor& want) {
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.values.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - want.values[i]));
    scale = std::max(scale, std::fabs(want.values[i]));
  }
  return scale > 0 ? err / scale : err;
}

}  // namespace dtrain::testing
