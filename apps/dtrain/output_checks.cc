#include "dtrain/output_checks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "train/run_dir.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/trace.h"

namespace dtrain {

namespace fs = std::filesystem;

namespace {

// Whether `dir` is a checkpoints folder (its `latest` pointer file) or a sharded checkpoint
// (a manifest.json of this format), not any folder with an entry of one of those names (a
// `latest` link to a model version, a web app's manifest.json).
bool is_checkpoint_folder(const fs::path& dir) {
  std::error_code ec;
  if (fs::is_regular_file(dir / "latest", ec) && fs::file_size(dir / "latest", ec) <= 4096)
    return true;
  const fs::path manifest = dir / "manifest.json";
  if (!fs::is_regular_file(manifest, ec)) return false;
  // Its shards beside it, or its format named in it (anywhere: the keys are sorted, and the
  // stored config comes before "format"); a manifest too large to read counts as one.
  for (const auto& ent : fs::directory_iterator(dir, ec))
    if (const std::string n = ent.path().filename().string();
        n.starts_with("rank-") && n.ends_with(".safetensors"))
      return true;
  if (fs::file_size(manifest, ec) > (64u << 20)) return true;
  std::ifstream in(manifest, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.find("\"dtrain-checkpoint\"") != std::string::npos;
}

// Whether `dir` is a dtrain checkpoints folder, its `latest` naming one of its step-<N> entries,
// or a sharded checkpoint's folder: stricter than is_checkpoint_folder, for the folders above an
// --out (another tool's `latest` file up there, DeepSpeed's say, is no reason to refuse it).
bool is_dtrain_checkpoint_folder(const fs::path& dir) {
  if (!latest_step_entry(dir.string()).empty()) return true;
  std::error_code ec;
  return fs::is_regular_file(dir / "manifest.json", ec) && is_checkpoint_folder(dir);
}

// Whether `dir` holds one of a run's own files (train/run_dir.h's kRunFiles).
bool is_run_folder(const fs::path& dir) {
  std::error_code ec;
  for (const char* f : kRunFiles)
    if (fs::exists(dir / f, ec)) return true;
  return false;
}

// The checks of check_output_file on one spelling of the output: `abs`, absolute; `shown`, the
// output as messages name it.
void check_output_place(const std::string& shown, const fs::path& abs) {
  const fs::path parent = abs.parent_path();
  if (is_checkpoint_folder(parent))
    throw UserError(shown + " is inside a checkpoint folder ('" + parent.string() +
                    "'), whose files it could replace: write it elsewhere");
  // A run folder's own files (train/run_dir.h): replacing one breaks resume, plot and verify.
  const std::string name = abs.filename().string();
  const bool run_folder = is_run_folder(parent);
  for (const char* f : kRunFiles)
    if (run_folder && name == f)
      throw UserError(shown + " would replace the " + f + " of the run in '" + parent.string() +
                      "': write it elsewhere or under another name");
}

}  // namespace

void check_out_folder(const std::string& option, const std::string& out_dir) {
  std::error_code ec;
  const fs::path abs = fs::weakly_canonical(fs::absolute(out_dir, ec), ec);
  if (ec) return;  // (unresolvable: the run's own checks name the problem)
  for (fs::path p = abs; !p.empty(); p = p.parent_path()) {
    if (is_dtrain_checkpoint_folder(p))
      throw UserError(option + " '" + out_dir + "' is " + (p == abs ? "" : "inside ") +
                      "a checkpoint folder ('" + p.string() +
                      "'), whose run prunes and replaces what is there: give another folder");
    if (p == p.root_path()) break;
  }
}

void check_output_file(const std::string& option, const std::string& path) {
  if (const std::string why = output_file_problem(path); !why.empty())
    throw UserError(option + " '" + path + "' " + why);
  std::error_code ec;
  const fs::path abs = fs::absolute(path, ec);
  check_output_place(option + " '" + path + "'", abs);
  // The writes follow a symlink to its target (util/fs.h's output_target): the file replaced is
  // the target's, which the same rules protect.
  const fs::path target = output_file_target(path);
  if (target != abs.lexically_normal())
    check_output_place(option + " '" + path + "' (a link to '" + target.string() + "')", target);
}

// Whether a and b name one file (hard links and symlinks included; b need not exist yet).
bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::equivalent(a, b, ec)) return true;
  const fs::path ca = fs::weakly_canonical(fs::absolute(a), ec);
  const fs::path cb = fs::weakly_canonical(fs::absolute(b), ec);
  return !ec && ca == cb;
}

namespace {

// The files a command reads that an output must not be: the config and the data files it names,
// as (what, path) for messages.
std::vector<std::pair<std::string, std::string>> config_inputs(const std::string& config,
                                                               const DataConfig& data) {
  std::vector<std::pair<std::string, std::string>> reads = {{"the config", config}};
  for (const auto& [key, files] :
       {std::pair{"data.train", &data.train}, {"data.test", &data.test}}) {
    if (!files->images.empty()) reads.emplace_back(std::string(key) + ".images", files->images);
    if (!files->labels.empty()) reads.emplace_back(std::string(key) + ".labels", files->labels);
    for (const std::string& p : files->path) reads.emplace_back(std::string(key) + ".path", p);
  }
  return reads;
}

void check_not_read(const std::string& option, const std::string& output,
                    const std::vector<std::pair<std::string, std::string>>& reads,
                    const std::string& command) {
  for (const auto& [what, path] : reads)
    if (same_file(output, path))
      throw UserError(option + " '" + output + "' is the same file as " + what + " ('" + path +
                      "'): " + command + " would replace what it reads; write it elsewhere");
}

// Whether path is an existing regular file that reads as safetensors (header and metadata).
// Neither output check may replace the other kind of file: predict's CSV must not replace
// weights, consolidate's weights must not replace anything but weights.
bool is_existing_safetensors(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  try {
    read_safetensors_metadata(path);
  } catch (const UserError&) {
    return false;
  }
  return true;
}

}  // namespace

void check_predict_output(const std::string& output, const std::string& input,
                          const std::string& checkpoint, const std::string& config,
                          const DataConfig& data) {
  auto reads = config_inputs(config, data);
  // (through /dev/stdin and /dev/stdout: the files a shell redirected them to, if any)
  reads.insert(reads.begin(), input == "-"
                                  ? std::pair<std::string, std::string>{"--input -", "/dev/stdin"}
                                  : std::pair<std::string, std::string>{"--input", input});
  reads.emplace_back("--checkpoint", checkpoint);
  if (output.empty()) {
    struct stat st {};
    // Standard output redirected to a file: not one predict reads (`1<> rows.csv`).
    if (::fstat(STDOUT_FILENO, &st) == 0 && S_ISREG(st.st_mode))
      check_not_read("standard output", "/dev/stdout", reads, "predict");
    return;
  }
  check_not_read("--output", output, reads, "predict");
  check_output_file("--output", output);  // (a checkpoint folder's files among others)
  // Predictions are CSV: an existing safetensors file (another checkpoint, a consolidated model)
  // is no earlier output of predict, and replacing it would lose weights.
  if (is_existing_safetensors(output))
    throw UserError("--output '" + output +
                    "' is a safetensors file (a checkpoint or model) that the predictions "
                    "(CSV) would replace: remove it first or choose another name");
}

void check_trace_output(const std::string& trace, const std::string& out_dir,
                        const std::string& config, const std::string& resume,
                        const DataConfig& data) {
  auto reads = config_inputs(config, data);
  if (!resume.empty() && resume != "auto") reads.emplace_back("--resume", resume);
  check_not_read("--trace", trace, reads, "the run");
  std::error_code ec;
  // (weakly_canonical keeps a trailing '/' of a path that does not exist: dropped.)
  const auto canonical = [&](const std::string& p) {
    fs::path c = fs::weakly_canonical(fs::absolute(p), ec);
    if (c.filename().empty()) c = c.parent_path();
    return c;
  };
  const fs::path t = canonical(trace);
  const fs::path out = canonical(out_dir);
  if (t == out)
    throw UserError("--trace '" + trace + "' is the output folder (--out): give a file name");
  // The run's own files, whether the folder holds them yet or not.
  for (const char* f : kRunFiles)
    if (t.parent_path() == out && t.filename() == f)
      throw UserError("--trace '" + trace + "' would replace the run's " + f +
                      ": write the trace elsewhere or under another name");
  if (path_is_within(t.string(), (out / "checkpoints").string()))
    throw UserError("--trace '" + trace +
                    "' is inside the run's checkpoints folder: write it "
                    "elsewhere");
  // The ranks' parts, written next to FILE and deleted by the merge (util/trace.h): an existing
  // file of such a name must be a trace (a part a killed run left), never a config or data.
  for (const auto& e : fs::directory_iterator(t.parent_path(), ec)) {
    const std::string name = e.path().filename().string();
    if (is_rank_trace_name(t.string(), name) && !is_dtrain_trace_file(e.path().string()))
      throw UserError("--trace '" + trace + "': the run writes each rank's part next to it, as '" +
                      name + "' among others, and that file exists and is not a dtrain trace " +
                      "(the run would replace it, then delete it): move it, or give --trace " +
                      "another name");
  }
  // Directly in an --out the run is about to create: its folder is checked when it is created.
  if (t.parent_path() == out && !fs::exists(out, ec)) return;
  check_output_file("--trace", trace);
  // The ranks' parts are longer names than FILE (rank numbers up to 1023, the transports' limit):
  // one the file system refuses failed the run after training.
  for (const std::string& part :
       {rank_trace_path(trace, 1023), failed_rank_trace_path(trace, 1023)})
    if (const std::string why = output_file_problem(part); !why.empty())
      throw UserError("--trace '" + trace + "': each rank writes its part next to it, as '" +
                      fs::path(part).filename().string() + "', which " + why +
                      ": give a shorter name");
  // A FIFO or device: the trace is merged into it only after training, where a FIFO nobody reads
  // blocked the finished run without a word (and its ranks' parts cannot go next to a device).
  struct stat st {};
  if (::stat(trace.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw UserError("--trace '" + trace +
                    "' is not a regular file (a FIFO or a device): a trace is a file, merged "
                    "from the ranks' parts written next to it; give a file name");
  // An existing file is replaced only if it is a trace (an earlier run's) or empty (mktemp's):
  // a mistyped --trace must not destroy a checkpoint, a config or anything else.
  if (::stat(trace.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
      !is_dtrain_trace_file(trace))
    throw UserError("--trace '" + trace +
                    "' exists and is not a dtrain trace: the run replaces only an earlier trace; "
                    "remove it first or choose another name");
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
  // An existing file is replaced only if it is a dtrain checkpoint file (a consolidation
  // written before, say) or empty (mktemp's): a mistyped -o must not destroy a config, data, or
  // another program's weights (a PyTorch model's safetensors file was replaced).
  struct stat st {};
  if (::stat(output.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    bool ours = false;
    try {
      const auto md = read_safetensors_metadata(output);
      const auto it = md.find("format");
      ours = it != md.end() && it->second == "dtrain-checkpoint";
    } catch (const UserError&) {
    }
    if (!ours)
      throw UserError("-o '" + output +
                      "' exists and is not a dtrain checkpoint file (another program's weights, "
                      "or no safetensors file at all): consolidate replaces only a checkpoint "
                      "file; remove it first or choose another name");
  }
}

void check_plot_output(const std::string& output) {
  check_output_file("-o", output);
  struct stat st {};
  if (::stat(output.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) return;
  std::string head(4096, '\0');
  std::ifstream in(output, std::ios::binary);
  if (!in)
    throw UserError("-o '" + output +
                    "' exists and cannot be read, so plot cannot tell whether "
                    "it is an image it may replace: remove it first or choose another name");
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(std::max<std::streamsize>(0, in.gcount())));
  // PNG by its signature; SVG: markup (after a BOM and blanks) with an <svg element near the
  // start (after an XML declaration, comments or a DOCTYPE), not any XML file.
  const bool png = head.rfind("\x89PNG\r\n\x1a\n", 0) == 0;
  size_t at = head.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;
  while (at < head.size() && std::isspace(static_cast<unsigned char>(head[at]))) ++at;
  const bool svg = head.compare(at, 1, "<") == 0 && head.find("<svg", at) != std::string::npos;
  if (!png && !svg)
    throw UserError("-o '" + output +
                    "' exists and is not an SVG or PNG image: plot replaces only an image; "
                    "remove it first or choose another name");
}

}  // namespace dtrain
