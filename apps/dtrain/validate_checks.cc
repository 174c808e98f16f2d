#include "dtrain/validate_checks.h"

#include <algorithm>
#include <vector>

#include <spdlog/spdlog.h>

#include "comm/grpc/tls_files.h"
#include "comm/rank_grid.h"
#include "data/dataset.h"
#include "data/text.h"
#include "nn/model.h"
#include "nn/registry.h"
#include "train/init_from.h"
#include "train/loop.h"
#include "train/pipeline.h"
#include "train/trainer.h"

namespace dtrain {

namespace {

// The warning for ranks without training samples, when the data set's size is known without
// reading it (validate, before a run loads the data; the run warns again with the exact count).
void warn_idle_ranks(const Config& cfg, int64_t rows) {
  if (rows < 0) return;
  const DistributedConfig& d = cfg.distributed;
  const std::string w =
      idle_ranks_warning(rows, d.world_size, d.pipeline.stages, d.tensor_parallel.size);
  if (!w.empty()) spdlog::warn("{}", w);
}

// data.drop_last with a global batch larger than the training set trains nothing: the run refuses
// that once it has loaded the data (plan_steps); validate refuses it, with the same message, when
// the set's size is known without reading it.
void check_drop_last_fits(const Config& cfg, int64_t rows) {
  if (!cfg.data.drop_last) return;
  const DistributedConfig& d = cfg.distributed;
  const int64_t ranks_per_replica =
      std::max<int64_t>(1, d.pipeline.stages) * std::max<int64_t>(1, d.tensor_parallel.size);
  const int replicas = static_cast<int>(std::max<int64_t>(1, d.world_size / ranks_per_replica));
  if (rows >= 0 && rows < cfg.data.batch_size * replicas) plan_steps(cfg, 0, rows, replicas);
}

// What run refuses once it has laid out its ranks and built the model, checked by validate
// without reading the data where the config tells: an in-process rank grid that cannot be laid out
// (launched ranks get their world size from the launcher), and, when the input shape is known from
// the config or a file header (data/dataset.h), a model that does not fit it or has fewer layers
// with parameters than pipeline stages, or whose training state and activations cannot fit in
// memory (train/trainer.h's check_training_memory, as run checks it).
void check_layout_without_data(const Config& cfg, bool evaluate, int64_t train_rows) {
  const DistributedConfig& d = cfg.distributed;
  const int S = pipeline_stages(cfg);
  if (d.backend == Backend::kInproc) {
    const GridLayout grid(static_cast<int>(d.world_size), static_cast<int>(d.tensor_parallel.size),
                          S);  // throws UserError as run's does
    (void)grid;
  }
  const Shape sample = train_sample_shape_without_loading(cfg.data);
  if (sample.empty()) return;
  // Synthetic labels are i % classes over the samples: fewer samples than classes, fewer labels.
  int64_t classes = cfg.data.format == DataFormat::kText ? kTextVocab
                    : cfg.data.format == DataFormat::kSynthetic
                        ? std::min(cfg.data.synthetic.classes, cfg.data.synthetic.samples)
                        : 0;
  if (cfg.data.format == DataFormat::kIdx) {
    classes = idx_label_classes(cfg.data.train.labels);
    if (!cfg.data.test.labels.empty())
      classes = std::max(classes, idx_label_classes(cfg.data.test.labels));
  }
  // run's checks of model.input_features and model.num_classes against the data (its label
  // range is known for synthetic and IDX data; text has the byte vocabulary).
  int64_t features = 1;
  for (int64_t d : sample) features *= d;
  if (cfg.model.input_features > 0 && cfg.model.input_features != features &&
      cfg.data.format != DataFormat::kText)
    throw UserError("model.input_features is " + std::to_string(cfg.model.input_features) +
                    " but the data has " + std::to_string(features) + " features");
  if (cfg.model.num_classes > 0 && classes > cfg.model.num_classes)
    throw UserError(
        "the data has label " + std::to_string(classes - 1) +
        ", out of range for model.num_classes = " + std::to_string(cfg.model.num_classes));
  if (cfg.model.num_classes > 0) classes = cfg.model.num_classes;
  if (classes < 2) return;  // (run refuses a single label with its own message)
  const Model model = build_model(cfg.model, {sample, classes});
  const std::vector<LayerRange> stages = S > 1 ? partition_stages(model, S, d.pipeline.partition)
                                               : std::vector<LayerRange>{{0, model.num_layers()}};
  // train.init_from against this model, as run reads it (after the memory check: a model too
  // large is refused there first, without its weights allocated here).
  const auto check_init_from = [&] {
    if (cfg.train.init_from.empty()) return;
    std::vector<float> weights(static_cast<size_t>(model.param_count()));
    read_init_weights(cfg.train.init_from, model, weights.data());
  };
  // Its memory, per rank of each stage (tensor-parallel ranks hold slices: left to run).
  if (d.tensor_parallel.size > 1) return check_init_from();
  const int world = static_cast<int>(std::max<int64_t>(1, d.world_size));
  const int here = d.backend == Backend::kInproc ? world : 1;
  // (gRPC ranks: as if all on this machine, dtrain launch's way.)
  const int blas = run_blas_threads(cfg, world);
  const int replicas = std::max(1, world / S);
  const int64_t test_rows = test_rows_without_loading(cfg.data);
  // In-process ranks share the process: every stage with its ranks. gRPC ranks: one stage per
  // process, each checked.
  const auto check = [&](const std::vector<std::pair<size_t, size_t>>& held, int per_stage) {
    check_training_memory(
        cfg, model,
        {.stages = held,
         .replicas = replicas,
         .ranks_here = per_stage,
         .blas_threads = blas,
         .train_rows = train_rows,
         // Unknown (CSV, an unreadable text file): not counted, so validate never
         // refuses what run, which knows the rows, accepts.
         .eval_rows = !evaluate || test_rows < 0 ? 0 : (test_rows + replicas - 1) / replicas});
  };
  if (here > 1) {
    check({stages.begin(), stages.end()}, here / S);
  } else {
    for (const auto& st : stages) check({st}, 1);
  }
  check_init_from();
}

}  // namespace

void check_config_without_data(const Config& cfg, bool evaluate) {
  // An explicit test fraction that holds out no sample (run's refusal), where the sample count
  // is known without the data: synthetic, and IDX from the labels' header.
  const DataConfig& d = cfg.data;
  if (d.format == DataFormat::kSynthetic) check_synthetic_options(d.synthetic);
  const int64_t n = d.format == DataFormat::kSynthetic ? d.synthetic.samples
                    : d.format == DataFormat::kIdx     ? idx_label_count(d.train.labels)
                                                       : -1;
  if (n > 0 && d.test.empty())
    if (const std::string why = empty_test_split_problem(d, n); !why.empty()) throw UserError(why);
  // The TLS files as the gRPC ranks check them (PEM, the key the certificate's, signed by the CA),
  // whatever distributed.backend says: `dtrain launch` runs any config's ranks over gRPC.
  const TlsConfig& tls = cfg.distributed.tls;
  if (tls.enabled()) read_tls_files(tls.cert, tls.key, tls.ca);
  // IDX: run's refusals that the headers and the files' sizes decide.
  if (d.format == DataFormat::kIdx) {
    check_idx_headers(d.train.images, d.train.labels);
    if (!d.test.empty()) {
      check_idx_headers(d.test.images, d.test.labels);
      check_idx_test_shape(d.train.images, d.test.images);
    }
  }
  // Text: run's refusals of an empty text or a split shorter than a window, from the sizes.
  // (the training rows counted once: a gzip text is counted by decompressing it)
  const int64_t rows = d.format == DataFormat::kText && d.block_size > 0
                           ? check_text_sizes(text_options(d))
                           : train_rows_without_loading(d);
  if (const std::string w = split_overlap_warning(d); !w.empty()) spdlog::warn("{}", w);
  warn_idle_ranks(cfg, rows);
  check_drop_last_fits(cfg, rows);
  check_layout_without_data(cfg, evaluate, rows);
}

}  // namespace dtrain
