// The CLI's checks of output paths, made before the work that writes them: an output must be
// writable, must not land in a checkpoint's folder, and must not replace what the command reads.
#pragma once

#include <string>

#include "data/options.h"

namespace dtrain {

// An output option's file (`option` names it in messages) can be written; nor may it land in a
// checkpoint: a checkpoints folder (it holds `latest`) or a sharded checkpoint's folder
// (manifest.json), where it would replace a checkpoint's file or be taken for one; nor replace
// a run folder's own files (kRunFiles: summary.json, metrics.jsonl, config.json). UserError.
void check_output_file(const std::string& option, const std::string& path);
// An output folder (run's, launch's and verify's --out) must not lie in a checkpoint's place: in
// or under a checkpoints folder (its `latest` names one of its step-<N> entries) or a sharded
// checkpoint's folder, where the owning run's keep_last and --overwrite delete entries (a run
// written to RUN/checkpoints/step-99 was removed whole by RUN's next save). UserError.
void check_out_folder(const std::string& option, const std::string& out_dir);
// predict's --output must not replace what it reads: its --input rows, the --checkpoint file,
// the config, or the data files the config names (predict reads the training data for its
// normaliser and classes); nor any existing safetensors file (weights that CSV would replace).
// `output` "" is standard output (a file it was redirected to is held to the same rules);
// `input` "-" is standard input (the file it was redirected from).
void check_predict_output(const std::string& output, const std::string& input,
                          const std::string& checkpoint, const std::string& config,
                          const DataConfig& data);
// run's and launch's --trace must not replace what the run reads (the config, its data files,
// the --resume checkpoint), be the output folder, or replace the run's own files (kRunFiles,
// whether written yet or not, and anything under its checkpoints folder).
void check_trace_output(const std::string& trace, const std::string& out_dir,
                        const std::string& config, const std::string& resume,
                        const DataConfig& data);
// consolidate's -o must not replace a file of a checkpoint: the checkpoint it reads (a shard or
// its manifest) or, next to it in the checkpoints folder, `latest` and the step-<N> entries; and
// an existing file is replaced only if it is a safetensors file (a mistyped -o must not destroy
// a config or data).
void check_consolidate_output(const std::string& input, const std::string& output);
// plot's -o: check_output_file, and an existing file is replaced only if it is an image plot
// writes (PNG by its signature, SVG by its XML start), not a config, data or a run's file.
void check_plot_output(const std::string& output);

}  // namespace dtrain
