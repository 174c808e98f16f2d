// CSV loaders. One record per line (quoted fields may contain the delimiter and "" escapes but
// not line breaks); \r\n endings, a trailing newline and blank lines are tolerated. Spaces and
// tabs around a field are ignored (unless one of them is the delimiter). Every error names
// FILE:LINE and, for a bad cell, the 1-based column number (and header name when there is one).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "data/dataset.h"
#include "util/check.h"
#include "util/strings.h"

namespace dtrain {
namespace {

// Labels become output-layer indices; a larger value is almost certainly a wrong column, and
// would otherwise size a huge output layer.
constexpr double kMaxLabel = 1 << 20;

// Parses a whole cell as a finite float. Accepts a leading '+'; rejects empty cells, trailing
// garbage, nan, inf and values out of float range.
bool parse_float(std::string_view s, float* out) {
  const char* b = s.data();
  const char* e = b + s.size();
  if (b != e && *b == '+') {
    ++b;
    if (b != e && *b == '-') return false;
  }
  if (b == e) return false;
  float v = 0;
  const auto [p, ec] = std::from_chars(b, e, v, std::chars_format::general);
  if (ec == std::errc::result_out_of_range && p == e) {
    // Out of float's range: a magnitude below its smallest (1e-50) rounds to 0 as any reader
    // of numbers rounds it; one above its largest stays refused (it would be infinite).
    const std::string text(b, e);
    const double d = std::strtod(text.c_str(), nullptr);
    if (!(std::fabs(d) < 1.0)) return false;
    *out = static_cast<float>(d);
    return true;
  }
  if (ec != std::errc() || p != e || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

// Whether s is written as a number, usable or not: parse_float's syntax, but also "nan",
// "inf" and magnitudes beyond float's range.
bool looks_numeric(std::string_view s) {
  const char* b = s.data();
  const char* e = b + s.size();
  if (b != e && *b == '+') ++b;
  if (b == e) return false;
  float v = 0;
  const auto [p, ec] = std::from_chars(b, e, v, std::chars_format::general);
  return p == e && (ec == std::errc() || ec == std::errc::result_out_of_range);
}

bool parse_double(std::string_view s, double* out) {
  const char* b = s.data();
  const char* e = b + s.size();
  if (b != e && *b == '+') {
    ++b;
    if (b != e && *b == '-') return false;
  }
  if (b == e) return false;
  double v = 0;
  const auto [p, ec] = std::from_chars(b, e, v, std::chars_format::general);
  if (ec != std::errc() || p != e || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

// Whether s is a number too large for a double (1e309, a run of 400 digits): parse_double's
// syntax, out of range. (Magnitudes below a double's smallest are not: parse_float takes them.)
bool overflows_double(std::string_view s) {
  const char* b = s.data();
  const char* e = b + s.size();
  if (b != e && *b == '+') ++b;
  if (b == e || *b == '+') return false;
  double v = 0;
  const auto [p, ec] = std::from_chars(b, e, v, std::chars_format::general);
  if (p != e || ec != std::errc::result_out_of_range) return false;
  // (from_chars says out of range for magnitudes below a double's smallest too: 1e-400)
  return std::isinf(std::strtod(std::string(s).c_str(), nullptr));
}

// Why a feature cell is no float: empty, a number beyond float32's range, or no number at all.
std::string cell_problem(std::string_view cell) {
  if (cell.empty()) return "empty cell";
  double d = 0;
  if (parse_double(cell, &d) || overflows_double(cell))
    return "\"" + shown_text(cell) + "\" is outside float32's range (magnitudes up to 3.4e38)";
  return "\"" + shown_text(cell) + "\" is not a number";
}

// s for a message with the bytes that are not UTF-8 shown as \xNN (shown_text shows them as
// '?', which cannot tell which encoding the file is in); cut past max_bytes.
std::string escaped_bytes(std::string_view s, size_t max_bytes = 60) {
  const std::string text(s.substr(0, max_bytes));
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_sequence_at(text, i);
    if (n == 0) {
      out += fmt::format("\\x{:02X}", static_cast<unsigned char>(text[i++]));
      continue;
    }
    out += printable_utf8(text.substr(i, n));
    i += n;
  }
  return s.size() > max_bytes ? out + "... (" + std::to_string(s.size()) + " bytes)" : out;
}

// A hint for a first row read as 1 column: a comment line, or another delimiter than
// data.csv.delimiter ("" when neither shows). `cell`: the row's one cell.
std::string one_column_hint(std::string_view cell, char delim) {
  if (cell.starts_with('#'))
    return "; lines starting with '#' are not comments to this reader (CSV has none): remove "
           "them (grep -v '^#' IN > OUT)";
  for (const char c : {';', '\t', '|', ','}) {
    if (c == delim || cell.find(c) == std::string_view::npos) continue;
    const std::string shown = c == '\t' ? "\\t" : std::string(1, c);
    return "; the row holds '" + shown + "': if it separates the columns, set data.csv.delimiter" +
           " to it (--set 'data.csv.delimiter=" + shown + "')";
  }
  return "";
}

// Reads a CSV file row by row. The constructor consumes the first non-empty row and decides
// (per CsvOptions::header) whether it is a header; next() then yields the data rows.
class CsvReader {
 public:
  // known_header: a first row equal to it is a header whatever its cells look like (predict's
  // input carrying the training file's own feature names, numeric-looking ones included).
  CsvReader(const std::string& path, const CsvOptions& opts,
            const std::vector<std::string>& known_header = {})
      : CsvReader(path, read_maybe_gzip(path), opts, known_header) {}
  // The same for text read already, `path` naming it in messages.
  CsvReader(const std::string& path, std::string text, const CsvOptions& opts,
            const std::vector<std::string>& known_header)
      : path_(path), delim_(opts.delimiter), text_(std::move(text)) {
    // Text has no NUL bytes: a binary file (an IDX file, a checkpoint) was reported by whatever
    // its bytes first tripped ("stray quote", "a bare carriage return").
    if (const size_t nul = text_.find('\0'); nul != std::string::npos)
      throw UserError(path +
                      ": not a CSV text file: it holds binary data or UTF-16 text (a NUL byte at "
                      "offset " +
                      std::to_string(nul) + "; CSV is read as UTF-8)" +
                      (text_.size() >= 4 && text_[0] == 0 && text_[1] == 0 && text_[2] == 0x08
                           ? "; it starts as an IDX file does (data.format: idx reads those)"
                           : ""));
    if (text_.compare(0, 3, "\xEF\xBB\xBF") == 0) pos_ = 3;  // UTF-8 byte order mark
    if (delim_ == '"' || delim_ == '\n' || delim_ == '\r' || delim_ == '\0') {
      throw UserError("bad CSV delimiter for '" + path + "'");
    }
    if (!next_line(&first_, &first_line_)) return;  // no rows at all: has_rows() is false
    cols_ = static_cast<int64_t>(first_.size());
    const bool known =
        !known_header.empty() &&
        std::equal(first_.begin(), first_.end(), known_header.begin(), known_header.end());
    const bool all_numeric = std::all_of(first_.begin(), first_.end(), [](std::string_view c) {
      return !c.empty() && looks_numeric(c);
    });
    if (opts.header != CsvHeader::kAuto) {
      has_header_ = opts.header == CsvHeader::kTrue;
    } else if (known && all_numeric) {
      // The training file's names are numbers, and so is this row: a header, or a data row that
      // happens to equal them? Taking it as a header dropped a row of predictions silently.
      throw UserError(path + ":" + std::to_string(first_line_) +
                      ": the first row is both the training data's column names and a row of "
                      "numbers: say whether it is a header (" +
                      opts.header_hint + " true: it is skipped) or data (" + opts.header_hint +
                      " false)");
    } else if (known) {
      has_header_ = true;
    } else {
      // A header is a row of names: every non-empty cell is text. A row that mixes numbers and
      // text is ambiguous -- a header with numeric names, or a data row with a bad cell, which
      // taking it as a header would drop silently -- so it is refused, naming both readings.
      // (An empty cell does not decide: a data row with a hole is reported as such.)
      // A cell that reads as a number but not a usable one (nan, inf, 1e39) is a number here:
      // a data row of such cells is refused as data, not dropped as a header.
      int64_t text = 0, numbers = 0, first_text = -1;
      for (size_t i = 0; i < first_.size(); ++i) {
        if (first_[i].empty()) continue;
        if (looks_numeric(first_[i])) {
          ++numbers;
        } else if (text++ == 0) {
          first_text = static_cast<int64_t>(i);
        }
      }
      if (text > 0 && numbers > 0)
        throw UserError(path + ":" + std::to_string(first_line_) + ": the first row mixes " +
                        std::to_string(numbers) + " number(s) and " + std::to_string(text) +
                        " text cell(s) (column " + std::to_string(first_text + 1) + ": \"" +
                        shown_text(first_[static_cast<size_t>(first_text)]) +
                        "\" is not a number): if it is a header, set " + opts.header_hint +
                        " true; if it is data, fix that cell");
      has_header_ = text > 0;
    }
    // A header row after '#' (numpy.savetxt's `# a,b,label`) named its first column "# a": the
    // names a checkpoint records and predict's input is held to. (1 column: one_column_hint.)
    if (has_header_ && !known && opts.header == CsvHeader::kAuto && cols_ > 1 &&
        first_[0].starts_with('#'))
      throw UserError(path + ":" + std::to_string(first_line_) +
                      ": the first row starts with '#' (\"" + shown_text(first_[0]) +
                      "\"): lines starting with '#' are not comments to this reader (CSV has "
                      "none), and as a header it names its first column so: remove the '#' "
                      "(numpy.savetxt writes one before its header unless given comments=''), "
                      "or set " +
                      opts.header_hint + " true if a column's name starts with it");
    if (has_header_) {
      header_.assign(first_.begin(), first_.end());
    } else {
      pending_ = true;
    }
  }

  CsvReader(const CsvReader&) = delete;
  CsvReader& operator=(const CsvReader&) = delete;

  bool has_rows() const { return cols_ > 0; }
  bool has_header() const { return has_header_; }
  const std::vector<std::string>& header() const { return header_; }
  int64_t cols() const { return cols_; }
  int64_t first_line() const { return first_line_; }
  // The first non-blank row's cells (the header's, or the first data row's).
  const std::vector<std::string_view>& first_row() const { return first_; }
  const std::string& path() const { return path_; }

  // Next data row (cells are valid until the next call); checks the column count.
  bool next(std::vector<std::string_view>* cells, int64_t* line) {
    if (pending_) {
      pending_ = false;
      *cells = first_;
      *line = first_line_;
    } else if (!next_line(cells, line)) {
      return false;
    }
    if (static_cast<int64_t>(cells->size()) != cols_) {
      throw UserError(where(*line) + "expected " + std::to_string(cols_) + " columns (as on line " +
                      std::to_string(first_line_) + "), found " + std::to_string(cells->size()) +
                      (!first_.empty() && first_[0].starts_with('#')
                           ? "; line " + std::to_string(first_line_) +
                                 " starts with '#', and lines starting with '#' are not comments "
                                 "to this reader (CSV has none): remove them (grep -v '^#' IN > "
                                 "OUT)"
                           : ""));
    }
    return true;
  }

  std::string where(int64_t line) const { return path_ + ":" + std::to_string(line) + ": "; }
  std::string where(int64_t line, size_t col) const {
    std::string s = where(line) + "column " + std::to_string(col + 1);
    if (has_header_) s += " (\"" + shown_text(header_[col]) + "\")";  // (bytes as elsewhere)
    return s + ": ";
  }

 private:
  // Splits the next non-blank line into cells. Returns false at end of file.
  bool next_line(std::vector<std::string_view>* cells, int64_t* line_no) {
    while (pos_ < text_.size()) {
      size_t end = text_.find('\n', pos_);
      if (end == std::string::npos) end = text_.size();
      std::string_view line(text_.data() + pos_, end - pos_);
      pos_ = end + 1;
      ++line_;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      // A carriage return left inside: the lines end in a bare CR (classic Mac OS, some
      // spreadsheet exports), so this "line" is the whole file's rows run together.
      if (line.find('\r') != std::string_view::npos)
        throw UserError(where(line_) +
                        "the lines end in a bare carriage return (CR, classic Mac OS or a "
                        "spreadsheet's export), which this reader does not split on: convert "
                        "them to LF (tr '\\r' '\\n' < IN > OUT) or CRLF line ends");
      // Blank: nothing but spaces and tabs -- a tab that is the delimiter separates (empty)
      // cells, which are reported, not skipped.
      const std::string_view blank = delim_ == '\t' ? std::string_view(" ") : " \t";
      if (line.find_first_not_of(blank) == std::string_view::npos) continue;
      split(line, cells);
      *line_no = line_;
      return true;
    }
    return false;
  }

  std::string_view trim(std::string_view s) const {
    auto blank = [&](char c) { return (c == ' ' || c == '\t') && c != delim_; };
    while (!s.empty() && blank(s.front())) s.remove_prefix(1);
    while (!s.empty() && blank(s.back())) s.remove_suffix(1);
    return s;
  }

  void split(std::string_view line, std::vector<std::string_view>* cells) {
    cells->clear();
    if (line.find('"') == std::string_view::npos) {  // fast path
      size_t start = 0;
      for (;;) {
        const size_t d = line.find(delim_, start);
        if (d == std::string_view::npos) {
          cells->push_back(trim(line.substr(start)));
          return;
        }
        cells->push_back(trim(line.substr(start, d - start)));
        start = d + 1;
      }
    }
    // Quoted fields: unquoted text goes to a per-line buffer sized up front so views stay valid.
    // The first row's cells must outlive later lines (first_line_ is still 0 while it is being
    // read), so it gets its own buffer.
    std::string& buf = first_line_ == 0 ? first_buf_ : scratch_;
    buf.clear();
    buf.reserve(line.size());
    size_t i = 0;
    for (;;) {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t') && line[i] != delim_) ++i;
      if (i < line.size() && line[i] == '"') {
        const size_t begin = buf.size();
        ++i;
        for (;;) {
          if (i >= line.size()) {
            throw UserError(where(line_) + "unterminated quoted field");
          }
          if (line[i] == '"') {
            if (i + 1 < line.size() && line[i + 1] == '"') {
              buf.push_back('"');
              i += 2;
              continue;
            }
            ++i;
            break;
          }
          buf.push_back(line[i++]);
        }
        cells->push_back(std::string_view(buf.data() + begin, buf.size() - begin));
        while (i < line.size() && (line[i] == ' ' || line[i] == '\t') && line[i] != delim_) ++i;
        if (i == line.size()) return;
        if (line[i] != delim_) {
          throw UserError(where(line_) + "unexpected text after a quoted field in column " +
                          std::to_string(cells->size()));
        }
        ++i;
      } else {
        const size_t d = line.find(delim_, i);
        const size_t stop = d == std::string_view::npos ? line.size() : d;
        const std::string_view cell = line.substr(i, stop - i);
        if (cell.find('"') != std::string_view::npos) {
          throw UserError(where(line_) + "stray quote in column " +
                          std::to_string(cells->size() + 1));
        }
        cells->push_back(trim(cell));
        if (d == std::string_view::npos) return;
        i = d + 1;
      }
    }
  }

  std::string path_;
  char delim_;
  std::string text_;
  size_t pos_ = 0;
  int64_t line_ = 0;  // 1-based number of the last line read
  std::vector<std::string_view> first_;
  std::string first_buf_, scratch_;
  int64_t first_line_ = 0;
  int64_t cols_ = 0;
  bool has_header_ = false;
  bool pending_ = false;  // first_ is a data row not yet returned
  std::vector<std::string> header_;
};

size_t resolve_label_column(const CsvReader& r, const std::string& spec) {
  const size_t cols = static_cast<size_t>(r.cols());
  if (spec.empty()) return cols - 1;
  if (r.has_header()) {
    // A name the header holds twice is ambiguous: the other column would become a feature that
    // is the label itself.
    const auto& h = r.header();
    const auto first = std::find(h.begin(), h.end(), spec);
    if (first != h.end()) {
      if (const auto again = std::find(first + 1, h.end(), spec); again != h.end())
        throw UserError("label column \"" + spec + "\" is ambiguous: the header of '" + r.path() +
                        "' names columns " + std::to_string(first - h.begin()) + " and " +
                        std::to_string(again - h.begin()) +
                        " so (give a 0-based column index instead, or rename one)");
      // A name that is also another column's 0-based index: either column could be meant (the
      // name was taken, silently).
      const auto named = static_cast<size_t>(first - h.begin());
      if (spec.find_first_not_of("0123456789") == std::string::npos && spec.size() <= 9 &&
          std::stoul(spec) < cols && std::stoul(spec) != named) {
        // Said, not refused: a numeric header (pandas' index column first: ",0,1,2") makes every
        // column ambiguous so, and no spelling would choose one. The name wins, as it did.
        const size_t index = std::stoul(spec);
        spdlog::warn(
            "data.csv.label_column \"{}\" is the name of column {} in the header of '{}', the "
            "label taken; {} is also the 0-based index of column {} (\"{}\"): if that one is "
            "meant, "
            "give its name{}",
            spec, named, r.path(), spec, index, shown_text(h[index]),
            h[index].empty() ? " (it has none: rename it)" : "");
      }
      return named;
    }
  }
  const bool numeric = spec.find_first_not_of("0123456789") == std::string::npos;
  if (!numeric) {
    if (!r.has_header()) {
      throw UserError("label column \"" + spec + "\" not found: '" + r.path() +
                      "' has no header row (give a 0-based column index instead)");
    }
    std::string names;
    for (const auto& h : r.header()) {
      if (!names.empty()) names += ", ";
      names += h;
    }
    throw UserError("label column \"" + spec + "\" not found in the header of '" + r.path() +
                    "' (columns: " + names + ")");
  }
  if (spec.size() > 9 || std::stoul(spec) >= cols) {
    throw UserError("label column index " + spec + " is out of range: '" + r.path() + "' has " +
                    std::to_string(cols) + " columns (0-based indices 0.." +
                    std::to_string(cols - 1) + ")");
  }
  return std::stoul(spec);
}

}  // namespace

Dataset load_csv(const std::string& path, const CsvOptions& opts) {
  CsvReader r(path, opts);
  if (!r.has_rows()) throw UserError("empty data set: '" + path + "' has no rows");
  if (r.cols() < 2) {
    throw UserError(r.where(r.first_line()) + "the first row has only 1 column (\"" +
                    shown_text(r.first_row()[0]) + "\"): need at least one feature and a label" +
                    one_column_hint(r.first_row()[0], opts.delimiter));
  }
  const size_t label_col = resolve_label_column(r, opts.label_column);
  // Feature column names go into the checkpoint's JSON metadata, which holds UTF-8 only: a header
  // in Latin-1 failed there, after training, with nothing saved. (The label's name is not kept.)
  if (r.has_header())
    for (size_t c = 0; c < r.header().size(); ++c)
      if (const std::string& name = r.header()[c]; c != label_col && !valid_utf8(name)) {
        size_t bad = 0;
        while (utf8_sequence_at(name, bad) != 0) bad += utf8_sequence_at(name, bad);
        throw UserError(fmt::format(
            "{}the header's column {} (\"{}\") is not UTF-8 text (byte 0x{:02X} at its byte {}: "
            "Latin-1 or another 8-bit encoding?); column names are kept as UTF-8 in the "
            "checkpoint: convert the file to UTF-8, e.g. iconv -f latin1 -t utf-8 '{}' > OUT",
            r.where(r.first_line()), c + 1, escaped_bytes(name),
            static_cast<unsigned char>(name[bad]), bad + 1, path));
      }

  Dataset d;
  d.features = r.cols() - 1;
  d.label_column = static_cast<int64_t>(label_col);
  if (r.has_header())
    for (size_t c = 0; c < static_cast<size_t>(r.cols()); ++c)
      if (c != label_col) d.columns.push_back(r.header()[c]);
  std::vector<std::string_view> cells;
  int64_t line = 0;
  int32_t max_label = 0;
  while (r.next(&cells, &line)) {
    for (size_t c = 0; c < cells.size(); ++c) {
      if (c == label_col) {
        double v;
        if (overflows_double(cells[c])) {  // (1e309: too large, or negative, as 1e12 is)
          v = cells[c].starts_with('-') ? -HUGE_VAL : HUGE_VAL;
        } else if (!parse_double(cells[c], &v)) {
          throw UserError(r.where(line, c) + "label \"" + shown_text(cells[c]) +
                          "\" is not a number");
        }
        if (v < 0) {
          throw UserError(r.where(line, c) + "label " + shown_text(cells[c]) +
                          " is negative (labels are class indices 0, 1, ...)");
        }
        if (v != std::floor(v)) {
          throw UserError(r.where(line, c) + "label " + shown_text(cells[c]) +
                          " is not an integer");
        }
        if (v >= kMaxLabel) {
          throw UserError(r.where(line, c) + "label " + shown_text(cells[c]) +
                          " is too large (at most " + std::to_string(int64_t(kMaxLabel) - 1) + ")");
        }
        const auto label = static_cast<int32_t>(v);
        d.y.push_back(label);
        max_label = std::max(max_label, label);
        continue;
      }
      float v;
      if (!parse_float(cells[c], &v)) {
        throw UserError(r.where(line, c) + cell_problem(cells[c]));
      }
      d.x.push_back(v);
    }
  }
  d.rows = static_cast<int64_t>(d.y.size());
  if (d.rows == 0) throw UserError("empty data set: '" + path + "' has a header but no data rows");
  d.num_classes = max_label + 1;
  return d;
}

std::string csv_columns_problem(const std::string& what, const std::vector<std::string>& names,
                                const std::vector<std::string>& train) {
  if (names.empty() || train.empty() || names == train) return "";
  return what + " names its feature columns " + shown_text(join(names, ", ")) +
         ", the training data's are " + shown_text(join(train, ", ")) +
         ": the model reads columns by position, so give them in the training order (or drop "
         "the header row)";
}

namespace {

std::vector<float> csv_features(CsvReader& r, const CsvOptions& opts, int64_t expected_features,
                                int64_t* rows_out, const std::vector<std::string>& columns) {
  const std::string& path = r.path();
  if (!r.has_rows()) throw UserError("empty input: '" + path + "' has no rows");
  if (r.has_header() && static_cast<int64_t>(r.cols()) == expected_features) {
    const std::string why = csv_columns_problem("'" + path + "'", r.header(), columns);
    if (!why.empty()) throw UserError(why);
  }
  std::vector<float> x;
  std::vector<std::string_view> cells;
  int64_t line = 0;
  int64_t rows = 0;
  // Checked on the first row (header or data); next() holds every later row to the same count.
  if (r.cols() != expected_features) {
    throw UserError(r.where(r.first_line()) + "expected " + std::to_string(expected_features) +
                    " feature columns (the model's input size), found " + std::to_string(r.cols()) +
                    (r.cols() == 1 ? one_column_hint(r.first_row()[0], opts.delimiter) : ""));
  }
  while (r.next(&cells, &line)) {
    for (size_t c = 0; c < cells.size(); ++c) {
      float v;
      if (!parse_float(cells[c], &v)) {
        // (a header read as data because it was told so: say what would skip it)
        const bool header_like = line == r.first_line() && opts.header == CsvHeader::kFalse &&
                                 std::none_of(cells.begin(), cells.end(),
                                              [](std::string_view t) { return looks_numeric(t); });
        throw UserError(r.where(line, c) + cell_problem(cells[c]) +
                        (header_like ? "; the first row looks like a header: " + opts.header_hint +
                                           " true skips it"
                                     : ""));
      }
      x.push_back(v);
    }
    ++rows;
  }
  if (rows == 0) throw UserError("empty input: '" + path + "' has a header but no data rows");
  if (rows_out != nullptr) *rows_out = rows;
  return x;
}

}  // namespace

std::vector<float> load_csv_features(const std::string& path, const CsvOptions& opts,
                                     int64_t expected_features, int64_t* rows_out,
                                     const std::vector<std::string>& columns) {
  CsvReader r(path, opts, columns);
  return csv_features(r, opts, expected_features, rows_out, columns);
}

std::vector<float> load_csv_features_text(const std::string& name, std::string text,
                                          const CsvOptions& opts, int64_t expected_features,
                                          int64_t* rows_out,
                                          const std::vector<std::string>& columns) {
  CsvReader r(name, std::move(text), opts, columns);
  return csv_features(r, opts, expected_features, rows_out, columns);
}

}  // namespace dtrain
