// Tied parameters (nn/model.h TiedParam: the GPT's transformer.wte.weight and lm_head.weight)
// under every strategy and pipeline layout. A tie is two copies in the flat layout, each inside
// its own element, so units, shards and stages stay ranges; the copies start bitwise equal and
// stay so because, every step, both get the same gradient -- the sum of the two copies'
// gradients, the gradient of the one tensor they stand for -- and every optimizer is elementwise
// (equal gradients, parameters and state give equal updates, sharded or not).
//
// Where a rank's copies' gradients live after Strategy::finish_backward (HeldGrads):
//   ddp, zero1, local_sgd   the whole range on every rank of the data axis
//   zero2, fsdp             this rank's shard: the axis's ranks hold disjoint parts
//   a pipeline (S >= 2)     the primary on the stage of its layer (0), the mirror on S - 1
// For each tie a buffer B of the tensor's size receives this rank's parts of both copies'
// gradients (by element index within the tensor); shards are summed over the data axis (an
// all-reduce of B); copies on different stages are summed over the pipeline axis (an all-reduce
// of B that every stage of the replica joins, the stages holding neither copy with zeros, as
// Megatron-LM all-reduces the word embedding's gradient between its first and last stage); then
// B goes back into the held parts of both copies. Without shards and without a pipeline nothing
// is communicated. Cost per step and tie: one all-reduce of the tensor (V x C floats) over the
// data axis with zero2/fsdp, and one over the pipeline axis with S >= 2.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"
#include "nn/model.h"
#include "optim/optimizer.h"
#include "train/sharding.h"

namespace dtrain {

class TiedGrads {
 public:
  // stages: every pipeline stage's layers (one entry, the whole model, without a pipeline);
  // stage: this rank's index into it. dp, pp: this rank's data and pipeline axis communicators.
  TiedGrads(const Model& m, const std::vector<LayerRange>& stages, int stage, Communicator& dp,
            Communicator& pp);

  // Gives both copies of every tie, in `held` (this rank's gradient after finish_backward), the
  // sum of their gradients. Collective over the data axis (shards) and the pipeline axis
  // (copies on different stages): every rank of the job calls it once per step, after
  // finish_backward. Returns what this rank's clipping norm subtracts so that each tied tensor
  // counts once in the global norm (as in PyTorch's norm over nanoGPT's parameters): the summed
  // gradient's squared L2 norm for each tie whose mirror this stage holds, else 0.
  double sum(const HeldGrads& held);
  // Seconds in sum()'s collectives so far (exposed communication).
  double wait_seconds() const { return wait_s_; }

 private:
  struct Tie {
    const ParamEntry* primary = nullptr;
    const ParamEntry* mirror = nullptr;
    bool has_primary = false, has_mirror = false;  // on this rank's stage
    bool across_stages = false;                    // the copies on different stages
    std::vector<float> buf;                        // B
  };
  void allreduce(Communicator& c, std::vector<float>& b);  // sum, timed

  std::vector<Tie> ties_;
  Communicator& dp_;
  Communicator& pp_;
  double wait_s_ = 0.0;
};

// The pieces [begin, end) (offsets relative to `begin`) that split the flat range [begin, end)
// so that every tied copy inside it is a piece of its own: a collective over the pieces one by
// one then treats both copies of a tie -- here or on another stage -- alike. The ring all-reduce
// sums an element in an order that depends on its position in the buffer, so local_sgd averages
// its parameters piece by piece to keep the copies bitwise equal.
std::vector<FlatRange> tie_aligned_pieces(const Model& m, int64_t begin, int64_t end);

// A loaded checkpoint (resume, eval, predict, generate): throws UserError when a tie's copies
// differ in `params` or in any state buffer (whole-model layout), as in a checkpoint written with
// model.tie_embeddings false -- a tied model would silently use one copy. `from` names the
// checkpoint.
void check_tied_copies(const Model& m, const float* params, const std::vector<const float*>& state,
                       const std::string& from);

}  // namespace dtrain
