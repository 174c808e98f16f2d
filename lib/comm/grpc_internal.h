// Internals of the gRPC transport shared with its tests and benchmarks: wire constants, tuning
// knobs, and a view of the peer table. Production code uses grpc_transport.h only.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/grpc/wire.h"  // kGrpcMaxMessageBytes
#include "comm/grpc_transport.h"

namespace dtrain {

// Bumped whenever proto/dtrain.proto or the metadata below change incompatibly; the rendezvous
// refuses a rank that speaks another version.
// 2: heartbeats; 3: the rendezvous store; 4: the TCP data path (tcp_port, grpc/tcp_wire.h)
inline constexpr uint32_t kGrpcProtocolVersion = 4;
// Metadata on every RPC: the job token, and on Data.Stream the sender's rank.
inline constexpr char kGrpcTokenKey[] = "x-dtrain-token";
inline constexpr char kGrpcRankKey[] = "x-dtrain-rank";
inline constexpr char kGrpcStreamMethod[] = "/dtrain.wire.Data/Stream";
// Messages a rank buffers from one peer ahead of its own receives, under distinct keys or the
// same one. A correct peer is at most a few collectives (their segments) and a pipeline
// schedule's sends ahead; a frame that would open one more is malformed (forged far-future
// sequence numbers, or one key sent over and over), so buffering is bounded.
inline constexpr size_t kGrpcMaxBufferedMessages = 65536;
// Bytes a rank buffers from one peer ahead of its own receives (one waiting message of up to
// kGrpcMaxMessageBytes is always admitted). A correct peer is ahead by a few collectives'
// segments or a pipeline's activations: far below this, even for a model of a billion
// parameters (whose gradients are 4 GiB, sent in W segments); without it, 65,536 forged 4 GiB
// headers could ask for 256 TiB.
inline constexpr uint64_t kGrpcMaxBufferedBytes = uint64_t{8} << 30;
// A peer's abort reason (Heartbeat.aborted) is cut to this many bytes: it is only printed.
inline constexpr size_t kMaxAbortNoticeBytes = 1024;
// How long an aborting rank waits for its peers to acknowledge its abort notice before it
// closes its connections. Acknowledgements take about a millisecond; a dead peer's call fails
// at once; only an unreachable one (a partition) costs the whole wait. Generous, so that a peer
// slowed by a sanitizer or a loaded machine still hears why before it sees the closed sockets.
inline constexpr auto kAbortNoticeWait = std::chrono::seconds(1);
// Largest single frame a server accepts; chunk_bytes must stay below it.
inline constexpr int kGrpcMaxFrameBytes = (64 << 20) + 4096;

// Performance knobs, not part of the public options. Measured with the "grpc: throughput"
// benchmark in tests/comm/test_grpc.cc (64 MiB one way between two processes on loopback, 2
// cores): 1 MiB chunks beat 256 KiB (~1.6x the throughput, less CPU per byte on both sides) and
// 4 MiB (less throughput, more variance); lending the caller's memory costs the sender ~15-20%
// less CPU than copying at equal throughput. Once the malloc churn was fixed (tune_malloc), the
// HTTP/2 frame size and TCP read chunk made no difference beyond run-to-run noise, so they stay
// at gRPC's defaults; a larger initial stream window is kept for links with a higher
// bandwidth-delay product than loopback (BDP probing stays on and grows it further).
struct GrpcTuning {
  size_t chunk_bytes = size_t{1} << 20;  // payload bytes per frame
  bool copy_send = false;  // copy each chunk into gRPC instead of lending the caller's memory
  // 0 = gRPC's default.
  int lookahead_bytes = 8 << 20;  // grpc.http2.lookahead_bytes (initial stream window)
  int max_frame_size = 0;         // grpc.http2.max_frame_size
  int tcp_read_chunk = 0;         // grpc.experimental.tcp_read_chunk_size
  bool tune_malloc = true;        // keep freed heap instead of trimming it (see connect_grpc)
};

std::unique_ptr<Transport> connect_grpc(const GrpcOptions& opts, const GrpcTuning& tuning);

// How received messages reached the caller's buffer: straight from gRPC's slices because the
// recv was posted before the message started (direct) or while it was arriving (redirected:
// the received prefix is copied once more), or copied out of a complete mailbox message.
struct GrpcRecvStats {
  uint64_t direct = 0, redirected = 0, mailbox = 0;
  uint64_t chunks_read_direct = 0;  // TCP chunks read from the socket into the posted buffer
};
GrpcRecvStats grpc_recv_stats(const Transport& t);

// The ranks this gRPC transport sends to through shared memory (same host, both sides on).
std::vector<int> grpc_shm_peers(const Transport& t);
// The ranks it sends to over its TCP data path, and the port that path listens on (0 = none).
std::vector<int> grpc_tcp_peers(const Transport& t);
int grpc_tcp_port(const Transport& t);

// The peer table a gRPC transport joined with: element r is rank r's "host:port". Throws
// std::invalid_argument if t is not a gRPC transport.
std::vector<std::string> grpc_peer_addresses(const Transport& t);

// How long a peer may stay silent before it is declared frozen or unreachable: this rank's
// heartbeat_s, lengthened for a peer that says it beats less often (hosts may set heartbeat_s
// differently) to three of its intervals, but never past twice heartbeat_s: the interval comes
// from the peer, and a forged or broken one (1e308, NaN, negative) must not switch detection
// off or stretch it.
inline double peer_silence_limit(double heartbeat_s, double claimed_interval_s) {
  // Nonsense is ignored (NaN fails both comparisons).
  const bool sane = claimed_interval_s > 0 && claimed_interval_s < 1e9;
  const double iv = sane ? claimed_interval_s : 0.0;
  return std::min(2 * heartbeat_s, std::max(heartbeat_s, 3 * iv));
}

}  // namespace dtrain
