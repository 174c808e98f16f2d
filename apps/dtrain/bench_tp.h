// `dtrain bench tp CONFIG`: what sequence parallelism (Korthikanti et al. 2022) and a
// vocabulary-parallel embedding and head could save on a tensor-parallel GPT step, measured on
// the real layers instead of computed on paper (README "Tensor parallelism", issue 14).
//
// For each T, T tensor ranks run as threads of this process (in-process transport, 1 BLAS
// thread each), every rank doing the same work at the same time as in training. Each region is
// timed with steady_clock between barriers, the slowest rank of each repetition counts, and the
// median over repetitions is reported. Nothing is added to the training code: the harness calls
// the layers' forward and backward itself.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace dtrain {

struct TpBenchOptions {
  std::vector<int> tp = {2, 4};  // tensor-parallel sizes to measure (each divides n_head, 4 C)
  int iters = 5;                 // timed repetitions per region (after one warm-up)
  bool json = false;             // one JSON object per T instead of the table
};

// One T's measurements (milliseconds: medians over repetitions of the slowest rank).
struct TpRegions {
  int tp = 0;
  int64_t batch = 0, seq = 0, embd = 0, layers = 0, vocab = 0;
  bool dropout = false;
  // (c) the whole step: forward, cross-entropy, backward, the tied gradients summed (the
  // optimizer update is not included).
  double step_ms = 0;
  // (a) the replicated regions sequence parallelism would split, per step: 2L + 1 LayerNorms
  // forward + backward, 4L residual adds, the 2L row-parallel bias adds and bias gradients,
  // and (dropout > 0) the 2L + 1 residual/embedding dropout masks applied forward and backward.
  double ln_ms = 0, resid_ms = 0, dropout_ms = 0;
  // (b) the tied head's GEMMs (forward and both backward), softmax cross-entropy (forward and
  // gradient), the embedding (forward + backward).
  double head_gemm_ms = 0, ce_ms = 0, emb_ms = 0;
  // (d) one all-reduce of [B S, C] floats; reduce-scatter and all-gather of the same tensor;
  // one all-reduce of [B S] floats (a parallel cross-entropy's max / sum / target logit).
  double ar_ms = 0, rs_ms = 0, ag_ms = 0, ar_rows_ms = 0;
  // The tensor-axis all-reduces one step issues, counted through the layers' TensorGroup.
  int64_t step_allreduces = 0, step_allreduce_floats = 0;
  // Activation bytes one rank holds after forward (acts.out + saved state, nn/model.h): all of
  // them; the replicated part sequence parallelism would split (blocks' replicated part from
  // two tensor sizes, A(T) = R + S / T, plus the embedding's and ln_f's); the head's (logits).
  int64_t act_bytes = 0, sp_split_bytes = 0, head_act_bytes = 0;
  int other_tp = 0;  // the second size the blocks' decomposition used (0: none fits)

  double a_ms() const { return ln_ms + resid_ms + dropout_ms; }
  double parts_ms() const { return a_ms() + head_gemm_ms + ce_ms + emb_ms; }
  // Best case: (T-1)/T of (a) saved, each step all-reduce turned into reduce-scatter +
  // all-gather (its difference added or saved).
  double sp_saving_ms() const;
  // (T-1)/T of the head GEMMs and the cross-entropy saved, minus the all-reduces a vocabulary-
  // parallel embedding and head add: the embedding output and the head's input gradient ([B S,
  // C] each) and three [B S] ones of the parallel cross-entropy.
  double vp_saving_ms() const;
};

// UserError when T does not divide n_head, 4 n_embd and 256, the model is not a GPT, or this
// machine cannot hold what T ranks of a training step hold (train/trainer.h's memory check).
void check_tp_bench(const Config& cfg, int tp, int iters);

// Measures one tensor-parallel size (T threads), checked by check_tp_bench first.
TpRegions measure_tp_regions(const Config& cfg, int tp, int iters);

// Prints one T's line of the table, or its JSON object.
void print_tp_regions(const TpRegions& r, bool json, bool header);

// The command: every size in o.tp. Returns the exit code.
int bench_tp(const Config& cfg, const TpBenchOptions& o);

}  // namespace dtrain
