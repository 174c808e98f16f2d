// The output folder of a run (--out): what makes it "hold a run", and clearing one. A new run
// into a folder that holds one is refused unless the user continues it (--resume) or replaces
// it (--overwrite), so two runs' metrics, checkpoints and summaries never mix.
#pragma once

#include <string>
#include <vector>

namespace dtrain {

// The files of `out_dir` that belong to an earlier run, as shown to the user: "summary.json",
// "metrics.jsonl", "checkpoints/" (when it holds anything). config.json alone (a run that
// failed before training) and logs/ (launcher logs, appended per launch) do not count.
std::vector<std::string> run_files_in(const std::string& out_dir);

// Prepares out_dir for a run before anything is written: with `overwrite`, removes an earlier
// run's summary.json, metrics.jsonl, config.json and checkpoints/ (and logs/ when clear_logs);
// otherwise, unless `resuming`, throws UserError naming the folder, what it holds and the two
// ways out when run_files_in(out_dir) is not empty. Several ranks of one job may call it at
// start (they all see the same answer on a shared folder).
void prepare_out_dir(const std::string& out_dir, bool resuming, bool overwrite, bool clear_logs);

}  // namespace dtrain
