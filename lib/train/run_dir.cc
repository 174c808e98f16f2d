#include "train/run_dir.h"

#include "util/strings.h"

#include <filesystem>
#include <system_error>

#include "util/check.h"
#include "util/strings.h"

namespace dtrain {

namespace fs = std::filesystem;

std::vector<std::string> run_files_in(const std::string& out_dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const char* f : {"summary.json", "metrics.jsonl"})
    if (fs::exists(fs::path(out_dir) / f, ec)) found.emplace_back(f);
  const fs::path ck = fs::path(out_dir) / "checkpoints";
  if (fs::is_directory(ck, ec) && !fs::is_empty(ck, ec)) found.emplace_back("checkpoints/");
  return found;
}

void prepare_out_dir(const std::string& out_dir, bool resuming, bool overwrite, bool clear_logs) {
  // The folder's path is written into summary.json and manifests, which are JSON: UTF-8 only.
  // Refused here, before training, not when the summary is written.
  if (!valid_utf8(out_dir))
    throw UserError("--out '" + out_dir +
                    "': the path is not valid UTF-8 (summary.json and checkpoint manifests "
                    "record it as JSON text); choose a UTF-8 folder name");
  std::error_code ec;
  if (fs::exists(out_dir, ec) && !fs::is_directory(out_dir, ec))
    throw UserError("--out '" + out_dir + "' is a file, not a folder: choose another --out");
  if (overwrite) {
    std::vector<std::string> names = {"summary.json", "metrics.jsonl", "config.json",
                                      "checkpoints"};
    if (clear_logs) names.emplace_back("logs");
    for (const auto& n : names) {
      fs::remove_all(fs::path(out_dir) / n, ec);
      if (ec)
        throw UserError("--overwrite: cannot remove '" + (fs::path(out_dir) / n).string() +
                        "': " + ec.message());
    }
    return;
  }
  if (resuming) return;
  const std::vector<std::string> found = run_files_in(out_dir);
  if (found.empty()) return;
  throw UserError("output folder '" + out_dir + "' already holds a run (" + join(found, ", ") +
                  "): continue it with --resume auto, start over with --overwrite (deletes "
                  "them first), or choose another --out");
}

}  // namespace dtrain
