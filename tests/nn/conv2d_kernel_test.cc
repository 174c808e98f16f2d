// The conv2d kernels (lib/nn/kernels/conv2d.h): output sizes, geometry messages, agreement with a
// direct convolution in double for every im2col chunk size, finite-difference gradients over
// strides, paddings and non-square shapes, and the accumulate/overwrite contract of backward.
//
// Finite differences: conv is linear in x, w and b, so the central difference has no truncation
// error; what remains is float rounding in J, ~1e-7 |J| / eps ~ 1e-5 of the gradient scale with
// eps = 1e-2. Tolerance 1e-3 as in gradcheck_test.cc: a wrong gradient (a dropped patch row, an
// off-by-one padding offset, a missing sample) is off by O(1) of the scale.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "fd_util.h"
#include "nn/kernels/conv2d.h"
#include "util/check.h"
#include "util/rng.h"

namespace dtrain {
namespace {

using testing::fill_uniform;
using testing::grad_error;
using testing::numeric_grad;
using testing::weighted_sum;

using testing::kEps;
using testing::kTol;

Conv2dGeometry geom(int64_t n, int64_t c, int64_t h, int64_t w, int64_t o, int64_t kh, int64_t kw,
                    int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  return {n, c, h, w, o, kh, kw, sh, sw, ph, pw};
}

// The geometries of the gradient and reference checks: stride 1 and 2, padding 0, 1 and larger
// than half the kernel, non-square inputs, kernels, strides and paddings, C > 1, O > 1, N > 1,
// and sizes where the floor in the output formula drops input rows or columns.
std::vector<Conv2dGeometry> geometries() {
  return {
      geom(1, 1, 5, 5, 1, 3, 3, 1, 1, 0, 0),  // the plain case
      geom(2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1),  // padding 1, C, O, N > 1, non-square input
      geom(3, 2, 8, 7, 3, 3, 3, 2, 2, 1, 1),  // stride 2, padded; 7 columns floor to 4
      geom(2, 2, 6, 9, 2, 2, 3, 2, 1, 0, 1),  // non-square kernel, stride and padding
      geom(2, 3, 5, 6, 2, 1, 1, 2, 2, 0, 0),  // 1x1 kernel, stride 2 drops the last row
      geom(1, 2, 3, 4, 2, 5, 5, 1, 1, 2, 2),  // kernel larger than the input, padded to fit
      geom(2, 1, 9, 8, 2, 4, 4, 3, 3, 1, 1),  // stride 3 with floor: 10 -> 3 rows, 9 -> 2 cols
      geom(2, 2, 3, 3, 2, 3, 3, int64_t{1} << 30, int64_t{1} << 30, 2, 2),  // one output per map
  };
}

std::string name(const Conv2dGeometry& g) {
  std::ostringstream os;  // (not string +: GCC 12 warns falsely about it, -Wrestrict)
  os << "N" << g.batch << " C" << g.channels << " " << g.height << "x" << g.width << " O"
     << g.out_channels << " k" << g.kernel_h << "x" << g.kernel_w << " s" << g.stride_h << "x"
     << g.stride_w << " p" << g.pad_h << "x" << g.pad_w;
  return os.str();
}

// The input element a kernel tap reads, or -1 when it falls on padding.
int64_t tap(const Conv2dGeometry& g, int64_t n, int64_t c, int64_t p, int64_t q, int64_t i,
            int64_t j) {
  const int64_t ih = p * g.stride_h - g.pad_h + i, iw = q * g.stride_w - g.pad_w + j;
  if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) return -1;
  return ((n * g.channels + c) * g.height + ih) * g.width + iw;
}

// Direct convolution and its gradients in double, from the definition (no im2col).
struct Direct {
  std::vector<double> y, dw, db, dx;
};

Direct direct(const Conv2dGeometry& g, const std::vector<float>& x, const std::vector<float>& w,
              const std::vector<float>& b, const std::vector<float>& dy) {
  const int64_t oh = g.out_height(), ow = g.out_width();
  Direct d;
  d.y.assign(static_cast<size_t>(g.batch * g.out_sample()), 0.0);
  d.dw.assign(w.size(), 0.0);
  d.db.assign(b.size(), 0.0);
  d.dx.assign(x.size(), 0.0);
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t o = 0; o < g.out_channels; ++o)
      for (int64_t p = 0; p < oh; ++p)
        for (int64_t q = 0; q < ow; ++q) {
          const size_t yi = static_cast<size_t>(((n * g.out_channels + o) * oh + p) * ow + q);
          double acc = b[static_cast<size_t>(o)];
          d.db[static_cast<size_t>(o)] += dy[yi];
          for (int64_t c = 0; c < g.channels; ++c)
            for (int64_t i = 0; i < g.kernel_h; ++i)
              for (int64_t j = 0; j < g.kernel_w; ++j) {
                const int64_t xi = tap(g, n, c, p, q, i, j);
                if (xi < 0) continue;
                const size_t wi =
                    static_cast<size_t>(((o * g.channels + c) * g.kernel_h + i) * g.kernel_w + j);
                acc += static_cast<double>(w[wi]) * x[static_cast<size_t>(xi)];
                d.dw[wi] += static_cast<double>(dy[yi]) * x[static_cast<size_t>(xi)];
                d.dx[static_cast<size_t>(xi)] += static_cast<double>(dy[yi]) * w[wi];
              }
          d.y[yi] = acc;
        }
  return d;
}

// max |a - b| / max |b|.
double rel_error(const std::vector<float>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  REQUIRE(scale > 0.0);
  return err / scale;
}

struct Buffers {
  std::vector<float> x, w, b, r;
};

Buffers random_buffers(const Conv2dGeometry& g, uint64_t seed) {
  Rng rng(seed, 3);
  Buffers t;
  t.x.resize(static_cast<size_t>(g.batch * g.in_sample()));
  t.w.resize(static_cast<size_t>(g.weight_count()));
  t.b.resize(static_cast<size_t>(g.out_channels));
  t.r.resize(static_cast<size_t>(g.batch * g.out_sample()));
  fill_uniform(t.x, rng, -1.0f, 1.0f);
  fill_uniform(t.w, rng, -1.0f, 1.0f);
  fill_uniform(t.b, rng, -1.0f, 1.0f);
  fill_uniform(t.r, rng, -1.0f, 1.0f);
  return t;
}

struct Outputs {
  std::vector<float> y, dw, db, dx, scratch;
};

// Forward, then backward with dy = t.r, from zero gradients.
Outputs run_kernels(const Conv2dGeometry& g, const Buffers& t, int64_t chunk) {
  Outputs o;
  o.y.resize(t.r.size());
  o.dw.assign(t.w.size(), 0.0f);
  o.db.assign(t.b.size(), 0.0f);
  o.dx.assign(t.x.size(), 0.0f);
  conv2d_forward(g, t.x.data(), t.w.data(), t.b.data(), o.y.data(), o.scratch, chunk);
  conv2d_backward(g, t.x.data(), t.w.data(), t.r.data(), o.dw.data(), o.db.data(), o.dx.data(),
                  o.scratch, chunk);
  return o;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double err = 0.0;
  for (size_t i = 0; i < a.size(); ++i) err = std::max(err, std::fabs(a[i] - b[i]));
  return err;
}

TEST_CASE("conv2d kernel: output sizes follow PyTorch's floor formula") {
  struct Case {
    int64_t h, w, k, s, p, oh, ow;
  };
  // Values as torch.nn.Conv2d gives them (e.g. 28 -> 28 for k3 p1, 28 -> 14 for k3 s2 p1).
  for (const Case& c :
       {Case{28, 28, 3, 1, 1, 28, 28}, Case{28, 28, 3, 1, 0, 26, 26}, Case{28, 28, 3, 2, 1, 14, 14},
        Case{14, 14, 5, 2, 2, 7, 7}, Case{7, 5, 3, 2, 0, 3, 2}, Case{3, 3, 3, 1, 0, 1, 1},
        Case{10, 11, 4, 3, 0, 3, 3}, Case{1, 1, 1, 1, 2, 5, 5}}) {
    const Conv2dGeometry g = conv2d_geometry(2, 3, c.h, c.w, 8, c.k, c.s, c.p);
    INFO(c.h, "x", c.w, " k", c.k, " s", c.s, " p", c.p);
    CHECK(conv2d_geometry_error(g).empty());
    CHECK(g.out_height() == c.oh);
    CHECK(g.out_width() == c.ow);
    CHECK(g.out_sample() == 8 * c.oh * c.ow);
    CHECK(g.weight_count() == 8 * 3 * c.k * c.k);
  }
  const Conv2dGeometry r = geom(1, 2, 9, 6, 3, 4, 2, 2, 3, 1, 0);
  CHECK(r.out_height() == 4);  // (9 + 2 - 4) / 2 + 1
  CHECK(r.out_width() == 2);   // floor((6 - 2) / 3) + 1
}

TEST_CASE("conv2d kernel: a geometry that does not fit gets one clear line") {
  const auto err = [](const Conv2dGeometry& g) { return conv2d_geometry_error(g); };
  CHECK(err(conv2d_geometry(1, 1, 3, 3, 4, 5)) ==
        "kernel 5x5 is larger than the padded input 3x3 (input 3x3, padding 0x0)");
  CHECK(err(geom(1, 1, 3, 8, 4, 4, 2, 1, 1, 0, 1)) ==
        "kernel 4x2 is larger than the padded input 3x10 (input 3x8, padding 0x1)");
  CHECK(err(conv2d_geometry(1, 1, 3, 3, 4, 4, 1, 1)).empty());  // 5x5 padded: fits
  CHECK(err(conv2d_geometry(1, 0, 3, 3, 4, 3)) == "input channels must be >= 1 (got 0)");
  CHECK(err(conv2d_geometry(1, 1, 0, 3, 4, 3)) == "input height and width must be >= 1 (got 0x3)");
  CHECK(err(conv2d_geometry(1, 1, 3, 3, 0, 3)) == "out_channels must be >= 1 (got 0)");
  CHECK(err(conv2d_geometry(1, 1, 3, 3, 4, 0)) == "kernel must be >= 1 (got 0x0)");
  CHECK(err(conv2d_geometry(1, 1, 3, 3, 4, 3, 0)) == "stride must be >= 1 (got 0x0)");
  CHECK(err(conv2d_geometry(1, 1, 3, 3, 4, 3, 1, -1)) == "padding must be >= 0 (got -1x-1)");
  CHECK(err(conv2d_geometry(-1, 1, 3, 3, 4, 3)) == "batch must be >= 0 (got -1)");
  CHECK(
      err(conv2d_geometry(1, 1, int64_t{1} << 40, 3, 4, 3)).rfind("sizes must be below 2^31", 0) ==
      0);
  CHECK(err(conv2d_geometry(1, 4096, 1024, 1024, 4, 3, 1, 1)) ==
        "too large: 4096x1024x1024 input, 4 output channels, kernel 3x3, stride 1x1 and padding "
        "1x1 (a 1024x1024 output) need 2^31 or more elements per sample");
  // A block's GEMMs span its samples' outputs (N = n x OH x OW, 32-bit): 2^30 per sample fits
  // one sample, not 2, so blocks are of one; the batch bounds a block too.
  CHECK(err(conv2d_geometry(4, 1, 32768, 32768, 1, 1)).empty());
  CHECK(conv2d_block_samples(conv2d_geometry(4, 1, 32768, 32768, 1, 1)) == 1);
  CHECK(conv2d_block_samples(conv2d_geometry(4, 1, 16384, 16384, 1, 1)) == 4);
  CHECK(conv2d_block_samples(conv2d_geometry(4, 1, 16384, 16384, 3, 1)) == 2);  // (O = 3 rows)
  CHECK(conv2d_block_samples(conv2d_geometry(2, 1, 8, 8, 4, 3)) == 2);
  // Padding a user could type, far beyond memory: a message, not an overflow.
  CHECK(err(conv2d_geometry(1, 1, 3, 3, 1, 3, 1, (int64_t{1} << 31) - 1))
            .rfind("too large: 1x3x3 input, 1 output channels", 0) == 0);
  CHECK(
      err(conv2d_geometry(1, 1, 3, 3, 1, 3, 1, int64_t{1} << 31)).rfind("sizes must be below", 0) ==
      0);
  CHECK(err(conv2d_geometry(1, 1, 3, 3, 1, 3, std::numeric_limits<int64_t>::max(), 5)) ==
        "sizes must be below 2^31 (input 3x3, kernel 3x3, stride 9223372036854775807x"
        "9223372036854775807, padding 5x5)");
  CHECK(err(conv2d_geometry(1, 1, 3, 3, 1, 3, (int64_t{1} << 31) - 1, 5)).empty());  // 1x1 out
  // The kernels refuse what the check refuses: a broken invariant, not a crash.
  std::vector<float> scratch, buf(64);
  CHECK_THROWS_AS(conv2d_forward(conv2d_geometry(1, 1, 3, 3, 1, 5), buf.data(), buf.data(), nullptr,
                                 buf.data(), scratch),
                  InternalError);
}

TEST_CASE("conv2d kernel: forward and backward equal a direct convolution for every chunk") {
  std::vector<Conv2dGeometry> gs = geometries();
  gs.push_back(conv2d_geometry(5, 32, 14, 14, 64, 3, 1, 1));  // cnn-ref's second conv, N = 5
  for (const Conv2dGeometry& g : gs) {
    const Buffers t = random_buffers(g, 17);
    const Direct ref = direct(g, t.x, t.w, t.b, t.r);
    for (int64_t chunk : {int64_t{1}, int64_t{2}, int64_t{3}, g.batch, int64_t{1000}}) {
      INFO(name(g), " chunk ", chunk);
      const Outputs out = run_kernels(g, t, chunk);
      CHECK(static_cast<int64_t>(out.scratch.size()) == conv2d_scratch_floats(g, chunk));
      CHECK(rel_error(out.y, ref.y) < 1e-5);
      CHECK(rel_error(out.dw, ref.dw) < 1e-5);
      CHECK(rel_error(out.db, ref.db) < 1e-5);
      CHECK(rel_error(out.dx, ref.dx) < 1e-5);
    }
  }
}

TEST_CASE("conv2d kernel: finite-difference gradients of input, weight and bias") {
  for (const Conv2dGeometry& g : geometries()) {
    for (int64_t chunk : {int64_t{1}, int64_t{2}}) {
      INFO(name(g), " chunk ", chunk);
      Buffers t = random_buffers(g, 29);
      std::vector<float> y(t.r.size()), scratch;
      const auto objective = [&]() {
        conv2d_forward(g, t.x.data(), t.w.data(), t.b.data(), y.data(), scratch, chunk);
        return weighted_sum(y, t.r);
      };
      std::vector<float> dw(t.w.size(), 0.0f), db(t.b.size(), 0.0f), dx(t.x.size());
      conv2d_backward(g, t.x.data(), t.w.data(), t.r.data(), dw.data(), db.data(), dx.data(),
                      scratch, chunk);
      CHECK(grad_error(numeric_grad(t.x, kEps, objective), dx) < kTol);
      CHECK(grad_error(numeric_grad(t.w, kEps, objective), dw) < kTol);
      CHECK(grad_error(numeric_grad(t.b, kEps, objective), db) < kTol);
    }
  }
}

TEST_CASE("conv2d kernel: dW and db accumulate, dx is overwritten and may be skipped") {
  const Conv2dGeometry g = geom(3, 2, 6, 5, 3, 3, 3, 2, 1, 1, 1);
  const Buffers t = random_buffers(g, 41);
  for (int64_t chunk : {int64_t{1}, int64_t{3}}) {
    INFO("chunk ", chunk);
    std::vector<float> scratch, dw1(t.w.size(), 0.0f), db1(t.b.size(), 0.0f), dx1(t.x.size());
    conv2d_backward(g, t.x.data(), t.w.data(), t.r.data(), dw1.data(), db1.data(), dx1.data(),
                    scratch, chunk);
    // Starting from nonzero gradients adds to them; a stale dx is replaced, not added to.
    std::vector<float> dw2(t.w.size(), 0.5f), db2(t.b.size(), -0.25f), dx2(t.x.size(), 7.0f);
    conv2d_backward(g, t.x.data(), t.w.data(), t.r.data(), dw2.data(), db2.data(), dx2.data(),
                    scratch, chunk);
    for (size_t i = 0; i < dw1.size(); ++i) CHECK(dw2[i] == doctest::Approx(dw1[i] + 0.5f));
    for (size_t i = 0; i < db1.size(); ++i) CHECK(db2[i] == doctest::Approx(db1[i] - 0.25f));
    CHECK(dx2 == dx1);
    // No dx (first layer): the same weight gradients; no bias: db untouched, rest the same.
    std::vector<float> dw3(t.w.size(), 0.0f), db3(t.b.size(), 0.0f);
    conv2d_backward(g, t.x.data(), t.w.data(), t.r.data(), dw3.data(), db3.data(), nullptr, scratch,
                    chunk);
    CHECK(dw3 == dw1);
    CHECK(db3 == db1);
    std::vector<float> dw4(t.w.size(), 0.0f), dx4(t.x.size());
    conv2d_backward(g, t.x.data(), t.w.data(), t.r.data(), dw4.data(), nullptr, dx4.data(), scratch,
                    chunk);
    CHECK(dw4 == dw1);
    CHECK(dx4 == dx1);
  }
}

TEST_CASE("conv2d kernel: no bias, an empty batch, and scratch reuse without reallocation") {
  const Conv2dGeometry g = geom(2, 3, 5, 4, 2, 3, 3, 1, 1, 1, 1);
  Buffers t = random_buffers(g, 53);
  std::vector<float> y(t.r.size()), y0(t.r.size()), scratch;
  conv2d_forward(g, t.x.data(), t.w.data(), t.b.data(), y.data(), scratch);
  conv2d_forward(g, t.x.data(), t.w.data(), nullptr, y0.data(), scratch);
  const int64_t ohw = g.out_height() * g.out_width();
  for (size_t i = 0; i < y.size(); ++i) {
    const size_t o = (i / static_cast<size_t>(ohw)) % static_cast<size_t>(g.out_channels);
    CHECK(y[i] == doctest::Approx(y0[i] + t.b[o]));
  }
  // The second call of each kind reuses the buffer the first one grew.
  const float* data = scratch.data();
  std::vector<float> dw(t.w.size(), 0.0f), dx(t.x.size());
  conv2d_backward(g, t.x.data(), t.w.data(), t.r.data(), dw.data(), nullptr, dx.data(), scratch);
  conv2d_forward(g, t.x.data(), t.w.data(), t.b.data(), y.data(), scratch);
  CHECK(scratch.data() == data);
  // N = 0 touches nothing.
  Conv2dGeometry empty = g;
  empty.batch = 0;
  std::vector<float> untouched(4, 3.0f);
  conv2d_forward(empty, nullptr, t.w.data(), t.b.data(), untouched.data(), scratch);
  conv2d_backward(empty, nullptr, t.w.data(), nullptr, untouched.data(), untouched.data(),
                  untouched.data(), scratch);
  CHECK(untouched == std::vector<float>(4, 3.0f));
}

TEST_CASE("conv2d kernel: 300 random small geometries equal the direct convolution") {
  // Corners the hand-picked list may miss: rectangular everything, padding as large as the kernel
  // (whole rows or columns of a block on padding), stride larger than the kernel (input elements
  // no output reads), 1x1 inputs, batch 0 and the contiguous and general im2col paths.
  Rng rng(2026);
  const auto pick = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng.below(static_cast<uint64_t>(hi - lo + 1)));
  };
  int tested = 0;
  while (tested < 300) {
    const Conv2dGeometry g =
        geom(pick(0, 3), pick(1, 3), pick(1, 8), pick(1, 8), pick(1, 3), pick(1, 4), pick(1, 4),
             pick(1, 3), pick(1, 3), pick(0, 3), pick(0, 3));
    if (!conv2d_geometry_error(g).empty()) continue;  // a kernel larger than the padded input
    ++tested;
    const Buffers t = random_buffers(g, static_cast<uint64_t>(tested));
    const Direct ref = direct(g, t.x, t.w, t.b, t.r);
    for (int64_t chunk : {int64_t{1}, int64_t{2}}) {
      INFO(name(g), " chunk ", chunk);
      const Outputs out = run_kernels(g, t, chunk);
      // Absolute error against the scale 1 of the inputs: some outputs read only padding.
      CHECK(max_abs_diff(out.y, ref.y) < 1e-5);
      CHECK(max_abs_diff(out.dw, ref.dw) < 1e-5);
      CHECK(max_abs_diff(out.db, ref.db) < 1e-5);
      CHECK(max_abs_diff(out.dx, ref.dx) < 1e-5);
    }
  }
}

}  // namespace
}  // namespace dtrain
