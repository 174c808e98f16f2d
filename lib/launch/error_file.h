#pragma once
// torchrun's error-file contract: a launcher gives each rank TORCHELASTIC_ERROR_FILE, and a rank
// that fails writes its error there as JSON, so the launcher can name the failure's cause rather
// than whichever rank it happened to reap first. dtrain's ranks write it under any launcher that
// sets the variable (torchrun shows it in its failure summary); `dtrain launch` sets it and reads
// it back. The record is torchelastic's ({"message": {"message", "extraInfo": {"timestamp"}}})
// plus a "dtrain" object: the rank, its exit code, and the rank its error names as the cause.

#include <optional>
#include <string>
#include <string_view>

namespace dtrain {

inline constexpr const char* kErrorFileEnv = "TORCHELASTIC_ERROR_FILE";

// The rank that an error message of rank `self` names as the cause of its failure -- the
// transport's own verdict ("rank R went down first"), a peer's abort relayed ("rank R aborted:
// ..."; the innermost other rank when relays nest), a lost or closed connection, a missing
// heartbeat, a connect or receive that timed out on rank R, a shard write rank R could not make --
// or -1 when it names none, only `self`, or no rank in [0, world) (world <= 0: any rank counts).
// Plain string searches over the first 8 KiB (no regex: its recursion overflowed the stack on a
// long message, in the error path itself).
int rank_named_as_cause(const std::string& message, int self, int world = -1);

// Writes the record for `message` atomically (temp file, rename); best effort: a failure to write
// it is ignored (the error itself is on stderr already).
// Never throws (it runs in the process's last error handler, out of memory included).
void write_error_file(const char* path, std::string_view message, int exit_code, int rank,
                      int world = -1) noexcept;

struct RankErrorRecord {
  std::string message;
  int exit_code = 1;
  int caused_by = -1;  // rank_named_as_cause of the message, as the rank judged it
};
// nullopt when the file is missing or not such a record.
std::optional<RankErrorRecord> read_error_file(const std::string& path);

// Where rank `rank` writes its record under `dtrain launch` (its TORCHELASTIC_ERROR_FILE).
std::string rank_error_path(const std::string& log_dir, int rank);
// Rank `rank`'s log under `log_dir`: "<log_dir>/rank-<rank>.log" (launch_cmd.cc's --overwrite
// clears these two names by pattern).
std::string rank_log_path(const std::string& log_dir, int rank);
// torchrun's contract towards its own caller: a launch that fails leaves the record of the rank it
// blames (`record`, a rank's error file) in the launcher's own TORCHELASTIC_ERROR_FILE, when its
// caller set one (TorchX and Kubeflow read it). Best effort, atomic.
void publish_parent_error(const std::string& record);

}  // namespace dtrain
