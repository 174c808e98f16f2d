// dtrain plot: reading metrics.jsonl, nice axis ticks, a well-formed SVG with one curve per run
// per panel, and a PNG that decodes to the requested size with every run's colour in it.
#include <doctest/doctest.h>

#include <cairo.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "report/plot.h"
#include "test_util.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/strings.h"

using namespace dtrain;
using namespace dtrain::report;
using dtrain::testing::contains;
using dtrain::testing::TempDir;

namespace {

std::string train_line(int step, const std::string& loss) {
  return "{\"kind\":\"train\",\"step\":" + std::to_string(step) +
         ",\"epoch\":0.5,\"loss\":" + loss + ",\"lr\":0.1,\"samples_per_s\":1000}\n";
}
std::string eval_line(int step, double acc) {
  return "{\"kind\":\"eval\",\"step\":" + std::to_string(step) +
         ",\"epoch\":1,\"test_loss\":0.4,\"test_accuracy\":" + std::to_string(acc) + "}\n";
}

// A run folder with `steps` train records (falling loss) and, if `evals`, eval records.
std::string make_run(const TempDir& dir, const std::string& name, int steps, int evals,
                     double acc0 = 0.7) {
  std::filesystem::create_directories(dir / name);
  std::string text;
  for (int s = 1; s <= steps; ++s) {
    text += train_line(s * 10, std::to_string(2.0 / s + 0.1));
    if (evals > 0 && s % (steps / evals) == 0) text += eval_line(s * 10, acc0 + 0.02 * s / steps);
  }
  dir.write(name + "/metrics.jsonl", text);
  return dir / name;
}

// Minimal XML well-formedness: balanced, properly nested tags, quoted attributes, known entity
// references, a single root element. Returns "" or what is wrong.
std::string xml_problem(const std::string& s) {
  std::vector<std::string> stack;
  int roots = 0;
  auto check_entities = [](std::string_view text) -> bool {
    for (size_t i = text.find('&'); i != std::string_view::npos; i = text.find('&', i + 1)) {
      bool ok = false;
      for (const char* e : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"})
        ok = ok || text.substr(i, std::strlen(e)) == e;
      if (!ok) return false;
    }
    return true;
  };
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] != '<') {
      const size_t next = s.find('<', i);
      const std::string_view text(s.data() + i, (next == std::string::npos ? s.size() : next) - i);
      if (!check_entities(text)) return "bad entity in text";
      if (stack.empty() && text.find_first_not_of(" \n\r\t") != std::string_view::npos)
        return "text outside the root";
      i = next == std::string::npos ? s.size() : next;
      continue;
    }
    if (s.compare(i, 2, "<?") == 0) {
      const size_t e = s.find("?>", i);
      if (e == std::string::npos) return "unterminated <?";
      i = e + 2;
      continue;
    }
    if (s.compare(i, 4, "<!--") == 0) {
      const size_t e = s.find("-->", i);
      if (e == std::string::npos) return "unterminated comment";
      i = e + 3;
      continue;
    }
    const bool closing = s.compare(i, 2, "</") == 0;
    size_t p = i + (closing ? 2 : 1);
    const size_t name_end = s.find_first_of(" \t\n/>", p);
    if (name_end == std::string::npos || name_end == p) return "bad tag name";
    const std::string name = s.substr(p, name_end - p);
    p = name_end;
    if (closing) {
      if (s[p] != '>') return "bad closing tag " + name;
      if (stack.empty() || stack.back() != name) return "mismatched </" + name + ">";
      stack.pop_back();
      i = p + 1;
      continue;
    }
    // Attributes: name="value"
    while (true) {
      while (p < s.size() && std::isspace(static_cast<unsigned char>(s[p]))) ++p;
      if (p >= s.size()) return "unterminated tag " + name;
      if (s[p] == '>' || s.compare(p, 2, "/>") == 0) break;
      const size_t eq = s.find('=', p);
      if (eq == std::string::npos || s[eq + 1] != '"') return "unquoted attribute in " + name;
      const size_t close = s.find('"', eq + 2);
      if (close == std::string::npos) return "unterminated attribute in " + name;
      const std::string_view value(s.data() + eq + 2, close - eq - 2);
      if (value.find('<') != std::string_view::npos || !check_entities(value))
        return "bad attribute value in " + name;
      p = close + 1;
    }
    if (stack.empty()) ++roots;
    if (s[p] == '>') {
      stack.push_back(name);
      i = p + 1;
    } else {
      i = p + 2;
    }
  }
  if (!stack.empty()) return "unclosed <" + stack.back() + ">";
  if (roots != 1) return "expected one root element, got " + std::to_string(roots);
  return "";
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

uint32_t be32(const std::string& s, size_t at) {
  const auto* u = reinterpret_cast<const unsigned char*>(s.data() + at);
  return (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) | (uint32_t{u[2]} << 8) | u[3];
}

}  // namespace

TEST_CASE("nice_ticks cover the range with 1-2-2.5-5 steps") {
  const std::vector<std::pair<double, double>> ranges = {
      {0, 4690}, {0.2812, 2.31}, {0.8312, 0.8956}, {0, 1}, {-3.5, 7.25}, {1e-4, 3e-4}, {5, 5}};
  for (const auto& [lo, hi] : ranges) {
    const auto t = nice_ticks(lo, hi, 6);
    INFO(lo, " ", hi);
    REQUIRE(t.size() >= 2);
    CHECK(t.size() <= 12);
    CHECK(t.front() <= lo);
    CHECK(t.back() >= hi);
    const double step = t[1] - t[0];
    const double mant = step / std::pow(10.0, std::floor(std::log10(step)));
    bool nice = false;
    for (double m : {1.0, 2.0, 2.5, 5.0}) nice = nice || std::fabs(mant - m) < 1e-6;
    CHECK_MESSAGE(nice, step);
    for (size_t k = 1; k < t.size(); ++k) CHECK(std::fabs(t[k] - t[k - 1] - step) < step * 1e-6);
    // No tick wasted past the data: the first and last are within one step of it.
    if (lo < hi) {
      CHECK(t.front() > lo - step - 1e-12);
      CHECK(t.back() < hi + step + 1e-12);
    }
  }
  CHECK(nice_ticks(0, 4690, 6) == std::vector<double>{0, 1000, 2000, 3000, 4000, 5000});
  // Nearly flat curves (a spread of 1e-12 to 1e-7 of the values): the last tick covers the data
  // and the labels differ (seven "7.37506838e0" labels, the top point on the panel's edge).
  for (const auto& [lo, hi] :
       std::vector<std::pair<double, double>>{{7.375068378723963, 7.3750683802275807},
                                              {0.6066317403, 0.60663174035},
                                              {7.375068378723963, 7.375068378723963 + 3e-7},
                                              {0.8, 0.8 + 1e-12}}) {
    CAPTURE(lo);
    CAPTURE(hi);
    const auto t = nice_ticks(lo, hi, 6);
    REQUIRE(t.size() >= 2);
    CHECK(t.front() <= lo);
    CHECK(t.back() >= hi);
    const double step = t[1] - t[0];
    std::set<std::string> labels;
    for (double v : t) labels.insert(tick_label(v, step));
    CHECK(labels.size() == t.size());
  }
}

TEST_CASE("tick labels use the decimals the step needs") {
  CHECK(tick_label(0.84, 0.02, 100) == "84");
  CHECK(tick_label(0.845, 0.005, 100) == "84.5");
  CHECK(tick_label(0.25, 0.25) == "0.25");
  CHECK(tick_label(1.5, 0.5) == "1.5");
  CHECK(tick_label(2000, 500) == "2000");
  CHECK(tick_label(12500, 2500) == "12.5k");
  CHECK(tick_label(0, 2500) == "0");
  CHECK(tick_label(-1e-17, 0.1) == "0");
  // Large and tiny magnitudes stay short: SI suffixes up to T, then a short exponent.
  CHECK(tick_label(2.5e6, 5e5) == "2500k");  // the step's magnitude picks the suffix
  CHECK(tick_label(1.5e7, 5e6) == "15M");
  CHECK(tick_label(3e9, 1e9) == "3G");
  CHECK(tick_label(6e12, 2e12) == "6T");
  CHECK(tick_label(2.5e15, 5e14) == "2500T");
  CHECK(tick_label(1.5e16, 5e15) == "1.5e16");
  CHECK(tick_label(3e20, 1e20) == "3e20");
  CHECK(tick_label(-1.25e18, 2.5e17) == "-1.25e18");
  CHECK(tick_label(1e18, 2.5e17) == "1e18");
  CHECK(tick_label(3e-7, 1e-7) == "3e-7");
  CHECK(tick_label(1.5e-5, 5e-6) == "1.5e-5");
  CHECK(tick_label(0.0002, 1e-4) == "0.0002");
  for (double step : {1e-12, 1e-6, 0.001, 1.0, 1e4, 1e9, 1e16, 1e300})
    for (int k : {-7, 1, 3, 9})
      CHECK_MESSAGE(tick_label(k * step, step).size() <= 9, k * step, " ", step);
}

TEST_CASE("read_run reads train and eval records, skips nulls and keeps a resume in order") {
  TempDir dir;
  std::filesystem::create_directories(dir / "r");
  dir.write("r/metrics.jsonl",
            train_line(10, "2.0") + train_line(20, "null") + "{\"kind\":\"bench\",\"x\":1}\n\n" +
                eval_line(20, 0.5) + train_line(30, "1.0") + train_line(40, "0.9") +
                // resumed from step 20: the replayed steps replace 30 and 40
                train_line(30, "1.1") + train_line(40, "0.8") + eval_line(40, 0.75));
  const RunSeries r = read_run(dir / "r");
  CHECK(r.label == "r");
  REQUIRE(r.loss.size() == 3);
  CHECK(r.loss[0].x == 10);
  CHECK(r.loss[0].y == 2.0);
  CHECK(r.loss[1].x == 30);
  CHECK(r.loss[1].y == 1.1);
  CHECK(r.loss[2].y == 0.8);
  REQUIRE(r.accuracy.size() == 2);
  CHECK(r.accuracy[1].x == 40);
  CHECK(r.accuracy[1].y == doctest::Approx(0.75));
  CHECK(read_run(dir / "r/").label == "r");
  // An abandoned run's evaluation at a step the replay reached but did not evaluate (it died
  // first) is no point of the replay: it stayed on the plot.
  std::filesystem::create_directories(dir / "a");
  dir.write("a/metrics.jsonl", train_line(10, "2.0") + train_line(20, "1.5") + eval_line(20, 0.5) +
                                   train_line(30, "1.0") + eval_line(30, 0.6) +
                                   // resumed from step 10, died after step 30's train record
                                   train_line(20, "1.4") + train_line(30, "1.2"));
  const RunSeries a = read_run(dir / "a");
  REQUIRE(a.loss.size() == 3);
  CHECK(a.loss[2].y == 1.2);
  CHECK(a.accuracy.empty());
}

TEST_CASE("read_run errors name the folder or FILE:LINE") {
  TempDir dir;
  auto message = [](const std::string& d) {
    try {
      read_run(d);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(contains(message(dir / "nope"), "does not exist"));
  dir.write("file", "x");
  CHECK(contains(message(dir / "file"), "not a folder"));
  std::filesystem::create_directories(dir / "empty");
  CHECK(contains(message(dir / "empty"), "no metrics.jsonl"));

  std::filesystem::create_directories(dir / "bad");
  dir.write("bad/metrics.jsonl", train_line(1, "1") + train_line(2, "1") + "{\"kind\": \"tr\n");
  CHECK(contains(message(dir / "bad"), "metrics.jsonl:3: malformed JSON"));
  dir.write("bad/metrics.jsonl", train_line(1, "1") + "[1,2]\n");
  CHECK(contains(message(dir / "bad"), "metrics.jsonl:2: expected a JSON object"));
  dir.write("bad/metrics.jsonl", "{\"kind\":\"train\",\"loss\":1}\n");
  CHECK(contains(message(dir / "bad"), "metrics.jsonl:1: train record without a numeric \"step\""));
  dir.write("bad/metrics.jsonl", "{\"kind\":\"eval\",\"step\":3,\"test_accuracy\":\"high\"}\n");
  CHECK(contains(message(dir / "bad"), "test_accuracy"));
  dir.write("bad/metrics.jsonl", "{\"step\":3}\n");
  CHECK(contains(message(dir / "bad"), "kind"));
  dir.write("bad/metrics.jsonl", train_line(1, "null") + "\n");
  CHECK(contains(message(dir / "bad"), "no data points"));
  dir.write("bad/metrics.jsonl", "");
  CHECK(contains(message(dir / "bad"), "no data points"));
  dir.write("bad/metrics.jsonl", train_line(1, "1") + train_line(2, "1e999") + "\n");
  CHECK(contains(message(dir / "bad"), "metrics.jsonl:2: malformed JSON: number overflow"));
}

TEST_CASE("extreme values (subnormal, near DBL_MAX) give an axis and a plot, never a hang") {
  // Each of these spun forever in the axis code.
  for (const auto& [lo, hi] : std::vector<std::pair<double, double>>{{5e-324, 5e-324},
                                                                     {1.7e308, 1.7e308},
                                                                     {-1.7e308, -1.7e308},
                                                                     {-1.7e308, 1.7e308},
                                                                     {0, 1.7e308},
                                                                     {1e-310, 2e-310},
                                                                     {-1e308, 1}}) {
    CAPTURE(lo);
    CAPTURE(hi);
    const auto t = nice_ticks(lo, hi, 6);
    REQUIRE(t.size() >= 2);
    REQUIRE(t.size() <= 17);
    for (double v : t) CHECK(std::isfinite(v));
  }
  TempDir dir;
  std::filesystem::create_directories(dir / "x");
  for (const std::string v : {"5e-324", "1.7e308", "-1.7e308"}) {
    dir.write("x/metrics.jsonl", "{\"kind\":\"train\",\"step\":1,\"loss\":" + v +
                                     "}\n{\"kind\":\"eval\",\"step\":" + v +
                                     ",\"test_accuracy\":1e308}\n");
    const std::string svg = render_svg({read_run(dir / "x")}, PlotOptions{});
    CHECK_MESSAGE(xml_problem(svg) == "", v);
    CHECK(render_png({read_run(dir / "x")}, PlotOptions{}).size() > 0);
  }
}

TEST_CASE("an accuracy flat at 100% or 0% keeps its axis within 0..100%") {
  // nice_ticks pads a flat series both ways: every evaluation at 100% drew an axis to 110%, at
  // 0% one from -100%.
  for (const double acc : {1.0, 0.0, 0.5}) {
    RunSeries r;
    r.label = "flat";
    r.loss = {{1, 0.5}, {2, 0.4}};
    r.accuracy = {{1, acc}, {2, acc}};
    const std::string svg = render_svg({r}, PlotOptions{});
    CHECK(xml_problem(svg) == "");
    CHECK_MESSAGE(!contains(svg, ">110</text>"), acc);
    CHECK_MESSAGE(!contains(svg, ">-10</text>"), acc);
    CHECK_MESSAGE(!contains(svg, ">-100</text>"), acc);
    if (acc == 1.0) CHECK(contains(svg, ">100</text>"));
    if (acc == 1.0) CHECK(contains(svg, ">90</text>"));
    if (acc == 0.0) CHECK(contains(svg, ">10</text>"));
  }
}

TEST_CASE("SVG is well-formed with one curve per run per panel, labels escaped") {
  TempDir dir;
  std::vector<RunSeries> runs = {read_run(make_run(dir, "a", 40, 4)),
                                 read_run(make_run(dir, "b", 30, 0))};  // b: no eval
  runs[0].label = "ddp <2 ranks> & \"fp16\"";
  PlotOptions opts;
  opts.title = "loss & accuracy";
  const std::string svg = render_svg(runs, opts);
  CHECK(xml_problem(svg) == "");
  CHECK(count(svg, "class=\"series run-0\"") == 2);  // loss and accuracy
  CHECK(count(svg, "class=\"series run-1\"") == 1);  // loss only
  CHECK(count(svg, "<polyline") == 3);
  CHECK(contains(svg, ">ddp &lt;2 ranks&gt; &amp; &quot;fp16&quot;</text>"));
  CHECK(contains(svg, ">b</text>"));
  CHECK(contains(svg, ">loss &amp; accuracy</text>"));
  // U+FFFE and U+FFFF are valid UTF-8 but no XML character: replaced.
  opts.title = "odd \xef\xbf\xbf\xef\xbf\xbe end";
  CHECK(contains(render_svg(runs, opts), ">odd ?? end</text>"));
  opts.title = "loss & accuracy";
  for (const char* s : {">Training loss</text>", ">Test accuracy</text>", ">step</text>",
                        ">accuracy (%)</text>", ">400</text>"})
    CHECK_MESSAGE(contains(svg, s), s);
  CHECK(contains(svg, "width=\"1200\" height=\"480\""));
  // Each run's colour is on its curves.
  CHECK(contains(svg, "stroke=\"#4e79a7\" stroke-width=\"2\""));
  CHECK(contains(svg, "stroke=\"#f28e2b\" stroke-width=\"2\""));
  // The curve has a point per record.
  const size_t at = svg.find("class=\"series run-0\"");
  const size_t pts = svg.find("points=\"", at);
  CHECK(count(svg.substr(pts, svg.find('"', pts + 8) - pts), ",") == 40);
  // A series of many points (a long run logged every step) keeps per pixel column its first,
  // lowest, highest and last point: at most 4 per column of the 1200-px figure, the curve's
  // extremes kept (cairo took minutes to stroke a million-point path).
  {
    TempDir many;
    const std::string big_svg = render_svg({read_run(make_run(many, "long", 50000, 0))}, opts);
    const size_t p0 = big_svg.find("points=\"", big_svg.find("class=\"series run-0\""));
    const std::string points = big_svg.substr(p0, big_svg.find('"', p0 + 8) - p0);
    CHECK(count(points, ",") <= 4 * 1200);
    CHECK(count(points, ",") > 100);
  }

  // The XML checker itself catches what it should.
  CHECK(xml_problem("<svg><g></svg>") != "");
  CHECK(xml_problem("<svg><text>a & b</text></svg>") != "");
  CHECK(xml_problem("<svg a=b/>") != "");
  CHECK(xml_problem("<svg/><svg/>") != "");

  // Without any eval record the accuracy panel says so instead of drawing axes.
  const std::string only_loss = render_svg({runs[1]}, opts);
  CHECK(xml_problem(only_loss) == "");
  CHECK(contains(only_loss, ">no eval records</text>"));
  CHECK(count(only_loss, "<polyline") == 1);
  // Past 10 runs the colours repeat, dashed: run 10 looks unlike run 0.
  std::vector<RunSeries> eleven(11, runs[1]);
  const std::string many = render_svg(eleven, opts);
  const size_t r0 = many.find("class=\"series run-0\""), r10 = many.find("class=\"series run-10\"");
  REQUIRE(r10 != std::string::npos);
  CHECK(many.substr(r0, 200).find("stroke-dasharray") == std::string::npos);
  CHECK(many.substr(r10, 200).find("stroke-dasharray") != std::string::npos);
  // Invalid UTF-8 and control characters in a label cannot break the document.
  runs[1].label = std::string("x\x01y\xff\xc3(");
  CHECK(xml_problem(render_svg(runs, opts)) == "");
}

TEST_CASE("PNG has the requested size, decodes, and shows every run's colour") {
  TempDir dir;
  const std::vector<RunSeries> runs = {read_run(make_run(dir, "a", 40, 4, 0.6)),
                                       read_run(make_run(dir, "b", 40, 4, 0.8)),
                                       read_run(make_run(dir, "c", 20, 0))};
  PlotOptions opts;
  opts.width = 900;
  opts.height = 420;
  opts.title = "three runs";
  const std::string png = render_png(runs, opts);
  REQUIRE(png.size() > 33);
  CHECK(png.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
  CHECK(png.compare(12, 4, "IHDR") == 0);
  CHECK(be32(png, 16) == 900);
  CHECK(be32(png, 20) == 420);

  const std::string path = dir / "p.png";
  write_file_atomic(path, png);
  cairo_surface_t* s = cairo_image_surface_create_from_png(path.c_str());
  REQUIRE(cairo_surface_status(s) == CAIRO_STATUS_SUCCESS);
  CHECK(cairo_image_surface_get_width(s) == 900);
  CHECK(cairo_image_surface_get_height(s) == 420);
  const unsigned char* data = cairo_image_surface_get_data(s);
  const int stride = cairo_image_surface_get_stride(s);
  std::map<uint32_t, int> pixels;
  for (int y = 0; y < 420; ++y)
    for (int x = 0; x < 900; ++x)
      ++pixels[reinterpret_cast<const uint32_t*>(data + y * stride)[x] & 0xffffffu];
  cairo_surface_destroy(s);
  CHECK(pixels[0xffffff] > 900 * 420 / 2);  // mostly background
  for (size_t i = 0; i < runs.size(); ++i) CHECK_MESSAGE(pixels[series_color(i)] > 20, "run ", i);
  CHECK(pixels[series_color(3)] == 0);  // no fourth run
  // Text was drawn: dark pixels (the ink colour or darker) exist.
  int dark = 0;
  for (const auto& [c, n] : pixels)
    if (((c >> 16) & 0xff) < 0x60 && ((c >> 8) & 0xff) < 0x60 && (c & 0xff) < 0x60) dark += n;
  CHECK(dark > 200);
  // Text that is not UTF-8 (a folder name, a title from the shell) is drawn with '?' for the bad
  // bytes, as in SVG; cairo refused it before (exit 1).
  opts.title = "t\xffx \xc0\x80 \xed\xa0\x80";  // a stray byte, an overlong NUL, a surrogate
  CHECK(render_png(runs, opts).compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
}

TEST_CASE("printable_utf8 keeps well-formed text and replaces every other byte by '?'") {
  CHECK(printable_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") ==
        "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  CHECK(printable_utf8("a\xff"
                       "b") == "a?b");
  CHECK(printable_utf8("\xc0\x80") == "??");       // overlong
  CHECK(printable_utf8("\xed\xa0\x80") == "???");  // surrogate
  CHECK(printable_utf8("\xe2\x82") == "??");       // truncated
  CHECK(printable_utf8(std::string("a\0b\x1b\tc", 6)) == "a?b?\tc");
}

TEST_CASE("plot_runs writes by extension and rejects bad requests") {
  TempDir dir;
  const std::string a = make_run(dir, "a", 10, 2), b = make_run(dir, "b", 10, 2);
  plot_runs({a, b}, {}, dir / "out.svg", {});
  CHECK(xml_problem(read_file(dir / "out.svg")) == "");
  CHECK(contains(read_file(dir / "out.svg"), ">a</text>"));
  plot_runs({a, b}, {"first", "second"}, dir / "out.PNG", {});
  CHECK(read_file(dir / "out.PNG").compare(1, 3, "PNG") == 0);
  auto error_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no UserError");
  };
  CHECK(contains(error_of([&] { plot_runs({a}, {}, dir / "out.jpg", {}); }), "'.jpg'"));
  CHECK(contains(error_of([&] { plot_runs({a}, {}, dir / "out", {}); }), ".svg or .png"));
  CHECK(contains(error_of([&] {
                   plot_runs({a, b}, {"x"}, dir / "o.svg", {});
                 }),
                 "--labels has 1 name(s) for 2"));
  CHECK(
      contains(error_of([&] { plot_runs({a}, {}, dir / "no/such/o.svg", {}); }), "does not exist"));
  PlotOptions tiny;
  tiny.width = 10;
  CHECK_THROWS_AS(plot_runs({a}, {}, dir / "o.svg", tiny), UserError);
  // The smallest allowed figure still fits one run; 40 legend rows do not fit in it.
  PlotOptions small;
  small.width = 480;
  small.height = 240;
  plot_runs({a}, {}, dir / "small.png", small);
  CHECK(contains(
      error_of([&] { plot_runs(std::vector<std::string>(40, a), {}, dir / "o.svg", small); }),
      "too small"));
  // Two folders with the same name are told apart by their paths.
  std::filesystem::create_directories(dir / "x");
  const std::string a2 = make_run(dir, "x/a", 10, 2);
  plot_runs({a, a2}, {}, dir / "same.svg", {});
  const std::string svg = read_file(dir / "same.svg");
  CHECK(contains(svg, ">" + a + "</text>"));
  CHECK(contains(svg, ">" + a2 + "</text>"));
}
