#include "comm/communicator.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "util/check.h"
#include "util/duration.h"

namespace dtrain {

using Clock = std::chrono::steady_clock;

void Work::wait(double timeout_s) {
  std::unique_lock<std::mutex> lk(mu_);
  if (timeout_s < 0) {
    cv_.wait(lk, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
    return;
  }
  const Deadline deadline = Deadline::in(timeout_s, pause_clock_.get());
  while (!done_ && !deadline.passed(Clock::now())) cv_.wait_until(lk, deadline.when());
  if (!done_) {
    const std::string msg =
        "wait for " + what_ + " timed out after " + std::to_string(timeout_s) + " s";
    lk.unlock();
    if (owner_) owner_->fail(msg);
    throw CommError(msg);
  }
  if (error_) std::rethrow_exception(error_);
}

bool Work::done() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}

Communicator::Communicator(std::unique_ptr<Transport> transport, CommOptions opts)
    : transport_(std::move(transport)), opts_(std::move(opts)) {
  DT_CHECK(transport_ != nullptr);
  if (!opts_.pause_clock) opts_.pause_clock = std::make_shared<PauseClock>();
  CommPosition start;
  start.since = Clock::now();
  transport_->publish_position(start);
  worker_ = std::thread([this] { worker_loop(); });
}

Communicator::~Communicator() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

std::string Communicator::failure() const {
  std::lock_guard<std::mutex> lk(mu_);
  return failed_;
}

double Communicator::comm_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return comm_s_;
}

void Communicator::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (failed_.empty()) failed_ = why;
  }
  transport_->abort(why);
}

void settle_before_free(Communicator& comm, const WorkPtr& w) noexcept {
  if (!w) return;
  try {
    if (!w->done())
      comm.abort("this rank stopped with a collective in flight (its own error comes first)");
    w->wait();
  } catch (...) {  // the abort's failure, or the collective's own: not the error to report
  }
}

void Communicator::fail(const std::string& msg) {
  abort(msg);
  if (rank() != 0 || reported_.exchange(true)) return;
  const std::string report = desync_report();
  if (!report.empty()) spdlog::error("{}", report);
}

namespace {
std::string secs(double s) {
  return fmt::format("{:.1f} s", std::max(0.0, s));
}
}  // namespace

void Communicator::set_rank_namer(std::function<std::string(int)> namer) {
  std::lock_guard<std::mutex> lk(mu_);
  namer_ = std::move(namer);
}

std::string Communicator::rank_name(int r) const {
  std::function<std::string(int)> f;
  {
    std::lock_guard<std::mutex> lk(mu_);
    f = namer_;
  }
  return f ? f(r) : "rank " + std::to_string(r);
}

std::string Communicator::peer_activities() const {
  std::string out;
  const auto now = Clock::now();
  const std::vector<RankPosition> all = transport_->positions();
  for (size_t r = 0; r < all.size(); ++r) {
    const RankPosition& p = all[r];
    if (static_cast<int>(r) == rank() || !p.known || p.pos.active || p.pos.activity.empty())
      continue;
    out += fmt::format("{}{} said, {} ago: {}", out.empty() ? " (" : "; ",
                       rank_name(static_cast<int>(r)),
                       secs(std::chrono::duration<double>(now - p.heard).count()), p.pos.activity);
  }
  return out.empty() ? out : out + ")";
}

std::string Communicator::desync_report() const {
  const std::vector<RankPosition> all = transport_->positions();
  if (all.size() < 2) return "";
  const auto now = Clock::now();
  auto since = [&](Clock::time_point t) { return std::chrono::duration<double>(now - t).count(); };
  // Another rank's row is its latest report, as of when it came: "for" is how long it had been
  // there then (the time since would count the report's age as time spent in the collective).
  std::string out = fmt::format(
      "where each rank is (rank {}'s view: each other rank as of its latest report):\n"
      "  {:>4}  {:>9}  {:<40}  {:>8}  {}",
      rank(), "rank", "last done", "now in", "for", "reported");
  double oldest = 0.0;
  for (size_t r = 0; r < all.size(); ++r) {
    const RankPosition& p = all[r];
    if (!p.known) {
      out += fmt::format("\n  {:>4}  {:>9}  {:<40}", r, "?", "no report");
      continue;
    }
    const std::string done =
        p.pos.completed == 0 ? "-" : fmt::format("seq {}", p.pos.completed - 1);
    const std::string in = p.pos.active ? fmt::format("{} seq {} ({} {})", comm_op_name(p.pos.op),
                                                      p.pos.seq, p.pos.count, count_unit(p.pos.op))
                           : p.pos.activity.empty() ? std::string("(no collective)")
                                                    : "(no collective: " + p.pos.activity + ")";
    const bool self = static_cast<int>(r) == rank();
    const std::string heard = self ? std::string("this rank") : secs(since(p.heard)) + " ago";
    if (!self) oldest = std::max(oldest, since(p.heard));
    const double in_for = self ? since(p.pos.since) : since(p.pos.since) - since(p.heard);
    out += fmt::format("\n  {:>4}  {:>9}  {:<40}  {:>8}  {}", r, done, in, secs(in_for), heard);
    if (const std::string name = rank_name(static_cast<int>(r));
        name != "rank " + std::to_string(r))
      out += "  " + name;  // grid coordinates
  }
  if (oldest >= 1.0)
    out += fmt::format(
        "\n  (reports come with the heartbeats; the oldest is {} old: a rank that died or froze "
        "since shows where it was then, and may look many collectives behind)",
        secs(oldest));
  return out;
}

WorkPtr Communicator::enqueue(CommOp op, size_t count, std::function<void(const CollCtx&)> fn) {
  auto work = std::make_shared<Work>();
  work->owner_ = this;
  work->pause_clock_ = opts_.pause_clock;
  const uint64_t seq = next_seq_++;
  work->what_ = comm_op_name(op) + " seq " + std::to_string(seq) + " (" + std::to_string(count) +
                " " + count_unit(op) + ")";
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(Task{op, count, seq, work, std::move(fn)});
  }
  cv_.notify_all();
  return work;
}

void Communicator::worker_loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr err;
    const std::string earlier = failure();
    const auto t0 = Clock::now();
    if (!earlier.empty()) {
      err = std::make_exception_ptr(
          CommError(rank_name(rank()) + ": " + task.work->what_ +
                    " not run: the communicator failed earlier: " + earlier));
    } else {
      CommPosition pos;
      pos.completed = completed_;
      pos.active = true;
      pos.op = task.op;
      pos.seq = task.seq;
      pos.count = task.count;
      pos.since = t0;
      transport_->publish_position(pos);
      try {
        CollCtx ctx;
        ctx.t = transport_.get();
        ctx.seq = task.seq;
        ctx.deadline = Deadline::in(opts_.timeout_s, opts_.pause_clock.get());
        ctx.segment_floats = std::max<size_t>(1, opts_.segment_bytes / sizeof(float));
        ctx.sends_in_flight = std::max<size_t>(1, opts_.sends_in_flight);
        Tracer* tr = tracer_.load();
        if (tr != nullptr && tr->enabled()) {
          thread_local bool named = false;
          if (!named) tr->set_thread_name(opts_.trace_track);
          named = true;
          const int64_t ts = tr->now_us();
          task.fn(ctx);
          tr->complete(comm_op_name(task.op), "comm", ts, tr->now_us() - ts,
                       {{"seq", task.seq}, {"what", task.work->what_}});
        } else {
          task.fn(ctx);
        }
        completed_ = task.seq + 1;
        pos.completed = completed_;
        pos.active = false;
        pos.since = Clock::now();
        transport_->publish_position(pos);
      } catch (const std::exception& e) {
        // The position stays "in this collective": that is where this rank stopped.
        const std::string msg =
            fmt::format("{}: {} failed after {}: {}{}", rank_name(rank()), task.work->what_,
                        secs(std::chrono::duration<double>(Clock::now() - t0).count()), e.what(),
                        peer_activities());
        fail(msg);
        err = std::make_exception_ptr(CommError(msg));
      }
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      comm_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    {
      std::lock_guard<std::mutex> lk(task.work->mu_);
      task.work->error_ = err;
      task.work->done_ = true;
    }
    task.work->cv_.notify_all();
  }
}

WorkPtr Communicator::allreduce_async(float* data, size_t n, ReduceOp op) {
  return enqueue(CommOp::kAllReduce, n, [=](const CollCtx& c) { ring_allreduce(c, data, n, op); });
}

void Communicator::reduce_scatter(const float* in, size_t n, float* out, ReduceOp op,
                                  std::vector<size_t> counts) {
  if (counts.empty()) counts = even_counts(n, size());
  DT_CHECK_EQ(counts.size(), static_cast<size_t>(size()));
  DT_CHECK_EQ(std::accumulate(counts.begin(), counts.end(), size_t{0}), n);
  std::vector<float> scratch(in, in + n);
  size_t offset = 0;
  for (int r = 0; r < rank(); ++r) offset += counts[static_cast<size_t>(r)];
  const size_t mine = counts[static_cast<size_t>(rank())];
  float* buf = scratch.data();
  enqueue(CommOp::kReduceScatter, n, [&, buf](const CollCtx& c) {
    ring_reduce_scatter_inplace(c, buf, counts, op);
  })->wait();
  std::copy(scratch.begin() + static_cast<std::ptrdiff_t>(offset),
            scratch.begin() + static_cast<std::ptrdiff_t>(offset + mine), out);
}

WorkPtr Communicator::reduce_scatter_inplace_async(float* data, std::vector<size_t> counts,
                                                   ReduceOp op) {
  DT_CHECK_EQ(counts.size(), static_cast<size_t>(size()));
  const size_t n = std::accumulate(counts.begin(), counts.end(), size_t{0});
  return enqueue(CommOp::kReduceScatter, n,
                 [=](const CollCtx& c) { ring_reduce_scatter_inplace(c, data, counts, op); });
}

void Communicator::allgather(const float* in, float* out, std::vector<size_t> counts) {
  allgather_typed(in, out, std::move(counts), DType::kF32);
}

WorkPtr Communicator::allgather_inplace_async(float* data, std::vector<size_t> counts) {
  return allgather_inplace_typed(data, std::move(counts), DType::kF32);
}

void Communicator::broadcast(float* data, size_t n, int root) {
  broadcast_typed(data, n, root, DType::kF32);
}

WorkPtr Communicator::allreduce_async(int64_t* data, size_t n, ReduceOp op) {
  DT_CHECK_MSG(op == ReduceOp::kSum || op == ReduceOp::kMin || op == ReduceOp::kMax,
               "int64 allreduce supports sum, min and max, not " << reduce_op_name(op));
  return enqueue(typed_op(CommOp::kAllReduce, DType::kI64), n,
                 [=](const CollCtx& c) { allgather_reduce_i64(c, data, n, op); });
}

void Communicator::allgather(const int64_t* in, int64_t* out, std::vector<size_t> counts) {
  allgather_typed(in, out, std::move(counts), DType::kI64);
}

void Communicator::allgather(const uint8_t* in, uint8_t* out, std::vector<size_t> counts) {
  allgather_typed(in, out, std::move(counts), DType::kBytes);
}

WorkPtr Communicator::allgather_inplace_async(int64_t* data, std::vector<size_t> counts) {
  return allgather_inplace_typed(data, std::move(counts), DType::kI64);
}

WorkPtr Communicator::allgather_inplace_async(uint8_t* data, std::vector<size_t> counts) {
  return allgather_inplace_typed(data, std::move(counts), DType::kBytes);
}

void Communicator::broadcast(int64_t* data, size_t n, int root) {
  broadcast_typed(data, n, root, DType::kI64);
}

void Communicator::broadcast(uint8_t* data, size_t n, int root) {
  broadcast_typed(data, n, root, DType::kBytes);
}

void Communicator::allgather_typed(const void* in, void* out, std::vector<size_t> counts, DType t) {
  DT_CHECK_EQ(counts.size(), static_cast<size_t>(size()));
  const size_t es = dtype_size(t);
  size_t offset = 0;
  for (int r = 0; r < rank(); ++r) offset += counts[static_cast<size_t>(r)];
  const size_t mine = counts[static_cast<size_t>(rank())];
  if (mine) std::memmove(static_cast<char*>(out) + offset * es, in, mine * es);
  allgather_inplace_typed(out, std::move(counts), t)->wait();
}

WorkPtr Communicator::allgather_inplace_typed(void* data, std::vector<size_t> counts, DType t) {
  DT_CHECK_EQ(counts.size(), static_cast<size_t>(size()));
  const bool equal =
      std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) == counts.end();
  const CommOp op = typed_op(equal ? CommOp::kAllGather : CommOp::kAllGatherV, t);
  const size_t n = std::accumulate(counts.begin(), counts.end(), size_t{0});
  return enqueue(op, n, [=](const CollCtx& c) { ring_allgather_inplace(c, data, counts, op); });
}

void Communicator::broadcast_typed(void* data, size_t n, int root, DType t) {
  DT_CHECK(root >= 0 && root < size());
  enqueue(typed_op(CommOp::kBroadcast, t), n, [=](const CollCtx& c) {
    ring_broadcast(c, data, n, root, t);
  })->wait();
}

void Communicator::barrier() {
  enqueue(CommOp::kBarrier, 0, [](const CollCtx& c) { ring_barrier(c); })->wait();
}

void Communicator::send(int dst, uint64_t tag, const float* data, size_t n) {
  DT_CHECK(dst >= 0 && dst < size() && dst != rank());
  DT_CHECK_EQ(tag & kP2PBit, 0u);
  const std::string earlier = failure();
  if (!earlier.empty()) throw CommError("send: the communicator failed earlier: " + earlier);
  const uint64_t idx = p2p_sent_[{dst, tag}]++;
  MsgHeader h{kP2PBit | tag, idx, CommOp::kSendRecv, n * sizeof(float)};
  try {
    transport_->send(dst, h, data);
  } catch (const std::exception& e) {
    const std::string msg = rank_name(rank()) + ": send of " + describe(h) + " to " +
                            rank_name(dst) + " failed: " + e.what();
    fail(msg);
    throw CommError(msg);
  }
}

void Communicator::recv(int src, uint64_t tag, float* data, size_t n) {
  DT_CHECK(src >= 0 && src < size() && src != rank());
  DT_CHECK_EQ(tag & kP2PBit, 0u);
  const std::string earlier = failure();
  if (!earlier.empty()) throw CommError("recv: the communicator failed earlier: " + earlier);
  const uint64_t idx = p2p_recvd_[{src, tag}]++;
  MsgHeader h{kP2PBit | tag, idx, CommOp::kSendRecv, n * sizeof(float)};
  try {
    transport_->recv(src, h, data, Deadline::in(opts_.timeout_s, opts_.pause_clock.get()));
  } catch (const std::exception& e) {
    const std::string msg = rank_name(rank()) + ": recv of " + describe(h) + " from " +
                            rank_name(src) + " failed: " + e.what();
    fail(msg);
    throw CommError(msg);
  }
}

double Communicator::allreduce_sum(double v) {
  const size_t world = static_cast<size_t>(size());
  std::vector<uint8_t> all(world * sizeof(double));
  allgather(reinterpret_cast<const uint8_t*>(&v), all.data(),
            std::vector<size_t>(world, sizeof(double)));
  double sum = 0.0;
  for (size_t r = 0; r < world; ++r) {
    double x;
    std::memcpy(&x, all.data() + r * sizeof(double), sizeof(double));
    sum += x;
  }
  return sum;
}

}  // namespace dtrain
