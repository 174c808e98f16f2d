// The choices of the train and distributed sections as enums (those of model, data and optimizer
// live in nn/options.h, data/options.h and optim/options.h). Parsed once by lib/config; every
// library below compares these, never the config's text.
#pragma once

#include <span>

#include "util/enum_names.h"

namespace dtrain {

enum class Nonfinite { kAbort, kSkip };
// train.preempt_signal: the signal a scheduler sends before it preempts (Slurm's --signal).
enum class PreemptSignal { kTerm, kUsr1 };
enum class Backend { kInproc, kGrpc };
enum class StrategyKind { kDdp, kLocalSgd, kZero1, kZero2, kFsdp, kPipeline };
enum class FsdpUnit { kLayer, kModel };
enum class PipelineSchedule { kGpipe, k1f1b };
enum class PipelinePartition { kUniform, kBalanced };
// The names are also the compression type recorded in checkpoints (compression_state.cc): keep
// them stable.
enum class CompressionType { kNone, kFp16, kBf16, kInt8, kTopk, kPowersgd };

inline constexpr EnumName<Nonfinite> kNonfiniteNames[] = {{Nonfinite::kAbort, "abort"},
                                                          {Nonfinite::kSkip, "skip"}};
inline constexpr EnumName<PreemptSignal> kPreemptSignalNames[] = {
    {PreemptSignal::kTerm, "TERM"},
    {PreemptSignal::kUsr1, "USR1"},
    {PreemptSignal::kTerm, "SIGTERM", true},
    {PreemptSignal::kUsr1, "SIGUSR1", true}};
inline constexpr EnumName<Backend> kBackendNames[] = {{Backend::kInproc, "inproc"},
                                                      {Backend::kGrpc, "grpc"}};
inline constexpr EnumName<StrategyKind> kStrategyNames[] = {
    {StrategyKind::kDdp, "ddp"},         {StrategyKind::kLocalSgd, "local_sgd"},
    {StrategyKind::kZero1, "zero1"},     {StrategyKind::kZero2, "zero2"},
    {StrategyKind::kFsdp, "fsdp"},       {StrategyKind::kPipeline, "pipeline"},
    {StrategyKind::kFsdp, "zero3", true}};
inline constexpr EnumName<FsdpUnit> kFsdpUnitNames[] = {{FsdpUnit::kLayer, "layer"},
                                                        {FsdpUnit::kModel, "model"}};
inline constexpr EnumName<PipelineSchedule> kPipelineScheduleNames[] = {
    {PipelineSchedule::kGpipe, "gpipe"}, {PipelineSchedule::k1f1b, "1f1b"}};
inline constexpr EnumName<PipelinePartition> kPipelinePartitionNames[] = {
    {PipelinePartition::kUniform, "uniform"}, {PipelinePartition::kBalanced, "balanced"}};
inline constexpr EnumName<CompressionType> kCompressionTypeNames[] = {
    {CompressionType::kNone, "none"}, {CompressionType::kFp16, "fp16"},
    {CompressionType::kBf16, "bf16"}, {CompressionType::kInt8, "int8"},
    {CompressionType::kTopk, "topk"}, {CompressionType::kPowersgd, "powersgd"}};

constexpr std::span<const EnumName<Nonfinite>> enum_names(Nonfinite) {
  return kNonfiniteNames;
}
constexpr std::span<const EnumName<PreemptSignal>> enum_names(PreemptSignal) {
  return kPreemptSignalNames;
}
constexpr std::span<const EnumName<Backend>> enum_names(Backend) {
  return kBackendNames;
}
constexpr std::span<const EnumName<StrategyKind>> enum_names(StrategyKind) {
  return kStrategyNames;
}
constexpr std::span<const EnumName<FsdpUnit>> enum_names(FsdpUnit) {
  return kFsdpUnitNames;
}
constexpr std::span<const EnumName<PipelineSchedule>> enum_names(PipelineSchedule) {
  return kPipelineScheduleNames;
}
constexpr std::span<const EnumName<PipelinePartition>> enum_names(PipelinePartition) {
  return kPipelinePartitionNames;
}
constexpr std::span<const EnumName<CompressionType>> enum_names(CompressionType) {
  return kCompressionTypeNames;
}

}  // namespace dtrain
