// The byte layout of the gRPC transport's TCP data path (grpc/tcp_path.h): the hello a sender
// opens its connection with, the receiver's answer, and the fixed header before every chunk.
// Fixed-size little-endian fields, so a receiver reads exactly the bytes it expects and can
// judge a header before reading a single payload byte.
//
//   hello   "DTRH" u32 version, i32 src, i32 dst, i32 world, u32 token_len, u32 session_len,
//           then the token and the session (the job's config hash) bytes
//   answer  "DTRA" u32 status (0 = accepted; anything else: refused, then the connection closes)
//   chunk   "DTRC" u32 op, u64 channel, u64 part, u64 total_bytes, u64 offset, u64 len, then
//           len payload bytes; the chunks of one message come in offset order, as on the
//           streams (comm/mailbox.h)
//
// Pure functions (no I/O, no allocation beyond their results): what fuzz/frame.cc drives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "comm/grpc/wire.h"

namespace dtrain::grpc_detail {

inline constexpr uint32_t kTcpVersion = 1;
inline constexpr size_t kTcpHelloFixedBytes = 28;
inline constexpr size_t kTcpMaxTokenBytes = 4096, kTcpMaxSessionBytes = 1024;
inline constexpr size_t kTcpAnswerBytes = 8;
inline constexpr size_t kTcpChunkHeaderBytes = 48;
// Largest chunk payload a receiver accepts: its read buffer has this size. Senders cut messages
// into chunks of kTcpChunkBytes (which the buffer holds in L2 cache, so delivering a chunk from it
// costs little next to the socket read).
inline constexpr uint64_t kTcpMaxChunkBytes = uint64_t{1} << 20;
inline constexpr uint64_t kTcpChunkBytes = uint64_t{256} << 10;

struct TcpHello {
  int src = -1, dst = -1, world = 0;
  std::string token, session;
};

std::string encode_tcp_hello(const TcpHello& h);
// The lengths the hello's fixed part announces; throws WireError for another magic or
// version, or lengths above the limits.
struct TcpHelloLengths {
  size_t token = 0, session = 0;
};
TcpHelloLengths decode_tcp_hello_fixed(std::span<const char> fixed, TcpHello* h);
// The whole hello (fixed part, token, session), for tests and the fuzzer.
TcpHello decode_tcp_hello(std::span<const char> bytes);

void encode_tcp_answer(char* out, uint32_t status);
// The answer's status; throws WireError for another magic.
uint32_t decode_tcp_answer(std::span<const char> bytes);

void encode_tcp_chunk_header(char* out, const MsgHeader& h, uint64_t offset, uint64_t len);
// Decodes and checks a chunk header from src (check_frame_fields, and len within
// kTcpMaxChunkBytes); throws WireError saying what is wrong.
WireFrame decode_tcp_chunk_header(std::span<const char> bytes, int src);

}  // namespace dtrain::grpc_detail
