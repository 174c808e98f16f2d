#include "dtrain/output_checks.h"

#include <sys/stat.h>

#include <filesystem>
#include <utility>
#include <vector>

#include "checkpoint/safetensors.h"
#include "train/run_dir.h"
#include "util/check.h"
#include "util/fs.h"

namespace dtrain {

namespace fs = std::filesystem;

void check_output_file(const std::string& option, const std::string& path) {
  if (const std::string why = output_file_problem(path); !why.empty())
    throw UserError(option + " '" + path + "' " + why);
  std::error_code ec;
  const fs::path abs = fs::absolute(path, ec);
  const fs::path parent = abs.parent_path();
  if (fs::exists(parent / "latest", ec) || fs::exists(parent / "manifest.json", ec))
    throw UserError(option + " '" + path + "' is inside a checkpoint folder ('" + parent.string() +
                    "'), whose files it could replace: write it elsewhere");
  // A run folder's own files (train/run_dir.h): replacing one breaks resume, plot and verify.
  const std::string name = abs.filename().string();
  bool run_folder = false;
  for (const char* f : kRunFiles) run_folder = run_folder || fs::exists(parent / f, ec);
  for (const char* f : kRunFiles)
    if (run_folder && name == f)
      throw UserError(option + " '" + path + "' would replace the " + f + " of the run in '" +
                      parent.string() + "': write it elsewhere or under another name");
}

// Whether a and b name one file (hard links and symlinks included; b need not exist yet).
bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::equivalent(a, b, ec)) return true;
  const fs::path ca = fs::weakly_canonical(fs::absolute(a), ec);
  const fs::path cb = fs::weakly_canonical(fs::absolute(b), ec);
  return !ec && ca == cb;
}

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
  // An existing file is replaced only if it is a safetensors file (a consolidation written
  // before, say): a mistyped -o must not destroy a config, data or anything else.
  struct stat st {};
  if (::stat(output.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    try {
      read_safetensors_metadata(output);
    } catch (const UserError&) {
      throw UserError("-o '" + output +
                      "' exists and is not a safetensors file: consolidate replaces only a "
                      "safetensors file; remove it first or choose another name");
    }
  }
}

}  // namespace dtrain
