// Small slices of the real data sets the Debian packages install, written into a test's folder
// (the first Fashion-MNIST training images as IDX files, a slice of the Jargon File as text), and
// the small CNN and GPT the fidelity tests train on them. Shared by the in-process training tests
// and the CLI tests that run the binary on them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "data/dataset.h"
#include "data/text.h"

namespace dtrain::testing {

inline const std::string kFmnistDir = "/usr/share/datasets/fashion-mnist/";
inline const std::string kJargonFile = "/usr/share/doc/jargon-text/jargon.txt.gz";
// The fidelity tests' text: 90% of 12 KB is 691 training windows of 17 bytes, so 20 steps of 24
// stay inside one epoch -- no short last batch, which Local SGD's ranks would weight as equals
// (each steps on its own mean) rather than by their samples.
inline constexpr int64_t kJargonSliceBytes = 12288;

inline void put_be32(std::ofstream& f, uint32_t v) {
  const unsigned char b[4] = {static_cast<unsigned char>(v >> 24),
                              static_cast<unsigned char>(v >> 16),
                              static_cast<unsigned char>(v >> 8), static_cast<unsigned char>(v)};
  f.write(reinterpret_cast<const char*>(b), 4);
}

// The first n Fashion-MNIST training images as uncompressed IDX files dir/images.idx and
// dir/labels.idx (real data, small enough that every rank of every run loads it quickly). False
// when the package is missing.
inline bool write_fmnist_subset(const std::string& dir, int64_t n) {
  if (!std::filesystem::exists(kFmnistDir + "train-images-idx3-ubyte.gz")) return false;
  const Dataset d = load_idx(kFmnistDir + "train-images-idx3-ubyte.gz",
                             kFmnistDir + "train-labels-idx1-ubyte.gz");
  std::ofstream img(dir + "/images.idx", std::ios::binary),
      lab(dir + "/labels.idx", std::ios::binary);
  put_be32(img, 0x00000803);
  put_be32(img, static_cast<uint32_t>(n));
  put_be32(img, 28);
  put_be32(img, 28);
  for (int64_t i = 0; i < n * d.features; ++i)
    img.put(static_cast<char>(static_cast<unsigned char>(d.x[static_cast<size_t>(i)])));  // 0..255
  put_be32(lab, 0x00000801);
  put_be32(lab, static_cast<uint32_t>(n));
  for (int64_t i = 0; i < n; ++i) lab.put(static_cast<char>(d.y[static_cast<size_t>(i)]));
  return true;
}

// `n` bytes of the Jargon File's English from byte `offset` on (past its front matter) as the
// plain text file `path`. False when the jargon-text package is missing.
inline bool write_jargon_slice(const std::string& path, int64_t n, int64_t offset = 200000) {
  if (!std::filesystem::exists(kJargonFile)) return false;
  const std::string all = read_text_files({kJargonFile}, "jargon");
  std::ofstream(path, std::ios::binary)
      << all.substr(static_cast<size_t>(offset), static_cast<size_t>(n));
  return true;
}

// A small CNN on write_fmnist_subset's files in `dir`: conv 3x3 6 -> act -> pool 2 -> conv 3x3 8
// stride 2 -> act -> flatten -> linear 10. `act`/`pool` select tanh + avg_pool2d (smooth: no
// kink for a float32 summation order to flip) or relu + max_pool2d (cnn-ref's kinds). Batch 24,
// 20 steps logged each, SGD lr 0.05 with momentum 0.9 (principle 10: Adam would amplify
// summation-order noise), one thread.
inline std::string small_cnn_cfg(const std::string& dir, const std::string& act = "tanh",
                                 const std::string& pool = "avg_pool2d") {
  return R"(
seed: 6
model:
  type: sequential
  layers:
    - {conv2d: {out_channels: 6, kernel: 3, padding: 1}}
    - )" +
         act + R"(
    - {)" +
         pool + R"(: 2}
    - {conv2d: {out_channels: 8, kernel: 3, stride: 2}}
    - )" +
         act + R"(
    - flatten
    - {linear: 10}
data:
  format: idx
  train: {images: )" +
         dir + "/images.idx, labels: " + dir + R"(/labels.idx}
  batch_size: 24
optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
train: {epochs: 0, max_steps: 20, log_every: 1}
distributed: {timeout_s: 30, ddp: {bucket_mb: 0.002}}
runtime: {threads: 1}
)";
}

// A tiny GPT (2 blocks, 2 heads, 16 wide, 16 positions) on the text file `text`; `tied`: the
// output head is the token embedding. Batch 24, 20 steps logged each, AdamW lr 1e-3 (at 3e-3 the
// layouts' summation-order noise grew to 5.6e-6 of the weights after 20 steps; at 1e-3 it stays
// under 1.5e-6) with decay 0.1 on the matrices, one thread.
inline std::string tiny_gpt_cfg(const std::string& text, bool tied) {
  return R"(
seed: 7
model: {type: gpt, n_layer: 2, n_head: 2, n_embd: 16, block_size: 16, tie_embeddings: )" +
         std::string(tied ? "true" : "false") + R"(}
data: {format: text, train: {path: )" +
         text + R"(}, batch_size: 24, eval_batch_size: 64}
optimizer: {type: adamw, lr: 0.001, weight_decay: 0.1, weight_decay_on: matrices}
train: {epochs: 0, max_steps: 20, log_every: 1}
distributed: {timeout_s: 30, ddp: {bucket_mb: 0.002}}
runtime: {threads: 1}
)";
}

}  // namespace dtrain::testing
