#include "util/fault.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>

#include <unistd.h>

#include "util/check.h"

namespace dtrain {

namespace {

std::vector<std::string> split_on(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  for (;;) {
    const size_t e = s.find(sep, pos);
    out.push_back(s.substr(pos, e == std::string::npos ? std::string::npos : e - pos));
    if (e == std::string::npos) return out;
    pos = e + 1;
  }
}

}  // namespace

std::vector<Fault> parse_faults(const std::string& spec) {
  std::vector<Fault> out;
  if (spec.empty()) return out;
  for (const std::string& entry : split_on(spec, ',')) {
    const auto fields = split_on(entry, ':');
    Fault f;
    f.kind = fields[0];
    if (f.kind != "kill" && f.kind != "kill_in_save" && f.kind != "nan")
      throw UserError("DTRAIN_FAULT: unknown fault '" + f.kind + "' in '" + entry +
                      "' (expected kill, kill_in_save or nan)");
    for (size_t i = 1; i < fields.size(); ++i) {
      const size_t eq = fields[i].find('=');
      const std::string key = fields[i].substr(0, eq);
      const std::string val = eq == std::string::npos ? "" : fields[i].substr(eq + 1);
      int64_t v = 0;
      try {
        size_t used = 0;
        v = std::stoll(val, &used);
        if (used != val.size() || v < 0) throw std::invalid_argument("bad");
      } catch (const std::exception&) {
        throw UserError("DTRAIN_FAULT: '" + fields[i] + "' in '" + entry +
                        "' needs a non-negative integer value");
      }
      if (key == "rank") {
        f.rank = v;
      } else if (key == "step") {
        f.step = v;
      } else {
        throw UserError("DTRAIN_FAULT: unknown field '" + key + "' in '" + entry +
                        "' (expected rank and step)");
      }
    }
    if (f.rank < 0 || f.step < 0)
      throw UserError("DTRAIN_FAULT: '" + entry + "' needs rank=R and step=S");
    out.push_back(f);
  }
  return out;
}

bool fault_due(const std::vector<Fault>& faults, const std::string& kind, int rank, int64_t step) {
  for (const auto& f : faults)
    if (f.kind == kind && f.rank == rank && f.step == step) return true;
  return false;
}

void die_by_fault(const std::string& what) {
  std::fprintf(stderr, "DTRAIN_FAULT: %s: killing this process (SIGKILL)\n", what.c_str());
  std::fflush(stderr);
  ::kill(::getpid(), SIGKILL);
  std::abort();
}

}  // namespace dtrain
