// A run's checkpoints folder (RUN/checkpoints): its step entries (step-<N>.safetensors files and
// step-<N> sharded folders), the `latest` pointer, retention (keep_last), the clean-up of
// interrupted saves, and what --resume names resolved to one checkpoint. The files themselves are
// written and read by checkpoint.cc and sharded_read.cc.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <regex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_internal.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/strings.h"
#include "util/warn_once.h"

namespace dtrain {

namespace fs = std::filesystem;
using checkpoint_internal::is_sharded_dir;
using checkpoint_internal::kManifest;

std::string checkpoint_file_name(int64_t step) {
  return "step-" + std::to_string(step) + ".safetensors";
}

namespace {

// A checkpoints folder's step entries: step-<N>.safetensors files and step-<N> sharded folders;
// group 1 is N (at most 18 digits, so std::stoll cannot overflow), group 2 the file extension.
// What a `latest` file may hold at most: one checkpoint's name and a newline.
constexpr uintmax_t kMaxLatestBytes = 4096;

// The checkpoint name a `latest` file holds, without its trailing newline (or spaces).
std::string read_latest_name(const fs::path& latest) {
  std::string name = read_regular_file(latest.string(), kMaxLatestBytes);
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' '))
    name.pop_back();
  return name;
}

const std::regex& step_entry_re() {
  static const std::regex re(R"(step-(\d{1,18})(\.safetensors)?)");
  return re;
}

}  // namespace

int64_t remove_orphaned_temp_files(const std::string& dir, bool include_step_folders) {
  static const std::regex tmp_re(R"(\..+\.tmp\.[A-Za-z0-9]{6})");
  int64_t removed = 0;
  std::error_code ec;
  auto sweep = [&](const fs::path& d) {
    for (const auto& ent : fs::directory_iterator(d, ec)) {
      const std::string name = ent.path().filename().string();
      std::error_code rec;
      if (std::regex_match(name, tmp_re) && ent.is_regular_file(rec) && fs::remove(ent.path(), rec))
        ++removed;
    }
  };
  sweep(dir);
  if (include_step_folders)
    for (const auto& ent : fs::directory_iterator(dir, ec))
      if (const std::string name = ent.path().filename().string(); ent.is_directory(ec)) {
        std::smatch m;
        if (std::regex_match(name, m, step_entry_re()) && !m[2].matched) sweep(ent.path());
      }
  return removed;
}

bool is_step_folder_entry(const std::string& name) {
  // (.nfs<hex digits>: NFS's name for a file removed while a reader has it open, on a shared --out)
  static const std::regex shard(
      R"(manifest\.json|rank-\d{1,9}\.safetensors|\..+\.tmp\.[A-Za-z0-9]{6}|\.nfs[0-9a-fA-F]+)");
  return std::regex_match(name, shard);
}

namespace {

// Whether step folder `p` holds nothing but what a sharded save writes there
// (is_step_folder_entry, as files): a folder holding anything else is a user's (weights exported
// into checkpoints/step-500/), never removed as a failed save's remains.
bool holds_only_shards(const fs::path& p) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(p, ec)) {
    std::error_code rec;
    if (!is_step_folder_entry(e.path().filename().string()) || !e.is_regular_file(rec))
      return false;
  }
  return !ec;
}

}  // namespace

int64_t remove_incomplete_checkpoints(const std::string& dir) {
  int64_t removed = remove_orphaned_temp_files(dir, /*include_step_folders=*/true);
  std::error_code ec;
  std::vector<fs::path> incomplete;
  // (never the one `latest` names: a manifest another machine wrote moments ago may not show
  // here yet, on a file system that caches a file's absence)
  const std::string named = latest_step_entry(dir);
  for (const auto& ent : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = ent.path().filename().string();
    std::error_code rec;
    if (std::regex_match(name, m, step_entry_re()) && !m[2].matched && name != named &&
        ent.is_directory(rec) && !ent.is_symlink(rec) && !is_sharded_dir(ent.path()) &&
        holds_only_shards(ent.path()))
      incomplete.push_back(ent.path());
  }
  for (const fs::path& p : incomplete) {
    std::error_code rec;
    if (fs::remove_all(p, rec) > 0) ++removed;
  }
  return removed;
}

void release_latest(const std::string& dir, const std::string& name) {
  const fs::path latest = fs::path(dir) / "latest";
  std::error_code ec;
  if (!fs::is_regular_file(latest, ec) || fs::file_size(latest, ec) > kMaxLatestBytes) return;
  if (read_latest_name(latest) != name) return;
  std::smatch m;
  const std::regex& re = step_entry_re();
  const int64_t step = std::regex_match(name, m, re) ? std::stoll(m[1].str()) : INT64_MAX;
  int64_t best = -1;
  std::string best_name;
  for (const auto& ent : fs::directory_iterator(dir, ec)) {
    const std::string n = ent.path().filename().string();
    if (!std::regex_match(n, m, re)) continue;
    const int64_t s = std::stoll(m[1].str());
    const bool complete =
        m[2].matched ? fs::is_regular_file(ent.path(), ec) : is_sharded_dir(ent.path());
    if (s < step && s > best && complete) {
      best = s;
      best_name = n;
    }
  }
  if (best >= 0)
    write_file_atomic(latest.string(), best_name + "\n", Links::kReplace);
  else
    fs::remove(latest, ec);
}

void adopt_latest(const std::string& dir, const std::string& resumed) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(resumed), ec);
  if (r.filename().empty()) r = r.parent_path();  // a sharded folder given with a trailing '/'
  const fs::path d = fs::weakly_canonical(fs::absolute(dir), ec);
  if (ec || r.parent_path() != d) return;
  const std::string name = r.filename().string();
  if (!std::regex_match(name, step_entry_re())) return;
  const fs::path latest = d / "latest";
  if (fs::is_regular_file(latest, ec) && fs::file_size(latest, ec) <= kMaxLatestBytes &&
      read_latest_name(latest) == name)
    return;
  write_file_atomic(latest.string(), name + "\n", Links::kReplace);
}

std::string latest_step_entry(const std::string& dir) {
  const fs::path latest = fs::path(dir) / "latest";
  std::error_code ec;
  if (!fs::is_regular_file(latest, ec) || fs::file_size(latest, ec) > kMaxLatestBytes) return "";
  try {
    const std::string name = read_latest_name(latest);
    return std::regex_match(name, step_entry_re()) && fs::exists(fs::path(dir) / name, ec) ? name
                                                                                           : "";
  } catch (const std::exception&) {  // (unreadable)
    return "";
  }
}

void remove_checkpoint(const std::string& path, std::error_code& ec) {
  if (fs::symlink_status(path, ec).type() == fs::file_type::directory) {
    const fs::path manifest = fs::path(path) / kManifest;
    if (fs::remove(manifest, ec)) sync_directory(path);
    if (ec) return;
  }
  ec.clear();
  fs::remove_all(path, ec);
}

void commit_checkpoint(const std::string& dir, const std::string& file_name, int64_t keep_last) {
  DT_CHECK_GE(keep_last, 1);
  write_file_atomic((fs::path(dir) / "latest").string(), file_name + "\n", Links::kReplace);
  remove_orphaned_temp_files(dir, /*include_step_folders=*/false);
  const std::regex& re = step_entry_re();
  std::vector<std::pair<int64_t, fs::path>> found;
  for (const auto& ent : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = ent.path().filename().string();
    std::error_code ec;
    // (a step folder holding anything but shards is a user's, not a checkpoint: never pruned)
    if (std::regex_match(name, m, re) &&
        (m[2].matched || !ent.is_directory(ec) || holds_only_shards(ent.path())))
      found.emplace_back(std::stoll(m[1].str()), ent.path());
  }
  // Oldest first. Steps above the one committed now are from a timeline this run abandoned (it
  // resumed from an earlier checkpoint): they count as older than every step of this one, so
  // keep_last removes them first instead of keeping them forever.
  std::smatch cur;
  const int64_t now = std::regex_match(file_name, cur, re) ? std::stoll(cur[1].str()) : INT64_MAX;
  // The same step in the other form (a step-<N> folder beside the step-<N>.safetensors committed
  // now, or the reverse) is the abandoned timeline's: superseded, and it would make the step
  // ambiguous for a folder whose `latest` is lost. Removed whatever keep_last says.
  std::erase_if(found, [&](const auto& e) {
    if (e.first != now || e.second.filename() == file_name) return false;
    std::error_code ec;
    remove_checkpoint(e.second.string(), ec);
    return true;
  });
  // A step folder without its manifest (a save that was interrupted) is no checkpoint: it counts
  // as older than every complete one, so it never takes a place keep_last promises to a step that
  // can be resumed.
  // (each entry's rank computed once: the sort's comparisons then read no files)
  std::vector<std::tuple<bool, int64_t, fs::path>> ranked;
  for (auto& [step, path] : found) {
    std::error_code ec;
    const bool complete = fs::is_regular_file(path, ec) || is_sharded_dir(path);
    ranked.emplace_back(complete && step <= now, step, std::move(path));
  }
  std::sort(ranked.begin(), ranked.end());
  found.clear();
  for (auto& [kept, step, path] : ranked) found.emplace_back(step, std::move(path));
  const int64_t excess = static_cast<int64_t>(found.size()) - keep_last;
  for (int64_t i = 0; i < excess; ++i) {
    if (found[static_cast<size_t>(i)].second.filename() == file_name) continue;
    std::error_code ec;
    remove_checkpoint(found[static_cast<size_t>(i)].second.string(), ec);
  }
}

namespace {

// The checkpoint a `latest` pointer file names, in the same folder.
std::string follow_latest(const fs::path& latest) {
  std::error_code ec;
  // A FIFO or device would block or never end: only a small regular file is read.
  if (const std::string why = input_file_problem(latest.string()); !why.empty())
    throw UserError("'" + latest.string() + "' " + why +
                    " (a checkpoints folder's latest file names its newest checkpoint)");
  if (fs::file_size(latest, ec) > kMaxLatestBytes)
    throw UserError("'" + latest.string() + "' is " + std::to_string(fs::file_size(latest, ec)) +
                    " bytes: not a latest file, which names one checkpoint");
  const std::string name = read_latest_name(latest);
  // (a control character: "step-40.safetensors\0junk" opened step-40, summary.json had it whole)
  const auto control = [](char c) { return static_cast<unsigned char>(c) < 0x20; };
  // ("latest" names the file itself: it was read as a checkpoint, "not a safetensors file")
  if (name.empty() || name == "latest" || name.find('/') != std::string::npos ||
      std::any_of(name.begin(), name.end(), control))
    throw UserError("'" + latest.string() + "' does not name a checkpoint file (it holds '" +
                    shown_text(name, 200) + "')");
  const fs::path file = latest.parent_path() / name;
  if (!fs::is_regular_file(file, ec) && !is_sharded_dir(file))
    throw UserError("'" + latest.string() + "' names '" + shown_text(name, 200) + "', " +
                    (fs::is_directory(file, ec)
                         ? "a folder without manifest.json (an incomplete sharded checkpoint: the "
                           "save was interrupted)"
                         : "which does not exist"));
  return file.string();
}

// The highest-numbered complete checkpoint in `dir` (a step-<N>.safetensors file, written
// atomically, or a step-<N> folder with its manifest, written last), or "". For a folder whose
// `latest` was lost: the checkpoints are still there and --resume auto must not start over.
std::string newest_complete_step(const fs::path& dir) {
  const std::regex& re = step_entry_re();
  std::error_code ec;
  int64_t best = -1;
  std::string found;
  for (const auto& ent : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = ent.path().filename().string();
    if (!std::regex_match(name, m, re)) continue;
    const bool complete =
        m[2].matched ? fs::is_regular_file(ent.path(), ec) : is_sharded_dir(ent.path());
    const int64_t step = std::stoll(m[1].str());
    if (complete && step > best) {
      best = step;
      found = ent.path().string();
    }
  }
  return found;
}

}  // namespace

std::string resolve_checkpoint(const std::string& path, bool allow_missing) {
  std::error_code ec;
  fs::path p(path);
  // A `latest` file given by hand (tab completion offers it) is followed, not parsed as
  // safetensors: it holds a file name, never a checkpoint.
  if (p.filename() == "latest" && fs::is_regular_file(p, ec)) return follow_latest(p);
  // A file inside a sharded checkpoint (its manifest or a rank's shard) means that checkpoint.
  static const std::regex shard_re(R"(rank-\d+\.safetensors)");
  const std::string fname = p.filename().string();
  if ((fname == kManifest || std::regex_match(fname, shard_re)) && is_sharded_dir(p.parent_path()))
    return p.parent_path().string();
  if (fs::is_regular_file(p, ec) || is_sharded_dir(p)) return p.string();
  if (fs::is_directory(p, ec)) {
    fs::path latest = p / "latest";
    if (!fs::exists(latest, ec) && fs::is_directory(p / "checkpoints", ec))
      latest = p / "checkpoints" / "latest";
    if (fs::exists(latest, ec)) return follow_latest(latest);
    if (const std::string newest = newest_complete_step(latest.parent_path()); !newest.empty()) {
      // (once: a command resolves its checkpoint several times, checked first and loaded later)
      warn_once(fmt::format("no 'latest' file in '{}': using its newest complete checkpoint '{}'",
                            latest.parent_path().string(), newest));
      return newest;
    }
    if (fs::exists(p / shard_file_name(0), ec) ||
        std::regex_match(p.filename().string(), step_entry_re()))
      throw UserError("checkpoint '" + path +
                      "' is a folder without manifest.json (an incomplete sharded checkpoint: "
                      "the save was interrupted)");
    if (allow_missing) return "";
    throw UserError("no checkpoint in '" + path + "' (no latest file)");
  }
  if (fs::exists(p, ec))
    throw UserError("checkpoint '" + path + "' is not a regular file or a checkpoint folder");
  if (allow_missing) return "";
  throw UserError("checkpoint '" + path + "' does not exist");
}

}  // namespace dtrain
