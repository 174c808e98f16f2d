// The declaration table of every config key (see schema.h) and what is derived from it alone:
// sections, JSON values and README's config table.
#include "config/schema.h"

#include <algorithm>
#include <charconv>

#include "util/check.h"

namespace dtrain {
namespace {

template <NamedEnum E, class F>
EnumRef enum_ref(F f) {
  return {enum_choices<E>(), [f](const Config& c) { return to_string(f(c)); },
          [f](Config& c, std::string_view s) {
            const std::optional<E> v = parse_enum<E>(s);
            if (v) f(c) = *v;
            return v.has_value();
          }};
}

// `f` is a generic lambda returning a reference to the key's field of a Config.
template <class F>
KeyDecl key(std::string path, F f, std::string doc) {
  using T = std::remove_reference_t<std::invoke_result_t<F, Config&>>;
  KeyDecl d;
  d.path = std::move(path);
  d.type = KeyType::kString;
  d.doc = std::move(doc);
  if constexpr (std::is_enum_v<T>) {
    d.type = KeyType::kEnum;
    d.ref = enum_ref<T>(f);
  } else {
    d.ref = static_cast<T& (*)(Config&)>(f);
    if constexpr (std::is_same_v<T, int64_t>) d.type = KeyType::kInt;
    if constexpr (std::is_same_v<T, double>) d.type = KeyType::kFloat;
    if constexpr (std::is_same_v<T, bool>) d.type = KeyType::kBool;
    if constexpr (std::is_same_v<T, char>) d.type = KeyType::kChar;
    if constexpr (std::is_same_v<T, std::vector<int64_t>>) d.type = KeyType::kIntList;
    if constexpr (std::is_same_v<T, std::vector<LayerSpec>>) d.type = KeyType::kLayerList;
    if constexpr (std::is_same_v<T, std::vector<std::string>>) d.type = KeyType::kPathList;
  }
  return d;
}

// The choices keys belong to (BelongsTo), shared by the section tables.
struct Owners {
  const BelongsTo sgd{"optimizer.type", {"sgd"}, "by optimizer sgd", {}};
  const BelongsTo mlp{"model.type", {"mlp"}, "by model type mlp", {}};
  const BelongsTo sequential{"model.type", {"sequential"}, "by model type sequential", {}};
  const BelongsTo gpt{"model.type", {"gpt"}, "by model type gpt", {}};
  const BelongsTo mlp_gpt{"model.type", {"mlp", "gpt"}, "by model types mlp and gpt", {}};
  const BelongsTo classifier{
      "model.type", {"mlp", "sequential"}, "by model types mlp and sequential", {}};
  const BelongsTo adam{"optimizer.type", {"adam", "adamw"}, "by optimizers adam and adamw", {}};
  const BelongsTo step{"optimizer.schedule.type", {"step"}, "by schedule step", {}};
  const BelongsTo cosine{"optimizer.schedule.type", {"cosine"}, "by schedule cosine", {}};
  const BelongsTo csv{"data.format", {"csv"}, "by format csv", "format"};
  const BelongsTo synthetic{"data.format", {"synthetic"}, "by format synthetic", "format"};
  const char* const compression = "distributed.compression.type";
  const BelongsTo topk{compression, {"topk"}, "by compression topk", {}};
  const BelongsTo powersgd{compression, {"powersgd"}, "by compression powersgd", {}};
  const BelongsTo compressed{
      compression, {"fp16", "bf16", "int8", "topk", "powersgd"}, "with compression", {}};
  const char* const strategy = "distributed.strategy";
  const BelongsTo local_sgd{strategy, {"local_sgd"}, "by strategy local_sgd", {}};
  const BelongsTo fsdp{strategy, {"fsdp"}, "by strategy fsdp", {}};
  const BelongsTo unit_layer{
      "distributed.fsdp.unit", {"layer"}, "with distributed.fsdp.unit layer", "unit"};
  // A pipeline: stages > 1, or strategy pipeline (ddp with a pipeline).
  const BelongsTo pipeline{
      "distributed.pipeline.stages", {}, "with a pipeline", {}, [](const Config& c) {
        return c.distributed.strategy == StrategyKind::kPipeline ||
               c.distributed.pipeline.stages > 1;
      }};
};

// The keys of seed and model, in the order of config.h.
std::vector<KeyDecl> model_keys(const Owners& o) {
  return {
      key(
          "seed", [](auto& c) -> auto& { return c.seed; },
          R"doc(Global RNG seed, ≥ 0: initialisation, shuffling, dropout, synthetic data, held-out split)doc")
          .min(0),
      key(
          "model.type", [](auto& c) -> auto& { return c.model.type; },
          R"doc(`mlp` (built from `hidden`, `activation`, ...) | `sequential` (built from `layers`) | `gpt` (nanoGPT's GPT over bytes, `data.format: text`))doc"),
      key(
          "model.layers", [](auto& c) -> auto& { return c.model.layers; },
          R"doc(The layer list of `sequential`, as PyTorch's nn.Sequential (see "Models"): `{linear: N}`, `{conv2d: {out_channels, kernel, stride, padding}}`, `{max_pool2d: {kernel, stride}}` or `{max_pool2d: K}`, `avg_pool2d` alike, `flatten`, `relu`, `gelu` (tanh approximation: `nn.GELU(approximate="tanh")`), `tanh`, `sigmoid`, `{dropout: P}`, `layer_norm`)doc")
          .by(o.sequential)
          .omitted_at_default_value(),
      key(
          "model.n_layer", [](auto& c) -> auto& { return c.model.n_layer; },
          R"doc(gpt: transformer blocks, 1 to 4096)doc")
          .range(1, 4096)
          .by(o.gpt)
          .omitted_at_default_value(),
      key(
          "model.n_head", [](auto& c) -> auto& { return c.model.n_head; },
          R"doc(gpt: attention heads per block, ≥ 1, dividing `n_embd`)doc")
          .min(1)
          .by(o.gpt)
          .omitted_at_default_value(),
      key(
          "model.n_embd", [](auto& c) -> auto& { return c.model.n_embd; },
          R"doc(gpt: embedding width C, 1 to 65536)doc")
          .range(1, 65536)
          .by(o.gpt)
          .omitted_at_default_value(),
      key(
          "model.block_size", [](auto& c) -> auto& { return c.model.block_size; },
          R"doc(gpt: context length T (positions), 1 to 2^20; text samples are windows of T + 1 bytes)doc")
          .range(1, int64_t{1} << 20)
          .by(o.gpt)
          .omitted_at_default_value(),
      key(
          "model.tie_embeddings", [](auto& c) -> auto& { return c.model.tie_embeddings; },
          R"doc(gpt: the output head is the token embedding `transformer.wte.weight` (nanoGPT's weight tying); false: a separate `lm_head.weight`)doc")
          .by(o.gpt)
          .omitted_at_default_value(),
      key(
          "model.complexity", [](auto& c) -> auto& { return c.model.complexity; },
          R"doc(Preset for `hidden`: `""` (none) | `simple` [128] | `medium` [512, 512] | `complex` [1024, 1024, 512, 256]; an error if `hidden` is also given)doc")
          .written_as_default()
          .by(o.mlp),
      key(
          "model.hidden", [](auto& c) -> auto& { return c.model.hidden; },
          R"doc(Hidden layer widths, each ≥ 1; `[]` = no hidden layer (softmax regression))doc")
          .min(1)
          .by(o.mlp),
      key(
          "model.activation", [](auto& c) -> auto& { return c.model.activation; },
          R"doc(`relu` | `gelu` (tanh approximation) | `tanh` | `sigmoid`)doc")
          .by(o.mlp),
      key(
          "model.dropout", [](auto& c) -> auto& { return c.model.dropout; },
          R"doc(Inverted dropout, in [0, 1): mlp: after each hidden activation; gpt: nanoGPT's (embeddings, attention weights, residual branches))doc")
          .unit()
          .by(o.mlp_gpt),
      key(
          "model.layer_norm", [](auto& c) -> auto& { return c.model.layer_norm; },
          R"doc(LayerNorm after each hidden Linear (before the activation))doc")
          .by(o.mlp),
      key(
          "model.init", [](auto& c) -> auto& { return c.model.init; },
          R"doc(`auto` | `kaiming` | `xavier` (auto: kaiming for relu/gelu, xavier for tanh/sigmoid); `sequential` always initialises as PyTorch does)doc")
          .by(o.mlp),
      key(
          "model.loss", [](auto& c) -> auto& { return c.model.loss; },
          R"doc(`cross_entropy` (fused softmax) | `mse` (on one-hot targets))doc")
          .by(o.classifier),
      key(
          "model.input_features", [](auto& c) -> auto& { return c.model.input_features; },
          R"doc(≥ 0; 0 = inferred from the data; else must equal it)doc")
          .min(0)
          .by(o.classifier),
      key(
          "model.num_classes", [](auto& c) -> auto& { return c.model.num_classes; },
          R"doc(≥ 0; 0 = inferred from the data (max label + 1 of the training data, a held-out split included); a label of `data.test`'s above them is refused (exit 2: test files do not shape the model to train); else labels must be below it)doc")
          .min(0)
          .by(o.classifier),
  };
}

// The keys of data, in the order of config.h.
std::vector<KeyDecl> data_keys(const Owners& o) {
  return {
      key(
          "data.format", [](auto& c) -> auto& { return c.data.format; },
          R"doc(`idx` | `csv` | `synthetic` | `text` (bytes as tokens for `model.type: gpt`, see "Text data"))doc"),
      key(
          "data.train.images", [](auto& c) -> auto& { return c.data.train.images; },
          R"doc(idx: training images file (required))doc")
          .file(),
      key(
          "data.train.labels", [](auto& c) -> auto& { return c.data.train.labels; },
          R"doc(idx: training labels file (required))doc")
          .file(),
      key(
          "data.train.path", [](auto& c) -> auto& { return c.data.train.path; },
          R"doc(csv: training CSV file (required). text: a file, a list of files, or glob patterns (sorted), gzip detected (required))doc"),
      key(
          "data.test.images", [](auto& c) -> auto& { return c.data.test.images; },
          R"doc(idx: test images file; give both images and labels or neither)doc")
          .file(),
      key(
          "data.test.labels", [](auto& c) -> auto& { return c.data.test.labels; },
          R"doc(idx: test labels file; give both images and labels or neither)doc")
          .file(),
      key(
          "data.test.path", [](auto& c) -> auto& { return c.data.test.path; },
          R"doc(csv: test CSV file (optional). text: the validation text, same forms as `data.train.path` (optional))doc"),
      key(
          "data.test_fraction", [](auto& c) -> auto& { return c.data.test_fraction; },
          R"doc(Fraction of train held out as the test set when `data.test` is not given: -1 = default (0 for idx/csv, 0.2 for synthetic, 0.1 for text: the last 10% of the bytes), else in [0, 1); > 0 together with `data.test` is an error, and so is a fraction that rounds to no sample (a format's default that does: a warning, and no evaluation))doc"),
      key(
          "data.batch_size", [](auto& c) -> auto& { return c.data.batch_size; },
          R"doc(Per-rank batch size, 1..16777216 (2^24))doc")
          .range(1, int64_t{1} << 24),
      key(
          "data.eval_batch_size", [](auto& c) -> auto& { return c.data.eval_batch_size; },
          R"doc(Evaluation batch size, 1..16777216 (2^24))doc")
          .range(1, int64_t{1} << 24),
      key(
          "data.shuffle", [](auto& c) -> auto& { return c.data.shuffle; },
          R"doc(Shuffle the training data each epoch (permutation from seed and epoch))doc"),
      key(
          "data.drop_last", [](auto& c) -> auto& { return c.data.drop_last; },
          R"doc(Drop the last short global batch of each epoch)doc"),
      key(
          "data.normalize", [](auto& c) -> auto& { return c.data.normalize; },
          R"doc(`auto` (scale for idx, standardize otherwise) | `scale` (idx: ÷255; else train min..max → 0..1) | `standardize` (train mean/std per feature) | `none`. Checkpoints store the per-feature statistics (and CSV column names) in their header, which safetensors readers cap at 100 MB: inputs of millions of features whose record would not fit are refused before training (exit 2; `none` stores no statistics))doc"),
      key(
          "data.csv.header", [](auto& c) -> auto& { return c.data.csv.header; },
          R"doc(`auto` (a first row of text cells is a header, of numbers data; a mix is an error) | `true` | `false`)doc")
          .by(o.csv),
      key(
          "data.csv.label_column", [](auto& c) -> auto& { return c.data.csv.label_column; },
          R"doc(Header name or 0-based index; `""` = last column)doc")
          .by(o.csv),
      key(
          "data.csv.delimiter", [](auto& c) -> auto& { return c.data.csv.delimiter; },
          R"doc(Exactly one character. In the file quote `,` and `#` (`','`); a tab is `"\t"`, or `\t` unquoted. With `--set` the value is taken as typed: `--set data.csv.delimiter=,`, `--set 'data.csv.delimiter=\t'` (a tab), `--set 'data.csv.delimiter=;'`)doc")
          .by(o.csv),
      key(
          "data.synthetic.samples", [](auto& c) -> auto& { return c.data.synthetic.samples; },
          R"doc(Total samples, ≥ 2)doc")
          .min(2)
          .by(o.synthetic),
      key(
          "data.synthetic.features", [](auto& c) -> auto& { return c.data.synthetic.features; },
          R"doc(≥ 1)doc")
          .min(1)
          .by(o.synthetic),
      key(
          "data.synthetic.classes", [](auto& c) -> auto& { return c.data.synthetic.classes; },
          R"doc(2 to 2^20)doc")
          .range(2, int64_t{1} << 20)
          .by(o.synthetic),
      key(
          "data.synthetic.noise", [](auto& c) -> auto& { return c.data.synthetic.noise; },
          R"doc(Std-dev around each class centre, 0 to 1e6)doc")
          .range(0, 1e6)
          .by(o.synthetic),
      key(
          "data.synthetic.seed", [](auto& c) -> auto& { return c.data.synthetic.seed; },
          R"doc(≥ -1; -1 = the top-level `seed`)doc")
          .min(-1)
          .by(o.synthetic),
  };
}

// The keys of optimizer, in the order of config.h.
std::vector<KeyDecl> optimizer_keys(const Owners& o) {
  return {
      key(
          "optimizer.type", [](auto& c) -> auto& { return c.optimizer.type; },
          R"doc(`sgd` | `adam` | `adamw` (PyTorch semantics))doc"),
      key(
          "optimizer.lr", [](auto& c) -> auto& { return c.optimizer.lr; },
          R"doc(Learning rate, > 0)doc")
          .positive(),
      key(
          "optimizer.momentum", [](auto& c) -> auto& { return c.optimizer.momentum; },
          R"doc(sgd, in [0, 1) (sgd only))doc")
          .unit()
          .by(o.sgd),
      key(
          "optimizer.nesterov", [](auto& c) -> auto& { return c.optimizer.nesterov; },
          R"doc(sgd Nesterov momentum; needs momentum > 0 (sgd only))doc")
          .by(o.sgd),
      key(
          "optimizer.weight_decay", [](auto& c) -> auto& { return c.optimizer.weight_decay; },
          R"doc(≥ 0; sgd/adam: L2 added to the gradient; adamw: decoupled (the default is 0 for adamw too, where `torch.optim.AdamW` defaults to 0.01: give it to match))doc")
          .non_negative(),
      key(
          "optimizer.weight_decay_on", [](auto& c) -> auto& { return c.optimizer.weight_decay_on; },
          R"doc(`all` | `matrices`: the parameters `weight_decay` applies to; `matrices` = tensors of ≥ 2 dimensions only (linear and conv weights, embeddings), not biases or LayerNorm weights, as nanoGPT's parameter groups)doc")
          .omitted_at_default_value(),
      key(
          "optimizer.beta1", [](auto& c) -> auto& { return c.optimizer.beta1; },
          R"doc(adam/adamw first-moment decay, in [0, 1) (adam/adamw only))doc")
          .unit()
          .by(o.adam),
      key(
          "optimizer.beta2", [](auto& c) -> auto& { return c.optimizer.beta2; },
          R"doc(adam/adamw second-moment decay, in [0, 1) (adam/adamw only))doc")
          .unit()
          .by(o.adam),
      key(
          "optimizer.eps", [](auto& c) -> auto& { return c.optimizer.eps; },
          R"doc(adam/adamw, > 0 (adam/adamw only))doc")
          .positive()
          .by(o.adam),
      key(
          "optimizer.scale_lr", [](auto& c) -> auto& { return c.optimizer.scale_lr; },
          R"doc(`none` | `linear` (lr *= the data-parallel replicas, world_size / (pipeline stages x tensor-parallel size): the linear scaling rule for the global batch))doc"),
      key(
          "optimizer.clip_grad_norm", [](auto& c) -> auto& { return c.optimizer.clip_grad_norm; },
          R"doc(≥ 0; 0 = off, else clip the global gradient L2 norm to this)doc")
          .non_negative(),
      key(
          "optimizer.schedule.type", [](auto& c) -> auto& { return c.optimizer.schedule.type; },
          R"doc(`constant` | `step` | `cosine` (half a cosine from lr after warmup down towards `min_lr`, reached the step after the last, as PyTorch's CosineAnnealingLR with T_max = the steps after warmup))doc"),
      key(
          "optimizer.schedule.warmup_steps",
          [](auto& c) -> auto& { return c.optimizer.schedule.warmup_steps; },
          R"doc(Linear warmup from lr/warmup_steps to lr, ≥ 0: step s of 1..W at lr·s/W, as PyTorch's LinearLR(start_factor=1/W, total_iters=W-1) (nanoGPT's get_lr warms up as lr·(s+1)/(W+1) from s = 0); step and cosine schedules start after it)doc")
          .min(0),
      key(
          "optimizer.schedule.step_size",
          [](auto& c) -> auto& { return c.optimizer.schedule.step_size; },
          R"doc(step: multiply lr by gamma every N steps after warmup, ≥ 1 (step schedule only))doc")
          .min(1)
          .by(o.step),
      key(
          "optimizer.schedule.gamma", [](auto& c) -> auto& { return c.optimizer.schedule.gamma; },
          R"doc(step decay factor, in (0, 1] (step schedule only))doc")
          .unit_open_low()
          .by(o.step),
      key(
          "optimizer.schedule.min_lr", [](auto& c) -> auto& { return c.optimizer.schedule.min_lr; },
          R"doc(cosine's floor (the lr one step after the last; the last step's is slightly above it), ≥ 0 and < `optimizer.lr` (cosine only))doc")
          .non_negative()
          .by(o.cosine),
  };
}

// The keys of train, in the order of config.h.
std::vector<KeyDecl> train_keys([[maybe_unused]] const Owners& o) {
  return {
      key(
          "train.epochs", [](auto& c) -> auto& { return c.train.epochs; },
          R"doc(≥ 0; 0 = no epoch limit (then `max_steps` is required))doc")
          .min(0)
          .not_hashed(),
      key(
          "train.max_steps", [](auto& c) -> auto& { return c.train.max_steps; },
          R"doc(≥ 0; 0 = no limit, else stop after N optimizer steps)doc")
          .min(0)
          .not_hashed(),
      key(
          "train.log_every", [](auto& c) -> auto& { return c.train.log_every; },
          R"doc(Steps between train records in metrics.jsonl, ≥ 1)doc")
          .min(1)
          .not_hashed(),
      key(
          "train.eval_every", [](auto& c) -> auto& { return c.train.eval_every; },
          R"doc(≥ 0; 0 = evaluate at each epoch end only, else every N steps too)doc")
          .min(0)
          .not_hashed(),
      key(
          "train.grad_accum_steps", [](auto& c) -> auto& { return c.train.grad_accum_steps; },
          R"doc(Micro-batches per optimizer step, ≥ 1 (the last step of an epoch may have fewer))doc")
          .min(1),
      key(
          "train.nonfinite", [](auto& c) -> auto& { return c.train.nonfinite; },
          R"doc(A NaN or infinite loss or gradient: `abort` (exit 1 naming the step and the loss or the first parameter whose gradient went non-finite; exit 2 when the loss or a gradient of step 1, before any update, is not finite: the data or the initial weights overflow float32, or fp16 compression does in transit, which no restart changes; so too at the first step after a resume, whose checkpoint may hold weights that overflow) | `skip` (drop that step's update on every rank: the step still counts and keeps its train record, evaluation, checkpoint and Local SGD synchronisation; its loss and samples are left out of the record, whose `loss` is null if every step since the previous record was skipped; counted in summary.json `skipped_steps` and logged). Every rank reaches the same verdict (reduced gradients are identical; strategies with per-rank gradients all-reduce it))doc"),
      key(
          "train.preempt_signal", [](auto& c) -> auto& { return c.train.preempt_signal; },
          R"doc(`TERM` | `USR1`: the signal a scheduler sends before it preempts the job (Slurm's `--signal`). Every rank stops after one agreed step, writes a checkpoint and exits 75 (requeue; README "Preemption"). SIGINT stays a plain interrupt (exit 130), and so does SIGTERM (exit 143) when this is `USR1`)doc")
          .not_hashed()
          .omitted_at_default_value(),
      key(
          "train.preempt_save_timeout_s",
          [](auto& c) -> auto& { return c.train.preempt_save_timeout_s; },
          R"doc(≥ 0; 0 = no deadline. Seconds from the agreed stop after a preemption signal to the checkpoint on disk: a rank not done by then exits 75 saying so, the previous checkpoint stays the newest complete one)doc")
          .non_negative()
          .not_hashed()
          .omitted_at_default_value(),
      key(
          "train.init_from", [](auto& c) -> auto& { return c.train.init_from; },
          R"doc(Model weights that a fresh run starts from instead of its random initialisation (`""` = none; a resume loads its checkpoint instead): a dtrain checkpoint as `--resume` names it (a file, a sharded folder, a run or checkpoints folder; its training state, `optim.*`, `comp.*`, `replica.*`, is ignored: the optimizer starts afresh at step 0) or a PyTorch `state_dict` saved with `safetensors.torch.save_file`/`save_model`, under the names "Models" gives (`layers.<i>.weight` or a bare `nn.Sequential`'s `<i>.weight`; nanoGPT's). Every parameter must be there, as float32 (or float16, bfloat16 or float64, converted), with the model's shape; a tied pair needs one of its names; other tensors are ignored with a warning)doc")
          .file()
          .omitted_at_default_value(),
      key(
          "train.checkpoint.every_steps",
          [](auto& c) -> auto& { return c.train.checkpoint.every_steps; },
          R"doc(≥ 0; 0 = only at the end of training)doc")
          .min(0)
          .not_hashed(),
      key(
          "train.checkpoint.keep_last",
          [](auto& c) -> auto& { return c.train.checkpoint.keep_last; },
          R"doc(Newest step checkpoints kept, ≥ 1 (after a resume from an earlier step, the steps past it go first; a step folder whose save was cut off, without its manifest, goes before any complete checkpoint))doc")
          .min(1)
          .not_hashed(),
      key(
          "train.checkpoint.async", [](auto& c) -> auto& { return c.train.checkpoint.async; },
          R"doc(`true`: a save copies the state (every rank its own part) and writes it on a background thread while training goes on; at most one write in flight (the next save waits), its error fails the run at the next step or at the end, `latest` moves only once every part is on disk. Same files and results as `false`)doc")
          .not_hashed()
          .omitted_at_default_value(),
  };
}

// The keys of distributed up to its transport settings, in the order of config.h.
std::vector<KeyDecl> distributed_keys([[maybe_unused]] const Owners& o) {
  return {
      key(
          "distributed.backend", [](auto& c) -> auto& { return c.distributed.backend; },
          R"doc(`inproc` | `grpc`)doc"),
      key(
          "distributed.world_size", [](auto& c) -> auto& { return c.distributed.world_size; },
          R"doc(Number of ranks, 1..1024; with the inproc backend the ranks are threads of one process; a launcher's environment overrides it)doc")
          .range(1, 1024),
      key(
          "distributed.strategy", [](auto& c) -> auto& { return c.distributed.strategy; },
          R"doc(`ddp` (gradients averaged every step) | `local_sgd` (parameters averaged every `sync_every` steps) | `zero1` (optimizer state sharded) | `zero2` (and gradients) | `fsdp` (and parameters; `zero3` is the same) | `pipeline` (ddp with a pipeline whose `distributed.pipeline.stages` default to 2 and may not be 1; kept for older configs))doc"),
      key(
          "distributed.timeout_s", [](auto& c) -> auto& { return c.distributed.timeout_s; },
          R"doc(Deadline of every collective and receive, at least 0.1; time the process was stopped (Ctrl-Z) is not counted)doc")
          .min(0.1, "a collective or receive waits longer than that on a busy host")
          .not_hashed(),
      key(
          "distributed.heartbeat_s", [](auto& c) -> auto& { return c.distributed.heartbeat_s; },
          R"doc(gRPC: a peer not heard from for this long (heartbeats go out every `heartbeat_s / 3`) is declared frozen or unreachable and everything waiting on it fails. Per host (not in the config hash): ranks with different values wait for the longer of their own and 3 of the peer's intervals, at most twice their own (what a peer claims cannot stretch detection further), and beat as often as their most frequently beating peer (at most every 10 ms), so values far apart work; at least 0.1: a shorter silence is a busy host's scheduling, not a frozen peer)doc")
          .min(0.1,
               "heartbeats go out at most every 10 ms, and a peer silent for less than 0.1 s is "
               "a busy host's scheduling, not a frozen peer")
          .not_hashed(),
      key(
          "distributed.rendezvous_timeout_s",
          [](auto& c) -> auto& { return c.distributed.rendezvous_timeout_s; },
          R"doc(How long rank 0 waits for all ranks to join, at least 1: processes take longer than that to start and meet)doc")
          .min(1.0, "processes take longer than that to start and meet")
          .not_hashed(),
      key(
          "distributed.token_file", [](auto& c) -> auto& { return c.distributed.token_file; },
          R"doc(File holding the job token (`DTRAIN_JOB_TOKEN` takes precedence))doc")
          .file()
          .not_hashed(),
      key(
          "distributed.bind", [](auto& c) -> auto& { return c.distributed.bind; },
          R"doc(This rank's listen address, a host alone (a `host:port`, URL or whitespace is refused); `""` = loopback for a loopback `MASTER_ADDR`, else `0.0.0.0`)doc")
          .not_hashed(),
      key(
          "distributed.shm", [](auto& c) -> auto& { return c.distributed.shm; },
          R"doc(Ranks of a gRPC job on the same machine exchange tensors through shared memory (`/dev/shm`) instead of their gRPC streams, which stay up for failure detection; `false` = gRPC streams only. Per host)doc")
          .not_hashed(),
      key(
          "distributed.tcp", [](auto& c) -> auto& { return c.distributed.tcp; },
          R"doc(Ranks of a gRPC job that do not share memory (other hosts, or `shm: false`) exchange tensors over plain TCP connections, one per rank pair, authenticated by the job token, instead of their gRPC streams, which stay up for failure detection; 1.3-2.5x the streams' bandwidth (README "The TCP data path"). Off whenever TLS is on, so data stays encrypted; `false` = gRPC streams. Per host)doc")
          .not_hashed()
          .omitted_at_default_value(),
      key(
          "distributed.tls.cert", [](auto& c) -> auto& { return c.distributed.tls.cert; },
          R"doc(Mutual TLS between ranks: this rank's PEM certificate; all three of cert, key and ca or none)doc")
          .file()
          .not_hashed(),
      key(
          "distributed.tls.key", [](auto& c) -> auto& { return c.distributed.tls.key; },
          R"doc(Mutual TLS: this rank's PEM private key)doc")
          .file()
          .not_hashed(),
      key(
          "distributed.tls.ca", [](auto& c) -> auto& { return c.distributed.tls.ca; },
          R"doc(Mutual TLS: the PEM CA that signed every rank's certificate)doc")
          .file()
          .not_hashed(),
  };
}

// The keys of the data-parallel strategies, compression, the pipeline and runtime.
std::vector<KeyDecl> strategy_keys(const Owners& o) {
  return {
      key(
          "distributed.ddp.bucket_mb", [](auto& c) -> auto& { return c.distributed.ddp.bucket_mb; },
          R"doc(DDP gradient bucket cap in MiB, > 0: each bucket's all-reduce starts as soon as backward has produced its gradients; a bucket never exceeds the cap unless one layer alone does. zero1 and zero2 shard along these buckets. Accepted with every strategy (ignored by fsdp, local_sgd and compression; a pipeline's data-parallel all-reduces use it). Measured: see "Benchmarks")doc")
          .positive(),
      key(
          "distributed.local_sgd.sync_every",
          [](auto& c) -> auto& { return c.distributed.local_sgd.sync_every; },
          R"doc(Local SGD: optimizer steps each rank takes on its own data between parameter averages, ≥ 1 (strategy local_sgd only))doc")
          .min(1)
          .by(o.local_sgd),
      key(
          "distributed.local_sgd.sync_optimizer_state",
          [](auto& c) -> auto& { return c.distributed.local_sgd.sync_optimizer_state; },
          R"doc(Also average the optimizer state (momentum, Adam moments) at each synchronisation (strategy local_sgd only))doc")
          .by(o.local_sgd),
      key(
          "distributed.local_sgd.outer_lr",
          [](auto& c) -> auto& { return c.distributed.local_sgd.outer_lr; },
          R"doc(≥ 0; > 0 enables the DiLoCo outer optimizer: the averaged change since the last synchronisation is a pseudo-gradient applied with Nesterov momentum at this rate; 0 = plain averaging (strategy local_sgd only))doc")
          .non_negative()
          .by(o.local_sgd),
      key(
          "distributed.local_sgd.outer_momentum",
          [](auto& c) -> auto& { return c.distributed.local_sgd.outer_momentum; },
          R"doc(Outer Nesterov momentum, in [0, 1) (strategy local_sgd only))doc")
          .unit()
          .by(o.local_sgd),
      key(
          "distributed.compression.type",
          [](auto& c) -> auto& { return c.distributed.compression.type; },
          R"doc(Compression for `ddp` (gradients) and `local_sgd` (each rank's parameter move since the last synchronisation, with error feedback on it, instead of a dense parameter average): `none` | `fp16` | `bf16` | `int8` (one float scale per 256 values) | `topk` (the `ratio` largest-magnitude entries as index/value pairs). Compressed gradients are all-gathered and every rank sums the decoded messages in rank order (bitwise the same result everywhere); for 2 ranks that sends 1/2, ~1/4 and 2·ratio of the ring all-reduce's bytes, and the saving shrinks as the group grows. `powersgd` (Vogels et al. 2019, as PyTorch's `powerSGD_hook`): each weight gradient of 2 or more dimensions, as the matrix M (n x m) of its first dimension by the rest (a conv2d weight `[O, I, kh, kw]` is O x I·kh·kw, as the hook views it), is sent as rank-`rank` factors, P = M Q all-reduced and orthonormalised, then Q = Mᵀ P all-reduced, result P Qᵀ (Q warm-started from the previous step; every rank gets bitwise the same result; unlike the hook's defaults, compression starts at the first step, where the hook all-reduces exactly for `start_powerSGD_iter` = 1000 iterations, and any matrix with `rank`·(n + m) < n·m is compressed, where the hook's `min_compression_rate` = 2 asks for 2·`rank`·(n + m) < n·m); biases and matrices where `rank`·(n + m) ≥ n·m are all-reduced exactly in the same all-reduce as the P's. Bytes: `rank`·(Σn + Σm) + (uncompressed floats) instead of all the gradient's floats, for any number of ranks (54x fewer for 784-512-512-10 at rank 4). Compression also applies at world size 1 (`ddp`): each step's gradient goes through the encode/decode round trip with error feedback and nothing is sent, so one process shows what a type costs in accuracy; `local_sgd` at world size 1 never synchronises, so compression is unused there, with a warning. The compression state (residuals, PowerSGD's Q) is checkpointed (see "Checkpoint format"))doc"),
      key(
          "distributed.compression.ratio",
          [](auto& c) -> auto& { return c.distributed.compression.ratio; },
          R"doc(topk: fraction of entries sent, in (0, 1] (topk only))doc")
          .unit_open_low()
          .by(o.topk),
      key(
          "distributed.compression.rank",
          [](auto& c) -> auto& { return c.distributed.compression.rank; },
          R"doc(powersgd: rank of the factors P and Q, ≥ 1; a matrix with `rank`·(n + m) ≥ n·m is sent uncompressed (powersgd only))doc")
          .min(1, "the number of columns of the PowerSGD factors")
          .by(o.powersgd),
      key(
          "distributed.compression.error_feedback",
          [](auto& c) -> auto& { return c.distributed.compression.error_feedback; },
          R"doc(Add what compression dropped to the next step's gradient (not with type none))doc")
          .by(o.compressed),
      key(
          "distributed.fsdp.unit", [](auto& c) -> auto& { return c.distributed.fsdp.unit; },
          R"doc(fsdp's unit of gathering: `layer` (`layers_per_unit` layers with parameters, with the layers without parameters after them; those before the first join the first unit) | `model` (one unit: the whole model is gathered) (strategy fsdp only))doc")
          .by(o.fsdp),
      key(
          "distributed.fsdp.layers_per_unit",
          [](auto& c) -> auto& { return c.distributed.fsdp.layers_per_unit; },
          R"doc(≥ 1, with `unit: layer` (strategy fsdp only))doc")
          .min(1)
          .by(o.fsdp)
          .by(o.unit_layer),
      key(
          "distributed.fsdp.reshard_after_forward",
          [](auto& c) -> auto& { return c.distributed.fsdp.reshard_after_forward; },
          R"doc(Free a unit's gathered parameters after its forward and gather them again for backward (less memory, more traffic); `false` keeps them until the step's last backward: one gather per unit and step, shared by accumulation and pipeline micro-batches (strategy fsdp only))doc")
          .by(o.fsdp),
      key(
          "distributed.pipeline.stages",
          [](auto& c) -> auto& { return c.distributed.pipeline.stages; },
          R"doc(Pipeline stages S, 1..1024, at most the model's layers with parameters; 1 = no pipeline (2 by default with strategy pipeline); `world_size` must be a multiple: W / S data-parallel replicas of each stage, which run `distributed.strategy` on their data axis)doc")
          .range(1, 1024),
      key(
          "distributed.pipeline.micro_batches",
          [](auto& c) -> auto& { return c.distributed.pipeline.micro_batches; },
          R"doc(Micro-batches per batch, 1..`data.batch_size` (with a pipeline only); the default 4 means one per row for a smaller batch)doc")
          .min(1)
          .by(o.pipeline),
      key(
          "distributed.pipeline.schedule",
          [](auto& c) -> auto& { return c.distributed.pipeline.schedule; },
          R"doc(`gpipe` | `1f1b` (with a pipeline only))doc")
          .by(o.pipeline),
      key(
          "distributed.pipeline.partition",
          [](auto& c) -> auto& { return c.distributed.pipeline.partition; },
          R"doc(`uniform` (layer count) | `balanced` (estimated cost) (with a pipeline only))doc")
          .by(o.pipeline),
      key(
          "distributed.pipeline.activation_checkpointing",
          [](auto& c) -> auto& { return c.distributed.pipeline.activation_checkpointing; },
          R"doc(Keep only stage inputs per micro-batch and recompute the forward in backward (with a pipeline only))doc")
          .by(o.pipeline),
      key(
          "distributed.tensor_parallel.size",
          [](auto& c) -> auto& { return c.distributed.tensor_parallel.size; },
          R"doc(Tensor-parallel ranks T, 1..1024 (model.type gpt only; 1 = none): each block's attention heads and MLP columns are split over T neighbouring ranks (Megatron-LM's layers); T must divide `model.n_head`, 4 `model.n_embd` and the vocabulary 256, and T x `distributed.pipeline.stages` must divide `world_size` (the rest are data-parallel replicas))doc")
          .range(1, 1024)
          .omitted_at_default_value(),
      key(
          "runtime.threads", [](auto& c) -> auto& { return c.runtime.threads; },
          R"doc(OpenBLAS threads per rank, 0..1024; 0 = the cores this process may use (its CPU affinity -- taskset, a container's cpuset -- at most its cgroup's CPU quota rounded up) divided by the ranks on this machine (at least 1; see "Threads"))doc")
          .range(0, 1024)
          .not_hashed(),
  };
}

std::vector<KeyDecl> declare_keys() {
  const Owners o;
  std::vector<KeyDecl> keys;
  for (auto section :
       {model_keys, data_keys, optimizer_keys, train_keys, distributed_keys, strategy_keys}) {
    std::vector<KeyDecl> k = section(o);
    keys.insert(keys.end(), std::make_move_iterator(k.begin()), std::make_move_iterator(k.end()));
  }
  return keys;
}

std::string show_float(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  const size_t e = s.find('e');
  if (e == std::string::npos) return s.find('.') == std::string::npos ? s + ".0" : s;
  // 1e-08 -> 1e-8
  size_t digits = e + 1 + (s[e + 1] == '-' || s[e + 1] == '+');
  while (digits + 1 < s.size() && s[digits] == '0') s.erase(digits, 1);
  return s;
}

const char* type_name(KeyType t) {
  switch (t) {
    case KeyType::kInt:
      return "int";
    case KeyType::kFloat:
      return "float";
    case KeyType::kBool:
      return "bool";
    case KeyType::kString:
    case KeyType::kEnum:
      return "string";
    case KeyType::kPath:
      return "path";
    case KeyType::kChar:
      return "char";
    case KeyType::kIntList:
      return "list of int";
    case KeyType::kLayerList:
      return "list of layers";
    case KeyType::kPathList:
      return "path or list of paths";
  }
  return "?";
}

// How the table shows a default: as YAML would write it, "" for an empty string.
std::string show_default(const KeyDecl& d, const nlohmann::json& v) {
  switch (d.type) {
    case KeyType::kFloat:
      return show_float(v.get<double>());
    case KeyType::kLayerList:
      return v.empty() ? "[]" : v.dump();
    case KeyType::kPathList:
      if (v.is_array()) return v.dump();
      return v.get<std::string>().empty() ? "\"\"" : v.get<std::string>();
    case KeyType::kIntList: {
      std::string s = "[";
      for (const auto& e : v) s += (s.size() > 1 ? ", " : "") + std::to_string(e.get<int64_t>());
      return s + "]";
    }
    case KeyType::kString:
    case KeyType::kPath:
    case KeyType::kChar:
    case KeyType::kEnum: {
      const std::string s = v.get<std::string>();
      return s.empty() ? "\"\"" : s;
    }
    default:
      return v.dump();
  }
}

std::string escape_cell(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '|') out += '\\';
    out += ch;
  }
  return out;
}

}  // namespace

void to_json(nlohmann::json& j, const LayerSpec& l) {
  const std::string kind(to_string(l.kind));
  switch (l.kind) {
    case LayerKind::kLinear:
      j = {{kind, l.out}};
      return;
    case LayerKind::kConv2d:
      j = {{kind,
            {{"out_channels", l.out},
             {"kernel", l.kernel},
             {"stride", l.stride},
             {"padding", l.padding}}}};
      return;
    case LayerKind::kMaxPool2d:
    case LayerKind::kAvgPool2d:
      j = {{kind, {{"kernel", l.kernel}, {"stride", l.stride}}}};
      return;
    case LayerKind::kDropout:
      j = {{kind, l.p}};
      return;
    default:
      j = kind;
  }
}

nlohmann::json KeyDecl::get(const Config& c) const {
  return std::visit(
      [&c](const auto& r) -> nlohmann::json {
        if constexpr (std::is_same_v<std::decay_t<decltype(r)>, EnumRef>) {
          return r.get(c);
        } else {
          // The accessors take a mutable Config (parsing writes through them); this only reads.
          const auto& v = r(const_cast<Config&>(c));
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, char>) {
            return std::string(1, v);
          } else if constexpr (std::is_same_v<std::decay_t<decltype(v)>,
                                              std::vector<std::string>>) {
            // A path list: "" for none and a plain string for one, as kPath writes them.
            if (v.size() <= 1) return v.empty() ? std::string() : v[0];
            return v;
          } else {
            return v;
          }
        }
      },
      ref);
}

std::string BelongsTo::choice(const Config& c) const {
  const nlohmann::json value = find_key(key)->get(c);
  return value.is_string() ? value.get<std::string>() : value.dump();
}

bool BelongsTo::holds(const Config& c) const {
  if (when && when(c)) return true;
  const std::string chosen = choice(c);
  return std::find(values.begin(), values.end(), chosen) != values.end();
}

bool KeyDecl::applies_to(const Config& c) const {
  return std::all_of(belongs.begin(), belongs.end(),
                     [&c](const BelongsTo& b) { return b.holds(c); });
}

const std::vector<KeyDecl>& config_keys() {
  static const std::vector<KeyDecl> keys = declare_keys();
  return keys;
}

const KeyDecl* find_key(std::string_view path) {
  static const std::map<std::string_view, const KeyDecl*, std::less<>> index = [] {
    std::map<std::string_view, const KeyDecl*, std::less<>> m;
    for (const KeyDecl& d : config_keys()) {
      DT_CHECK_MSG(m.emplace(d.path, &d).second, "config key declared twice: " << d.path);
    }
    return m;
  }();
  const auto it = index.find(path);
  return it == index.end() ? nullptr : it->second;
}

const std::map<std::string, std::vector<std::string_view>, std::less<>>& config_sections() {
  static const auto sections = [] {
    std::map<std::string, std::vector<std::string_view>, std::less<>> s;
    for (const KeyDecl& d : config_keys()) {
      const std::string_view path = d.path;
      // Each prefix "a", "a.b" of "a.b.c" is a section holding the next name.
      for (size_t start = 0;;) {
        const size_t dot = path.find('.', start);
        const std::string section(path.substr(0, start == 0 ? 0 : start - 1));
        const std::string_view child = path.substr(
            start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
        std::vector<std::string_view>& keys = s[section];
        if (std::find(keys.begin(), keys.end(), child) == keys.end()) keys.push_back(child);
        if (dot == std::string_view::npos) break;
        start = dot + 1;
      }
    }
    return s;
  }();
  return sections;
}

std::string config_reference_table() {
  const Config defaults;
  std::string out = "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const KeyDecl& d : config_keys()) {
    out += "| `" + d.path + "` | " + type_name(d.type) + " | `" +
           escape_cell(show_default(d, d.get(defaults))) + "` | " + escape_cell(d.doc) + " |\n";
  }
  return out;
}

}  // namespace dtrain
