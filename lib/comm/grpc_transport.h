// The gRPC transport: one process per rank. Rank 0 hosts the rendezvous service at
// MASTER_ADDR:MASTER_PORT; every rank (rank 0 included) starts its own transport server, joins
// with (rank, world size, listen address, job token, config hash) and receives the peer table
// once all ranks have joined. Tensor data then moves over long-lived client streams, one per
// ordered peer pair, in chunks; the receiving server drains frames into per-peer mailboxes.
// Between ranks on one host (and with GrpcOptions::shm on both) data moves through
// shared-memory rings instead, and to the other peers over plain TCP connections
// (GrpcOptions::tcp), both negotiated at the rendezvous; the streams still carry failures.
// Heartbeats (unary Health.Beat calls on their own thread) detect frozen or unreachable peers.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/transport.h"
#include "util/fault.h"

namespace dtrain {

// Sends gRPC's own log lines (gpr_log; which severities is GRPC_VERBOSITY's choice, errors by
// default) to spdlog at debug level, so they reach the console only with --log-level debug.
// Process-wide; call once, before the first gRPC use.
void route_grpc_logs_to_spdlog();

struct GrpcOptions {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";  // where rank 0's rendezvous service listens
  int master_port = 0;                    // > 0
  std::string bind = "127.0.0.1";         // this rank's listen address (port chosen free)
  std::string advertise;                  // address peers dial; "" = bind (or the hostname when
                                          // bind is 0.0.0.0 / ::)
  std::string token;                      // job token, checked on every RPC; "" = none
  std::string config_hash;                // must agree across ranks
  // The config in detail, for a refusal that names what differs (the comm layer knows no
  // configs): config_detail, this rank's (JSON of its resolved config), goes with its join when
  // at most kMaxConfigDetailBytes; on rank 0, config_difference(theirs) says how a joining rank's
  // differs from its own ("key: ours -> theirs; ..."; "" when it cannot tell), asked only when
  // the hashes differ. Either may be empty.
  std::string config_detail;
  std::function<std::string(const std::string& theirs)> config_difference;
  double rendezvous_timeout_s = 120;  // fail naming the ranks that never joined
  // After the rendezvous: how long connecting to the peers and waiting for their streams may
  // take at most (distributed.timeout_s). A peer that dies meanwhile is found sooner, by its
  // missing heartbeats (within heartbeat_s) or its closed connection.
  double connect_timeout_s = 300;
  // Optional TLS: PEM file paths; all three set or none.
  std::string tls_cert, tls_key, tls_ca;
  // Same-host data path: messages to ranks on this machine go through shared memory
  // (lib/comm/shm_ring.h) instead of gRPC streams, which stay up for failure detection. Both
  // sides must have it on; false = gRPC streams only (distributed.shm).
  bool shm = true;
  // Data path to the other peers: plain TCP connections (lib/comm/grpc/tcp_path.h), one per
  // ordered rank pair, authenticated by the job token like the gRPC calls; false = the gRPC
  // streams. Off whenever TLS is on, so data stays encrypted (distributed.tcp).
  bool tcp = true;
  // Failure detection: every rank sends a small heartbeat to every peer each heartbeat_s / 3 on
  // a thread of its own; a peer not heard from for heartbeat_s (or 3 of its own intervals, if it
  // beats more slowly) is declared frozen or unreachable, and every receive from and send to it
  // fails naming it. Beats carry this rank's position for the desync report. 0 = no heartbeats
  // (only the collective deadline and closed connections detect failures). Silence counts from
  // the rendezvous on, so a peer lost before its streams open is reported within heartbeat_s
  // too. distributed.heartbeat_s.
  double heartbeat_s = 10;
  // Fault injection (DTRAIN_FAULT kill_in_connect, util/fault.h); empty in production.
  std::vector<Fault> faults;
  // Rank 0 only: once every rank has joined, the rendezvous is refused with this message (every
  // rank raises it as a UserError: exit 2) instead of completed. How rank 0 turns away input it
  // alone checks (its --out holds another run) without leaving the other ranks to wait out
  // rendezvous_timeout_s for a host that never came up. "" = none.
  std::string refusal;
};

// True for "localhost", "::1" / "[::1]" and 127.0.0.0/8: the job stays on this machine, so
// ranks listen on loopback only.
bool is_loopback_host(const std::string& host);

// Joins the job and returns a connected transport. Throws CommError (timeout naming missing
// ranks, refused token, config hash mismatch with both hashes) or UserError (bad options, rank
// 0's refusal).
std::unique_ptr<Transport> connect_grpc(const GrpcOptions& opts);

// How long the teardown of a transport after a failure (a failed connect, a rank's error) may
// take before the process ends with the error it reports (util/exit_deadline.h), in seconds.
inline constexpr unsigned kFailedTeardownS = 20;

}  // namespace dtrain
