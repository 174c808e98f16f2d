// Validation of a parsed config: each key's own check from its declaration (schema.cc), the
// checks that relate keys, and the keys that belong to another choice of an option.
#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "config/internal.h"
#include "config/schema.h"
#include "util/strings.h"

namespace dtrain::config_detail {
namespace {

// "must be >= 1 (got 0)" when `v` fails `check`, else "". `is_int` shows the bounds as integers.
template <class T>
std::string check_problem(const KeyCheck& check, T v, bool is_int) {
  const auto bound = [is_int](double b) {
    return is_int ? show(static_cast<int64_t>(b)) : show(b);
  };
  const double x = static_cast<double>(v);
  bool ok = true;
  std::string rule;
  switch (check.kind) {
    case KeyCheck::kNone:
      return {};
    case KeyCheck::kMin:
      ok = x >= check.lo;
      rule = "must be >= " + bound(check.lo);
      break;
    case KeyCheck::kRange:
      ok = x >= check.lo && x <= check.hi;
      rule = "must be in [" + bound(check.lo) + ", " + bound(check.hi) + "]";
      break;
    case KeyCheck::kPositive:
      ok = x > 0;
      rule = "must be > 0";
      break;
    case KeyCheck::kNonNegative:
      ok = x >= 0;
      rule = "must be >= 0";
      break;
    case KeyCheck::kUnit:
      ok = x >= 0 && x < 1;
      rule = "must be in [0, 1)";
      break;
    case KeyCheck::kUnitOpenLow:
      ok = x > 0 && x <= 1;
      rule = "must be in (0, 1]";
      break;
  }
  if (ok) return {};
  if (!check.note.empty()) rule += ": " + std::string(check.note);
  return rule + " (got " + show(v) + ")";
}

void check_key(const KeyDecl& d, Config& c, const KeyErrors& errors) {
  if (d.check.kind == KeyCheck::kNone) return;
  std::visit(
      [&](const auto& ref) {
        using R = std::decay_t<decltype(ref)>;
        if constexpr (std::is_same_v<R, int64_t& (*)(Config&)>) {
          const std::string p = check_problem(d.check, ref(c), true);
          errors.check(p.empty(), d.path, p);
        } else if constexpr (std::is_same_v<R, double& (*)(Config&)>) {
          const std::string p = check_problem(d.check, ref(c), false);
          errors.check(p.empty(), d.path, p);
        } else if constexpr (std::is_same_v<R, std::vector<int64_t>& (*)(Config&)>) {
          const std::vector<int64_t>& v = ref(c);
          for (size_t i = 0; i < v.size(); ++i) {
            const std::string p = check_problem(d.check, v[i], true);
            errors.check(p.empty(), d.path + "[" + std::to_string(i) + "]", p);
          }
        } else {
          DT_CHECK_MSG(false, "config key " << d.path << " has a check its type cannot have");
        }
      },
      d.ref);
}

// A key that belongs to another choice of an option -- another optimizer, schedule, data format,
// compression type or strategy, fsdp.unit model -- is refused, naming what it belongs to: a
// config cannot silently run without a setting it names. A key left at its default is harmless
// (config_to_json writes every key, and a run's config.json must load back), so only a value
// other than the default is refused. distributed.ddp is accepted with every strategy: ddp is the
// default strategy, zero1/zero2 shard along its buckets, and configs tuned for it are switched
// to others with --set.
void check_belongs(const KeyDecl& d, const Config& c, const Config& defaults,
                   const KeyErrors& errors) {
  if (d.belongs.empty() || d.get(c) == d.get(defaults)) return;
  for (const BelongsTo& b : d.belongs) {
    const std::string shown(b.shown.empty() ? b.key : b.shown);
    errors.check(b.holds(c), d.path,
                 "only used " + std::string(b.phrase) + " (" + shown + " is " + b.choice(c) + ")");
  }
}

// Which file keys each format reads: a file key of another format is an error, not ignored,
// so a config cannot silently train on something other than what it names.
void validate_data_files(const DataConfig& d, const KeyErrors& errors) {
  const auto check = [&errors](bool ok, const std::string& path, const std::string& msg) {
    errors.check(ok, path, msg);
  };
  const std::pair<const char*, const SplitFiles*> splits[] = {{"data.train", &d.train},
                                                              {"data.test", &d.test}};
  for (const auto& [name, s] : splits) {
    const std::string p = name;
    if (d.format == DataFormat::kIdx) {
      check(s->path.empty(), p + ".path", "not used by format idx (it reads images and labels)");
    } else if (d.format == DataFormat::kCsv) {
      check(s->images.empty(), p + ".images", "not used by format csv (it reads path)");
      check(s->labels.empty(), p + ".labels", "not used by format csv (it reads path)");
      check(s->path.size() <= 1, p + ".path",
            "format csv reads one file (got a list of " + show(int64_t(s->path.size())) +
                "; a list of files or patterns is for format text)");
    } else if (d.format == DataFormat::kText) {
      check(s->images.empty(), p + ".images", "not used by format text (it reads path)");
      check(s->labels.empty(), p + ".labels", "not used by format text (it reads path)");
    } else {
      const char* why = "not used by format synthetic (it generates its data from no files)";
      check(s->images.empty(), p + ".images", why);
      check(s->labels.empty(), p + ".labels", why);
      check(s->path.empty(), p + ".path", why);
    }
  }
  if (d.format == DataFormat::kIdx) {
    check(!d.train.images.empty(), "data.train.images", "required for format idx");
    check(!d.train.labels.empty(), "data.train.labels", "required for format idx");
    check(!d.test.images.empty() || d.test.labels.empty(), "data.test.images",
          "required when data.test.labels is given (give both or neither)");
    check(!d.test.labels.empty() || d.test.images.empty(), "data.test.labels",
          "required when data.test.images is given (give both or neither)");
  } else if (d.format == DataFormat::kCsv) {
    check(!d.train.path.empty(), "data.train.path", "required for format csv");
  } else if (d.format == DataFormat::kText) {
    check(!d.train.path.empty(), "data.train.path", "required for format text");
  }
}

// Checks that relate keys of model, data, optimizer and train.
void validate_relations(const Config& c, const KeyErrors& errors) {
  const DataConfig& d = c.data;
  validate_data_files(d, errors);
  errors.check(d.test_fraction == -1.0 || (d.test_fraction >= 0 && d.test_fraction < 1),
               "data.test_fraction",
               "must be -1 (the default) or in [0, 1) (got " + show(d.test_fraction) + ")");
  errors.check(d.test.empty() || d.test_fraction <= 0, "data.test_fraction",
               "contradicts data.test: a test set is given, so nothing is held out (remove one)");
  // A language model reads bytes, and bytes are only read by a language model.
  errors.check(d.format != DataFormat::kText || c.model.type == ModelType::kGpt, "model.type",
               "data.format text needs model.type gpt (got " + to_string(c.model.type) + ")");
  errors.check(
      c.model.type != ModelType::kGpt || d.format == DataFormat::kText, "data.format",
      "model.type gpt reads text: needs data.format text (got " + to_string(d.format) + ")");
  // Checked here too (build_gpt refuses it again), so `dtrain validate` catches it.
  // (n_head < 1 is check_key's error; the modulo must not run then)
  errors.check(
      c.model.type != ModelType::kGpt || c.model.n_head < 1 || c.model.n_embd % c.model.n_head == 0,
      "model.n_head",
      show(c.model.n_head) + " does not divide model.n_embd " + show(c.model.n_embd) +
          " (each head gets n_embd / n_head columns)");
  errors.check(d.format != DataFormat::kText || d.normalize == Normalize::kAuto, "data.normalize",
               "not used by format text (token ids are used as they are)");
  errors.check(d.csv.delimiter != '\n' && d.csv.delimiter != '\r' && d.csv.delimiter != '"',
               "data.csv.delimiter", "cannot be a newline or a double quote");

  const OptimizerConfig& o = c.optimizer;
  // The update runs in float32: a positive value below its smallest normal number rounds to 0
  // there (an lr that never trains, an eps that divides by 0).
  // One above its largest finite number becomes inf there (an eps that silently zeroes every
  // update, an lr whose first step makes the weights non-finite).
  for (const auto& [key, v] : {std::pair<const char*, double>{"optimizer.lr", o.lr},
                               std::pair<const char*, double>{"optimizer.eps", o.eps}}) {
    errors.check(!(v > 0) || v >= std::numeric_limits<float>::min(), key,
                 "must be at least 1.2e-38, float32's smallest normal number (got " + show(v) +
                     ": the float32 update would round it to 0)");
    errors.check(!(v > std::numeric_limits<float>::max()), key,
                 "must be at most 3.4e+38, float32's largest finite number (got " + show(v) +
                     ": the float32 update would make it inf)");
  }
  // (a weight decay or an outer rate of inf makes the weights non-finite at their first use)
  for (const auto& [key, v] :
       {std::pair<const char*, double>{"optimizer.weight_decay", o.weight_decay},
        std::pair<const char*, double>{"distributed.local_sgd.outer_lr",
                                       c.distributed.local_sgd.outer_lr}})
    errors.check(!(v > std::numeric_limits<float>::max()), key,
                 "must be at most 3.4e+38, float32's largest finite number (got " + show(v) +
                     ": the float32 update would make it inf)");
  // (nesterov with another optimizer is refused by check_belongs, naming sgd)
  errors.check(o.type != OptimizerType::kSgd || !o.nesterov || o.momentum > 0, "optimizer.nesterov",
               "needs optimizer.momentum > 0 (got momentum " + show(o.momentum) + ")");
  errors.check(o.schedule.type != ScheduleType::kCosine || o.schedule.min_lr < o.lr,
               "optimizer.schedule.min_lr",
               "must be < optimizer.lr for a cosine schedule (got " + show(o.schedule.min_lr) +
                   ", lr " + show(o.lr) + ")");

  const TrainConfig& t = c.train;
  errors.check(t.epochs > 0 || t.max_steps > 0, "train.epochs",
               "nothing to train: epochs and max_steps are both 0 (set one of them > 0)");
}

// distributed.tensor_parallel.size against the model (the one place this is checked: the
// layers DT_CHECK it).
void validate_tensor_parallel(const Config& c, const KeyErrors& errors) {
  const DistributedConfig& dc = c.distributed;
  const int64_t T = dc.tensor_parallel.size;
  if (T <= 1) return;
  const char* key = "distributed.tensor_parallel.size";
  if (c.model.type != ModelType::kGpt) {
    errors.check(false, key,
                 "model.type " + to_string(c.model.type) +
                     " has no tensor-parallel layers (only model.type gpt does): use "
                     "data-parallel or pipeline ranks instead");
    return;
  }
  const ModelConfig& m = c.model;
  errors.check(m.n_head % T == 0, key,
               show(T) + " does not divide model.n_head " + show(m.n_head) +
                   " (each tensor rank owns whole heads)");
  errors.check(4 * m.n_embd % T == 0, key,
               show(T) + " does not divide the MLP width 4 x model.n_embd = " + show(4 * m.n_embd));
  errors.check(256 % T == 0, key, show(T) + " does not divide the vocabulary of 256 bytes");
  // T x stages dividing the world is the rank grid's check (comm/rank_grid.h): a launcher's
  // environment sets the world after the config is read, and eval and generate ignore it.
  errors.check(dc.compression.type == CompressionType::kNone, key,
               "distributed.compression does not apply with tensor parallelism");
  errors.check(dc.strategy != StrategyKind::kLocalSgd, key,
               "strategy local_sgd does not apply with tensor parallelism (tensor ranks must "
               "step together)");
}

// Checks that relate the distributed keys to each other and to the model and data.
void validate_distributed(const Config& c, const KeyErrors& errors) {
  const DistributedConfig& dc = c.distributed;
  const PipelineConfig& pc = dc.pipeline;
  // (strategy pipeline's stages default to 2; one given explicitly ran as plain ddp, though the
  // summary said pipeline)
  errors.check(dc.strategy != StrategyKind::kPipeline || pc.stages > 1,
               "distributed.pipeline.stages",
               "is 1 with strategy pipeline: one stage is no pipeline (give 2 or more stages, or "
               "strategy ddp)");
  if (dc.strategy == StrategyKind::kPipeline || pc.stages > 1) {
    // validate_config resolved a complexity preset into model.hidden. An mlp's and a sequential
    // model's layers with parameters are known from the config alone (a sequential model's
    // linear, conv2d and layer_norm entries); a gpt is counted once built (the loop's
    // partition_stages refuses too many stages with the same message).
    // (An empty sequential list is validate_config's own error, below.)
    if (c.model.type == ModelType::kMlp ||
        (c.model.type == ModelType::kSequential && !c.model.layers.empty())) {
      const auto has_params = [](const LayerSpec& l) {
        return l.kind == LayerKind::kLinear || l.kind == LayerKind::kConv2d ||
               l.kind == LayerKind::kLayerNorm;
      };
      const int64_t linears =
          c.model.type == ModelType::kMlp  // (a LayerNorm after each hidden Linear, if asked)
              ? static_cast<int64_t>(c.model.hidden.size()) * (c.model.layer_norm ? 2 : 1) + 1
              : std::count_if(c.model.layers.begin(), c.model.layers.end(), has_params);
      errors.check(pc.stages <= linears, "distributed.pipeline.stages",
                   "the model has " + show(linears) + " layers with parameters, fewer than " +
                       show(pc.stages) + " stages");
    }
    // The default is not refused: a batch smaller than it runs as many micro-batches as rows
    // (as a short batch does), which is what the key's documentation promises.
    errors.check(
        c.data.batch_size >= pc.micro_batches || pc.micro_batches == PipelineConfig{}.micro_batches,
        "distributed.pipeline.micro_batches",
        "must be at most data.batch_size (" + show(c.data.batch_size) +
            "): micro-batches split a batch by samples");
  }
  errors.check(dc.compression.type == CompressionType::kNone || dc.strategy == StrategyKind::kDdp ||
                   dc.strategy == StrategyKind::kLocalSgd,
               "distributed.compression.type",
               "compression applies to strategies ddp and local_sgd (got strategy '" +
                   to_string(dc.strategy) + "')");
  errors.check(dc.compression.type == CompressionType::kNone || pc.stages == 1,
               "distributed.compression.type",
               "compression does not apply with a pipeline (distributed.pipeline.stages is " +
                   show(pc.stages) + "): compress a plain data-parallel run instead");
  validate_tensor_parallel(c, errors);
  const LocalSgdConfig& ls = dc.local_sgd;
  const int64_t every = c.train.checkpoint.every_steps;
  if (dc.strategy == StrategyKind::kLocalSgd && every > 0)
    errors.check(every % ls.sync_every == 0, "train.checkpoint.every_steps",
                 "must be a multiple of distributed.local_sgd.sync_every (" + show(ls.sync_every) +
                     ") with strategy local_sgd: checkpoints are taken at synchronisation points");
  const TlsConfig& tls = dc.tls;
  errors.check(!tls.enabled() || (!tls.cert.empty() && !tls.key.empty() && !tls.ca.empty()),
               "distributed.tls", "needs all of cert, key and ca (or none)");
  // (rank 0 listened on "[127.0.0.1:80]:PORT", failed with exit 1, and was restarted for it)
  if (const std::string why = host_text_problem(
          dc.bind, "the port as MASTER_PORT (rank 0's; the other ranks pick their own)");
      !dc.bind.empty() && !why.empty())
    errors.check(false, "distributed.bind", "'" + dc.bind + "' " + why);
}

}  // namespace

void validate_config(Config& c, const KeyErrors& errors) {
  ModelConfig& m = c.model;
  if (m.complexity != Complexity::kNone) {
    errors.check(!errors.given("model.hidden"), "model.hidden",
                 "contradicts model.complexity '" + to_string(m.complexity) +
                     "' (the preset sets hidden); give only one of them");
    m.hidden = complexity_preset(m.complexity);
  }
  // Text windows are model.block_size + 1 bytes; lib/data takes the length from DataConfig.
  c.data.block_size = c.data.format == DataFormat::kText ? m.block_size : 0;
  for (const KeyDecl& d : config_keys()) check_key(d, c, errors);
  validate_relations(c, errors);
  validate_distributed(c, errors);
  const Config defaults;
  for (const KeyDecl& d : config_keys()) check_belongs(d, c, defaults, errors);
  // Checked here too (build_sequential refuses it again, with the data's class count), so
  // `dtrain validate` catches it; after check_belongs, so mlp keys under a sequential model are
  // named first.
  errors.check(m.type != ModelType::kSequential || !m.layers.empty(), "model.layers",
               "must not be empty: model.type sequential needs a layer list, e.g. [{linear: 128}, "
               "relu, {linear: 10}]");
  const LocalSgdConfig& ls = c.distributed.local_sgd;
  errors.check(
      ls.outer_lr > 0 || ls.outer_momentum == defaults.distributed.local_sgd.outer_momentum,
      "distributed.local_sgd.outer_momentum",
      "only used with distributed.local_sgd.outer_lr > 0 (the outer optimizer; outer_lr "
      "is 0)");
}

}  // namespace dtrain::config_detail
