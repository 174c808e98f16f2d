#include "dtrain/output_checks.h"

#include <filesystem>
#include <utility>
#include <vector>

#include "util/check.h"
#include "util/fs.h"

namespace dtrain {

namespace fs = std::filesystem;

// An output option's file can be written (checked before the work that produces it).
// Nor may it land in a checkpoint: a checkpoints folder (it holds `latest`) or a sharded
// checkpoint's folder (manifest.json), where it would replace a checkpoint's file or be taken
// for one.
void check_output_file(const std::string& option, const std::string& path) {
  if (const std::string why = output_file_problem(path); !why.empty())
    throw UserError(option + " '" + path + "' " + why);
  std::error_code ec;
  const fs::path parent = fs::absolute(path, ec).parent_path();
  if (fs::exists(parent / "latest", ec) || fs::exists(parent / "manifest.json", ec))
    throw UserError(option + " '" + path + "' is inside a checkpoint folder ('" + parent.string() +
                    "'), whose files it could replace: write it elsewhere");
}

// Whether a and b name one file (hard links and symlinks included; b need not exist yet).
bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::equivalent(a, b, ec)) return true;
  const fs::path ca = fs::weakly_canonical(fs::absolute(a), ec);
  const fs::path cb = fs::weakly_canonical(fs::absolute(b), ec);
  return !ec && ca == cb;
}

// predict's --output must not replace what it reads: its --input rows, the config, or the data
// files the config names (predict reads the training data for its normaliser and classes).
void check_predict_output(const std::string& output, const std::string& input,
                          const std::string& config, const DataConfig& data) {
  std::vector<std::pair<std::string, std::string>> reads = {{"--input", input},
                                                            {"the config", config}};
  for (const auto& [key, files] :
       {std::pair{"data.train", &data.train}, {"data.test", &data.test}}) {
    if (!files->images.empty()) reads.emplace_back(std::string(key) + ".images", files->images);
    if (!files->labels.empty()) reads.emplace_back(std::string(key) + ".labels", files->labels);
    for (const std::string& p : files->path) reads.emplace_back(std::string(key) + ".path", p);
  }
  for (const auto& [what, path] : reads)
    if (same_file(output, path))
      throw UserError("--output '" + output + "' is the same file as " + what + " ('" + path +
                      "'): predict would replace what it reads; write the predictions elsewhere");
  check_output_file("--output", output);
}

// consolidate's -o must not replace a file of a checkpoint: the checkpoint it reads (a shard or
// its manifest) or, next to it in the checkpoints folder, `latest` and the step-<N> entries.
void check_consolidate_output(const std::string& input, const std::string& output) {
  std::error_code ec;
  const fs::path out = fs::weakly_canonical(fs::absolute(output), ec);
  const fs::path in = fs::weakly_canonical(fs::absolute(input), ec);
  const std::string name = out.filename().string();
  const bool checkpoint_entry =
      out.parent_path() == in.parent_path() && (name == "latest" || name.rfind("step-", 0) == 0);
  if (checkpoint_entry || path_is_within(out.string(), in.string()))
    throw UserError("-o '" + output + "' would replace the checkpoint being read ('" + input +
                    "') or an entry of its checkpoints folder (latest, step-<N>): write the "
                    "consolidated checkpoint elsewhere");
  check_output_file("-o", output);  // (after: the message above is the more precise one)
}

}  // namespace dtrain
