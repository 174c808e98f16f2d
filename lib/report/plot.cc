#include "report/plot.h"

#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "util/check.h"
#include "util/fs.h"
#include "util/strings.h"

namespace dtrain::report {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Reading runs

namespace {

std::string folder_name(const std::string& dir) {
  fs::path q = fs::absolute(fs::path(dir)).lexically_normal();
  if (q.filename().empty()) q = q.parent_path();
  return q.filename().string();
}

// Keeps points in step order across a resume: a step at or before the last kept point starts a
// replay, whose points replace the old ones from that step on (read_run: of both series).
void add_point(std::vector<Point>& v, double step, const nlohmann::json& y) {
  while (!v.empty() && v.back().x >= step) v.pop_back();
  if (y.is_number()) v.push_back({step, y.get<double>()});
}

}  // namespace

RunSeries read_run(const std::string& run_dir) {
  std::error_code ec;
  const fs::path dir(run_dir);
  if (!fs::exists(dir, ec)) throw UserError("run folder '" + run_dir + "' does not exist");
  if (!fs::is_directory(dir, ec))
    throw UserError("'" + run_dir + "' is not a folder (plot takes run folders: the --out of run)");
  const std::string path = (dir / "metrics.jsonl").string();
  if (!fs::is_regular_file(path, ec))
    throw UserError("'" + run_dir +
                    "' has no metrics.jsonl (not a dtrain run folder, or nothing logged yet)");
  const std::string text = read_file(path);

  RunSeries r;
  r.label = folder_name(run_dir);
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no) + ": ";
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {  // a syntax error, a number overflow (1e999)
      std::string msg = e.what();
      const size_t cut = msg.find("] ");  // drop nlohmann's "[json.exception.parse_error.101] "
      if (cut != std::string::npos) msg = msg.substr(cut + 2);
      throw UserError(where + "malformed JSON: " + msg);
    }
    if (!j.is_object()) throw UserError(where + "expected a JSON object");
    const auto kind = j.find("kind");
    if (kind == j.end() || !kind->is_string())
      throw UserError(where + "no \"kind\" (a string) in the record");
    const std::string k = kind->get<std::string>();
    const char* value_key = k == "train" ? "loss" : k == "eval" ? "test_accuracy" : nullptr;
    if (value_key == nullptr) continue;  // other kinds: not plotted
    const auto step = j.find("step");
    if (step == j.end() || !step->is_number())
      throw UserError(where + k + " record without a numeric \"step\"");
    const auto value = j.find(value_key);
    if (value == j.end() || !(value->is_number() || value->is_null()))
      throw UserError(where + k + " record without a numeric \"" + value_key + "\"");
    // A replay's record ends the other series' old points too: its train record at step s
    // those from s on (an abandoned run's evaluations there), its evaluation at s the loss
    // points past s (a run's train record of a step precedes its evaluation).
    const double x = step->get<double>();
    std::vector<Point>& other = k == "train" ? r.accuracy : r.loss;
    while (!other.empty() && (other.back().x > x || (k == "train" && other.back().x == x)))
      other.pop_back();
    add_point(k == "train" ? r.loss : r.accuracy, x, *value);
  }
  if (r.loss.empty() && r.accuracy.empty())
    throw UserError(path + ": no data points (no train or eval record with a value)");
  return r;
}

// ---------------------------------------------------------------------------------------------
// Axes

// The largest magnitude an axis reaches (see nice_ticks).
constexpr double kMaxAxis = 1e300;

std::vector<double> nice_ticks(double lo, double hi, int target) {
  DT_CHECK_MSG(std::isfinite(lo) && std::isfinite(hi), "axis range " << lo << ".." << hi);
  if (hi < lo) std::swap(lo, hi);
  // Extreme data (a hand-edited file, a loss near DBL_MAX) still gets an axis: the range stays
  // within +-kMaxAxis, where its arithmetic cannot overflow (the panels clamp what they draw to
  // it), and a degenerate range too small to widen by a tenth (subnormals) widens by 1. A range
  // below 1e-8 of the values is degenerate: finer ticks would need more digits than labels
  // show, and steps near the values' rounding unit lose the last tick (a flat loss curve then
  // drew its points on the panel's edge under seven equal labels).
  lo = std::clamp(lo, -kMaxAxis, kMaxAxis);
  hi = std::clamp(hi, -kMaxAxis, kMaxAxis);
  if (hi - lo <= 1e-8 * std::max({1.0, std::fabs(hi), std::fabs(lo)})) {
    double d = lo == 0 ? 1.0 : std::fabs(lo) * 0.1;
    if (d < 1e-290) d = 1.0;
    lo -= d;
    hi += d;
  }
  target = std::max(2, target);
  // Candidate steps m * 10^e around range / target; the score prefers ticks that hug the data
  // (little axis beyond it) and a count near the target, 1-2-5 a little over 2.5.
  const double range = hi - lo;
  const double e0 = std::floor(std::log10(range / target));
  double step = 0, first = 0, last = 0, best = INFINITY;
  for (int de = -1; de <= 1; ++de)
    for (double m : {1.0, 2.0, 2.5, 5.0}) {
      const double st = m * std::pow(10.0, e0 + de);
      // The small slack keeps a bound that is a multiple of st (up to rounding) from adding a
      // tick.
      const double f = std::floor(lo / st + 1e-9) * st, l = std::ceil(hi / st - 1e-9) * st;
      const double n = std::round((l - f) / st) + 1;
      if (n < 2 || n > 2.5 * target + 1) continue;
      const double score =
          2 * (1 - range / (l - f)) + 0.5 * std::fabs(n - target) / target + (m == 2.5 ? 0.05 : 0);
      if (score < best) {
        best = score;
        step = st;
        first = f;
        last = l;
      }
    }
  DT_CHECK_GT(step, 0.0);
  std::vector<double> ticks;
  for (int k = 0;; ++k) {
    double v = first + k * step;
    if (v > last + step * 1e-6) break;
    if (std::fabs(v) < step * 1e-9) v = 0;
    ticks.push_back(v);
  }
  return ticks;
}

std::string tick_label(double v, double step, double scale) {
  v *= scale;
  step = std::fabs(step * scale);
  if (step > 0 && std::fabs(v) < step * 1e-9) return "0";
  char buf[64];
  if (!std::isfinite(v) || !std::isfinite(step) || step == 0) {  // scaled beyond DBL_MAX
    std::snprintf(buf, sizeof buf, "%.3g", v);
    return buf;
  }
  // Steps of 10^15 and above or below 10^-4 (losses that diverged, tiny learning rates): a
  // mantissa with the digits the step needs and a short exponent, e.g. "2.5e15", "3e-7".
  if (step >= 1e15 || (step > 0 && step < 1e-4)) {
    // Significant digits: from v's leading digit down to the step's last one (2.5e17 has two).
    const double step_exp = std::floor(std::log10(step) + 1e-9);
    int step_digits = 0;
    for (double m = step / std::pow(10.0, step_exp);
         step_digits < 6 && std::fabs(m - std::round(m)) > 1e-6 * m; m *= 10)
      ++step_digits;
    const int digits =
        static_cast<int>(std::floor(std::log10(std::fabs(v)) + 1e-9) - step_exp) + 1 + step_digits;
    std::snprintf(buf, sizeof buf, "%.*e", std::clamp(digits, 1, 17) - 1, v);
    std::string t = buf;  // "2.50e+15": drop the mantissa's trailing zeros and the exponent's '+'
    const size_t e = t.find('e');
    std::string m = t.substr(0, e), x = t.substr(e + 1);
    if (m.find('.') != std::string::npos) {
      while (m.back() == '0') m.pop_back();
      if (m.back() == '.') m.pop_back();
    }
    const bool neg = x[0] == '-';
    x = x.substr(1);
    while (x.size() > 1 && x[0] == '0') x.erase(0, 1);
    return m + "e" + (neg ? "-" : "") + x;
  }
  // Thousands, millions, ...: the suffix of the step's magnitude.
  static const char* const kSuffix[] = {"", "k", "M", "G", "T"};
  int power = 0;
  while (power < 4 && step >= 1000) {
    v /= 1000;
    step /= 1000;
    ++power;
  }
  int decimals = 0;
  for (double s = step; decimals < 9 && std::fabs(s - std::round(s)) > 1e-6 * std::max(1.0, s);
       s *= 10)
    ++decimals;
  std::snprintf(buf, sizeof buf, "%.*f%s", decimals, v, kSuffix[power]);
  return buf;
}

uint32_t series_color(size_t i) {
  // Tableau 10: distinct, readable on white, and mostly distinguishable with colour blindness.
  static const uint32_t kColors[] = {0x4e79a7, 0xf28e2b, 0xe15759, 0x76b7b2, 0x59a14f,
                                     0xedc948, 0xb07aa1, 0xff9da7, 0x9c755f, 0xbab0ac};
  return kColors[i % (sizeof kColors / sizeof kColors[0])];
}

// ---------------------------------------------------------------------------------------------
// The figure as primitives

namespace {

enum class Anchor { kStart, kMiddle, kEnd };

struct Item {
  enum class Kind { kLine, kPolyline, kText, kCircle };
  Kind kind = Kind::kLine;
  std::vector<Point> pts;  // line: 2 ends; polyline: its points; circle: centre
  uint32_t stroke = 0;     // lines, polylines, circle outlines
  uint32_t fill = 0;       // text, circles
  double width = 1;
  std::vector<double> dash;  // on/off lengths; empty: solid
  double radius = 0;
  std::string text;  // kText: the string, drawn with its baseline at pts[0]
  double size = 12;
  Anchor anchor = Anchor::kStart;
  bool bold = false;
  bool vertical = false;  // rotated -90 degrees about pts[0]
  std::string cls;        // SVG class (series curves: "series run-I")
};

struct Scene {
  double w = 0, h = 0;
  std::vector<Item> items;

  void line(double x1, double y1, double x2, double y2, uint32_t color, double width) {
    Item it;
    it.pts = {{x1, y1}, {x2, y2}};
    it.stroke = color;
    it.width = width;
    items.push_back(std::move(it));
  }
  void text(double x, double y, std::string s, double size, uint32_t color,
            Anchor anchor = Anchor::kStart, bool bold = false, bool vertical = false) {
    Item it;
    it.kind = Item::Kind::kText;
    it.pts = {{x, y}};
    it.text = std::move(s);
    it.size = size;
    it.fill = color;
    it.anchor = anchor;
    it.bold = bold;
    it.vertical = vertical;
    items.push_back(std::move(it));
  }
};

constexpr uint32_t kInk = 0x333333;    // text
constexpr uint32_t kAxis = 0x666666;   // axis lines and tick marks
constexpr uint32_t kGrid = 0xe6e6e6;   // grid lines
constexpr uint32_t kMuted = 0x999999;  // "no data" notes
constexpr double kTickFont = 11.5;
constexpr double kLabelFont = 12.5;

// Past the 10 colours, runs repeat them dashed, then dotted, so no two of 30 runs look alike.
std::vector<double> series_dash(size_t i) {
  if (i < 10) return {};
  if (i < 20) return {7, 4};
  return {1, 4};  // with round caps: dots
}

// Text width estimate for layout (both formats lay out the same way; the PNG renderer measures
// the real glyphs only to anchor each string). DejaVu Sans averages about 0.6 em a character.
double text_width(const std::string& s, double size) {
  size_t chars = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++chars;  // count UTF-8 code points
  return 0.6 * size * static_cast<double>(chars);
}

// Crisp 1-pixel lines: centre them on a pixel.
double snap(double v) {
  return std::floor(v) + 0.5;
}

struct Axis {
  std::vector<double> ticks;
  double lo = 0, hi = 1, step = 1;
};

Axis make_axis(double lo, double hi, int target) {
  Axis a;
  a.ticks = nice_ticks(lo, hi, target);
  a.lo = a.ticks.front();
  a.hi = a.ticks.back();
  a.step = a.ticks.size() > 1 ? a.ticks[1] - a.ticks[0] : 1;
  return a;
}

// A polyline as a viewer sees it, for series of many points (a long run logged every step):
// per pixel column (1 px of x), its first, lowest, highest and last point, in their order. What
// is drawn is the same to the pixel, and drawing stays linear in the plot's width: cairo took
// minutes to stroke a million-point path, and the SVG held every point.
std::vector<Point> decimate_columns(std::vector<Point> p) {
  constexpr size_t kKeepAll = 4096;  // fewer points: drawn as they are
  if (p.size() <= kKeepAll) return p;
  std::vector<Point> out;
  for (size_t i = 0; i < p.size();) {
    const double col = std::floor(p[i].x);
    size_t j = i, lo = i, hi = i;
    for (; j < p.size() && std::floor(p[j].x) == col; ++j) {
      if (p[j].y < p[lo].y) lo = j;
      if (p[j].y > p[hi].y) hi = j;
    }
    size_t last = SIZE_MAX;
    for (const size_t k : {i, std::min(lo, hi), std::max(lo, hi), j - 1})
      if (k != last) out.push_back(p[last = k]);
    i = j;
  }
  return out;
}

struct PanelSpec {
  std::string title;
  std::string y_label;
  double y_scale = 1;  // tick labels show v * y_scale (100 for %)
  bool markers = false;
  const std::vector<Point> RunSeries::*series = nullptr;
  std::string empty_note;
  // The quantity's own range, when it has one (accuracy: [0, 1]), else infinite.
  double y_min = -INFINITY, y_max = INFINITY;
};

void draw_panel(Scene& sc, double x0, double y0, double w, double h, const PanelSpec& spec,
                const Axis& xa, const std::vector<RunSeries>& runs) {
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& r : runs)
    for (const Point& p : r.*spec.series) {
      lo = std::min(lo, p.y);
      hi = std::max(hi, p.y);
    }
  const bool empty = !(lo <= hi);
  // A flat series at a bound of its range (every evaluation at 100%, or 0%) widens inward, by a
  // tenth of the range: nice_ticks pads a flat series both ways, to 110% or -100%.
  if (!empty && std::isfinite(spec.y_min) && std::isfinite(spec.y_max) && hi - lo <= 1e-12) {
    const double tenth = 0.1 * (spec.y_max - spec.y_min);
    if (hi >= spec.y_max) lo = spec.y_max - tenth;
    if (lo <= spec.y_min) hi = spec.y_min + tenth;
  }
  // Plot area: below the panel title, above the step ticks and label; left of it the value
  // ticks, as wide as their longest label.
  const double py0 = y0 + 30;
  const double py1 = y0 + h - 44;
  Axis ya;
  std::vector<std::string> ylabels;
  double label_w = 0;
  if (!empty) {
    ya = make_axis(lo, hi, std::clamp(static_cast<int>((py1 - py0) / 45), 3, 8));
    for (double t : ya.ticks) {
      ylabels.push_back(tick_label(t, ya.step, spec.y_scale));
      label_w = std::max(label_w, text_width(ylabels.back(), kTickFont));
    }
  }
  const double px0 = x0 + kLabelFont + 10 + label_w + 8;
  const double px1 = x0 + w - 12;
  const double pw = px1 - px0, ph = py1 - py0;
  // Clamped to the axes, which hold every value below kMaxAxis (and clip those above).
  const auto X = [&](double v) {
    return px0 + (std::clamp(v, xa.lo, xa.hi) - xa.lo) / (xa.hi - xa.lo) * pw;
  };
  const auto Y = [&](double v) {
    return py1 - (std::clamp(v, ya.lo, ya.hi) - ya.lo) / (ya.hi - ya.lo) * ph;
  };

  sc.text(px0, y0 + 16, spec.title, 14, kInk, Anchor::kStart, true);  // over the plot area

  // Grid, then axes and ticks on top of it.
  for (double t : xa.ticks) sc.line(snap(X(t)), py0, snap(X(t)), py1, kGrid, 1);
  if (!empty)
    for (size_t i = 0; i < ya.ticks.size(); ++i) {
      const double y = snap(Y(ya.ticks[i]));
      sc.line(px0, y, px1, y, kGrid, 1);
      sc.line(snap(px0) - 4, y, snap(px0), y, kAxis, 1);
      sc.text(px0 - 8, y + kTickFont * 0.35, ylabels[i], kTickFont, kInk, Anchor::kEnd);
    }
  sc.line(snap(px0), py0, snap(px0), snap(py1), kAxis, 1);
  sc.line(snap(px0), snap(py1), px1, snap(py1), kAxis, 1);
  for (double t : xa.ticks) {
    const double x = snap(X(t));
    sc.line(x, snap(py1), x, snap(py1) + 4, kAxis, 1);
    sc.text(x, py1 + 18, tick_label(t, xa.step), kTickFont, kInk, Anchor::kMiddle);
  }
  sc.text((px0 + px1) / 2, py1 + 37, "step", kLabelFont, kInk, Anchor::kMiddle);
  sc.text(x0 + kLabelFont, (py0 + py1) / 2, spec.y_label, kLabelFont, kInk, Anchor::kMiddle, false,
          true);
  if (empty) {
    sc.text((px0 + px1) / 2, (py0 + py1) / 2, spec.empty_note, kLabelFont, kMuted, Anchor::kMiddle);
    return;
  }

  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& pts = runs[i].*spec.series;
    if (pts.empty()) continue;
    Item it;
    it.kind = Item::Kind::kPolyline;
    it.stroke = series_color(i);
    it.width = 2;
    it.dash = series_dash(i);
    it.cls = "series run-" + std::to_string(i);
    for (const Point& p : pts) it.pts.push_back({X(p.x), Y(p.y)});
    it.pts = decimate_columns(std::move(it.pts));
    const bool markers = spec.markers || pts.size() == 1;
    std::vector<Point> centres = markers ? it.pts : std::vector<Point>{};
    sc.items.push_back(std::move(it));
    for (const Point& c : centres) {
      Item m;
      m.kind = Item::Kind::kCircle;
      m.pts = {c};
      m.radius = 3.5;
      m.fill = series_color(i);
      m.stroke = 0xffffff;
      m.width = 1;
      sc.items.push_back(std::move(m));
    }
  }
}

Scene build_scene(const std::vector<RunSeries>& runs, const PlotOptions& opts) {
  Scene sc;
  sc.w = opts.width;
  sc.h = opts.height;
  const double margin = 16;
  double top = 10;
  if (!opts.title.empty()) {
    sc.text(sc.w / 2, 30, opts.title, 18, kInk, Anchor::kMiddle, true);
    top = 44;
  }

  // Legend: entries (swatch + label) in centred rows under the title.
  const double swatch = 22, gap = 6, spacing = 22, row_h = 20;
  std::vector<std::vector<size_t>> rows(1);
  std::vector<double> row_w(1, 0);
  for (size_t i = 0; i < runs.size(); ++i) {
    const double ew = swatch + gap + text_width(runs[i].label, kLabelFont);
    if (!rows.back().empty() && row_w.back() + spacing + ew > sc.w - 2 * margin) {
      rows.emplace_back();
      row_w.push_back(0);
    }
    row_w.back() += (rows.back().empty() ? 0 : spacing) + ew;
    rows.back().push_back(i);
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    double x = (sc.w - row_w[r]) / 2;
    const double y = top + row_h * static_cast<double>(r) + 14;
    for (size_t i : rows[r]) {
      Item sw;
      sw.kind = Item::Kind::kLine;
      sw.pts = {{x, y - 4}, {x + swatch, y - 4}};
      sw.stroke = series_color(i);
      sw.width = 3;
      sw.dash = series_dash(i);
      sc.items.push_back(std::move(sw));
      sc.text(x + swatch + gap, y, runs[i].label, kLabelFont, kInk);
      x += swatch + gap + text_width(runs[i].label, kLabelFont) + spacing;
    }
  }
  top += row_h * static_cast<double>(rows.size()) + 8;

  // One step axis for both panels, from 0 (or the first step) to the last step of any run.
  double xlo = 0, xhi = -INFINITY;
  for (const auto& r : runs)
    for (const auto* s : {&r.loss, &r.accuracy})
      for (const Point& p : *s) {
        xlo = std::min(xlo, p.x);
        xhi = std::max(xhi, p.x);
      }
  if (!(xhi >= xlo)) xhi = xlo;  // callers reject runs without points; keep the axis valid anyway
  const double panel_gap = 28;
  const double panel_w = (sc.w - 2 * margin - panel_gap) / 2;
  const double panel_h = sc.h - top - margin;
  // Plot areas need room after the title, legend, ticks and axis labels (74 px of a panel).
  if (panel_h < 74 + 60)
    throw UserError("the figure is too small for the title and a legend of " +
                    std::to_string(runs.size()) + " run(s): use a larger --height");
  const Axis xa = make_axis(xlo, xhi, std::clamp(static_cast<int>(panel_w / 90), 3, 10));

  PanelSpec loss{"Training loss", "loss", 1, false, &RunSeries::loss, "no train records"};
  PanelSpec acc{"Test accuracy",      "accuracy (%)",    100, true,
                &RunSeries::accuracy, "no eval records", 0.0, 1.0};
  draw_panel(sc, margin, top, panel_w, panel_h, loss, xa, runs);
  draw_panel(sc, margin + panel_w + panel_gap, top, panel_w, panel_h, acc, xa, runs);
  return sc;
}

void check_options(const PlotOptions& opts) {
  if (opts.width < 480 || opts.width > 8000)
    throw UserError("--width " + std::to_string(opts.width) + " is outside [480, 8000]");
  if (opts.height < 240 || opts.height > 8000)
    throw UserError("--height " + std::to_string(opts.height) + " is outside [240, 8000]");
}

// ---------------------------------------------------------------------------------------------
// SVG

std::string hex(uint32_t c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%06x", c & 0xffffffu);
  return buf;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  std::string s = buf;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  if (s == "-0") s = "0";
  return s;
}

// XML text: the five special characters escaped, control characters and invalid UTF-8 bytes
// (a folder name can hold any byte) replaced by '?' (printable_utf8), so the document stays
// well-formed.
std::string xml_escape(const std::string& s) {
  std::string out;
  std::string text = printable_utf8(s);
  // U+FFFE and U+FFFF are valid UTF-8 but no XML character (EF BF BE, EF BF BF)
  for (size_t i = 0; i + 2 < text.size(); ++i)
    if (static_cast<unsigned char>(text[i]) == 0xEF &&
        static_cast<unsigned char>(text[i + 1]) == 0xBF &&
        (static_cast<unsigned char>(text[i + 2]) & 0xFE) == 0xBE)
      text.replace(i, 3, "?");
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string dash_attr(const std::vector<double>& dash) {
  if (dash.empty()) return "";
  std::string o = " stroke-dasharray=\"";
  for (size_t k = 0; k < dash.size(); ++k) {
    if (k) o += ' ';
    o += num(dash[k]);
  }
  return o + "\"";
}

std::string scene_to_svg(const Scene& sc, const std::string& title) {
  std::string o;
  o += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(sc.w) + "\" height=\"" +
       num(sc.h) + "\" viewBox=\"0 0 " + num(sc.w) + " " + num(sc.h) +
       "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n";
  if (!title.empty()) o += "<title>" + xml_escape(title) + "</title>\n";
  o += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  for (const Item& it : sc.items) {
    switch (it.kind) {
      case Item::Kind::kLine:
        o += "<line x1=\"" + num(it.pts[0].x) + "\" y1=\"" + num(it.pts[0].y) + "\" x2=\"" +
             num(it.pts[1].x) + "\" y2=\"" + num(it.pts[1].y) + "\" stroke=\"" + hex(it.stroke) +
             "\" stroke-width=\"" + num(it.width) + "\"" + dash_attr(it.dash) + "/>\n";
        break;
      case Item::Kind::kPolyline: {
        o += "<polyline class=\"" + it.cls + "\" fill=\"none\" stroke=\"" + hex(it.stroke) +
             "\" stroke-width=\"" + num(it.width) +
             "\" stroke-linejoin=\"round\" stroke-linecap=\"round\"" + dash_attr(it.dash) +
             " points=\"";
        for (size_t k = 0; k < it.pts.size(); ++k) {
          if (k) o += ' ';
          o += num(it.pts[k].x);
          o += ',';
          o += num(it.pts[k].y);
        }
        o += "\"/>\n";
        break;
      }
      case Item::Kind::kCircle:
        o += "<circle cx=\"" + num(it.pts[0].x) + "\" cy=\"" + num(it.pts[0].y) + "\" r=\"" +
             num(it.radius) + "\" fill=\"" + hex(it.fill) + "\" stroke=\"" + hex(it.stroke) +
             "\" stroke-width=\"" + num(it.width) + "\"/>\n";
        break;
      case Item::Kind::kText: {
        const char* anchor = it.anchor == Anchor::kStart    ? "start"
                             : it.anchor == Anchor::kMiddle ? "middle"
                                                            : "end";
        o += "<text x=\"" + num(it.pts[0].x) + "\" y=\"" + num(it.pts[0].y) + "\" font-size=\"" +
             num(it.size) + "\" fill=\"" + hex(it.fill) + "\" text-anchor=\"" + anchor + "\"";
        if (it.bold) o += " font-weight=\"bold\"";
        if (it.vertical)
          o += " transform=\"rotate(-90 " + num(it.pts[0].x) + " " + num(it.pts[0].y) + ")\"";
        o += ">" + xml_escape(it.text) + "</text>\n";
        break;
      }
    }
  }
  o += "</svg>\n";
  return o;
}

// ---------------------------------------------------------------------------------------------
// PNG (cairo)

void set_rgb(cairo_t* cr, uint32_t c) {
  cairo_set_source_rgb(cr, ((c >> 16) & 0xff) / 255.0, ((c >> 8) & 0xff) / 255.0,
                       (c & 0xff) / 255.0);
}

// A font family that renders here. With no font installed at all, cairo's toy API already falls
// back to its built-in "twin" font (checked with an empty fontconfig); this also covers a font
// that is found but fails to load, by asking for twin ("@cairo:") explicitly.
std::string pick_font_family(cairo_t* cr) {
  for (const char* family : {"DejaVu Sans", "sans-serif"}) {
    cairo_select_font_face(cr, family, CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 12);
    cairo_text_extents_t ext;
    cairo_text_extents(cr, "0", &ext);
    if (cairo_status(cr) == CAIRO_STATUS_SUCCESS &&
        cairo_scaled_font_status(cairo_get_scaled_font(cr)) == CAIRO_STATUS_SUCCESS &&
        ext.x_advance > 0 && ext.width > 0)
      return family;
  }
  return "@cairo:sans-serif";
}

cairo_status_t append_png(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
}

std::string scene_to_png(const Scene& sc) {
  std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)> surface(
      cairo_image_surface_create(CAIRO_FORMAT_RGB24, static_cast<int>(sc.w),
                                 static_cast<int>(sc.h)),
      &cairo_surface_destroy);
  std::unique_ptr<cairo_t, decltype(&cairo_destroy)> ctx(cairo_create(surface.get()),
                                                         &cairo_destroy);
  cairo_t* cr = ctx.get();
  if (cairo_status(cr) != CAIRO_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cairo: ") + cairo_status_to_string(cairo_status(cr)));
  const std::string family = pick_font_family(cr);
  set_rgb(cr, 0xffffff);
  cairo_paint(cr);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  cairo_set_line_cap(cr, CAIRO_LINE_CAP_BUTT);
  for (const Item& it : sc.items) {
    cairo_set_dash(cr, it.dash.data(), static_cast<int>(it.dash.size()), 0);
    switch (it.kind) {
      case Item::Kind::kLine:
        cairo_move_to(cr, it.pts[0].x, it.pts[0].y);
        cairo_line_to(cr, it.pts[1].x, it.pts[1].y);
        set_rgb(cr, it.stroke);
        cairo_set_line_width(cr, it.width);
        cairo_stroke(cr);
        break;
      case Item::Kind::kPolyline:
        for (size_t k = 0; k < it.pts.size(); ++k)
          (k ? cairo_line_to : cairo_move_to)(cr, it.pts[k].x, it.pts[k].y);
        set_rgb(cr, it.stroke);
        cairo_set_line_width(cr, it.width);
        cairo_set_line_cap(cr, CAIRO_LINE_CAP_ROUND);
        cairo_stroke(cr);
        cairo_set_line_cap(cr, CAIRO_LINE_CAP_BUTT);
        break;
      case Item::Kind::kCircle:
        cairo_new_sub_path(cr);
        cairo_arc(cr, it.pts[0].x, it.pts[0].y, it.radius, 0, 2 * M_PI);
        set_rgb(cr, it.fill);
        cairo_fill_preserve(cr);
        set_rgb(cr, it.stroke);
        cairo_set_line_width(cr, it.width);
        cairo_stroke(cr);
        break;
      case Item::Kind::kText: {
        cairo_select_font_face(cr, family.c_str(), CAIRO_FONT_SLANT_NORMAL,
                               it.bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
        cairo_set_font_size(cr, it.size);
        cairo_text_extents_t ext;
        const std::string text = printable_utf8(it.text);  // cairo refuses invalid UTF-8
        cairo_text_extents(cr, text.c_str(), &ext);
        const double shift = it.anchor == Anchor::kStart    ? 0
                             : it.anchor == Anchor::kMiddle ? ext.x_advance / 2
                                                            : ext.x_advance;
        cairo_save(cr);
        cairo_translate(cr, it.pts[0].x, it.pts[0].y);
        if (it.vertical) cairo_rotate(cr, -M_PI / 2);
        cairo_move_to(cr, -shift, 0);
        set_rgb(cr, it.fill);
        cairo_show_text(cr, text.c_str());
        cairo_restore(cr);
        break;
      }
    }
  }
  cairo_surface_flush(surface.get());
  if (cairo_status(cr) != CAIRO_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cairo: ") + cairo_status_to_string(cairo_status(cr)));
  std::string png;
  const cairo_status_t st = cairo_surface_write_to_png_stream(surface.get(), append_png, &png);
  if (st != CAIRO_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cairo PNG encoding: ") + cairo_status_to_string(st));
  return png;
}

std::string lower_extension(const std::string& path) {
  return ascii_lower(fs::path(path).extension().string());
}

}  // namespace

std::string render_svg(const std::vector<RunSeries>& runs, const PlotOptions& opts) {
  check_options(opts);
  return scene_to_svg(build_scene(runs, opts), opts.title);
}

std::string render_png(const std::vector<RunSeries>& runs, const PlotOptions& opts) {
  check_options(opts);
  return scene_to_png(build_scene(runs, opts));
}

void plot_runs(const std::vector<std::string>& run_dirs, const std::vector<std::string>& labels,
               const std::string& out, const PlotOptions& opts) {
  const std::string ext = lower_extension(out);
  if (ext != ".svg" && ext != ".png")
    throw UserError("-o '" + out + "': unknown image format '" + ext +
                    "' (the file name must end in .svg or .png)");
  check_options(opts);
  if (run_dirs.empty()) throw UserError("no run folder given");
  if (!labels.empty() && labels.size() != run_dirs.size())
    throw UserError("--labels has " + std::to_string(labels.size()) + " name(s) for " +
                    std::to_string(run_dirs.size()) + " run folder(s)");
  const fs::path parent = fs::path(out).parent_path();
  std::error_code ec;
  if (!parent.empty() && !fs::is_directory(parent, ec))
    throw UserError("-o '" + out + "': folder '" + parent.string() + "' does not exist");

  std::vector<RunSeries> runs;
  for (const auto& d : run_dirs) runs.push_back(read_run(d));
  if (labels.empty()) {
    // Same folder name twice (runs/a/x and runs/b/x): label those with the paths as given.
    std::map<std::string, int> count;
    for (const auto& r : runs) ++count[r.label];
    for (size_t i = 0; i < runs.size(); ++i)
      if (count[runs[i].label] > 1) {
        std::string p = run_dirs[i];
        while (p.size() > 1 && p.back() == '/') p.pop_back();
        runs[i].label = p;
      }
  } else {
    for (size_t i = 0; i < runs.size(); ++i) runs[i].label = labels[i];
  }
  write_file_atomic(out, ext == ".svg" ? render_svg(runs, opts) : render_png(runs, opts));
}

}  // namespace dtrain::report
