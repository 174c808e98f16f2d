// TrainLoop's resume (train_loop.h): the checkpoint's full state into this rank's strategy, the
// sampler's position and schedule it recorded, and what a resume leaves to do.
#include "train/train_loop.h"

#include <fstream>

#include "train/init_from.h"
#include "train/replica_state.h"
#include "util/strings.h"

namespace dtrain {
namespace loop_detail {

// Whether this run resumes is rank 0's call, told to every rank: rank 0 alone reads the
// checkpoint and broadcasts it, so the others need not see the file. Their own --resume can
// differ when each node's launcher looks for this job's checkpoints in its own --out: a folder
// the nodes do not share holds them on node 0 only, and the other nodes' launchers restarted
// their ranks without --resume, which then ran other collectives than rank 0's.
bool TrainLoop::resuming() {
  const bool mine = !opts_.resume.empty();
  uint8_t lead = mine ? 1 : 0;
  world_.broadcast(&lead, 1, 0);
  if (lead != 0 && !mine)
    spdlog::info(
        "rank 0 resumes and this rank was started without --resume: it takes rank 0's "
        "checkpoint (its launcher found no new one in {}: a folder the nodes do not share, or "
        "a node that joined after that checkpoint)",
        opts_.out_dir);
  else if (lead == 0 && mine)
    spdlog::warn(
        "this rank was given --resume {} and rank 0 was not: it starts fresh, as rank 0 does",
        opts_.resume);
  return lead != 0;
}

// train.init_from on rank 0: the whole model's weights into init_full_, checked (init_from.h).
void TrainLoop::read_init_from() {
  const Model& whole = tp_ ? tp_->global() : model_;
  init_full_.resize(static_cast<size_t>(whole.param_count()));
  read_init_weights(cfg_.train.init_from, whole, init_full_.data());
  spdlog::info("initial weights from {}", cfg_.train.init_from);
  // A dtrain checkpoint records the inputs its weights were trained on: other ones (CSV columns
  // reordered or renamed, another label column) are said -- a fine-tune may mean them, but the
  // model reads its inputs by position.
  if (data_->train.kind != SampleKind::kFeatures) return;
  const std::string json = checkpoint_input_record(resolve_checkpoint(cfg_.train.init_from, false));
  if (json.empty()) return;
  const InputRecord r =
      input_record_from_json(json, "train.init_from '" + cfg_.train.init_from + "'");
  if (const std::string why = input_layout_problem(r, data_->train, "the training data's");
      !why.empty())
    spdlog::warn("train.init_from '{}': {}", cfg_.train.init_from, why);
}

// train.init_from: the weights rank 0 read (init_full_) to every rank, each strategy keeping its
// part; the optimizer starts afresh.
void TrainLoop::init_weights_from_file() {
  const Model& whole = tp_ ? tp_->global() : model_;
  const size_t P = static_cast<size_t>(whole.param_count());
  // (not read at the start: a resume was to load a checkpoint that was not there)
  if (lead_ && init_full_.empty()) read_init_from();
  std::vector<float> full = std::move(init_full_);
  full.resize(P);  // (the other ranks' buffer)
  world_.broadcast(full.data(), P, 0);
  if (tp_) tp_->slice(full.data(), full.data());  // (this tensor rank's shards, in place)
  const std::vector<float> zeros(P, 0.0f);        // (a fresh optimizer's state)
  const std::vector<const float*> state(strategy_->state_names().size(), zeros.data());
  strategy_->load_full(full.data(), state);
}

bool TrainLoop::resume() {
  if (resuming_) {
    // The full state is read by rank 0 and broadcast; each strategy keeps its part (of the
    // whole model's layout, sliced to this tensor rank's shards first).
    const Model& whole = tp_ ? tp_->global() : model_;
    const int64_t P = whole.param_count();
    const std::vector<std::string> names = strategy_->state_names();
    std::vector<float> full_p(static_cast<size_t>(P));
    std::vector<std::vector<float>> full_s(names.size(),
                                           std::vector<float>(static_cast<size_t>(P)));
    std::vector<StateBuffer> sb;
    std::vector<const float*> ptrs;
    for (size_t i = 0; i < names.size(); ++i) {
      sb.push_back({names[i], full_s[i].data()});
      ptrs.push_back(full_s[i].data());
    }
    rp_ = resume_full_state(cfg_, opts_, world_, whole, ckpt_dir_, hash_, full_p.data(), sb, rng_,
                            &saved_comp_, &saved_replicas_);
    if (rp_.loaded) {
      check_tied_copies(whole, full_p.data(), ptrs,
                        !rp_.from.empty()       ? rp_.from
                        : !opts_.resume.empty() ? opts_.resume
                                                : std::string("rank 0's checkpoint"));
      // The checkpoint's record of its training inputs (rank 0 holds it; its refusal ends the
      // others' collectives).
      if (lead_ && !rp_.normalizer.empty() && data_->train.kind == SampleKind::kFeatures) {
        // Inputs laid out otherwise than the checkpoint's training data (CSV columns reordered,
        // another label column): the weights would train on permuted features (it went on with
        // a statistics warning).
        if (const std::string why =
                input_layout_problem(input_record_from_json(rp_.normalizer, rp_.from), data_->train,
                                     "the training data's");
            !why.empty())
          throw UserError(why + " (checkpoint '" + rp_.from +
                          "' records its training data's): data.csv.label_column or the training "
                          "files changed since; resume with the data it was trained on");
        // Training goes on with the data's statistics as they are now; the weights learned with
        // the checkpoint's (an elastic restart or an interrupted run has the same files: equal).
        if (!(Normalizer::from_json(rp_.normalizer, data_->train.features, rp_.from) ==
              data_->normalizer))
          spdlog::warn(
              "the training data's statistics differ from those {} was trained with (the data "
              "files or the held-out split changed since): training continues on inputs scaled by "
              "the data's own, which the weights have not seen",
              rp_.from);
      }
      if (tp_) {  // this tensor rank's shards, in place (a local layout is no larger)
        tp_->slice(full_p.data(), full_p.data());
        for (std::vector<float>& b : full_s) tp_->slice(b.data(), b.data());
      }
      strategy_->load_full(full_p.data(), ptrs);
      // (the full state is in the strategy now: freed before the replicas' states are read)
      ptrs.clear();
      sb.clear();
      std::vector<float>().swap(full_p);
      std::vector<std::vector<float>>().swap(full_s);
      // Local SGD keeps an optimizer state per rank between synchronisations (replica_state.h).
      if (lead_ && rp_.lost_replica_states > 0)
        spdlog::warn(
            "checkpoint '{}' was written by Local SGD without sync_optimizer_state on {} ranks, "
            "whose optimizer states differed, by a dtrain that stored rank 0's alone (before "
            "2026-12-07): every rank continues from it, so this run does not continue exactly as "
            "the interrupted one would have",
            rp_.from, rp_.lost_replica_states);
      if (strategy_->per_rank_optimizer_state() && one_file())
        restore_replica_state(world_, strategy_->optimizer(), saved_replicas_, rp_.from);
      else if (strategy_->per_rank_optimizer_state() && !strategy_->sharded()) {
        // (rank 0 reads the sharded checkpoint rp_.from; each replica's shard ranges in the whole
        // layout tell whether its stage holds what the checkpoint's did)
        const std::vector<ShardRange> local = strategy_->checkpoint_shard().ranges;
        restore_shard_replica_state(world_, grid_.layout(), strategy_->optimizer(), rp_.from,
                                    tp_ ? tp_->global_ranges(local) : local,
                                    saved_replicas_.world_size);
      } else if (lead_ && saved_replicas_.world_size > 0)
        spdlog::warn(
            "the checkpoint holds each of its {} ranks' own optimizer state (Local SGD without "
            "sync_optimizer_state); this run keeps one state and continues from rank 0's, so it "
            "does not continue exactly as the interrupted one would have",
            saved_replicas_.world_size);
      saved_replicas_ = ReplicaState{};
      step_ = rp_.step;
      epoch_ = rp_.epoch;
      batch_ = resumed_batch_index();
      plan_.total_steps = resumed_total_steps();
      keep_resumed_lr();
      strategy_->optimizer().set_step_count(rp_.optimizer_steps);
      last_ckpt_step_ = step_;
      restore_progress(rp_.progress);
      if (GradReducer* r = strategy_->reducer())
        restore_compression_state(world_, *r, cfg_.distributed.compression.type,
                                  cfg_.distributed.strategy, saved_comp_);
    }
  }
  if (!rp_.loaded && !cfg_.train.init_from.empty()) init_weights_from_file();
  std::vector<float>().swap(init_full_);  // (a resume's checkpoint came first: not needed)
  if (const std::string why = nothing_left_reason(cfg_, rp_, plan_, batch_); !why.empty()) {
    if (!run_left_unfinished()) {
      if (lead_) spdlog::warn("{}", why);
      early_summary_ = nothing_to_do_summary(why, rp_);
      return false;  // the folder stays as it was: config.json describes its checkpoints
    }
    // Its last checkpoint written, the run ended before its final evaluation and summary (a
    // rank lost during them, then a restart): those are all that is left to do.
    if (lead_)
      spdlog::warn(
          "the checkpoint {} is at step {}, where this config stops, but the run in {} ended "
          "before its final evaluation and summary: finishing it (no step to train)",
          rp_.from, rp_.step, opts_.out_dir);
  }
  // Deferred by start_run_dir for a resumed run: written once the checkpoint has loaded and
  // there is something to train. A resume from an earlier checkpoint of this folder makes it
  // `latest` (adopt_latest).
  if (!opts_.resume.empty() && lead_) {
    write_run_config(cfg_, opts_.out_dir);
    if (rp_.loaded) adopt_latest(ckpt_dir_, rp_.from);
  }
  schedule_steps_ = schedule_horizon(rp_, plan_, lead_);
  return true;
}

// The running totals the checkpoint recorded (CheckpointMeta::progress_json): the skip count and
// the train record in progress, read by rank 0 and broadcast (every rank reports the same skip
// count and, where each holds the global loss, the same final_train_loss). Where the loss is per
// rank, each rank continues its own interval sums when the checkpoint holds every rank's of this
// world size (interval_ranks); otherwise record() adds the other ranks' own sums (from 0) to rank
// 0's, so only rank 0 keeps the saved all-ranks sums. Collective.
namespace {

// The run folder's newest eval record (metrics.jsonl) at a step <= `step` of the timeline the
// file ends on, or null (a malformed line, or no file, is no record). The model at those steps is
// the checkpoint's timeline, so its figures are this run's last evaluation (summary.json's
// test_loss), and the evaluation a checkpoint carries as due (it is written before its step's
// evaluation) ran if its record is there: a resume does not evaluate it twice.
// Runs append to the file: a record at a step at or before an earlier eval record's comes from a
// run resumed from an earlier checkpoint, whose timeline replaces the evaluations from that step
// on (within one run a step's train record precedes its evaluation) -- a run resumed under other
// settings took the abandoned run's evaluation of the same step for its own.
nlohmann::json last_eval_record(const std::string& out_dir, int64_t step) {
  std::ifstream in(fs::path(out_dir) / "metrics.jsonl");
  std::vector<nlohmann::json> evals;  // by increasing step
  for (std::string line; std::getline(in, line);) {
    nlohmann::json r = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!r.is_object()) continue;
    const int64_t s = r.value("step", int64_t{-1});
    if (s < 0) continue;
    while (!evals.empty() && evals.back().value("step", int64_t{-1}) >= s) evals.pop_back();
    if (r.value("kind", "") == "eval") evals.push_back(std::move(r));
  }
  while (!evals.empty() && evals.back().value("step", int64_t{-1}) > step) evals.pop_back();
  return evals.empty() ? nlohmann::json() : std::move(evals.back());
}

// A record's figure as a double: NaN for null (a non-finite evaluation) or a missing one.
double figure(const nlohmann::json& rec, const char* key) {
  const auto it = rec.find(key);
  return it != rec.end() && it->is_number() ? it->get<double>() : std::nan("");
}

}  // namespace

uint32_t TrainLoop::train_crc() {
  // (a CRC is 0 for 1 in 2^32 data sets: computed again each time for those, no harm)
  if (train_crc_ == 0) train_crc_ = data_fingerprint(data_->train);
  return train_crc_;
}

void TrainLoop::restore_progress(const std::string& progress) {
  // skipped, record loss, record samples, interval loss, interval samples, an evaluation due,
  // the last train record's mean loss (NaN: none; the last two absent before 2026-12-05), and
  // the folder's last evaluation up to the checkpoint's step (its step, -1: none; loss,
  // accuracy), which the summary reports until this run evaluates
  const nlohmann::json eval_rec = lead_ ? last_eval_record(opts_.out_dir, rp_.step) : nullptr;
  const std::vector<double> last_eval = {
      eval_rec.is_null() ? -1.0 : static_cast<double>(eval_rec.value("step", int64_t{-1})),
      figure(eval_rec, "test_loss"), figure(eval_rec, "test_accuracy")};
  std::vector<double> v = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, std::nan("")};
  std::vector<double> own;  // [2 x world] or empty
  if (lead_ && !progress.empty()) {
    try {
      const nlohmann::json p = nlohmann::json::parse(progress);
      const nlohmann::json last = p.value("final_train_loss", nlohmann::json());
      // The sampler's position (epoch, batch) indexes the training set the checkpoint was saved
      // with (absent before 2026-12-06): another size means other files, and another order.
      const int64_t rows = p.value("train_rows", int64_t{-1});
      if (rows >= 0 && rows != data_->train.rows) {
        spdlog::warn(
            "the training set has {} samples and {} was saved while training on {}: the data "
            "changed since, so {}",
            data_->train.rows, rp_.from, rows,
            batch_ >= bpe_
                ? fmt::format("epoch {} is over in the new set (its {} batches are no more than "
                              "the {} done)",
                              rp_.epoch, bpe_, batch_)
                : fmt::format("epoch {} goes on from batch {} of the new set's order, not the "
                              "interrupted run's",
                              rp_.epoch, batch_));
      } else if (const auto crc = p.find("train_crc"); crc != p.end() &&
                                                       crc->is_number_unsigned() &&
                                                       crc->get<uint32_t>() != train_crc()) {
        // Same size, other contents (replaced files, permuted labels: absent before 2026-12-07)
        spdlog::warn(
            "the training data differs from what {} was saved while training on (as many "
            "samples, {}, other contents): the run goes on from epoch {}, batch {} of the new "
            "data's order",
            rp_.from, rows, rp_.epoch, batch_);
      } else if (batch_ > bpe_) {
        // Past the end of its epoch on the same data (an edited file): the rest of the epoch
        // is skipped -- said (it went by in silence).
        spdlog::warn(
            "{}'s sampler position (epoch {}, batch {}) is past the end of its epoch, whose "
            "training data makes {} batches: training continues with epoch {}",
            rp_.from, rp_.epoch, batch_, bpe_, rp_.epoch + 1);
      }
      // Every rank's own interval sums, of a run with as many ranks (interval_per_rank).
      if (const auto it = p.find("interval_ranks");
          it != p.end() && it->is_array() && it->size() == static_cast<size_t>(world_.size()))
        for (const nlohmann::json& r : *it) {
          own.push_back(r.at(0).get<double>());
          own.push_back(static_cast<double>(r.at(1).get<int64_t>()));
        }
      v = {static_cast<double>(p.at("skipped_steps").get<int64_t>()),
           p.at("record_loss").get<double>(),
           static_cast<double>(p.at("record_samples").get<int64_t>()),
           p.at("interval_loss").get<double>(),
           static_cast<double>(p.at("interval_samples").get<int64_t>()),
           p.value("eval_due", false) && last_eval[0] != static_cast<double>(rp_.step) ? 1.0 : 0.0,
           last.is_number() ? last.get<double>() : std::nan("")};
    } catch (const nlohmann::json::exception& e) {
      // Totals for the records only: a checkpoint whose tensors passed their checks resumes.
      spdlog::warn("{}: its running totals (progress) are unreadable ({}): records restart at 0",
                   rp_.from, shown_text(e.what(), 200));
      v = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, std::nan("")};
      own.clear();
    }
  }
  v.insert(v.end(), last_eval.begin(), last_eval.end());
  v.push_back(own.empty() ? 0.0 : 1.0);  // v[10]
  own.resize(static_cast<size_t>(world_.size()) * 2, 0.0);
  v.insert(v.end(), own.begin(), own.end());
  world_.broadcast(reinterpret_cast<uint8_t*>(v.data()), v.size() * sizeof(double), 0);
  // Where the loss is per rank, each rank continues its own sums when the checkpoint has them.
  const bool own_sums = !loss_global_ && v[10] != 0.0;
  if (own_sums) {
    interval_loss_ = v[11 + static_cast<size_t>(rank_) * 2];
    interval_samples_ = static_cast<int64_t>(v[12 + static_cast<size_t>(rank_) * 2]);
  }
  skipped_steps_ = static_cast<int64_t>(v[0]);
  eval_due_ = v[5] != 0.0;  // (every rank: an evaluation is collective)
  if (v[7] >= 0) {
    // (every rank: the final evaluation is skipped where this step's already ran, collectively)
    last_eval_step_ = static_cast<int64_t>(v[7]);
    // Its figures are the summary's only where this run evaluates (--no-eval: none reported)
    // the test set it has.
    if (opts_.evaluate && data_->test.rows > 0) {
      have_eval_ = true;
      last_eval_.loss = v[8];
      last_eval_.accuracy = v[9];
    }
  }
  if (!lead_ && !loss_global_) return;
  final_train_loss_ = v[6];
  record_loss_ = v[1];
  record_samples_ = static_cast<int64_t>(v[2]);
  if (own_sums) return;
  interval_loss_ = v[3];
  interval_samples_ = static_cast<int64_t>(v[4]);
}

namespace {

// Whether summary `s` (of a completed run in `out`) describes a checkpoint that another run has
// since replaced: its final checkpoint's file is there with other content (checkpoint_id). A run
// resumed from an earlier checkpoint under other settings that died after its final checkpoint,
// before its summary: its restart took the first run's summary for its own ("nothing to train").
bool summary_replaced(const nlohmann::json& s, const fs::path& out) {
  const auto ck = s.find("checkpoint");
  const auto id = s.find("checkpoint_id");
  if (ck == s.end() || !ck->is_string() || id == s.end() || !id->is_string() ||
      id->get<std::string>().empty())
    return false;  // (a summary from before checkpoint_id: taken as it says)
  const fs::path file = out / "checkpoints" / fs::path(ck->get<std::string>()).filename();
  const std::string now = checkpoint_identity(file.string());
  return !now.empty() && now != id->get<std::string>();
}

}  // namespace

// Whether the resumed checkpoint, at the step where this config stops, is this run folder's own
// (--resume auto, or a checkpoint under --out) and the folder holds no summary of a run completed
// at (or past) that step: its run ended after its last checkpoint, before the final evaluation and
// summary. Rank 0 reads the folder (the other ranks' hosts may not see it) and tells the others.
bool TrainLoop::run_left_unfinished() {
  uint8_t unfinished = 0;
  if (lead_) {
    std::error_code ec;
    const fs::path out = fs::weakly_canonical(fs::absolute(opts_.out_dir), ec);
    const bool own =
        opts_.resume == "auto" ||
        path_is_within(fs::weakly_canonical(fs::absolute(rp_.from), ec).string(), out.string());
    if (own) {
      unfinished = 1;
      try {
        const nlohmann::json s =
            nlohmann::json::parse(read_regular_file((out / "summary.json").string(), 1 << 20));
        // (A run completed past this checkpoint's step, resumed from an older one of its
        // checkpoints under a shorter plan, is finished too: its results are left alone.)
        if (s.value("status", std::string()) == "completed" &&
            s.value("steps", int64_t{-1}) >= rp_.step && !summary_replaced(s, out))
          unfinished = 0;
      } catch (const std::exception&) {  // none, or unreadable: no completed run recorded
      }
    }
  }
  world_.broadcast(&unfinished, 1, 0);
  return unfinished != 0;
}

// The checkpoint counts its place in the epoch in sampler batches (data.batch_size x replicas;
// grad_accum_steps of them per optimizer step) of the run that wrote it. Under another sampler
// batch (data.batch_size or the number of replicas changed) the same index would
// skip or repeat samples: it is converted through the samples already seen, rounded down (the
// few samples of a partial batch are seen again rather than skipped).
int64_t TrainLoop::resumed_batch_index() const {
  const int64_t now = cfg_.data.batch_size * DP_, before = rp_.global_batch;
  if (before <= 0 || before == now || rp_.batch == 0) return rp_.batch;
  const int64_t n = data_->train.rows;
  const int64_t seen = std::min(n, rp_.batch * before);  // the last batch of an epoch may be short
  const int64_t k = seen == n ? bpe_ : seen / now;
  // Only split otherwise (batch 30 -> batch 10 x 3 accumulated): the same optimizer steps.
  const bool same_steps = rp_.step_samples > 0 && rp_.step_samples == now * plan_.accum;
  if (lead_)
    spdlog::log(
        same_steps ? spdlog::level::info : spdlog::level::warn,
        "the sampler's batch (data.batch_size x {} replica(s); train.grad_accum_steps of them "
        "make one optimizer step) changed from {} to {} samples since the checkpoint: its epoch "
        "continues after the {} samples seen, at batch {} of {}{}{}",
        DP_, before, now, seen, k, bpe_,
        seen == n || seen % now == 0
            ? std::string()
            : fmt::format(" ({} samples of the partial batch are seen again)", seen % now),
        same_steps
            ? fmt::format("; the {} samples per optimizer step are the same", rp_.step_samples)
            : std::string());
  return k;
}

// optimizer.scale_lr linear multiplies optimizer.lr by the data-parallel replicas, so a resume
// on another number of them with the same samples per optimizer step (3 ranks x batch 10 ->
// 1 rank x batch 30) would go on at another rate (0.09 -> 0.03) for the same training: the
// rate the checkpoint trained at is kept, as an elastic restart keeps it, and recorded in the
// checkpoints this run writes (their progress), so a further resume keeps it too. Said either
// way; an optimizer.lr changed since the checkpoint is the user's own choice and applies as
// given.
void TrainLoop::keep_resumed_lr() {
  if (cfg_.optimizer.scale_lr != ScaleLr::kLinear || rp_.linear_lr != cfg_.optimizer.lr ||
      !(rp_.base_lr > 0) || rp_.base_lr == plan_.base_lr)
    return;
  const int64_t samples = cfg_.data.batch_size * DP_ * plan_.accum;
  if (samples == rp_.step_samples) {
    if (lead_)
      spdlog::warn(
          "learning rate {} kept from the checkpoint: the samples per optimizer step ({}) are "
          "the same, and optimizer.scale_lr linear would make it {} x {} replica(s) = {} (for "
          "another rate: optimizer.scale_lr none and optimizer.lr)",
          rp_.base_lr, samples, cfg_.optimizer.lr, DP_, plan_.base_lr);
    plan_.base_lr = rp_.base_lr;
  } else if (lead_) {
    spdlog::warn(
        "the learning rate changes from {} to {} since the checkpoint (optimizer.scale_lr "
        "linear: {} x {} replica(s); {} -> {} samples per optimizer step)",
        rp_.base_lr, plan_.base_lr, cfg_.optimizer.lr, DP_, rp_.step_samples, samples);
  }
}

// train.epochs counts from where the checkpoint stands: the rest of its epoch, then whole epochs,
// in this run's steps. epochs x steps per epoch would count the steps already taken at the
// checkpoint's global batch as if they were this run's: a larger batch (fewer steps per epoch)
// ended the run epochs early, a smaller one ran past train.epochs. The same as epochs x steps
// per epoch when the global batch and grad_accum_steps are unchanged. train.max_steps still caps
// the absolute step.
int64_t TrainLoop::resumed_total_steps() const {
  if (cfg_.train.epochs <= 0) return plan_.total_steps;
  // The checkpoint's place in train.epochs: epoch e, with b of its batches done.
  int64_t e = epoch_, b = batch_;
  if (b >= bpe_) {
    ++e;
    b = 0;
  }
  int64_t end = step_;
  if (e < cfg_.train.epochs) {
    const int64_t left = bpe_ - b;  // (ceil without overflow, as plan_steps)
    const int64_t rest_of_epoch = left / plan_.accum + (left % plan_.accum != 0);
    int64_t whole = 0;
    if (__builtin_mul_overflow(cfg_.train.epochs - e - 1, plan_.steps_per_epoch, &whole) ||
        __builtin_add_overflow(end, rest_of_epoch, &end) ||
        __builtin_add_overflow(end, whole, &end))
      end = std::numeric_limits<int64_t>::max();
  }
  return cfg_.train.max_steps > 0 ? std::min(end, cfg_.train.max_steps) : end;
}

}  // namespace loop_detail
}  // namespace dtrain
