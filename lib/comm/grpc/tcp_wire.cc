#include "comm/grpc/tcp_wire.h"

#include <fmt/format.h>

#include <cstring>

namespace dtrain::grpc_detail {
namespace {

constexpr char kHelloMagic[4] = {'D', 'T', 'R', 'H'};
constexpr char kAnswerMagic[4] = {'D', 'T', 'R', 'A'};
constexpr char kChunkMagic[4] = {'D', 'T', 'R', 'C'};

// Little-endian on every host (the supported ones are little-endian; the loops say so anyway).
template <typename T>
char* put(char* p, T v) {
  auto u = static_cast<std::make_unsigned_t<T>>(v);
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<char>((u >> (8 * i)) & 0xff);
  return p + sizeof(T);
}
template <typename T>
T get(const char* p) {
  std::make_unsigned_t<T> u = 0;
  for (size_t i = 0; i < sizeof(T); ++i)
    u |= static_cast<std::make_unsigned_t<T>>(static_cast<uint8_t>(p[i])) << (8 * i);
  return static_cast<T>(u);
}

void need(std::span<const char> b, size_t n, const char* what) {
  if (b.size() < n) throw WireError(fmt::format("truncated {}: {} of {} bytes", what, b.size(), n));
}

void check_magic(const char* p, const char (&magic)[4], const char* what) {
  if (std::memcmp(p, magic, 4) != 0) throw WireError(fmt::format("not a {} (bad magic)", what));
}

}  // namespace

std::string encode_tcp_hello(const TcpHello& h) {
  std::string out(kTcpHelloFixedBytes + h.token.size() + h.session.size(), '\0');
  char* p = out.data();
  std::memcpy(p, kHelloMagic, 4);
  p = put<uint32_t>(p + 4, kTcpVersion);
  p = put<int32_t>(p, h.src);
  p = put<int32_t>(p, h.dst);
  p = put<int32_t>(p, h.world);
  p = put<uint32_t>(p, static_cast<uint32_t>(h.token.size()));
  p = put<uint32_t>(p, static_cast<uint32_t>(h.session.size()));
  std::memcpy(p, h.token.data(), h.token.size());
  std::memcpy(p + h.token.size(), h.session.data(), h.session.size());
  return out;
}

TcpHelloLengths decode_tcp_hello_fixed(std::span<const char> b, TcpHello* h) {
  need(b, kTcpHelloFixedBytes, "data-connection hello");
  check_magic(b.data(), kHelloMagic, "dtrain data-connection hello");
  const char* p = b.data();
  if (const auto v = get<uint32_t>(p + 4); v != kTcpVersion)
    throw WireError(
        fmt::format("data-connection version {} (this build speaks {})", v, kTcpVersion));
  h->src = get<int32_t>(p + 8);
  h->dst = get<int32_t>(p + 12);
  h->world = get<int32_t>(p + 16);
  TcpHelloLengths n{get<uint32_t>(p + 20), get<uint32_t>(p + 24)};
  if (n.token > kTcpMaxTokenBytes || n.session > kTcpMaxSessionBytes)
    throw WireError(
        fmt::format("hello announces a {}-byte token and a {}-byte session (at most "
                    "{} and {})",
                    n.token, n.session, kTcpMaxTokenBytes, kTcpMaxSessionBytes));
  return n;
}

TcpHello decode_tcp_hello(std::span<const char> b) {
  TcpHello h;
  const TcpHelloLengths n = decode_tcp_hello_fixed(b, &h);
  const size_t total = kTcpHelloFixedBytes + n.token + n.session;
  need(b, total, "data-connection hello");
  if (b.size() != total)
    throw WireError(fmt::format("{} bytes after the data-connection hello", b.size() - total));
  h.token.assign(b.data() + kTcpHelloFixedBytes, n.token);
  h.session.assign(b.data() + kTcpHelloFixedBytes + n.token, n.session);
  return h;
}

void encode_tcp_answer(char* out, uint32_t status) {
  std::memcpy(out, kAnswerMagic, 4);
  put<uint32_t>(out + 4, status);
}

uint32_t decode_tcp_answer(std::span<const char> b) {
  need(b, kTcpAnswerBytes, "data-connection answer");
  check_magic(b.data(), kAnswerMagic, "dtrain data-connection answer");
  return get<uint32_t>(b.data() + 4);
}

void encode_tcp_chunk_header(char* out, const MsgHeader& h, uint64_t offset, uint64_t len) {
  std::memcpy(out, kChunkMagic, 4);
  char* p = put<uint32_t>(out + 4, static_cast<uint32_t>(h.op));
  p = put<uint64_t>(p, h.channel);
  p = put<uint64_t>(p, h.part);
  p = put<uint64_t>(p, h.bytes);
  p = put<uint64_t>(p, offset);
  put<uint64_t>(p, len);
}

WireFrame decode_tcp_chunk_header(std::span<const char> b, int src) {
  need(b, kTcpChunkHeaderBytes, "chunk header");
  check_magic(b.data(), kChunkMagic, "chunk header");
  const char* p = b.data();
  WireFrame f;
  f.src = src;
  f.op_raw = get<uint32_t>(p + 4);
  f.h.op = static_cast<CommOp>(f.op_raw);
  f.h.channel = get<uint64_t>(p + 8);
  f.h.part = get<uint64_t>(p + 16);
  f.h.bytes = get<uint64_t>(p + 24);
  f.offset = get<uint64_t>(p + 32);
  f.len = get<uint64_t>(p + 40);
  check_frame_fields(f);
  if (f.len > kTcpMaxChunkBytes)
    throw WireError(fmt::format("a chunk of {} bytes (at most {})", f.len, kTcpMaxChunkBytes));
  return f;
}

}  // namespace dtrain::grpc_detail
