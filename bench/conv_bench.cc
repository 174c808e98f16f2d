// conv_bench: cnn-ref's two convolutions (conv 3x3 1->32 on 28x28, conv 3x3 32->64 on 14x14,
// padding 1; bench/peers/torch_cnn_fmnist.py) forward + backward on a batch, against the GEMMs
// alone: the same im2col GEMMs (same shapes, same buffers, nothing around them), 1 BLAS thread by
// default. The first conv's backward skips dx (it is the first layer), as in training.
//
// For each chunk (samples per im2col GEMM, lib/nn/kernels/conv2d.h) it prints the median
// milliseconds of the kernels, their time relative to the first chunk, the GEMMs alone and the
// fraction GEMM / kernels; then the same GEMMs made whole-batch (the widest shapes; on these
// machines slower than per-sample ones, whose operands stay in cache) and the pooling kernels
// (max-pool 2 fwd + bwd of both layers) for scale. The last line is the same as JSON. Rounds
// alternate the chunks, so load changes on a shared machine spread over all of them.
//
//   build/bin/conv_bench [--batch 128] [--iters 10] [--rounds 3] [--threads 1] [--chunks 1,4,128]
//                        [--layer 0|1|2]   (both convs, or only the first or the second)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "nn/kernels/conv2d.h"
#include "nn/kernels/pool2d.h"
#include "tensor/blas.h"
#include "util/rng.h"

namespace dtrain {
namespace {

struct Layer {
  Conv2dGeometry g;
  bool need_dx = false;
  std::vector<float> x, w, b, y, dy, dw, db, dx, scratch;
};

std::vector<float> filled(int64_t n, Rng& rng) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& e : v) e = rng.uniform() - 0.5f;
  return v;
}

Layer make_layer(const Conv2dGeometry& g, bool need_dx, Rng& rng) {
  Layer l;
  l.g = g;
  l.need_dx = need_dx;
  l.x = filled(g.batch * g.in_sample(), rng);
  l.w = filled(g.weight_count(), rng);
  l.b = filled(g.out_channels, rng);
  l.y = filled(g.batch * g.out_sample(), rng);
  l.dy = filled(g.batch * g.out_sample(), rng);
  l.dw = filled(g.weight_count(), rng);
  l.db = filled(g.out_channels, rng);
  l.dx = filled(g.batch * g.in_sample(), rng);
  return l;
}

void kernels_step(std::vector<Layer>& layers, int64_t chunk) {
  for (Layer& l : layers)
    conv2d_forward(l.g, l.x.data(), l.w.data(), l.b.data(), l.y.data(), l.scratch, chunk);
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
    Layer& l = *it;
    conv2d_backward(l.g, l.x.data(), l.w.data(), l.dy.data(), l.dw.data(), l.db.data(),
                    l.need_dx ? l.dx.data() : nullptr, l.scratch, chunk);
  }
}

// The GEMMs conv2d_forward/backward make for this chunk, with the same operands: per sample, the
// GEMMs write y and read dy of that sample in place; per chunk of several, the [O, len] buffer in
// scratch. The col buffer holds whatever the kernels left there.
void gemm_step(std::vector<Layer>& layers, int64_t chunk) {
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t li = 0; li < layers.size(); ++li) {
      Layer& l = layers[pass == 0 ? li : layers.size() - 1 - li];
      const Conv2dGeometry& g = l.g;
      const int64_t cn = std::max<int64_t>(1, std::min(chunk, g.batch));
      const int64_t o = g.out_channels, k = g.patch(), ohw = g.out_height() * g.out_width();
      l.scratch.resize(static_cast<size_t>(conv2d_scratch_floats(g, cn)));
      float* col = l.scratch.data();
      for (int64_t s0 = 0; s0 < g.batch; s0 += cn) {
        const int64_t len = std::min(cn, g.batch - s0) * ohw;
        float* tmp = col + k * cn * ohw;
        if (pass == 0) {
          // beta as in conv2d_forward: 1 onto the broadcast bias for one sample, 0 into tmp.
          float* out = cn > 1 ? tmp : l.y.data() + s0 * g.out_sample();
          gemm(false, false, o, len, k, 1.0f, l.w.data(), k, col, len, cn > 1 ? 0.0f : 1.0f, out,
               len);
        } else {
          const float* dy = cn > 1 ? tmp : l.dy.data() + s0 * g.out_sample();
          gemm(false, true, o, k, len, 1.0f, dy, len, col, len, 1.0f, l.dw.data(), k);
          if (l.need_dx) gemm(true, false, k, len, o, 1.0f, l.w.data(), k, dy, len, 0.0f, col, len);
        }
      }
    }
  }
}

// Milliseconds on the clock the run uses: with 1 BLAS thread all the work runs in this thread, so
// its CPU time is the measure (time spent descheduled on a machine other jobs share does not
// count); with more threads, wall time.
bool g_wall_clock = false;

double clock_ms() {
  timespec ts{};
  clock_gettime(g_wall_clock ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

double median_ms(const std::function<void()>& f, int iters) {
  f();  // warm-up: buffers grown, caches and OpenBLAS state settled
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const double t0 = clock_ms();
    f();
    t.push_back(clock_ms() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> out;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    const long long v = std::strtoll(p, &end, 10);
    if (end == p || v < 1) {
      std::fprintf(stderr, "conv_bench: --chunks wants positive integers separated by commas\n");
      std::exit(2);
    }
    out.push_back(v);
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

int run(int argc, char** argv) {
  int64_t batch = 128;
  int iters = 10, rounds = 3, threads = 1, only_layer = 0;
  std::vector<int64_t> chunks = {1, 2, 4, 8, 16, 32, 128};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--batch")
      batch = std::atoll(argv[i + 1]);
    else if (a == "--iters")
      iters = std::atoi(argv[i + 1]);
    else if (a == "--rounds")
      rounds = std::atoi(argv[i + 1]);
    else if (a == "--threads")
      threads = std::atoi(argv[i + 1]);
    else if (a == "--chunks")
      chunks = parse_list(argv[i + 1]);
    else if (a == "--layer")
      only_layer = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "conv_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (batch < 1 || iters < 1 || rounds < 1 || threads < 0 || only_layer < 0 || only_layer > 2) {
    std::fprintf(stderr,
                 "conv_bench: --batch, --iters, --rounds must be >= 1, --threads >= 0, --layer "
                 "0 (both), 1 or 2\n");
    return 2;
  }
  set_blas_threads(threads);
  g_wall_clock = blas_threads() != 1;
  Rng rng(1);
  std::vector<Layer> layers;
  if (only_layer != 2)
    layers.push_back(make_layer(conv2d_geometry(batch, 1, 28, 28, 32, 3, 1, 1), false, rng));
  if (only_layer != 1)
    layers.push_back(make_layer(conv2d_geometry(batch, 32, 14, 14, 64, 3, 1, 1), true, rng));
  double flops = 0.0;
  for (const Layer& l : layers)
    flops +=
        2.0 * static_cast<double>(batch * l.g.out_sample() * l.g.patch()) * (l.need_dx ? 3 : 2);

  std::vector<std::vector<double>> kern(chunks.size()), only(chunks.size());
  std::vector<double> whole, pools;
  const Pool2dGeometry p1 = pool2d_geometry(batch, 32, 28, 28, 2),
                       p2 = pool2d_geometry(batch, 64, 14, 14, 2);
  std::vector<int32_t> idx(static_cast<size_t>(batch * p1.out_sample()));
  std::vector<float> py(idx.size()), pool_in1 = filled(batch * p1.in_sample(), rng),
                                     pool_in2 = filled(batch * p2.in_sample(), rng);
  for (int r = 0; r < rounds; ++r) {
    for (size_t c = 0; c < chunks.size(); ++c) {
      kern[c].push_back(median_ms([&] { kernels_step(layers, chunks[c]); }, iters));
      only[c].push_back(median_ms([&] { gemm_step(layers, chunks[c]); }, iters));
    }
    whole.push_back(median_ms([&] { gemm_step(layers, batch); }, iters));
    pools.push_back(median_ms(
        [&] {
          for (int pass = 0; pass < 2; ++pass) {
            const Pool2dGeometry& g = pass == 0 ? p1 : p2;
            std::vector<float>& x = pass == 0 ? pool_in1 : pool_in2;
            max_pool2d_forward(g, x.data(), py.data(), idx.data());
            max_pool2d_backward(g, py.data(), idx.data(), x.data());
          }
        },
        iters));
  }
  const std::string core = blas_core();
  std::printf(
      "cnn-ref conv%s fwd+bwd, batch %lld, %d BLAS thread(s), OpenBLAS kernels %s, %.2f GFLOP per "
      "step, %s\n",
      only_layer == 0   ? "s"
      : only_layer == 1 ? " 1"
                        : " 2",
      static_cast<long long>(batch), blas_threads(), core.c_str(), flops * 1e-9,
      g_wall_clock ? "wall time" : "thread CPU time");
  // Shares and relative speeds are medians of per-round ratios: a load change between rounds
  // cancels out of them.
  std::string json =
      "{\"batch\": " + std::to_string(batch) + ", \"blas_core\": \"" + core + "\", \"chunks\": [";
  size_t best = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    std::vector<double> share, rel;
    for (int r = 0; r < rounds; ++r) {
      share.push_back(only[c][static_cast<size_t>(r)] / kern[c][static_cast<size_t>(r)]);
      rel.push_back(kern[c][static_cast<size_t>(r)] / kern[0][static_cast<size_t>(r)]);
    }
    const double k = median(kern[c]), g = median(only[c]);
    if (k < median(kern[best])) best = c;
    std::printf(
        "  chunk %4lld: kernels %7.2f ms (%5.1f GFLOP/s, %.2fx the time of chunk %lld), GEMMs "
        "alone %7.2f ms: %.0f%% of the kernels' time is GEMM\n",
        static_cast<long long>(chunks[c]), k, flops / k * 1e-6, median(rel),
        static_cast<long long>(chunks[0]), g, 100.0 * median(share));
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "%s{\"chunk\": %lld, \"kernels_ms\": %.3f, \"gemm_ms\": %.3f, \"gemm_share\": "
                  "%.4f, \"relative_time\": %.4f}",
                  c ? ", " : "", static_cast<long long>(chunks[c]), k, g, median(share),
                  median(rel));
    json += buf;
  }
  const double whole_ms = median(whole), pool_ms = median(pools);
  std::printf(
      "  the same GEMMs as one whole-batch GEMM each, alone: %.2f ms (%.1f GFLOP/s); max-pool 2 "
      "fwd+bwd of both layers: %.2f ms\n",
      whole_ms, flops / whole_ms * 1e-6, pool_ms);
  std::printf("  fastest: chunk %lld\n", static_cast<long long>(chunks[best]));
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "], \"whole_batch_gemm_ms\": %.3f, \"pool_ms\": %.3f, \"best_chunk\": %lld}",
                whole_ms, pool_ms, static_cast<long long>(chunks[best]));
  std::printf("%s%s\n", json.c_str(), buf);
  return 0;
}

}  // namespace
}  // namespace dtrain

int main(int argc, char** argv) {
  dtrain::reexec_with_better_blas(argv);  // OpenBLAS's best kernels for this CPU (tensor/blas.h)
  return dtrain::run(argc, argv);
}
