#pragma once
// torchrun's error-file contract: a launcher gives each rank TORCHELASTIC_ERROR_FILE, and a rank
// that fails writes its error there as JSON, so the launcher can name the failure's cause rather
// than whichever rank it happened to reap first. dtrain's ranks write it under any launcher that
// sets the variable (torchrun shows it in its failure summary); `dtrain launch` sets it and reads
// it back. The record is torchelastic's ({"message": {"message", "extraInfo": {"timestamp"}}})
// plus a "dtrain" object: the rank, its exit code, and the rank its error names as the cause.

#include <optional>
#include <string>

namespace dtrain {

inline constexpr const char* kErrorFileEnv = "TORCHELASTIC_ERROR_FILE";

// The rank that an error message of rank `self` names as the cause of its failure -- a peer's
// abort relayed ("rank R aborted: ..."; the innermost when relays nest), a lost or closed
// connection, a missing heartbeat, a connect or receive that timed out on rank R, a shard write
// rank R could not make -- or -1 when it names none (or only `self`): its own failure.
int rank_named_as_cause(const std::string& message, int self);

// Writes the record for `message` atomically (temp file, rename); best effort: a failure to write
// it is ignored (the error itself is on stderr already).
void write_error_file(const std::string& path, const std::string& message, int exit_code, int rank);

struct RankErrorRecord {
  std::string message;
  int exit_code = 1;
  int caused_by = -1;  // rank_named_as_cause of the message, as the rank judged it
};
// nullopt when the file is missing or not such a record.
std::optional<RankErrorRecord> read_error_file(const std::string& path);

}  // namespace dtrain
