// Tensor parallelism for the GPT (Megatron-LM, Shoeybi et al. 2019): the transformer block split
// over the T ranks of a tensor-parallel group, and the map between a tensor rank's shards and
// the whole (T = 1) model's flat layout.
//
// Tensor rank r of T holds, in each block (C = n_embd, H = n_head, Cl = C / T, Fl = 4C / T):
//   ln_1, ln_2                  replicated
//   attn.c_attn  [3Cl, C] + [3Cl]  column-parallel: the q, k and v rows of heads
//                               [r H/T, (r+1) H/T) (three chunks of the whole weight's dim 0)
//   attention                   local, over those H / T heads
//   attn.c_proj  [C, Cl]        row-parallel: columns [r Cl, (r+1) Cl) of the weight; its bias
//                [C]            replicated, added after the all-reduce
//   mlp.c_fc     [Fl, C] + [Fl] column-parallel: rows [r Fl, (r+1) Fl)
//   GELU                        local
//   mlp.c_proj   [C, Fl] + [C]  row-parallel, bias replicated
// The embedding, ln_f and the (tied) head are replicated: build_gpt keeps them as they are.
//
// Communication, through LayerCtx::tensor: one all-reduce (sum) of [B, T, C] in the forward of
// each row-parallel layer (Megatron's g) and one in the backward of each column-parallel
// layer's input (f): 4 per block and step. The residual stream is then bitwise the same on
// every tensor rank (the all-reduce gives every rank the same sum), so replicated parameters
// receive identical gradients on every tensor rank without any communication of their own, and
// the loss each tensor rank computes is the same.
//
// Dropout: the masks are the T = 1 model's (keyed on the sample: nn/layer.h); attention dropout
// draws the whole [H, T, T] mask of a row and keeps this rank's heads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/layer.h"
#include "nn/model.h"

namespace dtrain {

// The tensor-parallel group's collective, as the layers see it (train/ supplies one over the
// rank grid's tensor-axis communicator). Every rank of the group calls it in the same order.
class TensorGroup {
 public:
  virtual ~TensorGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: every rank ends with the elementwise sum over the group, bitwise the same on all.
  virtual void allreduce_sum(float* data, size_t n) = 0;
};

// The tensor-parallel block of tensor rank `rank` of `size` (size divides n_head and 4 embd).
std::unique_ptr<Layer> make_tp_block(int64_t seq, int64_t embd, int64_t n_head, int64_t n_layer,
                                     double dropout, int rank, int size);

// How one parameter of a tensor rank's model sits in the whole model's parameter of the same
// name: replicated (dim -1), or a shard along `dim` of the global shape. The dimension is cut
// into `chunks` equal parts (c_attn's q, k and v: 3; otherwise 1) and the rank holds
// [offset, offset + extent) of each part.
struct TpShard {
  std::string name;
  Shape global, local;
  int dim = -1;
  int64_t offset = 0, extent = 0, chunks = 1;
};

// The shard table of tensor rank `rank` of `size` for `local` (build_gpt's model of that rank),
// in local's parameter order.
std::vector<TpShard> tp_shard_table(const Model& local, int rank, int size);

// A run of consecutive floats that is contiguous in both layouts.
struct TpPiece {
  int64_t local = 0, global = 0, n = 0;
  bool replicated = false;  // of a parameter every tensor rank holds whole
};
// The pieces covering local's flat layout exactly once, ascending in local offsets.
std::vector<TpPiece> tp_pieces(const Model& local, const Model& global, int rank, int size);

// Copies tensor rank `rank`'s shards of a whole-layout buffer into a local-layout one.
void tp_slice(const std::vector<TpPiece>& pieces, const float* global, float* local);
// The converse: writes this rank's shards of `local` into `global` (replicated parameters too).
void tp_unslice(const std::vector<TpPiece>& pieces, const float* local, float* global);

// Local flat ranges [begin, end) -> the whole layout's ranges they occupy, as (global begin,
// global end, local begin) triples in local order (a row-parallel weight's shard is one range
// per row of the whole weight); without the replicated parameters' when skip_replicated.
struct TpRange {
  int64_t gbegin = 0, gend = 0, lbegin = 0;
};
std::vector<TpRange> tp_global_ranges(const std::vector<TpPiece>& pieces, int64_t begin,
                                      int64_t end, bool skip_replicated = false);

// Per local parameter (model.params() order): true when it is replicated over the group.
std::vector<bool> tp_replicated(const Model& local, int rank, int size);

}  // namespace dtrain
