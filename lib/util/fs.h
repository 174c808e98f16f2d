// File helpers. write_file_atomic is the only way dtrain writes persistent files: the bytes go to
// a temp file in the same folder, are fsynced, renamed over the target, and the folder is fsynced,
// so a reader (or a crash) sees either the old file or the complete new one.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace dtrain {

// Throws UserError (naming the path and errno text) when the file cannot be read.
std::string read_file(const std::string& path);
// read_file for a file that must be a regular one of at most max_bytes (a checkpoint's manifest,
// a `latest` file): a FIFO, device or folder there is refused at once (UserError) instead of
// blocking or reading without end.
std::string read_regular_file(const std::string& path, uint64_t max_bytes);

// Why `path` cannot be read as an input file, or "" when it is a regular file this process can
// open for reading: "does not exist", "is a directory, not a file", "is not a regular file",
// "cannot be opened: Permission denied". Opens (and closes) the file, so the answer holds for
// this process's privileges, root included. Reads nothing.
std::string input_file_problem(const std::string& path);

// What names a file whatever path spells it: its device and inode, or the path itself when it
// cannot be stat'ed (a missing file: whoever reads it names the problem). Two paths with equal
// identities are the same file (a symlink, `./a` and `a`, a hard link).
std::string file_identity(const std::string& path);

// What a write does with a `path` that is a symbolic link.
enum class Links {
  // Replaces the file the link names, as a shell's `>` does: outputs a user names (--output,
  // --trace, consolidate -o), which may well be links on purpose.
  kFollow,
  // Replaces the link itself: a run folder's own files (config.json, summary.json, latest,
  // checkpoints), whose links -- a folder copied with `cp -rs` to branch a run -- name another
  // run's files, which a resume of the copy must not rewrite.
  kReplace,
};

// Atomic replace of `path` with `data`. Throws std::runtime_error on I/O failure; the old file,
// if any, is left untouched and the temp file removed.
void write_file_atomic(const std::string& path, std::string_view data,
                       Links links = Links::kFollow);
// fsync of a directory, so the entries created, renamed or removed in it are on disk (best
// effort: a directory that cannot be opened is left alone).
void sync_directory(const std::string& dir);

// Same, but the content is streamed by `writer(fd)`, which must write everything or throw.
void write_file_atomic_with(const std::string& path, const std::function<void(int fd)>& writer,
                            Links links = Links::kFollow);

// Before a run appends to a file of its folder (metrics.jsonl, a rank's log): when `path` is a
// symbolic link or one of several hard links to its file (a copy made with `cp -rs` or `cp -al`
// to branch a run), its content is copied into a file of its own at `path` first, so the appends
// do not reach the other run's file. Throws std::runtime_error on I/O failure.
void own_file_for_append(const std::string& path);

// Unlinks the temp files the writes above have open right now (from any thread), for a signal
// handler about to end the process: the rename never comes, and a consolidation's or a
// prediction's temp file (hidden, hundreds of MB) would stay behind. Async-signal-safe (atomics
// and unlink only). Up to 16 writes at once are tracked; more are still written, untracked.
void remove_temp_files_in_flight();

// "<$TMPDIR>/<name>-XXXXXX", a template for make_temp_folder (an unusable $TMPDIR: /tmp, as
// mkdtemp's own convention).
std::string temp_folder_template(const std::string& name);
// mkdtemp on `tmpl`, which it completes in place; UserError "<what> as '<tmpl>': <why>" when the
// folder cannot be created (`what`: "bench step: cannot create a temp folder for the run").
void make_temp_folder(std::string& tmpl, const std::string& what);

// write(2) all of `len` bytes or throw.
void write_all(int fd, const void* data, size_t len, const std::string& what);

// Appends a line to a file (metrics.jsonl); opened and closed per call is too slow, so this is a
// small owning wrapper around a FILE* that flushes each line. The file is made its own first
// (own_file_for_append): the writer never writes through a link. Appending to a file whose last
// line is unfinished (a crash in the middle of a write) first cuts that partial line off, so the
// next record starts a line of its own; dropped_bytes() says how much was cut.
class LineWriter {
 public:
  LineWriter() = default;
  explicit LineWriter(const std::string& path, bool append);
  size_t dropped_bytes() const { return dropped_; }
  ~LineWriter();
  LineWriter(const LineWriter&) = delete;
  LineWriter& operator=(const LineWriter&) = delete;
  // Writes line + '\n' and flushes. Throws std::runtime_error naming the file and the cause when
  // the write fails (a full disk, an I/O error): a record lost is a run's record lost.
  void write_line(std::string_view line);
  bool is_open() const { return f_ != nullptr; }

 private:
  void* f_ = nullptr;
  std::string path_;
  size_t dropped_ = 0;
};

// Peak resident set size of this process in MiB (VmHWM), 0 when unknown.
double peak_rss_mb();

// Bytes this process can still allocate: the smallest of the machine's MemAvailable
// (/proc/meminfo), what its memory cgroup's limit leaves (util/cgroup_limits.h: a container's)
// and the address-space limit (RLIMIT_AS) minus the process's current size; -1 when none is
// known.
int64_t available_memory_bytes();
// The same without the address-space limit: what the machine (and the memory cgroup) can still
// give all of a job's processes together, each under its own RLIMIT_AS. -1 when unknown.
int64_t machine_memory_available_bytes();

// Whether this process can map `bytes` more of address space now: always true without an
// address-space limit (RLIMIT_AS, `ulimit -v`); under one, a PROT_NONE reservation of that size
// is made and released (it counts against the limit but takes no memory).
bool address_space_allows(int64_t bytes);
// The address-space limit (RLIMIT_AS) and this process's size (VmSize), in bytes; -1 unknown or
// no limit.
int64_t address_space_limit_bytes();
int64_t address_space_used_bytes();

// "" when a file can be written at `path` (created or replaced, as write_file_atomic does: its
// folder must exist and take new files), else why not: "is empty", "is a directory", "is in
// '/x', which does not exist", ... For output options, checked before the work that produces the
// file.
std::string output_file_problem(const std::string& path);
// The file write_file_atomic replaces for `path`: the path itself, or where its symlinks lead
// (followed one by one; a dangling link names the file it creates), absolute, with the folders
// on the way resolved.
std::string output_file_target(const std::string& path);

// Whether `path` is `dir` or inside it, comparing absolute paths with symlinks resolved as far as
// they exist (std::filesystem::weakly_canonical): "runs/a/checkpoints/step-4.safetensors" is
// within "./runs/a/checkpoints". False when either cannot be resolved.
bool path_is_within(const std::string& path, const std::string& dir);

// 64-bit FNV-1a, as 16 hex digits: content hashes (config_hash).
std::string fnv1a_hex(std::string_view data);

// This process's binary, /proc/self/exe's target: its path, and whether that file was removed
// since the process started (the kernel then reads " (deleted)" after the path, stripped here).
// An empty path when it cannot be read.
struct OwnBinary {
  std::string path;
  bool removed = false;
};
OwnBinary own_binary();

}  // namespace dtrain
