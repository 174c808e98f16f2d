// dtrain verify's report: the table users read and the same content as JSON (train/verify.h).
#include <fmt/format.h>

#include <cmath>

#include "train/verify.h"

namespace dtrain {

namespace {

nlohmann::json number(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

std::string element(const TensorDiff& d) {
  return d.index >= 0 ? format_index(d.shape, d.index) : "";
}

nlohmann::json diff_json(const TensorDiff& d) {
  return {{"tensor", d.name},         {"rel", number(d.rel)},  {"max_rel", number(d.max_rel)},
          {"scale", number(d.scale)}, {"element", element(d)}, {"want", number(d.want)},
          {"got", number(d.got)}};
}

std::string sci(double v) {
  return std::isfinite(v) ? fmt::format("{:.1e}", v) : std::string(std::isnan(v) ? "nan" : "inf");
}

std::string loss_text(double v) {
  return std::isfinite(v) ? fmt::format("{:.6f}", v) : "-";
}

}  // namespace

nlohmann::json report_json(const VerifyReport& r) {
  nlohmann::json forced = nlohmann::json::array();
  for (const ForcedStep& s : r.forced) {
    nlohmann::json j = diff_json(s.worst);
    j["step"] = s.step;
    j["loss_reference"] = number(s.loss_reference);
    j["loss_layout"] = number(s.loss_layout);
    forced.push_back(std::move(j));
  }
  nlohmann::json end = nlohmann::json::array();
  for (const TensorDiff& d : r.end_state) end.push_back(diff_json(d));
  nlohmann::json losses = nlohmann::json::array();
  for (const LossPoint& p : r.losses)
    losses.push_back(
        {{"step", p.step}, {"reference", number(p.reference)}, {"layout", number(p.layout)}});
  return {
      {"verdict", r.verdict},
      {"layout", r.plan.layout_text},
      {"reference", r.plan.reference_text},
      {"exact", r.plan.exact},
      {"divergence", r.plan.divergence},
      {"unchecked_state", r.plan.unchecked_state.empty() ? nlohmann::json(nullptr)
                                                         : nlohmann::json(r.plan.unchecked_state)},
      {"steps", r.steps},
      {"tolerance", r.tolerance},
      {"teacher_forcing", forced},
      {"noise_floor", r.noise_floor > 0.0 ? number(r.noise_floor) : nlohmann::json(nullptr)},
      {"noise_parts", r.noise_parts > 0 ? nlohmann::json(r.noise_parts) : nlohmann::json(nullptr)},
      {"free_run", r.plan.free_run_note.empty() ? nlohmann::json(nullptr)
                                                : nlohmann::json(r.plan.free_run_note)},
      // (a layout that diverges by design fails no step: the tolerance is not applied)
      {"first_failing_step", r.first_bad_step > 0 && r.plan.exact ? nlohmann::json(r.first_bad_step)
                                                                  : nlohmann::json(nullptr)},
      {"end_state", end},
      {"end_step", r.end_step},
      {"end_state_worst", diff_json(worst(r.end_state))},
      {"losses", losses}};
}

std::string report_text(const VerifyReport& r) {
  std::string s;
  s += fmt::format(
      "layout:     {}\nreference:  {}\ntolerance:  {} relative{}\n{}\n", r.plan.layout_text,
      r.plan.reference_text, sci(r.tolerance),
      r.plan.exact ? "" : " (not applied: the layout diverges by design)",
      r.plan.unchecked_state.empty() ? "" : "compared:   " + r.plan.unchecked_state + "\n");
  if (!r.forced.empty()) {
    s += "teacher forcing: each step from the reference's state, the update's difference relative "
         "to the reference update\n";
    s += fmt::format("{:>6}  {:>14}  {:>14}  {:>10}  {}\n", "step", "loss reference", "loss layout",
                     "rel. diff", "worst tensor [worst element]: its max rel. diff");
    for (const ForcedStep& f : r.forced)
      s += fmt::format(
          "{:>6}  {:>14}  {:>14}  {:>10}  {} {}{}\n", f.step, loss_text(f.loss_reference),
          loss_text(f.loss_layout), sci(f.worst.rel), f.worst.name,
          f.worst.index >= 0 ? fmt::format("{}: {}", element(f.worst), sci(f.worst.max_rel)) : "",
          f.worst.rel > r.tolerance && r.plan.exact ? "  <-- over tolerance" : "");
    s += "\n";
  } else {
    s += "teacher forcing: skipped (" + r.plan.teacher_forcing_skipped + ")\n\n";
  }
  s += fmt::format("free running, {} steps:\n{:>6}  {:>14}  {:>14}\n", r.steps, "step",
                   "loss reference", "loss layout");
  for (const LossPoint& p : r.losses)
    s +=
        fmt::format("{:>6}  {:>14}  {:>14}\n", p.step, loss_text(p.reference), loss_text(p.layout));
  const TensorDiff e = worst(r.end_state);
  int over = 0;
  for (const TensorDiff& d : r.end_state) over += d.rel > r.tolerance;
  s += fmt::format(
      "end state{}: worst tensor {} (rel. diff {}); {} of {} tensors over tolerance{}\n",
      r.end_step != r.steps ? fmt::format(" at step {}", std::max<int64_t>(r.end_step, 1)) : "",
      e.name, sci(e.rel), over, r.end_state.size(),
      r.plan.free_run_note.empty() ? ""
      : r.end_step == 0            ? " (not judged: " + r.plan.free_run_note + ")"
                                   : " (" + r.plan.free_run_note + ")");
  if (r.noise_floor > 0.0)
    s += fmt::format(
        "one process against itself, each batch summed in {} parts: {} (the "
        "dynamics amplify rounding; the end state passes within {:g}x that)\n",
        r.noise_parts, sci(r.noise_floor), kDriftFactor);
  else if (r.noise_floor < 0.0)
    s += "one process against itself: not measured (the batch cannot be summed in parts of the "
         "same rows: one row, or data.drop_last), so the end state is held to the tolerance\n";
  s += "\n";
  if (r.verdict == "pass") {
    double w = 0;
    for (const ForcedStep& f : r.forced) w = std::max(w, f.worst.rel);
    s += fmt::format(
        "verdict: PASS: the layout trains what one process trains (worst step {}, "
        "end state {}{}, tolerance {})\n",
        sci(w), sci(e.rel),
        r.noise_floor > 0.0 ? ", as far as one process drifts from itself under rounding" : "",
        sci(r.tolerance));
  } else if (r.verdict == "fail") {
    if (r.first_bad_step > 0) {
      const TensorDiff& d = r.forced[static_cast<size_t>(r.first_bad_step - 1)].worst;
      s += fmt::format(
          "verdict: FAIL at step {}: tensor {} element {}: update {:.4g} where the "
          "reference's is {:.4g} (rel. diff {} > {})\n",
          r.first_bad_step, d.name, element(d), d.got, d.want, sci(d.rel), sci(r.tolerance));
    } else {
      s += fmt::format(
          "verdict: FAIL: every step agrees from the same state, but the end states "
          "differ: {} element {}: {:.6g} against the reference's {:.6g} (rel. diff "
          "{} > {}{})\n",
          e.name, element(e), e.got, e.want, sci(e.rel), sci(r.tolerance),
          r.noise_floor > 0.0 ? fmt::format(", and > {:g}x one process's own drift {}",
                                            kDriftFactor, sci(r.noise_floor))
                              : "");
    }
  } else {
    // (not "not a bug": a fault shows in the numbers, but is not told apart from the cost)
    s += "verdict: DIVERGES AS EXPECTED, not judged (the differences are expected by design, so a "
         "bug among them is not told apart): " +
         r.plan.divergence + "\n";
  }
  return s;
}

}  // namespace dtrain
