// The receive path of the gRPC data streams on arbitrary bytes: what one stream from rank 1 to
// rank 0 delivers. Each received message goes through decode_frame (cut into pieces the way
// gRPC's slices cut it), check_chunk and deliver into rank 0's mailbox for rank 1, exactly as
// GrpcTransport::on_frame does; the first malformed frame ends the stream, as there. Then every
// message is received, and what recv returns is compared with what the frames carried.
//
// Input: records of [u16 little-endian length][u8 cut][length bytes: one received message]; cut
// 0 keeps the message in one piece, cut c > 0 cuts it into pieces of c bytes (an incomplete
// record at the end is one message with what is left). fuzz/gen_corpus.cc writes the seeds.
//
// Checked besides "no crash, no sanitizer report":
//  - a frame decodes the same from pieces and from one buffer, and re-encoded with
//    encode_frame_header it decodes to the same fields and payload;
//  - reducing its payload straight from the pieces (reduce_frame_payload, what a posted
//    recv_reduce does) gives the same floats as reducing the contiguous payload;
//  - recv returns exactly the bytes delivered for its message, and fails (CommError) exactly
//    when the message is incomplete or another message on its channel disagrees about the op.
// Messages above kHarnessMaxBytes (total_bytes) are decoded and checked but not delivered: the
// mailbox allocates total_bytes at the first chunk, and a 4 GiB message (the protocol's limit,
// kGrpcMaxMessageBytes) is legal but above the fuzzer's memory limit.
#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "comm/grpc/wire.h"
#include "comm/mailbox.h"
#include "fuzz_util.h"

namespace {
using namespace dtrain;

constexpr uint64_t kHarnessMaxBytes = 1 << 20;
constexpr size_t kMaxBuffered = 64;  // GrpcTransport's bound is larger; a small one is reached

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_frame: broken property: %s\n", what);
    std::abort();
  }
}

bool same(const WireFrame& a, const WireFrame& b) {
  return a.src == b.src && a.h.channel == b.h.channel && a.h.part == b.h.part &&
         a.op_raw == b.op_raw && a.h.bytes == b.h.bytes && a.offset == b.offset && a.len == b.len;
}

std::string payload(std::span<const std::span<const char>> pieces, const WireFrame& f) {
  std::string out(f.len, '\0');
  copy_frame_payload(pieces, f, out.data());
  return out;
}

// Decodes one received message; false when it is malformed (the stream ends).
bool decode_checked(std::string_view msg, size_t cut, WireFrame* f, std::string* pay) {
  std::vector<std::span<const char>> pieces;
  for (size_t at = 0; at < msg.size(); at += cut ? cut : msg.size())
    pieces.emplace_back(msg.data() + at, std::min(msg.size() - at, cut ? cut : msg.size()));
  WireFrame whole;
  bool ok_whole = true, ok_pieces = true;
  try {
    whole = decode_frame(std::span<const char>(msg.data(), msg.size()));
  } catch (const WireError&) {
    ok_whole = false;
  }
  try {
    *f = decode_frame(pieces);
  } catch (const WireError&) {
    ok_pieces = false;
  }
  require(ok_whole == ok_pieces, "pieces and one buffer decode alike");
  if (!ok_pieces) return false;
  *pay = payload(pieces, *f);
  if (f->len > 0 && f->len % sizeof(float) == 0) {  // what a posted recv_reduce takes
    const size_t n = f->len / sizeof(float);
    std::vector<float> from_pieces(n, 1.0f), flat(n, 1.0f), contiguous(n);
    std::memcpy(contiguous.data(), pay->data(), f->len);
    reduce_frame_payload(pieces, *f, from_pieces.data(), Transport::Reduce::kSum);
    reduce_into(flat.data(), contiguous.data(), n, Transport::Reduce::kSum);
    require(std::memcmp(from_pieces.data(), flat.data(), f->len) == 0,
            "reducing from pieces equals reducing the contiguous payload");
  }
  const std::span<const char> one[1] = {std::span<const char>(msg.data(), msg.size())};
  require(same(whole, *f) && payload(one, whole) == *pay,
          "pieces and one buffer give the same frame");
  std::string again(kMaxFrameHeaderBytes, '\0');
  again.resize(encode_frame_header(again.data(), f->src, f->h, f->offset, f->len));
  again += *pay;
  WireFrame back;
  try {
    back = decode_frame(std::span<const char>(again.data(), again.size()));
  } catch (const WireError&) {
    require(false, "a re-encoded frame decodes");
  }
  require(same(back, *f), "a re-encoded frame decodes to the same fields");
  require(std::string_view(again).substr(again.size() - back.len) == *pay,
          "a re-encoded frame carries the same payload");
  return true;
}

// What the frames delivered, per message: the model recv is checked against.
struct Sent {
  MsgHeader h;
  std::string bytes;
  bool complete = false;
};

// Receives every delivered message in key order and checks what recv says against the model.
void receive_all(Mailbox& box, std::map<MsgKey, std::deque<Sent>>& sent) {
  for (auto& [key, q] : sent) {
    while (!q.empty()) {
      const Sent& m = q.front();
      bool mismatch = false;
      for (const auto& [k2, q2] : sent)
        if (k2.channel == key.channel && !q2.empty() && q2.front().h.op != m.h.op) mismatch = true;
      std::string got(m.h.bytes, '\0');
      bool ok = true;
      try {
        box.recv(m.h, got.data(), nullptr, std::chrono::steady_clock::now());
      } catch (const CommError&) {
        ok = false;
      }
      require(ok == (m.complete && !mismatch), "recv succeeds exactly on a complete message");
      if (!ok) break;  // the message stays in the mailbox (an incomplete one, redirected)
      require(got == m.bytes, "recv returns the bytes the frames carried");
      q.pop_front();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  BufferPool pool;
  Mailbox box(/*self=*/0, /*src=*/1, &pool, nullptr, nullptr, MailboxLimits{kMaxBuffered});
  Partials partial;
  std::map<MsgKey, std::deque<Sent>> sent;
  std::string_view in = fuzz::as_view(data, size);
  while (!in.empty()) {
    size_t len = in.size() >= 2 ? static_cast<uint8_t>(in[0]) | size_t{uint8_t(in[1])} << 8 : 0;
    const size_t cut = in.size() >= 3 ? static_cast<uint8_t>(in[2]) : 0;
    in.remove_prefix(std::min<size_t>(3, in.size()));
    len = std::min(len, in.size());
    const std::string_view msg = in.substr(0, len);
    in.remove_prefix(len);
    WireFrame f;
    std::string pay;
    if (!decode_checked(msg, cut, &f, &pay)) break;
    if (f.h.bytes > kHarnessMaxBytes) continue;
    if (!box.check_chunk(f, partial).empty()) break;
    const bool first = !partial.count(MsgKey{f.h.channel, f.h.part});
    const Mailbox::Delivery d = box.deliver(
        partial, f, [&](char* dst) { std::memcpy(dst, pay.data(), pay.size()); }, nullptr);
    if (d.kind != Mailbox::Delivery::kOk) break;  // kOverflow: the stream ends, as on_frame's
    auto& q = sent[MsgKey{f.h.channel, f.h.part}];
    if (first) q.push_back(Sent{f.h, "", false});
    Sent& m = q.back();
    require(m.bytes.size() == f.offset, "check_chunk admits chunks in offset order only");
    m.bytes += pay;
    m.complete = m.bytes.size() == m.h.bytes;
  }
  receive_all(box, sent);
  return 0;
}
