// dtrain's CNN kernels against PyTorch, as llm.c checks itself: scripts/ref/torch_cnn_ref.py ran
// cnn-ref's first layers (conv 3x3 1->32 p1, ReLU, max-pool 2, conv 3x3 32->64 p1, ReLU, then
// max-pool 2 and avg-pool 2) in float64 on 2 images with weights from a shared formula and wrote
// the pooled outputs, the loss and every gradient to tests/nn/data/torch_cnn_ref.bin. This test
// rebuilds the same inputs, runs the float32 kernels forward and backward, and compares; it needs
// no PyTorch.
//
// Criterion per tensor: max_i |dtrain_i - torch_i| <= 1e-5 * max_i |torch_i|. The script chose
// the seed so that no ReLU input and no max-pool runner-up lies within 1e-5 of the scale of its
// decision, so float32 rounding (measured: a few 1e-7) cannot flip a gate and the bound holds
// elementwise everywhere; a wrong kernel (padding offset, a window's argmax, a missing bias
// gradient term) is off by far more.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "nn/kernels/conv2d.h"
#include "nn/kernels/pool2d.h"

namespace dtrain {
namespace {

constexpr double kTol = 1e-5;

// The 32-bit hash of the script (mod 2^32 arithmetic; lowbias32 after a Weyl step).
uint32_t mix(uint32_t i, uint32_t salt) {
  uint32_t x = i * 0x9E3779B1u + salt * 0x85EBCA77u;
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// Tensor `id` of the script: element i is (k / 2^24 + offset) * scale, k = mix(i, 16 seed + id)
// >> 8, exact in float32.
std::vector<float> formula(int64_t n, uint32_t seed, uint32_t id, float offset, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t k = mix(static_cast<uint32_t>(i), 16 * seed + id) >> 8;
    v[static_cast<size_t>(i)] = (static_cast<float>(k) / 16777216.0f + offset) * scale;
  }
  return v;
}

struct Reference {
  uint32_t seed = 0;
  std::map<std::string, std::vector<float>> tensors;
};

Reference load_reference() {
  const std::string path = std::string(DTRAIN_SOURCE_DIR) + "/tests/nn/data/torch_cnn_ref.bin";
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open ", path);
  std::string line;
  std::getline(in, line);
  REQUIRE(line == "dtrain torch_cnn_ref 1");
  std::getline(in, line);
  REQUIRE(line.rfind("seed ", 0) == 0);
  Reference ref;
  ref.seed = static_cast<uint32_t>(std::stoul(line.substr(5)));
  std::vector<std::pair<std::string, int64_t>> order;
  while (std::getline(in, line) && line != "end") {
    std::istringstream ls(line);
    std::string name;
    ls >> name;
    int64_t n = 1, d = 0;
    while (ls >> d) n *= d;
    order.emplace_back(name, n);
  }
  REQUIRE(line == "end");
  for (const auto& [name, n] : order) {
    std::vector<float> v(static_cast<size_t>(n));
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
    REQUIRE_MESSAGE(in.gcount() == static_cast<std::streamsize>(n * sizeof(float)),
                    "truncated reference at ", name);
    ref.tensors[name] = std::move(v);  // the file is little-endian float32, as this machine
  }
  in.peek();
  REQUIRE(in.eof());  // nothing after the last tensor
  return ref;
}

// max |a - b| / max |b|, with the sizes checked.
double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  REQUIRE(scale > 0.0);
  return err / scale;
}

void relu(std::vector<float>& v) {
  for (float& e : v) e = e > 0.0f ? e : 0.0f;
}

// dv *= (pre > 0): ReLU's backward.
void relu_backward(const std::vector<float>& pre, std::vector<float>& dv) {
  for (size_t i = 0; i < dv.size(); ++i) dv[i] = pre[i] > 0.0f ? dv[i] : 0.0f;
}

TEST_CASE("torch reference: cnn-ref's first layers match PyTorch forward and backward (1e-5)") {
  const Reference ref = load_reference();
  const uint32_t s = ref.seed;
  const int64_t n = 2;
  const Conv2dGeometry g1 = conv2d_geometry(n, 1, 28, 28, 32, 3, 1, 1);
  const Conv2dGeometry g2 = conv2d_geometry(n, 32, 14, 14, 64, 3, 1, 1);
  const Pool2dGeometry q1 = pool2d_geometry(n, 32, 28, 28, 2),
                       q2 = pool2d_geometry(n, 64, 14, 14, 2);
  const std::vector<float> x = formula(n * g1.in_sample(), s, 0, 0.0f, 1.0f);
  const std::vector<float> w1 = formula(g1.weight_count(), s, 1, -0.5f, 0.5f);
  const std::vector<float> b1 = formula(32, s, 2, -0.5f, 0.5f);
  const std::vector<float> w2 = formula(g2.weight_count(), s, 3, -0.5f, 0.125f);
  const std::vector<float> b2 = formula(64, s, 4, -0.5f, 0.125f);
  const std::vector<float> c_max = formula(n * q2.out_sample(), s, 5, -0.5f, 2.0f);
  const std::vector<float> c_avg = formula(n * q2.out_sample(), s, 6, -0.5f, 2.0f);

  // Forward.
  std::vector<float> scratch, a1(static_cast<size_t>(n * g1.out_sample()));
  conv2d_forward(g1, x.data(), w1.data(), b1.data(), a1.data(), scratch);
  std::vector<float> r1 = a1;
  relu(r1);
  std::vector<float> p1(static_cast<size_t>(n * q1.out_sample()));
  std::vector<int32_t> i1(p1.size());
  max_pool2d_forward(q1, r1.data(), p1.data(), i1.data());
  std::vector<float> a2(static_cast<size_t>(n * g2.out_sample()));
  conv2d_forward(g2, p1.data(), w2.data(), b2.data(), a2.data(), scratch);
  std::vector<float> r2 = a2;
  relu(r2);
  std::vector<float> pmax(c_max.size()), pavg(c_avg.size());
  std::vector<int32_t> i2(pmax.size());
  max_pool2d_forward(q2, r2.data(), pmax.data(), i2.data());
  avg_pool2d_forward(q2, r2.data(), pavg.data());
  double loss = 0.0;
  for (size_t i = 0; i < pmax.size(); ++i)
    loss += static_cast<double>(c_max[i]) * pmax[i] + static_cast<double>(c_avg[i]) * pavg[i];

  CHECK(rel_error(p1, ref.tensors.at("pool1")) < kTol);
  CHECK(rel_error(pmax, ref.tensors.at("pool2_max")) < kTol);
  CHECK(rel_error(pavg, ref.tensors.at("pool2_avg")) < kTol);
  CHECK(loss == doctest::Approx(ref.tensors.at("loss")[0]).epsilon(kTol));

  // Backward: dL/dpool2 are the coefficients.
  std::vector<float> dr2(r2.size()), tmp(r2.size());
  max_pool2d_backward(q2, c_max.data(), i2.data(), dr2.data());
  avg_pool2d_backward(q2, c_avg.data(), tmp.data());
  for (size_t i = 0; i < dr2.size(); ++i) dr2[i] += tmp[i];
  relu_backward(a2, dr2);
  std::vector<float> dw2(w2.size(), 0.0f), db2(b2.size(), 0.0f), dp1(p1.size());
  conv2d_backward(g2, p1.data(), w2.data(), dr2.data(), dw2.data(), db2.data(), dp1.data(),
                  scratch);
  std::vector<float> dr1(r1.size());
  max_pool2d_backward(q1, dp1.data(), i1.data(), dr1.data());
  relu_backward(a1, dr1);
  std::vector<float> dw1(w1.size(), 0.0f), db1(b1.size(), 0.0f), dx(x.size());
  conv2d_backward(g1, x.data(), w1.data(), dr1.data(), dw1.data(), db1.data(), dx.data(), scratch);

  CHECK(rel_error(dw2, ref.tensors.at("grad.conv2.weight")) < kTol);
  CHECK(rel_error(db2, ref.tensors.at("grad.conv2.bias")) < kTol);
  CHECK(rel_error(dw1, ref.tensors.at("grad.conv1.weight")) < kTol);
  CHECK(rel_error(db1, ref.tensors.at("grad.conv1.bias")) < kTol);
  CHECK(rel_error(dx, ref.tensors.at("grad.x")) < kTol);
  // For the record (doctest prints it with the results): the measured errors.
  MESSAGE("errors: pool1 ", rel_error(p1, ref.tensors.at("pool1")), ", pool2_max ",
          rel_error(pmax, ref.tensors.at("pool2_max")), ", grad.conv2.weight ",
          rel_error(dw2, ref.tensors.at("grad.conv2.weight")), ", grad.conv1.weight ",
          rel_error(dw1, ref.tensors.at("grad.conv1.weight")), ", grad.x ",
          rel_error(dx, ref.tensors.at("grad.x")));
}

}  // namespace
}  // namespace dtrain
