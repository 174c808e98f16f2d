// The receive side of the TCP data path (lib/comm/grpc/tcp_path.h) on arbitrary bytes: what one
// connection to rank 0 carries. The input is the connection's byte stream: a hello
// (decode_tcp_hello_fixed, then its token and session), then chunks (decode_tcp_chunk_header,
// Mailbox::check_chunk, the payload, deliver into rank 0's mailbox for the hello's rank, with a
// copy and a reduce as TcpPath::read_loop does); the first malformed piece ends the
// connection, as there, and so does the input's end. Then every message is received.
//
// Checked besides "no crash, no sanitizer report":
//  - a hello and every chunk header re-encode to exactly the bytes they were decoded from (the
//    layout is fixed: one encoding per value);
//  - recv returns exactly the bytes the chunks carried for its message, or fails with
//    CommError (incomplete, or disagreeing with another message on its channel).
// Messages above kHarnessMaxBytes are decoded and checked but not delivered (the mailbox
// allocates total_bytes at the first chunk).
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "comm/grpc/tcp_wire.h"
#include "comm/mailbox.h"

namespace {
using namespace dtrain;
using namespace dtrain::grpc_detail;

constexpr uint64_t kHarnessMaxBytes = 1 << 20;
constexpr size_t kMaxBuffered = 64;

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_tcp: broken property: %s\n", what);
    std::abort();
  }
}

struct Sent {
  MsgHeader h;
  std::string bytes;  // what the chunks carried, in order
  bool complete = false;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  TcpHello hello;
  TcpHelloLengths n;
  try {
    n = decode_tcp_hello_fixed(std::span<const char>(in.data(), in.size()), &hello);
  } catch (const WireError&) {
    return 0;
  }
  const size_t hello_bytes = kTcpHelloFixedBytes + n.token + n.session;
  if (in.size() < hello_bytes) return 0;
  hello.token.assign(in.data() + kTcpHelloFixedBytes, n.token);
  hello.session.assign(in.data() + kTcpHelloFixedBytes + n.token, n.session);
  require(encode_tcp_hello(hello) == in.substr(0, hello_bytes), "hello re-encodes the same");
  in.remove_prefix(hello_bytes);
  const int src = 1;
  BufferPool pool;
  Mailbox box(0, src, &pool, nullptr, nullptr, MailboxLimits{kMaxBuffered});
  box.stream_opened();
  Partials partial;
  std::map<MsgKey, Sent> sent;  // the first message under each key
  std::vector<float> buf(kTcpMaxChunkBytes / sizeof(float));
  while (in.size() >= kTcpChunkHeaderBytes) {
    WireFrame f;
    try {
      f = decode_tcp_chunk_header(std::span<const char>(in.data(), kTcpChunkHeaderBytes), src);
    } catch (const WireError&) {
      break;
    }
    char re[kTcpChunkHeaderBytes];
    encode_tcp_chunk_header(re, f.h, f.offset, f.len);
    require(std::memcmp(re, in.data(), kTcpChunkHeaderBytes) == 0, "header re-encodes the same");
    if (!box.check_chunk(f, partial).empty()) break;
    in.remove_prefix(kTcpChunkHeaderBytes);
    if (in.size() < f.len) break;  // closed in the middle of the chunk
    std::memcpy(buf.data(), in.data(), f.len);
    const std::string_view pay = in.substr(0, f.len);
    in.remove_prefix(f.len);
    if (f.h.bytes > kHarnessMaxBytes) continue;
    const Mailbox::ReduceFn reduce = [&](float* dst, Transport::Reduce op) {
      reduce_into(dst, buf.data(), f.len / sizeof(float), op);
    };
    const Mailbox::Delivery d = box.deliver(
        partial, f, [&](char* dst) { std::memcpy(dst, buf.data(), f.len); }, &reduce);
    if (d.kind != Mailbox::Delivery::kOk) break;
    const MsgKey key{f.h.channel, f.h.part};
    auto [it, fresh] = sent.try_emplace(key);
    if (fresh) it->second.h = f.h;
    Sent& s = it->second;
    if (!s.complete && s.h.op == f.h.op && s.h.bytes == f.h.bytes) {
      s.bytes += pay;
      s.complete = s.bytes.size() == s.h.bytes;
    }
  }
  box.stream_ended("the input ended");
  for (const auto& [key, s] : sent) {
    std::string got(s.h.bytes, '\0');
    try {
      box.recv(s.h, got.data(), nullptr, std::chrono::steady_clock::now());
    } catch (const CommError&) {
      continue;
    }
    require(s.complete && got == s.bytes, "recv returns what the chunks carried");
  }
  return 0;
}
