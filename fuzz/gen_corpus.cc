// Writes the seed corpora of fuzz/frame.cc, fuzz/rendezvous.cc and fuzz/tcp.cc with dtrain's own
// encoders (encode_frame_header, encode_tcp_*, the generated protobuf classes), so the seeds are
// what real ranks send:
//
//   build-asan/bin/fuzz_gen_corpus fuzz/corpus   (rewrites fuzz/corpus/{frame,rendezvous,tcp}/)
//
// Each seed is one scenario, named after it; the input formats are the targets' (see their
// opening comments). Deterministic: running it again gives the same bytes.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "comm/grpc/tcp_wire.h"
#include "comm/grpc/wire.h"
#include "comm/grpc_internal.h"
#include "dtrain.pb.h"

namespace {
using namespace dtrain;

void write(const std::filesystem::path& path, const std::string& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::perror(path.c_str());
    std::exit(1);
  }
}

std::string u16(size_t n) {
  return {static_cast<char>(n & 0xff), static_cast<char>((n >> 8) & 0xff)};
}

// ---- frame: records of [u16 length][u8 cut][one message] ----

// The frames rank 1 sends for a message of `total` bytes in chunks of `chunk` bytes (one frame
// for an empty message), each cut into pieces of `cut` bytes on arrival (0 = one piece).
std::string frames(uint64_t channel, uint64_t part, CommOp op, uint64_t total, uint64_t chunk,
                   uint8_t cut, uint64_t upto = ~uint64_t{0}) {
  const MsgHeader h{channel, part, op, total};
  std::string out;
  uint64_t off = 0;
  do {
    const uint64_t len = std::min(chunk, total - off);
    std::string msg(kMaxFrameHeaderBytes, '\0');
    msg.resize(encode_frame_header(msg.data(), 1, h, off, len));
    for (uint64_t i = 0; i < len; ++i) msg += static_cast<char>('a' + (off + i) % 26);
    out += u16(msg.size()) + static_cast<char>(cut) + msg;
    off += len;
  } while (off < total && off < upto);
  return out;
}

void frame_seeds(const std::filesystem::path& dir) {
  const CommOp ar = CommOp::kAllReduce;
  write(dir / "one_frame", frames(0, 0, ar, 16, 16, 0));
  write(dir / "three_chunks_in_pieces", frames(3, 1, ar, 24, 8, 5));
  write(dir / "empty_and_p2p", frames(1, 0, CommOp::kBarrier, 0, 1, 0) +
                                   frames(kP2PBit | 7, 0, CommOp::kSendRecv, 10, 10, 3));
  // Two messages interleaved on one stream (typed ops), the second left incomplete.
  const std::string a = frames(5, 0, typed_op(CommOp::kAllGather, DType::kI64), 32, 16, 0);
  const std::string b = frames(5, 1, typed_op(CommOp::kAllGather, DType::kI64), 32, 16, 0, 16);
  const size_t a1 = 3 + static_cast<uint8_t>(a[0]) + (size_t{uint8_t(a[1])} << 8);
  write(dir / "interleaved_incomplete", a.substr(0, a1) + b + a.substr(a1));
  // Parts of one channel that disagree about the op: a mismatch for the receiver.
  write(dir / "mismatched_ops",
        frames(9, 0, ar, 8, 8, 0) + frames(9, 1, CommOp::kBroadcast, 8, 8, 0));
  write(dir / "two_messages_one_key", frames(2, 0, ar, 4, 4, 0) + frames(2, 0, ar, 4, 4, 2));
}

// ---- rendezvous: [u8 world - 1] then records of [u8 method][u16 length][StoreRequest] ----

std::string call(int method, const wire::StoreRequest& req) {
  const std::string s = req.SerializeAsString();
  return static_cast<char>(method) + u16(s.size()) + s;
}
std::string set(const std::string& key, const std::string& value) {
  wire::StoreRequest r;
  r.set_key(key);
  r.set_value(value);
  return call(0, r);
}
std::string add(const std::string& key, int64_t delta) {
  wire::StoreRequest r;
  r.set_key(key);
  r.set_delta(delta);
  return call(1, r);
}
std::string get(const std::string& key) {
  wire::StoreRequest r;
  r.set_key(key);
  r.set_timeout_ms(1000);
  return call(2, r);
}
std::string wait(const std::vector<std::string>& keys) {
  wire::StoreRequest r;
  for (const auto& k : keys) r.add_keys(k);
  r.set_timeout_ms(1000);
  return call(3, r);
}

// What rank `rank` sends as the n-th joiner: add joins, set its JoinRequest, get the result.
std::string join(int n, int rank, int world, const std::string& hash = "cafe") {
  wire::JoinRequest j;
  j.set_protocol_version(kGrpcProtocolVersion);
  j.set_rank(rank);
  j.set_world_size(world);
  j.set_listen_address("127.0.0.1:" + std::to_string(40000 + rank));
  j.set_config_hash(hash);
  j.set_shm_name(rank % 2 ? "" : "/dtrain-" + std::to_string(rank));
  j.set_tcp_port(rank % 2 ? 0 : 40100 + rank);
  return add("rdzv/joins", 1) + set("rdzv/join/" + std::to_string(n), j.SerializeAsString()) +
         get("rdzv/result");
}

void rendezvous_seeds(const std::filesystem::path& dir) {
  auto world = [](int w) { return std::string(1, static_cast<char>(w - 1)); };
  write(dir / "two_ranks_complete",
        world(2) + join(1, 1, 2) + join(2, 0, 2) + add("rdzv/acks", 1) + add("rdzv/acks", 1));
  write(dir / "three_ranks_config_hash_differs",
        world(3) + join(1, 0, 3) + join(2, 2, 3, "beef") + join(3, 1, 3));
  write(dir / "rank_joins_twice", world(2) + join(1, 0, 2) + join(2, 0, 2));
  write(dir / "four_ranks_one_missing", world(4) + join(1, 0, 4) + join(2, 3, 4) + join(3, 1, 4) +
                                            wait({"rdzv/join/1", "rdzv/join/2", "rdzv/join/4"}));
  write(dir / "world_size_differs", world(2) + join(1, 0, 2) + join(2, 1, 3));
  write(dir / "one_rank", world(1) + join(1, 0, 1));
}

// ---- tcp: one connection's bytes: a hello, then chunks ----

std::string tcp_hello(int src = 1) {
  return grpc_detail::encode_tcp_hello(grpc_detail::TcpHello{src, 0, 2, "job-token", "cafe"});
}

// The chunks of a message of `total` bytes in chunks of `chunk` bytes (one for an empty one).
std::string tcp_chunks(uint64_t channel, uint64_t part, CommOp op, uint64_t total, uint64_t chunk,
                       uint64_t upto = ~uint64_t{0}) {
  const MsgHeader h{channel, part, op, total};
  std::string out;
  uint64_t off = 0;
  do {
    const uint64_t len = std::min(chunk, total - off);
    std::string hdr(grpc_detail::kTcpChunkHeaderBytes, '\0');
    grpc_detail::encode_tcp_chunk_header(hdr.data(), h, off, len);
    out += hdr;
    for (uint64_t i = 0; i < len; ++i) out += static_cast<char>('a' + (off + i) % 26);
    off += len;
  } while (off < total && off < upto);
  return out;
}

void tcp_seeds(const std::filesystem::path& dir) {
  const CommOp ar = CommOp::kAllReduce;
  write(dir / "hello_only", tcp_hello());
  write(dir / "one_chunk", tcp_hello() + tcp_chunks(0, 0, ar, 16, 16));
  write(dir / "three_chunks", tcp_hello() + tcp_chunks(3, 1, ar, 24, 8));
  write(dir / "empty_and_p2p", tcp_hello() + tcp_chunks(1, 0, CommOp::kBarrier, 0, 1) +
                                   tcp_chunks(kP2PBit | 7, 0, CommOp::kSendRecv, 10, 4));
  write(dir / "incomplete_then_mismatch",
        tcp_hello() + tcp_chunks(5, 0, typed_op(CommOp::kAllGather, DType::kI64), 32, 16, 16) +
            tcp_chunks(9, 0, ar, 8, 8) + tcp_chunks(9, 1, CommOp::kBroadcast, 8, 8));
  write(dir / "cut_in_a_payload", tcp_hello() + tcp_chunks(2, 0, ar, 64, 64).substr(0, 70));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root = argv[1];
  frame_seeds(root / "frame");
  rendezvous_seeds(root / "rendezvous");
  tcp_seeds(root / "tcp");
  return 0;
}
