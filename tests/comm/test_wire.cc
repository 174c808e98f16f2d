// The pure decoders a fuzzer drives: gRPC data frames (comm/grpc/wire.h), the TCP data path's
// hello and chunk headers (comm/grpc/tcp_wire.h) and rendezvous join requests
// (comm/rendezvous/rendezvous.h). No transport involved.
#include <doctest/doctest.h>

#include <span>
#include <string>
#include <vector>

#include "comm/grpc/tcp_wire.h"
#include "comm/grpc/wire.h"
#include "comm/grpc_internal.h"
#include "comm/grpc_transport.h"
#include "comm/rendezvous/rendezvous.h"
#include "comm/transport.h"
#include "dtrain.pb.h"

using namespace dtrain;
using dtrain::grpc_detail::decode_join_request;
using dtrain::grpc_detail::join_refusal;
using dtrain::grpc_detail::kMaxJoinRequestBytes;

namespace {

// A frame as the sender writes it: header, then payload.
std::string encode(int src, const MsgHeader& h, uint64_t offset, const std::string& payload) {
  char hdr[kMaxFrameHeaderBytes];
  const size_t n = encode_frame_header(hdr, src, h, offset, payload.size());
  return std::string(hdr, n) + payload;
}

std::string payload_of(std::span<const std::span<const char>> pieces, const WireFrame& f) {
  std::string out(f.len, '\0');
  copy_frame_payload(pieces, f, out.data());
  return out;
}

std::string error_of(const std::string& bytes) {
  try {
    decode_frame(std::span<const char>(bytes.data(), bytes.size()));
  } catch (const WireError& e) {
    return e.what();
  }
  return "decoded";
}

}  // namespace

TEST_CASE("wire: a frame decodes to what was encoded, however it is split into slices") {
  const MsgHeader h = MsgHeader{kP2PBit | 7, (uint64_t{2} << 56) | 5,
                                typed_op(CommOp::kAllGather, DType::kI64), 40};
  const std::string payload = "0123456789abcdef";
  const std::string bytes = encode(3, h, 24, payload);
  for (size_t cut1 = 0; cut1 <= bytes.size(); ++cut1) {
    for (size_t cut2 = cut1; cut2 <= bytes.size(); cut2 += 3) {
      CAPTURE(cut1);
      CAPTURE(cut2);
      const std::vector<std::span<const char>> pieces = {
          std::span<const char>(bytes.data(), cut1),
          std::span<const char>(bytes.data() + cut1, cut2 - cut1),
          std::span<const char>(bytes.data() + cut2, bytes.size() - cut2)};
      const WireFrame f = decode_frame(pieces);
      CHECK(f.src == 3);
      CHECK(f.h.channel == h.channel);
      CHECK(f.h.part == h.part);
      CHECK(f.h.op == h.op);
      CHECK(f.h.bytes == 40);
      CHECK(f.offset == 24);
      CHECK(f.len == payload.size());
      CHECK(payload_of(pieces, f) == payload);
    }
  }
}

TEST_CASE("wire: frames from the generated protobuf encoder decode the same") {
  wire::Frame pf;
  pf.set_src_rank(1);
  pf.set_channel(9);
  pf.set_part(2);
  pf.set_op(static_cast<uint32_t>(CommOp::kBroadcast));
  pf.set_total_bytes(5);
  pf.set_offset(0);
  pf.set_payload("hello");
  const std::string bytes = pf.SerializeAsString();
  const WireFrame f = decode_frame(std::span<const char>(bytes.data(), bytes.size()));
  CHECK(f.src == 1);
  CHECK(f.h.channel == 9);
  CHECK(f.h.part == 2);
  CHECK(f.h.op == CommOp::kBroadcast);
  const std::span<const char> one[1] = {std::span<const char>(bytes.data(), bytes.size())};
  CHECK(payload_of(one, f) == "hello");
}

TEST_CASE("wire: every prefix of a frame decodes or throws WireError, and bad frames say why") {
  const std::string bytes = encode(1, MsgHeader{4, 0, CommOp::kAllReduce, 8}, 0, "abcdefgh");
  for (size_t n = 0; n < bytes.size(); ++n) {
    CAPTURE(n);
    const std::string e = error_of(bytes.substr(0, n));
    CHECK(!e.empty());  // "decoded" (a header without payload is a valid frame) or a reason
  }
  CHECK(error_of(bytes) == "decoded");
  CHECK(error_of(encode(1, MsgHeader{4, 0, static_cast<CommOp>(77), 8}, 0, "abcdefgh")) ==
        "unknown op 77");
  CHECK(error_of(encode(1, MsgHeader{4, 0, CommOp::kAllReduce, kGrpcMaxMessageBytes + 1}, 0, "x"))
            .find("exceed the limit") != std::string::npos);
  CHECK(error_of(encode(1, MsgHeader{4, 0, CommOp::kAllReduce, 8}, 4, "abcdefgh")) ==
        "offset 4 + payload 8 exceeds the total of 8 bytes");
  CHECK(error_of(bytes + bytes.substr(bytes.size() - 10)) == "payload appears twice");
  CHECK(error_of(std::string("\x3b", 1)) == "unsupported wire type 3");
  CHECK(error_of(std::string(11, '\xff')) == "truncated field tag");
  CHECK(error_of(std::string("\x08", 1)) == "bad header field 1");
  CHECK(error_of(std::string("\x7a\x05"
                             "ab",
                             4)) == "field 15 is longer than the frame");
}

TEST_CASE("rendezvous: join requests decode, and refusals name the rank and both sides") {
  wire::JoinRequest req;
  req.set_protocol_version(kGrpcProtocolVersion);
  req.set_rank(1);
  req.set_world_size(2);
  req.set_listen_address("127.0.0.1:4000");
  req.set_config_hash("cafe");
  const std::string bytes = req.SerializeAsString();
  const wire::JoinRequest got =
      decode_join_request(std::span<const char>(bytes.data(), bytes.size()));
  CHECK(got.rank() == 1);
  CHECK(got.listen_address() == "127.0.0.1:4000");
  CHECK(join_refusal(got, 2, "cafe") == "");
  CHECK(join_refusal(got, 3, "cafe") == "rank 1 says the world size is 2, rank 0 says 3");
  CHECK(join_refusal(got, 2, "beef") == "rank 1 has config hash cafe, rank 0 has beef");
  // With the configs' details, the keys that differ (rank 0's -> the joining rank's); without a
  // detail (an older dtrain) or an answer, the hashes alone.
  const auto diff = [](const std::string& theirs) { return "optimizer.lr: 0.1 -> " + theirs; };
  wire::JoinRequest detailed = got;
  detailed.set_config_detail("0.2");
  CHECK(join_refusal(detailed, 2, "beef", diff) ==
        "rank 1 has config hash cafe, rank 0 has beef; the keys that differ (rank 0's -> rank "
        "1's): optimizer.lr: 0.1 -> 0.2");
  CHECK(join_refusal(got, 2, "beef", diff) ==
        "rank 1 has config hash cafe, rank 0 has beef; rank 1 sent no config to name the keys "
        "that differ by (one above 32 KiB, or a dtrain before 2026-12-07): compare the ranks' "
        "config.json");
  CHECK(join_refusal(got, 2, "beef") == "rank 1 has config hash cafe, rank 0 has beef");
  CHECK(join_refusal(detailed, 2, "beef", [](const std::string&) { return std::string(); }) ==
        "rank 1 has config hash cafe, rank 0 has beef");
  CHECK(join_refusal(detailed, 2, "cafe", diff) == "");
  wire::JoinRequest out = got;
  out.set_rank(5);
  out.set_world_size(2);
  CHECK(join_refusal(out, 2, "cafe") == "rank 5 is out of range for world size 2");
  out = got;
  out.set_protocol_version(kGrpcProtocolVersion + 1);
  CHECK(join_refusal(out, 2, "cafe").find("speaks wire protocol") != std::string::npos);
  out = got;
  out.clear_listen_address();
  CHECK(join_refusal(out, 2, "cafe") == "rank 1 sent no listen address");
  const std::string garbage = "\xff\xff\xff\xff";
  CHECK_THROWS_AS(decode_join_request(std::span<const char>(garbage.data(), garbage.size())),
                  WireError);
  const std::string huge(kMaxJoinRequestBytes + 1, '\0');
  CHECK_THROWS_AS(decode_join_request(std::span<const char>(huge.data(), huge.size())), WireError);
}

TEST_CASE("tcp wire: hello, answer and chunk header decode to what was encoded") {
  using namespace dtrain::grpc_detail;
  const TcpHello h{3, 1, 8,
                   std::string("tok\x01"
                               "en"),
                   "hash"};
  const std::string b = encode_tcp_hello(h);
  CHECK(b.size() == kTcpHelloFixedBytes + 6 + 4);
  const TcpHello d = decode_tcp_hello(b);
  CHECK(d.src == 3);
  CHECK(d.dst == 1);
  CHECK(d.world == 8);
  CHECK(d.token == h.token);
  CHECK(d.session == "hash");
  char a[kTcpAnswerBytes];
  encode_tcp_answer(a, 0);
  CHECK(decode_tcp_answer(a) == 0);
  encode_tcp_answer(a, 7);
  CHECK(decode_tcp_answer(a) == 7);
  MsgHeader m;
  m.channel = kP2PBit | 0x123456789ull;
  m.part = 41;
  m.op = typed_op(CommOp::kAllGather, DType::kI64);
  m.bytes = uint64_t{5} << 30 >> 2;
  char c[kTcpChunkHeaderBytes];
  encode_tcp_chunk_header(c, m, 1024, kTcpChunkBytes);
  const WireFrame f = decode_tcp_chunk_header(c, 5);
  CHECK(f.src == 5);
  CHECK(f.h.channel == m.channel);
  CHECK(f.h.part == 41);
  CHECK(f.h.op == m.op);
  CHECK(f.h.bytes == m.bytes);
  CHECK(f.offset == 1024);
  CHECK(f.len == kTcpChunkBytes);
}

TEST_CASE("tcp wire: every prefix and bad field is refused with WireError saying why") {
  using namespace dtrain::grpc_detail;
  const std::string b = encode_tcp_hello(TcpHello{1, 0, 2, "token", "hash"});
  for (size_t n = 0; n < b.size(); ++n)
    CHECK_THROWS_AS(decode_tcp_hello(std::span<const char>(b.data(), n)), WireError);
  CHECK_THROWS_WITH_AS(decode_tcp_hello(b + "x"), doctest::Contains("after the"), WireError);
  std::string v = b;
  v[4] = 9;
  CHECK_THROWS_WITH_AS(decode_tcp_hello(v), doctest::Contains("version 9"), WireError);
  v = b;
  v[0] = 'X';
  CHECK_THROWS_WITH_AS(decode_tcp_hello(v), doctest::Contains("bad magic"), WireError);
  v = b;
  v[26] = 1;  // session length 65536 + 4
  CHECK_THROWS_WITH_AS(decode_tcp_hello(v), doctest::Contains("at most"), WireError);
  char a[kTcpAnswerBytes] = "DTRX";
  CHECK_THROWS_AS(decode_tcp_answer(a), WireError);
  MsgHeader m;
  m.bytes = 100;
  char c[kTcpChunkHeaderBytes];
  encode_tcp_chunk_header(c, m, 0, 100);
  for (size_t n = 0; n < sizeof c; ++n)
    CHECK_THROWS_AS(decode_tcp_chunk_header(std::span<const char>(c, n), 1), WireError);
  encode_tcp_chunk_header(c, m, 60, 41);
  CHECK_THROWS_WITH_AS(decode_tcp_chunk_header(c, 1), doctest::Contains("exceeds"), WireError);
  m.bytes = kGrpcMaxMessageBytes + 1;
  encode_tcp_chunk_header(c, m, 0, 1);
  CHECK_THROWS_WITH_AS(decode_tcp_chunk_header(c, 1), doctest::Contains("limit"), WireError);
  m.bytes = 8 << 20;
  encode_tcp_chunk_header(c, m, 0, kTcpMaxChunkBytes + 4);
  CHECK_THROWS_WITH_AS(decode_tcp_chunk_header(c, 1), doctest::Contains("at most"), WireError);
  m.op = static_cast<CommOp>(0x77);
  encode_tcp_chunk_header(c, m, 0, 4);
  CHECK_THROWS_WITH_AS(decode_tcp_chunk_header(c, 1), doctest::Contains("unknown op"), WireError);
}

TEST_CASE("describe: a subgroup's message names its sequence number and group apart") {
  MsgHeader h;
  h.channel = 7;
  h.bytes = 64;
  CHECK(describe(h) == "allreduce seq 7 (phase 0, step 0, segment 0) (64 bytes)");
  // Group 3's tag (id + 1) above bit 40, as subgroup.cc sets it: was "seq 4398046511111".
  h.channel = (uint64_t{4} << kChannelGroupShift) | 7;
  CHECK(describe(h) == "allreduce seq 7 of group 3 (phase 0, step 0, segment 0) (64 bytes)");
}

TEST_CASE("is_loopback_host: every spelling a rank 0 listens on loopback for") {
  // (LOCALHOST and localhost. made rank 0 listen on every interface)
  for (const char* h : {"localhost", "LOCALHOST", "localhost.", "node.localhost", "127.0.0.1",
                        "127.0.0.1.", "127.1.2.3", "::1", "[::1]"})
    CHECK_MESSAGE(dtrain::is_loopback_host(h), h);
  for (const char* h : {"10.0.0.7", "node0", "localhostx", "[fe80::1]", "128.0.0.1"})
    CHECK_MESSAGE(!dtrain::is_loopback_host(h), h);
}
