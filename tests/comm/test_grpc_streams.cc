// The faster gRPC streams: a ring step's send and receive overlap (Transport::send_recv), a
// posted recv_reduce reduces straight from gRPC's slices (reduce_frame_payload), and what a
// forged peer can do to that path. Ranks are threads of this process on the gRPC streams only.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "callback_queue.h"
#include "comm/grpc/wire.h"
#include "comm/grpc_internal.h"
#include "comm/grpc_transport.h"
#include "comm/mailbox.h"
#include "test_util.h"
#include "util/duration.h"

using namespace dtrain;

namespace {

using Clock = std::chrono::steady_clock;
using dtrain::testing::contains;

// Two ranks over gRPC streams only (no shared memory), connected concurrently.
std::vector<std::unique_ptr<Transport>> connect_pair() {
  dtrain::grpc_test::keep_callback_queue();
  const int port = dtrain::testing::free_port();
  std::vector<std::unique_ptr<Transport>> t(2);
  std::vector<std::string> err(2);
  std::vector<std::thread> th;
  for (int r = 0; r < 2; ++r)
    th.emplace_back([&, r] {
      GrpcOptions o;
      o.shm = false;
      o.tcp = false;
      o.rank = r;
      o.world_size = 2;
      o.master_port = port;
      o.token = "tok";
      o.rendezvous_timeout_s = 20;
      o.connect_timeout_s = 20;
      try {
        t[r] = connect_grpc(o);
      } catch (const std::exception& e) {
        err[r] = e.what();
      }
    });
  for (auto& x : th) x.join();
  for (int r = 0; r < 2; ++r) REQUIRE_MESSAGE(err[r].empty(), "rank ", r, ": ", err[r]);
  return t;
}

float stream_value(int rank, size_t i) {
  return static_cast<float>(rank + 1) * 0.5f + static_cast<float>(i % 977) * 0.25f;
}

float reduce_ref(Transport::Reduce op, float a, float b) {
  switch (op) {
    case Transport::Reduce::kSum:
      return a + b;
    case Transport::Reduce::kProd:
      return a * b;
    case Transport::Reduce::kMin:
      return std::min(a, b);
    case Transport::Reduce::kMax:
      return std::max(a, b);
  }
  return 0;
}

}  // namespace

TEST_CASE("wire: reducing a frame's payload from its slices equals reducing it contiguously") {
  // The payload follows a header of odd length, so it is unaligned; gRPC's slices may cut it
  // anywhere, also inside a float.
  const size_t n = 1000;
  std::vector<float> src(n);
  for (size_t i = 0; i < n; ++i) src[i] = stream_value(1, i) - 100.0f;
  MsgHeader h{7, 3, CommOp::kAllReduce, n * sizeof(float)};
  std::string msg(kMaxFrameHeaderBytes, '\0');
  msg.resize(encode_frame_header(msg.data(), 1, h, 0, h.bytes));
  msg.append(reinterpret_cast<const char*>(src.data()), h.bytes);
  for (const Transport::Reduce op : {Transport::Reduce::kSum, Transport::Reduce::kProd,
                                     Transport::Reduce::kMin, Transport::Reduce::kMax}) {
    for (const size_t cut :
         {size_t{1}, size_t{2}, size_t{3}, size_t{5}, size_t{7}, size_t{4096}, msg.size()}) {
      CAPTURE(cut);
      std::vector<std::span<const char>> pieces;
      for (size_t at = 0; at < msg.size(); at += cut)
        pieces.emplace_back(msg.data() + at, std::min(cut, msg.size() - at));
      const WireFrame f = decode_frame(pieces);
      REQUIRE(f.len == h.bytes);
      std::vector<float> got(n), want(n);
      for (size_t i = 0; i < n; ++i) got[i] = want[i] = stream_value(0, i);
      reduce_frame_payload(pieces, f, got.data(), op);
      for (size_t i = 0; i < n; ++i) want[i] = reduce_ref(op, want[i], src[i]);
      CHECK(std::memcmp(got.data(), want.data(), h.bytes) == 0);
    }
  }
}

TEST_CASE("grpc streams: send_recv reduces into a posted buffer or from the mailbox alike") {
  // Rank 0 posts at once; rank 1 only after 1 s, when rank 0's message has long arrived. So
  // rank 0 takes rank 1's message straight from the slices (direct) and rank 1 takes rank 0's
  // from its mailbox; both get the same reduction. 3 MiB + 12 bytes: several 1 MiB chunks and a
  // short last one.
  auto t = connect_pair();
  const size_t n = (size_t{3} << 18) + 3;
  for (const Transport::Reduce op : {Transport::Reduce::kSum, Transport::Reduce::kMax}) {
    const uint64_t ch = op == Transport::Reduce::kSum ? 1 : 2;
    std::vector<std::vector<float>> send(2, std::vector<float>(n)), got(2, std::vector<float>(n));
    for (int r = 0; r < 2; ++r)
      for (size_t i = 0; i < n; ++i)
        send[r][i] = stream_value(r, i), got[r][i] = stream_value(r, i) * 2;
    const GrpcRecvStats before0 = grpc_recv_stats(*t[0]), before1 = grpc_recv_stats(*t[1]);
    std::vector<std::string> err(2);
    std::vector<std::thread> th;
    for (int r = 0; r < 2; ++r)
      th.emplace_back([&, r] {
        if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
        const MsgHeader h{ch, 0, CommOp::kAllReduce, n * sizeof(float)};
        try {
          t[r]->send_recv(1 - r, h, send[r].data(), 1 - r, h, got[r].data(), &op, deadline_in(60));
        } catch (const std::exception& e) {
          err[r] = e.what();
        }
      });
    for (auto& x : th) x.join();
    for (int r = 0; r < 2; ++r) {
      REQUIRE_MESSAGE(err[r].empty(), "rank ", r, ": ", err[r]);
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i)
        bad += got[r][i] != reduce_ref(op, stream_value(r, i) * 2, send[1 - r][i]);
      CHECK_MESSAGE(bad == 0, "rank ", r, ": ", bad, " wrong floats");
    }
    CHECK(grpc_recv_stats(*t[0]).direct == before0.direct + 1);
    CHECK(grpc_recv_stats(*t[0]).mailbox == before0.mailbox);
    CHECK(grpc_recv_stats(*t[1]).mailbox == before1.mailbox + 1);
  }
}

TEST_CASE("grpc streams: send_recv fails naming the peer that went away, without hanging") {
  auto t = connect_pair();
  const size_t n = size_t{4} << 20;  // bytes; more than one chunk
  std::vector<char> s(n, 1), r(n);
  const MsgHeader h{5, 0, CommOp::kAllGather, n};
  std::string err;
  std::thread th([&] {
    try {
      t[0]->send_recv(1, h, s.data(), 1, h, r.data(), nullptr, deadline_in(60));
    } catch (const CommError& e) {
      err = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = Clock::now();
  t[1].reset();  // rank 1 leaves without receiving or sending
  th.join();
  CHECK_MESSAGE(contains(err, "rank 1"), err);
  CHECK(Clock::now() - t0 < std::chrono::seconds(30));
}

TEST_CASE("mailbox: a chunk that is not float-aligned is refused by a posted recv_reduce") {
  // Only a forged peer cuts a float32 message at a byte offset that is not a multiple of 4;
  // reducing from such a chunk would misalign every float after it.
  BufferPool pool;
  Mailbox box(0, 1, &pool, nullptr, nullptr, MailboxLimits{16});
  const MsgHeader h{9, 0, CommOp::kAllReduce, 16};
  std::vector<float> dst(4, 1.0f);
  std::string err;
  std::thread waiter([&] {
    const Transport::Reduce op = Transport::Reduce::kSum;
    try {
      box.recv(h, dst.data(), &op, deadline_in(60));
    } catch (const CommError& e) {
      err = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // the recv is posted
  WireFrame f;
  f.src = 1;
  f.h = h;
  f.op_raw = static_cast<uint32_t>(h.op);
  f.offset = 0;
  f.len = 6;
  Partials partial;
  REQUIRE(box.check_chunk(f, partial).empty());
  int reduced = 0;
  const Mailbox::ReduceFn reduce = [&](float*, Transport::Reduce) { ++reduced; };
  const Mailbox::Delivery d = box.deliver(
      partial, f, [](char*) {}, &reduce);
  CHECK(d.kind == Mailbox::Delivery::kOverflow);
  CHECK_MESSAGE(contains(d.why, "not float-aligned"), d.why);
  CHECK(reduced == 0);
  box.abort("test over");
  waiter.join();
  CHECK(contains(err, "test over"));
  CHECK(dst == std::vector<float>(4, 1.0f));  // untouched
}

TEST_CASE("mailbox: complete messages under one key are bounded like distinct ones") {
  // A peer that sends the same (channel, part) over and over, never received, made the receiver
  // buffer without bound (only distinct keys were counted). Past max_buffered the frame is
  // refused (the transport fails the stream and says why), whatever the keys.
  BufferPool pool;
  const size_t kMax = 16;
  Mailbox box(0, 1, &pool, nullptr, nullptr, MailboxLimits{kMax});
  Partials partial;
  auto chunk = [](uint64_t channel) {
    WireFrame f;
    f.src = 1;
    f.h = MsgHeader{channel, 0, CommOp::kSendRecv, 4};
    f.op_raw = static_cast<uint32_t>(f.h.op);
    f.len = 4;
    return f;
  };
  const char payload[4] = {1, 2, 3, 4};
  auto deliver = [&](const WireFrame& f) {
    REQUIRE(box.check_chunk(f, partial).empty());
    return box.deliver(
        partial, f, [&](char* d) { std::memcpy(d, payload, 4); }, nullptr);
  };
  for (size_t i = 0; i < kMax; ++i)
    REQUIRE(deliver(chunk(kP2PBit | 5)).kind == Mailbox::Delivery::kOk);
  const Mailbox::Delivery d = deliver(chunk(kP2PBit | 5));
  CHECK(d.kind == Mailbox::Delivery::kOverflow);
  CHECK_MESSAGE(contains(d.why, "over the limit of 16"), d.why);
  // Same for a new key while the budget is spent; receiving one frees a place.
  CHECK(deliver(chunk(kP2PBit | 6)).kind == Mailbox::Delivery::kOverflow);
  char got[4] = {};
  box.recv(MsgHeader{kP2PBit | 5, 0, CommOp::kSendRecv, 4}, got, nullptr, deadline_in(5));
  CHECK(std::memcmp(got, payload, 4) == 0);
  CHECK(deliver(chunk(kP2PBit | 6)).kind == Mailbox::Delivery::kOk);
  CHECK(deliver(chunk(kP2PBit | 7)).kind == Mailbox::Delivery::kOverflow);
}

TEST_CASE("seq window: a collective far ahead of this rank's sequence numbers is refused") {
  // Per group: what this rank sent or received last, plus SeqWindow::kSeqWindow. Point-to-point
  // channels are user tags and never judged; groups are judged apart.
  SeqWindow w;
  const uint64_t group2 = uint64_t{3} << kChannelGroupShift;
  CHECK(w.check(SeqWindow::kSeqWindow).empty());
  CHECK(contains(w.check(SeqWindow::kSeqWindow + 1), "beyond the window"));
  w.note(1000);
  CHECK(w.check(1000 + SeqWindow::kSeqWindow).empty());
  const std::string why = w.check(1001 + SeqWindow::kSeqWindow);
  CHECK_MESSAGE(contains(why, "ahead of this rank's 1000"), why);
  w.note(10);  // going back never lowers the horizon
  CHECK(w.check(1000 + SeqWindow::kSeqWindow).empty());
  CHECK(!w.check(group2 | (SeqWindow::kSeqWindow + 5)).empty());  // group 2 is still at 0
  w.note(group2 | 7);
  CHECK(w.check(group2 | (SeqWindow::kSeqWindow + 7)).empty());
  CHECK(w.check(kP2PBit | (uint64_t{1} << 62)).empty());
  w.note(kP2PBit | (uint64_t{1} << 50));  // ignored
  CHECK(!w.check(uint64_t{1} << 39).empty());
}

TEST_CASE("mailbox: frames over the byte budget or out of the sequence window are refused") {
  BufferPool pool;
  SeqWindow window;
  Mailbox box(0, 1, &pool, nullptr, nullptr, MailboxLimits{100, 1000, &window});
  Partials partial;
  auto frame = [](uint64_t channel, uint64_t bytes) {
    WireFrame f;
    f.src = 1;
    f.h = MsgHeader{channel, 0, CommOp::kAllReduce, bytes};
    f.op_raw = static_cast<uint32_t>(f.h.op);
    f.len = bytes;
    return f;
  };
  std::vector<char> payload(4000, 7);
  auto deliver = [&](const WireFrame& f) {
    REQUIRE(box.check_chunk(f, partial).empty());
    return box.deliver(
        partial, f, [&](char* d) { std::memcpy(d, payload.data(), f.len); }, nullptr);
  };
  // The first waiting message is admitted whatever its size; then the budget counts.
  REQUIRE(deliver(frame(1, 4000)).kind == Mailbox::Delivery::kOk);
  Mailbox::Delivery d = deliver(frame(2, 1));
  CHECK(d.kind == Mailbox::Delivery::kOverflow);
  CHECK_MESSAGE(contains(d.why, "4001 bytes buffered ahead"), d.why);
  std::vector<char> got(4000);
  box.recv(MsgHeader{1, 0, CommOp::kAllReduce, 4000}, got.data(), nullptr, deadline_in(5));
  CHECK(got == payload);
  for (uint64_t c = 2; c < 6; ++c) REQUIRE(deliver(frame(c, 250)).kind == Mailbox::Delivery::kOk);
  d = deliver(frame(6, 1));
  CHECK_MESSAGE(contains(d.why, "1001 bytes buffered ahead"), d.why);
  // Receives note their sequence numbers (here up to 5): a frame past 5 + kSeqWindow is
  // refused at once, with room in the budget.
  for (uint64_t c = 2; c < 6; ++c)
    box.recv(MsgHeader{c, 0, CommOp::kAllReduce, 250}, got.data(), nullptr, deadline_in(5));
  d = deliver(frame(6 + SeqWindow::kSeqWindow, 4));
  CHECK(d.kind == Mailbox::Delivery::kOverflow);
  CHECK_MESSAGE(contains(d.why, "beyond the window"), d.why);
  CHECK(deliver(frame(5 + SeqWindow::kSeqWindow, 4)).kind == Mailbox::Delivery::kOk);
}

// A 2-chunk message of 8 bytes on channel 3 from rank 1, as a TCP reader sees its chunks.
static WireFrame direct_chunk(uint64_t offset) {
  WireFrame f;
  f.src = 1;
  f.h = MsgHeader{3, 0, CommOp::kAllGather, 8};
  f.op_raw = static_cast<uint32_t>(f.h.op);
  f.offset = offset;
  f.len = 4;
  return f;
}

// pin_direct for chunk f, polled until the recv is posted (null before); fails after 10 s.
static char* pin_when_posted(Mailbox& box, Partials& partial, const WireFrame& f,
                             std::function<void()> interrupt) {
  const auto give_up = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    REQUIRE(box.check_chunk(f, partial).empty());
    if (char* d = box.pin_direct(partial, f, interrupt)) return d;
    REQUIRE(Clock::now() < give_up);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

TEST_CASE("mailbox: chunks read straight into a posted recv's buffer (pin_direct)") {
  BufferPool pool;
  RecvCounters counters;
  Mailbox box(0, 1, &pool, &counters, nullptr, MailboxLimits{16});
  char got[8] = {};
  std::thread receiver([&] {
    box.recv(MsgHeader{3, 0, CommOp::kAllGather, 8}, got, nullptr, deadline_in(10));
  });
  Partials partial;
  for (uint64_t off : {0, 4}) {
    const WireFrame f = direct_chunk(off);
    char* dst = pin_when_posted(box, partial, f, [] {});
    CHECK(dst == got + off);
    std::memcpy(dst, off ? "5678" : "1234", 4);  // the socket read
    box.unpin_direct(partial, f, true);
  }
  receiver.join();
  CHECK(std::string(got, 8) == "12345678");
  CHECK(partial.empty());
  CHECK(counters.chunks_read_direct == 2);
  CHECK(counters.direct == 1);
  // A recv_reduce is never pinned: its chunks are reduced from a staging buffer.
  std::vector<float> acc(2, 1.0f);
  std::thread reducer([&] {
    const Transport::Reduce op = Transport::Reduce::kSum;
    try {
      box.recv(MsgHeader{4, 0, CommOp::kAllReduce, 8}, acc.data(), &op, deadline_in(0.5));
    } catch (const CommError&) {
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  WireFrame f = direct_chunk(0);
  f.h = MsgHeader{4, 0, CommOp::kAllReduce, 8};
  f.op_raw = static_cast<uint32_t>(f.h.op);
  CHECK(box.pin_direct(partial, f, [] {}) == nullptr);
  reducer.join();
}

TEST_CASE("mailbox: a recv giving up while a producer reads into its buffer waits for it") {
  // The receive times out while chunk 1 is being read into its buffer: it interrupts the
  // producer (a TCP reader shuts its socket down) and returns only after the producer has left
  // the buffer, which the caller may free at once.
  BufferPool pool;
  Mailbox box(0, 1, &pool, nullptr, nullptr, MailboxLimits{16});
  std::vector<char> got(8);
  std::atomic<bool> interrupted{false};
  std::atomic<int64_t> unpinned_at{0}, returned_at{0};
  std::string error;
  auto now_ns = [] { return Clock::now().time_since_epoch().count(); };
  std::thread receiver([&] {
    try {
      // 2 s: the main thread must pin chunk 1 before the deadline, also on a loaded machine.
      box.recv(MsgHeader{3, 0, CommOp::kAllGather, 8}, got.data(), nullptr, deadline_in(2));
    } catch (const CommError& e) {
      error = e.what();
    }
    returned_at = now_ns();
  });
  Partials partial;
  const WireFrame f = direct_chunk(0);
  char* dst = pin_when_posted(box, partial, f, [&] { interrupted = true; });
  const auto give_up = Clock::now() + std::chrono::seconds(10);
  while (!interrupted && Clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(interrupted);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a read that takes a while
  CHECK(returned_at == 0);                                      // still waiting for it
  std::memcpy(dst, "1234", 4);
  unpinned_at = now_ns();
  box.unpin_direct(partial, f, false);
  receiver.join();
  CHECK_MESSAGE(contains(error, "timed out"), error);
  CHECK(returned_at >= unpinned_at);
  // Chunk 2 finds the recv gone: staged and dropped by deliver(), never written to the buffer.
  CHECK(box.pin_direct(partial, direct_chunk(4), [] {}) == nullptr);
}
