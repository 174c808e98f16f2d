#include "util/fault.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include <unistd.h>

#include "util/check.h"
#include "util/strings.h"

namespace dtrain {

namespace {

// The value of a whole non-negative decimal integer (digits only), else -1.
int64_t non_negative(const std::string& s) {
  try {
    size_t used = 0;
    const long long v = std::stoll(s, &used);
    if (used == s.size() && v >= 0 && s.find_first_not_of("0123456789") == std::string::npos)
      return v;
  } catch (const std::exception&) {
  }
  return -1;
}

// The milliseconds of every `kind` fault of this rank (at point *at, when given), summed.
int64_t sum_ms(const std::vector<Fault>& faults, const char* kind, int rank,
               const std::string* at) {
  int64_t ms = 0;
  for (const auto& f : faults)
    if (f.kind == kind && f.rank == rank && (at == nullptr || f.at == *at)) ms += f.ms;
  return ms;
}

}  // namespace

std::vector<Fault> parse_faults(const std::string& spec, int64_t attempt) {
  std::vector<Fault> out;
  if (spec.empty()) return out;
  for (const std::string& entry : split(spec, ',')) {
    const auto fields = split(entry, ':');
    Fault f;
    f.kind = fields[0];
    const bool stall = f.kind == "stall_in_connect";
    const bool timed = f.kind == "delay" || f.kind == "slow_save" || f.kind == "slow_load" || stall;
    const bool placed = f.kind == "kill_in_connect" || stall;
    if (f.kind != "kill" && f.kind != "kill_in_save" && f.kind != "drop" && f.kind != "nan" &&
        f.kind != "grad_scale" && f.kind != "fail_in_save" && !timed && !placed)
      throw UserError(
          "DTRAIN_FAULT: unknown fault '" + f.kind + "' in '" + entry +
          "' (expected kill, kill_in_save, fail_in_save, slow_save, slow_load, drop, delay, nan, "
          "grad_scale, kill_in_connect or stall_in_connect)");
    const char* fields_wanted = stall    ? "rank, at and ms"
                                : timed  ? "rank and ms"
                                : placed ? "rank and at"
                                         : "rank and step";
    std::vector<std::string> seen;
    for (size_t i = 1; i < fields.size(); ++i) {
      const size_t eq = fields[i].find('=');
      const std::string key = fields[i].substr(0, eq);
      if (std::find(seen.begin(), seen.end(), key) != seen.end())
        throw UserError("DTRAIN_FAULT: '" + key + "' is given twice in '" + entry + "'");
      seen.push_back(key);
      const std::string val = eq == std::string::npos ? "" : fields[i].substr(eq + 1);
      if (key == "at" && placed) {
        if (val != "joined" && val != "channels" && val != "streams")
          throw UserError("DTRAIN_FAULT: '" + fields[i] + "' in '" + entry +
                          "': expected at=joined, at=channels or at=streams");
        f.at = val;
        continue;
      }
      const int64_t v = non_negative(val);
      if (v < 0)
        throw UserError("DTRAIN_FAULT: '" + fields[i] + "' in '" + entry +
                        "' needs a non-negative integer value");
      if (key == "rank") {
        f.rank = v;
      } else if (key == "step" && !timed && !placed) {
        if (v == 0)
          throw UserError("DTRAIN_FAULT: '" + fields[i] + "' in '" + entry +
                          "': steps count from 1 (step=0 would never fire)");
        f.step = v;
      } else if (key == "ms" && timed) {
        f.ms = v;
      } else {
        throw UserError("DTRAIN_FAULT: unknown field '" + key + "' in '" + entry + "' (expected " +
                        fields_wanted + ")");
      }
    }
    if (f.rank < 0 || (timed && f.ms < 0) || (placed && f.at.empty()) ||
        (!timed && !placed && f.step < 0))
      throw UserError("DTRAIN_FAULT: '" + entry + "' needs " +
                      (stall    ? "rank=R, at=joined|channels|streams and ms=M"
                       : timed  ? "rank=R and ms=M"
                       : placed ? "rank=R and at=joined|channels|streams"
                                : "rank=R and step=S"));
    out.push_back(f);
  }
  if (attempt > 0) out.clear();  // checked, but a restart runs without them
  return out;
}

void check_fault_ranks(const std::vector<Fault>& faults, int64_t world_size) {
  for (const Fault& f : faults)
    if (f.rank >= world_size)
      throw UserError("DTRAIN_FAULT: the " + f.kind + " fault names rank " +
                      std::to_string(f.rank) + ", but the run has " + std::to_string(world_size) +
                      " rank(s), 0.." + std::to_string(world_size - 1) + ": it would never fire");
}

std::string fault_past(const std::vector<Fault>& faults, int64_t steps) {
  for (const Fault& f : faults)
    if (f.step > steps)
      return "DTRAIN_FAULT: the " + f.kind + " fault is at step " + std::to_string(f.step) +
             ", past the last of the " + std::to_string(steps) + " step(s): it would never fire";
  return "";
}

std::string fault_unfired_save(const std::vector<Fault>& faults, bool one_file) {
  if (!one_file) return "";
  for (const Fault& f : faults)
    if ((f.kind == "kill_in_save" || f.kind == "fail_in_save" || f.kind == "slow_save") &&
        f.rank != 0)
      return "DTRAIN_FAULT: the " + f.kind + " fault names rank " + std::to_string(f.rank) +
             ", but this run's checkpoints are one file, which rank 0 writes alone (no sharded "
             "strategy, pipeline or tensor parallelism): it would never fire; name rank 0";
  return "";
}

int64_t parse_restart_count(const char* value, const char* name) {
  if (value == nullptr) return 0;
  const int64_t v = non_negative(value);
  if (v < 0)
    throw UserError(std::string(name) + "='" + value +
                    "': expected a non-negative integer (the launcher's restart attempt)");
  return v;
}

bool fault_due(const std::vector<Fault>& faults, const std::string& kind, int rank, int64_t step) {
  for (const auto& f : faults)
    if (f.kind == kind && f.rank == rank && f.step == step) return true;
  return false;
}

bool fault_due_at(const std::vector<Fault>& faults, const std::string& kind, int rank,
                  const std::string& at) {
  for (const auto& f : faults)
    if (f.kind == kind && f.rank == rank && f.at == at) return true;
  return false;
}

int64_t fault_stall_ms(const std::vector<Fault>& faults, int rank, const std::string& at) {
  return sum_ms(faults, "stall_in_connect", rank, &at);
}

int64_t fault_delay_ms(const std::vector<Fault>& faults, int rank) {
  return sum_ms(faults, "delay", rank, nullptr);
}

int64_t fault_save_delay_ms(const std::vector<Fault>& faults, int rank) {
  return sum_ms(faults, "slow_save", rank, nullptr);
}

int64_t fault_load_delay_ms(const std::vector<Fault>& faults, int rank) {
  return sum_ms(faults, "slow_load", rank, nullptr);
}

void die_by_fault(const std::string& what) {
  std::fprintf(stderr, "DTRAIN_FAULT: %s: killing this process (SIGKILL)\n", what.c_str());
  std::fflush(stderr);
  ::kill(::getpid(), SIGKILL);
  std::abort();
}

}  // namespace dtrain
