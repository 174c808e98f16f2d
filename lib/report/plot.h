// `dtrain plot`: training loss and test accuracy against step for one or more run folders, drawn
// as two side-by-side panels with the runs overlaid (one colour per run) and a shared legend.
//
// The figure is laid out once as a list of primitives (lines, polylines, text, circles) in pixel
// coordinates; the SVG writer emits them as XML (text stays text: searchable, selectable), the
// PNG writer renders the same list with cairo. So both formats show the same figure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::report {

struct Point {
  double x = 0, y = 0;
};

// One run's curves from its metrics.jsonl, in file order by step.
struct RunSeries {
  std::string label;
  std::vector<Point> loss;      // (step, mean training loss) from "kind":"train" records
  std::vector<Point> accuracy;  // (step, test accuracy 0..1) from "kind":"eval" records
};

// Reads RUN_DIR/metrics.jsonl. Train records give loss points, eval records accuracy points;
// other kinds are ignored, and so are null values (a non-finite loss is written as null). A
// resumed run appends to the file: a record whose step is not after the previous one of its
// kind replaces the points from that step on (the replayed steps). Throws UserError for a
// missing folder, a missing metrics.jsonl, a malformed line (FILE:LINE: reason) or a file with
// no data point at all. The label is the folder's name.
RunSeries read_run(const std::string& run_dir);

struct PlotOptions {
  std::string title;  // above the panels; none when empty
  int width = 1200;   // pixels (SVG user units), in [480, 8000]
  int height = 480;   // in [240, 8000]
};

// "Nice" axis ticks covering [lo, hi]: steps of 1, 2, 2.5 or 5 times a power of ten, about
// `target` of them, first <= lo and last >= hi, chosen to waste little axis beyond the data.
// lo == hi is widened around the value.
std::vector<double> nice_ticks(double lo, double hi, int target);

// Tick label for value v on an axis whose tick step is `step`: as few decimals as the step
// needs; on axes whose step is 1000 or more, in thousands with a k suffix (12.5k). `scale`
// multiplies first (100 for %).
std::string tick_label(double v, double step, double scale = 1.0);

// The colour of run i (cycles through 10 colour-blind-friendly colours), as 0xRRGGBB.
uint32_t series_color(size_t i);

// The figure as an SVG document. Each run's curve is one <polyline class="series run-I"> per
// panel it has points in (a single point is drawn as a marker only, still with its polyline).
std::string render_svg(const std::vector<RunSeries>& runs, const PlotOptions& opts);

// The figure as PNG bytes (cairo; with cairo's built-in font where no usable font is installed).
std::string render_png(const std::vector<RunSeries>& runs, const PlotOptions& opts);

// The `dtrain plot` command: reads every run folder, labels them with `labels` (one per run,
// or empty for the folder names), writes `out` atomically as SVG or PNG by its extension.
// Throws UserError for bad input (unknown extension, label count, a bad run folder, sizes).
void plot_runs(const std::vector<std::string>& run_dirs, const std::vector<std::string>& labels,
               const std::string& out, const PlotOptions& opts);

}  // namespace dtrain::report
