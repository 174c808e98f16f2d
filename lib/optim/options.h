// What lib/optim needs: its option structs and enums. lib/config reads them from YAML (key
// schema, documentation and checks live there); nothing in lib/optim parses text.
#pragma once

#include <cstdint>
#include <span>

#include "util/enum_names.h"

namespace dtrain {

enum class OptimizerType { kSgd, kAdam, kAdamw };
enum class ScheduleType { kConstant, kStep, kCosine };
enum class ScaleLr { kNone, kLinear };
// Which parameters weight decay applies to: every element, or only tensors of 2 or more
// dimensions (nanoGPT's configure_optimizers, PyTorch parameter groups: weights of linear and
// convolution layers and embeddings decay; biases, LayerNorm weights and other 1-D tensors do not).
enum class WeightDecayOn { kAll, kMatrices };

inline constexpr EnumName<OptimizerType> kOptimizerTypeNames[] = {
    {OptimizerType::kSgd, "sgd"}, {OptimizerType::kAdam, "adam"}, {OptimizerType::kAdamw, "adamw"}};
inline constexpr EnumName<ScheduleType> kScheduleTypeNames[] = {
    {ScheduleType::kConstant, "constant"},
    {ScheduleType::kStep, "step"},
    {ScheduleType::kCosine, "cosine"}};
inline constexpr EnumName<ScaleLr> kScaleLrNames[] = {{ScaleLr::kNone, "none"},
                                                      {ScaleLr::kLinear, "linear"}};

inline constexpr EnumName<WeightDecayOn> kWeightDecayOnNames[] = {
    {WeightDecayOn::kAll, "all"}, {WeightDecayOn::kMatrices, "matrices"}};

constexpr std::span<const EnumName<OptimizerType>> enum_names(OptimizerType) {
  return kOptimizerTypeNames;
}
constexpr std::span<const EnumName<ScheduleType>> enum_names(ScheduleType) {
  return kScheduleTypeNames;
}
constexpr std::span<const EnumName<ScaleLr>> enum_names(ScaleLr) {
  return kScaleLrNames;
}
constexpr std::span<const EnumName<WeightDecayOn>> enum_names(WeightDecayOn) {
  return kWeightDecayOnNames;
}

struct ScheduleConfig {
  ScheduleType type = ScheduleType::kConstant;
  int64_t warmup_steps = 0;  // linear warmup from lr/warmup_steps to lr over these steps
  int64_t step_size = 1000;  // step: multiply by gamma every step_size steps
  double gamma = 0.1;
  double min_lr = 0.0;  // cosine: final lr
};

struct OptimizerConfig {
  OptimizerType type = OptimizerType::kSgd;
  double lr = 0.01;                   // > 0
  double momentum = 0.0;              // sgd, in [0, 1)
  bool nesterov = false;              // sgd, needs momentum > 0
  double weight_decay = 0.0;          // sgd/adam: L2 added to the gradient; adamw: decoupled
  double beta1 = 0.9;                 // adam/adamw, in [0, 1)
  double beta2 = 0.999;               // adam/adamw, in [0, 1)
  double eps = 1e-8;                  // adam/adamw, > 0
  ScaleLr scale_lr = ScaleLr::kNone;  // linear: lr *= world_size
  double clip_grad_norm = 0.0;        // 0: off; else clip the global gradient L2 norm to this
  // The parameters weight_decay applies to (the strategies pass them to the optimizer as flat
  // ranges: decayed_ranges in train/strategy.h).
  WeightDecayOn weight_decay_on = WeightDecayOn::kAll;
  ScheduleConfig schedule;
};

}  // namespace dtrain
