#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "util/check.h"
#include "util/fs.h"
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

namespace {

// Refuses (UserError, exit 2) a run folder, or its checkpoints/ folder, this process cannot
// create files in -- a read-only mount, a folder of another user -- before any data loads: a
// resume in place otherwise loaded everything and failed at its first write (exit 1, which a
// restart repeats). Probed by creating and removing a file, which root's permission bypass and
// read-only file systems both answer truthfully.
void require_writable(const std::string& out_dir) {
  for (const fs::path& dir : {fs::path(out_dir), fs::path(out_dir) / "checkpoints"}) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    // (mkstemp: a name of its own, so a probe a killed run left cannot answer EEXIST for EROFS;
    // the temp-file pattern, which remove_orphaned_temp_files clears in checkpoints/)
    std::string probe = (dir / ".write-probe.tmp.XXXXXX").string();
    const int fd = ::mkstemp(probe.data());
    if (fd >= 0) {
      ::close(fd);
      ::unlink(probe.c_str());
      continue;
    }
    const int err = errno;
    // (no file can be opened at all: the process's limit, not the folder)
    if (err == EMFILE || err == ENFILE) {
      struct rlimit nofile {};
      ::getrlimit(RLIMIT_NOFILE, &nofile);
      throw UserError(std::string("cannot open a file: ") + std::strerror(err) +
                      (err == EMFILE ? " (this process's limit, ulimit -n, is " +
                                           std::to_string(nofile.rlim_cur) + "): raise it"
                                     : " (the system's limit): close other programs' files"));
    }
    throw UserError("--out '" + out_dir + "': cannot create files in '" + dir.string() +
                    "': " + std::strerror(err) +
                    ": the run writes its records and checkpoints there; choose another --out" +
                    " (a run resumed from a checkpoint there reads it with --resume PATH)");
  }
}

}  // namespace

OutDirLock::OutDirLock(const std::string& out_dir) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw UserError("--out '" + out_dir + "': cannot create the folder: " + ec.message());
  fd_ = ::open(out_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0)
    throw UserError("--out '" + out_dir + "': cannot open the folder: " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
    require_writable(out_dir);
    return;
  }
  const int err = errno;
  ::close(fd_);
  fd_ = -1;
  if (err == EWOULDBLOCK)
    throw UserError("output folder '" + out_dir +
                    "' is in use by another dtrain run that is writing to it now: wait for it "
                    "to end, or choose another --out");
  spdlog::warn(
      "--out '{}': the folder cannot be locked ({}): nothing stops another run from "
      "writing to it at the same time",
      out_dir, std::strerror(err));
}

bool OutDirLock::inherited(int fd, const std::string& out_dir) {
  struct stat held {
  }, dir{};
  if (::fstat(fd, &held) != 0 || !S_ISDIR(held.st_mode) || ::stat(out_dir.c_str(), &dir) != 0)
    return false;
  // (a second flock through the same open file description keeps its lock; another run's lock
  // on the folder refuses it)
  return held.st_dev == dir.st_dev && held.st_ino == dir.st_ino &&
         ::flock(fd, LOCK_EX | LOCK_NB) == 0;
}

OutDirLock OutDirLock::checkpoints_folder(const std::string& dir, const std::string& what) {
  OutDirLock l;
  l.fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (l.fd_ < 0) return l;
  if (::flock(l.fd_, LOCK_EX | LOCK_NB) == 0) return l;
  const int err = errno;
  ::close(l.fd_);
  l.fd_ = -1;
  if (err == EWOULDBLOCK)
    throw UserError(what +
                    " is in use by another dtrain run that writes its checkpoints there "
                    "now (its checkpoints/ is the same folder, through a symbolic link): "
                    "wait for it to end, or give this run a checkpoints folder of its own");
  return l;
}

OutDirLock::~OutDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

OutDirLock& OutDirLock::operator=(OutDirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

// (run_dir.h) checkpoints/ holds only what dtrain writes there -- `latest`, step-<N>.safetensors
// files and step-<N> folders, the temp files of atomic writes -- or --overwrite, which deletes the
// folder, would take the user's files with it (a consolidated checkpoint saved there, another
// program's).
void check_checkpoints_are_ours(const std::string& out_dir) {
  // (.nfs<hex digits>: NFS's name for a file removed while a reader has it open, on a shared --out)
  static const std::regex ours(
      R"(latest|step-\d{1,18}(\.safetensors)?|\..+\.tmp\.[A-Za-z0-9]{6}|\.nfs[0-9a-fA-F]+)");
  const fs::path ck = fs::path(out_dir) / "checkpoints";
  std::error_code ec;
  // (through a link: a checkpoints/ linked to a larger disk is cleared, not unlinked)
  if (fs::status(ck, ec).type() != fs::file_type::directory) return;
  std::vector<std::string> foreign;
  for (const auto& e : fs::directory_iterator(ck, ec)) {
    const std::string name = e.path().filename().string();
    if (!std::regex_match(name, ours)) {
      foreign.push_back("'" + shown_text(name, 100) + "'");
      continue;
    }
    // (inside a step folder, not through a link: a link is removed, not what it names)
    std::error_code sec;
    if (e.symlink_status(sec).type() != fs::file_type::directory) continue;
    for (const auto& f : fs::directory_iterator(e.path(), sec))
      if (const std::string inner = f.path().filename().string(); !is_step_folder_entry(inner))
        foreign.push_back("'" + shown_text(name + "/" + inner, 100) + "'");
  }
  if (foreign.empty()) return;
  std::sort(foreign.begin(), foreign.end());
  const size_t n = foreign.size();
  if (n > 3) foreign.resize(3);
  throw UserError("--overwrite: '" + ck.string() + "' holds what no dtrain run wrote (" +
                  join(foreign, ", ") + (n > 3 ? " and " + std::to_string(n - 3) + " more" : "") +
                  "), which --overwrite would delete with the folder: move it, or choose "
                  "another --out");
}

namespace {

// Removes `path`; checkpoints/ as a symbolic link to a folder keeps the link and loses what the
// folder holds (linked to another disk, it stays there for the new run: removing the link
// made the new run write beside the old one's files, on the small disk, with the old files kept).
void remove_run_path(const fs::path& path, std::error_code& ec) {
  std::error_code sec;
  // (checkpoints/ only, whose contents check_checkpoints_are_ours holds to what dtrain writes)
  if (path.filename() == "checkpoints" && fs::is_symlink(path, sec) &&
      fs::is_directory(path, sec)) {
    for (const auto& e : fs::directory_iterator(path, ec)) {
      if (fs::remove_all(e.path(), ec); ec) return;
    }
    return;
  }
  fs::remove_all(path, ec);
}

}  // namespace

void clear_run_files(const std::string& out_dir, bool clear_logs) {
  check_checkpoints_are_ours(out_dir);
  std::vector<std::string> names(std::begin(kRunFiles), std::end(kRunFiles));
  names.emplace_back("checkpoints");
  if (clear_logs) names.emplace_back("logs");
  for (const auto& n : names) {
    std::error_code ec;
    remove_run_path(fs::path(out_dir) / n, ec);
    if (!ec) continue;
    // What is left says which file would not go (a folder's error names the folder alone).
    // (error codes throughout: an unreadable subfolder, a likely cause, must not replace this
    // message with the iterator's own)
    std::string left;
    std::error_code le;
    for (fs::recursive_directory_iterator
             it(fs::path(out_dir) / n, fs::directory_options::skip_permission_denied, le),
         end;
         !le && it != end; it.increment(le))
      if (std::error_code de; !it->is_directory(de)) {
        left = it->path().string();
        break;
      }
    throw UserError("--overwrite: cannot remove '" + (fs::path(out_dir) / n).string() +
                    "': " + ec.message() +
                    (left.empty() ? std::string() : " ('" + left + "' is still there)"));
  }
}

namespace {

// The folder's config.json is one a dtrain run wrote (a JSON object of config sections), or none.
// config.json is a common name (a model's, a project's): another program's must not be replaced
// by the run's, nor deleted by --overwrite.
void check_config_json_is_ours(const std::string& out_dir) {
  const fs::path path = fs::path(out_dir) / "config.json";
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  bool ours = false;
  try {
    const std::string text = read_regular_file(path.string(), 16 << 20);
    if (json_depth(text) <= 32) {
      const nlohmann::json j = nlohmann::json::parse(text);
      ours = j.is_object();
      for (const char* section : {"model", "data", "optimizer", "train"})
        ours = ours && j.contains(section) && j[section].is_object();
    }
  } catch (const std::exception&) {
    ours = false;
  }
  if (!ours)
    throw UserError("output folder '" + out_dir +
                    "' holds a config.json that no dtrain run wrote (the run writes its own "
                    "there): move it, or choose another --out");
}

}  // namespace

void check_out_dir_path(const std::string& out_dir) {
  // The folder's path is written into summary.json and manifests, which are JSON: UTF-8 only.
  // Refused here, before training, not when the summary is written.
  if (!valid_utf8(out_dir))
    throw UserError("--out '" + out_dir +
                    "': the path is not valid UTF-8 (summary.json and checkpoint manifests "
                    "record it as JSON text); choose a UTF-8 folder name");
  // The longest path a run makes inside it: a sharded checkpoint's temp file, with a step and a
  // rank of any size ("/checkpoints/step-<20 digits>/.rank-<10 digits>.safetensors.tmp." and
  // mkstemp's 6 characters, 78 bytes; 128 kept). Past the system's limit, the run failed at the
  // first checkpoint whose step number made the path too long (exit 1, and every resume alike).
  constexpr size_t kLongestInside = 128;
  if (out_dir.size() + kLongestInside >= PATH_MAX)
    throw UserError(fmt::format(
        "--out is {} bytes long: the files a run writes inside it (checkpoints/step-N/...) "
        "would pass the system's limit of {} bytes for a path; choose a shorter --out (a path "
        "relative to a nearer working folder, or a symbolic link to the folder)",
        out_dir.size(), PATH_MAX));
  std::error_code ec;
  if (fs::exists(out_dir, ec) && !fs::is_directory(out_dir, ec))
    throw UserError("--out '" + out_dir + "' is a file, not a folder: choose another --out");
  check_config_json_is_ours(out_dir);
}

void prepare_out_dir(const std::string& out_dir, bool resuming, bool overwrite, bool clear_logs,
                     OutDirLock* lock) {
  check_out_dir_path(out_dir);
  if (lock != nullptr) *lock = OutDirLock(out_dir);
  check_config_json_is_ours(out_dir);  // (again under the lock: what it clears is the run's)
  if (overwrite) {
    clear_run_files(out_dir, clear_logs);
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
