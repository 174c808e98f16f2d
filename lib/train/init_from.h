// train.init_from: a fresh run's initial weights from a safetensors file -- a dtrain checkpoint,
// or a PyTorch state_dict saved with safetensors (safetensors.torch.save_file / save_model) under
// the names dtrain's models share with PyTorch's (README "Models"): fine-tuning a model trained
// elsewhere, or another run's weights with a new optimizer, schedule and data.
#pragma once

#include <string>

#include "nn/model.h"

namespace dtrain {

// Fills `params` (whole.param_count() floats, whole's flat layout) from `path`: a safetensors
// file, or a dtrain checkpoint as --resume names it (a sharded folder, a run or checkpoints
// folder: its latest).
// Every parameter of `whole` must be in the file with its shape -- as F32, or F16, BF16 or F64
// converted (st_dtype.h; one info line says how many) -- under its own name,
// or -- for an `nn.Sequential` saved bare -- without the "layers." prefix; a tied pair (the GPT's
// token embedding and head) needs one of its two names (safetensors keeps one name of tensors
// that share memory) and both copies get it. Tensors of dtrain's training state (optim.*, comp.*,
// replica.*) are skipped unread; any other tensor (of any dtype) the model does not have (nanoGPT's
// attention-mask buffers `attn.bias` under PyTorch < 2) is named in one warning. UserError, naming
// the file, for a missing tensor, another shape, or a file that is no safetensors file.
void read_init_weights(const std::string& path, const Model& whole, float* params);

}  // namespace dtrain
