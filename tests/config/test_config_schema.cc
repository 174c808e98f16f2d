// lib/config/schema: the key declarations drive parsing, config.json, the hash and README's
// config table. Every key round-trips; every enum value parses and prints back; unknown values
// name the choices; README's "Config reference" table is the one generated from the declarations;
// config.json and config_hash are those of the dtrain before the declarations existed.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/config_diff.h"
#include "config/schema.h"
#include "config_test_util.h"
#include "util/check.h"

namespace dtrain {
namespace {

using config_test::error_of;

std::optional<Config> try_parse(const std::string& yaml, const std::vector<std::string>& sets) {
  try {
    return parse_config(yaml, "x.yaml", sets);
  } catch (const UserError&) {
    return std::nullopt;
  }
}

// --set values that put a key's owning choices (BelongsTo) in place, so the key may be set.
std::vector<std::string> owner_sets(const KeyDecl& d) {
  std::vector<std::string> sets;
  for (const BelongsTo& b : d.belongs) {
    // A predicate owner (a pipeline: stages > 1) is met by 2; an enum owner by its first value.
    sets.push_back(std::string(b.key) + "=" +
                   (b.when ? std::string("2") : std::string(b.values.front())));
  }
  return sets;
}

// Candidate values other than the default, as --set text, for a key of this type.
std::vector<std::string> candidates(const KeyDecl& d, const nlohmann::json& def) {
  switch (d.type) {
    case KeyType::kInt: {
      const int64_t v = def.get<int64_t>();
      return {std::to_string(v + 1), std::to_string(v + 2), "8", "16", "2"};
    }
    case KeyType::kFloat:
      return {"0.5", "0.25", "2.5", "0.75", "0.001"};
    case KeyType::kBool:
      return {def.get<bool>() ? "false" : "true"};
    case KeyType::kString:
      return {"x", "lbl"};
    case KeyType::kPath:
      return {"some/file.bin"};
    case KeyType::kChar:
      return {";"};
    case KeyType::kIntList:
      return {"[7, 5]"};
    case KeyType::kLayerList:
      return {"[{linear: 8}, relu, {linear: 4}]", "[flatten, {dropout: 0.25}, {linear: 3}]"};
    case KeyType::kPathList:
      return {"some/file.csv"};
    case KeyType::kEnum: {
      std::vector<std::string> out;
      for (std::string_view c : std::get<EnumRef>(d.ref).choices) out.emplace_back(c);
      return out;
    }
  }
  return {};
}

// Bases in which keys of every data format and file key are allowed.
const char* const kBases[] = {
    "data: {format: synthetic}\n",
    "data: {format: idx, train: {images: a, labels: b}}\n",
    "data: {format: csv, train: {path: a.csv}}\n",
    "model: {type: gpt}\ndata: {format: text, train: {path: a.txt}}\n",
};

// A config with key `d` set to a non-default value, or nullopt if no candidate is accepted.
std::optional<Config> with_non_default(const KeyDecl& d) {
  const Config defaults;
  const nlohmann::json def = d.get(defaults);
  for (const char* base : kBases) {
    for (const std::string& v : candidates(d, def)) {
      std::vector<std::string> sets = owner_sets(d);
      sets.push_back(d.path + "=" + v);
      if (d.path == "optimizer.nesterov") sets.push_back("optimizer.momentum=0.9");
      if (d.path == "distributed.local_sgd.outer_momentum")
        sets.push_back("distributed.local_sgd.outer_lr=0.7");
      if (d.path == "data.test.images") sets.push_back("data.test.labels=t");
      if (d.path == "data.test.labels") sets.push_back("data.test.images=t");
      if (d.path.starts_with("distributed.tls.")) {
        for (const char* k : {"cert", "key", "ca"}) {
          if (d.path != std::string("distributed.tls.") + k)
            sets.push_back(std::string("distributed.tls.") + k + "=f");
        }
      }
      std::optional<Config> c = try_parse(base, sets);
      if (c && d.get(*c) != def) return c;
    }
  }
  return std::nullopt;
}

// The "Config reference" table of README.md: from its header row to the first non-table line.
std::string readme_table() {
  std::ifstream in(std::string(DTRAIN_SOURCE_DIR) + "/README.md");
  REQUIRE(in.good());
  std::string line, out;
  bool in_section = false, in_table = false;
  while (std::getline(in, line)) {
    if (line.starts_with("## ")) in_section = line == "## Config reference";
    if (!in_section) continue;
    if (line.starts_with("| key | type | default | meaning |")) in_table = true;
    if (in_table) {
      if (!line.starts_with("|")) break;
      out += line + "\n";
    }
  }
  return out;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace

TEST_CASE("schema: every key is declared once, and sections come from the declarations") {
  std::set<std::string> seen;
  for (const KeyDecl& d : config_keys()) {
    CAPTURE(d.path);
    CHECK(seen.insert(d.path).second);
    CHECK(find_key(d.path) == &d);
    CHECK_FALSE(d.doc.empty());
    for (const BelongsTo& b : d.belongs) {
      const KeyDecl* owner = find_key(b.key);
      REQUIRE(owner != nullptr);
      if (b.when) continue;  // a predicate (a pipeline), not a choice of an enum
      REQUIRE(owner->type == KeyType::kEnum);
      for (std::string_view v : b.values) {
        const auto& choices = std::get<EnumRef>(owner->ref).choices;
        CHECK(std::find(choices.begin(), choices.end(), v) != choices.end());
      }
    }
  }
  CHECK(find_key("optimizer") == nullptr);  // a section, not a key
  CHECK(find_key("optimizer.lrr") == nullptr);
  const auto& top = config_sections().at("");
  CHECK(std::vector<std::string>(top.begin(), top.end()) ==
        std::vector<std::string>{"seed", "model", "data", "optimizer", "train", "distributed",
                                 "runtime"});
}

TEST_CASE("schema: every declared key round-trips through config_to_json and back") {
  for (const KeyDecl& d : config_keys()) {
    CAPTURE(d.path);
    // An enum of one choice (model.type) has no other value: its default round-trips.
    const bool one_choice =
        d.type == KeyType::kEnum && std::get<EnumRef>(d.ref).choices.size() == 1;
    const std::optional<Config> c = one_choice ? try_parse(kBases[0], {}) : with_non_default(d);
    REQUIRE_MESSAGE(c.has_value(), "no non-default value of " << d.path << " loads");
    const nlohmann::json j = config_to_json(*c);
    std::string pointer = "/" + d.path;
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    REQUIRE(j.contains(nlohmann::json::json_pointer(pointer)));
    // JSON is YAML: config.json loads back as the same config.
    const Config back = parse_config(j.dump(), "config.json");
    CHECK(config_to_json(back) == j);
    CHECK(config_hash(back) == config_hash(*c));
    if (!d.json_as_default) CHECK(d.get(back) == d.get(*c));
  }
}

TEST_CASE("schema: a preset is written as its widths (model.complexity is written as \"\")") {
  const Config c = parse_config("data: {format: synthetic}\nmodel: {complexity: medium}\n", "x");
  CHECK(c.model.complexity == Complexity::kMedium);
  const nlohmann::json j = config_to_json(c);
  CHECK(j["model"]["complexity"] == "");
  CHECK(j["model"]["hidden"] == nlohmann::json::array({512, 512}));
}

TEST_CASE("schema: every enum value parses and prints back, and zero3 reads as fsdp") {
  for (const KeyDecl& d : config_keys()) {
    if (d.type != KeyType::kEnum) continue;
    CAPTURE(d.path);
    const EnumRef& e = std::get<EnumRef>(d.ref);
    REQUIRE_FALSE(e.choices.empty());
    for (std::string_view name : e.choices) {
      CAPTURE(name);
      Config c;
      REQUIRE(e.set(c, name));
      CHECK(e.get(c) == name);
      CHECK(d.get(c) == std::string(name));
    }
    Config c;
    CHECK_FALSE(e.set(c, "nonsense"));
  }
  CHECK(to_string(StrategyKind::kFsdp) == "fsdp");
  CHECK(parse_enum<StrategyKind>("zero3") == StrategyKind::kFsdp);
  CHECK(enum_choices<StrategyKind>() ==
        std::vector<std::string_view>{"ddp", "local_sgd", "zero1", "zero2", "fsdp", "pipeline"});
  CHECK(to_string(Complexity::kNone).empty());
  CHECK(enum_choices<Complexity>() == std::vector<std::string_view>{"simple", "medium", "complex"});
  // Checkpoints store the compression type by name (compression_state.cc).
  CHECK(to_string(CompressionType::kPowersgd) == "powersgd");
  CHECK(to_string(PipelineSchedule::k1f1b) == "1f1b");
}

TEST_CASE("schema: an unknown enum value names the key, the choices and a close one") {
  for (const KeyDecl& d : config_keys()) {
    if (d.type != KeyType::kEnum) continue;
    CAPTURE(d.path);
    std::string choices;
    for (std::string_view c : std::get<EnumRef>(d.ref).choices)
      choices += (choices.empty() ? "" : ", ") + std::string(c);
    const std::string msg = error_of("data: {format: synthetic}\n", {d.path + "=nonsense"});
    CHECK(msg == "--set " + d.path + "=nonsense: " + d.path + ": must be one of " + choices +
                     " (got 'nonsense')");
  }
  CHECK(error_of("data: {format: synthetic}\noptimizer: {type: adamm}\n", {}) ==
        "x.yaml:2:19: optimizer.type: must be one of sgd, adam, adamw (got 'adamm'; did you "
        "mean 'adam'?)");
}

TEST_CASE("schema: README's Config reference table is the one generated from the declarations") {
  const std::string readme = readme_table();
  const std::string generated = config_reference_table();
  // Rows by their first cell, so that one changed key reports one row.
  const auto rows = [](const std::string& table) {
    std::map<std::string, std::string> m;
    for (const std::string& l : lines_of(table)) m[l.substr(0, l.find(" | "))] = l;
    return m;
  };
  const auto a = rows(readme), b = rows(generated);
  for (const auto& [key, row] : b) {
    const auto it = a.find(key);
    CHECK_MESSAGE(it != a.end(), "README lacks the row of " << key << ":\n  " << row);
    if (it != a.end())
      CHECK_MESSAGE(it->second == row, "README's row of " << key << " differs from the declaration:"
                                                          << "\n  README: " << it->second
                                                          << "\n  schema: " << row);
  }
  for (const auto& [key, row] : a)
    CHECK_MESSAGE(b.count(key) == 1, "README has a row for " << key << ", which is not declared");
  CHECK_MESSAGE(readme == generated, "the table generated from lib/config/schema.cc:\n"
                                         << "<<<\n"
                                         << generated << ">>>");
}

TEST_CASE("schema: config.json and config_hash are those of the dtrain before the declarations") {
  // config.json of each config and its hash, written by the dtrain before lib/config/schema
  // (commit f4e3c9d): checkpoints store the JSON, resume diffs it, rendezvous and resume
  // compare the hash, so neither may change for the same config.
  const std::pair<const char*, const char*> pinned[] = {
      {R"json({"data":{"batch_size":128,"csv":{"delimiter":",","header":"auto","label_column":""},"drop_last":false,"eval_batch_size":1000,"format":"idx","normalize":"auto","shuffle":true,"synthetic":{"classes":4,"features":32,"noise":0.5,"samples":10000,"seed":-1},"test":{"images":"/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz","labels":"/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz","path":""},"test_fraction":-1.0,"train":{"images":"/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz","labels":"/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz","path":""}},"distributed":{"backend":"grpc","bind":"","compression":{"error_feedback":true,"rank":4,"ratio":0.01,"type":"none"},"ddp":{"bucket_mb":1.0},"fsdp":{"layers_per_unit":1,"reshard_after_forward":true,"unit":"layer"},"heartbeat_s":10.0,"local_sgd":{"outer_lr":0.0,"outer_momentum":0.9,"sync_every":8,"sync_optimizer_state":false},"pipeline":{"activation_checkpointing":false,"micro_batches":4,"partition":"balanced","schedule":"1f1b","stages":2},"rendezvous_timeout_s":120.0,"shm":true,"strategy":"ddp","timeout_s":300.0,"tls":{"ca":"","cert":"","key":""},"token_file":"","world_size":2},"model":{"activation":"relu","complexity":"","dropout":0.0,"hidden":[512,512],"init":"auto","input_features":0,"layer_norm":false,"loss":"cross_entropy","num_classes":0,"type":"mlp"},"optimizer":{"beta1":0.9,"beta2":0.999,"clip_grad_norm":0.0,"eps":1e-08,"lr":0.05,"momentum":0.9,"nesterov":false,"scale_lr":"linear","schedule":{"gamma":0.1,"min_lr":0.0,"step_size":1000,"type":"cosine","warmup_steps":0},"type":"sgd","weight_decay":0.0},"runtime":{"threads":0},"seed":42,"train":{"checkpoint":{"every_steps":0,"keep_last":3},"epochs":10,"eval_every":0,"grad_accum_steps":1,"log_every":100,"max_steps":0,"nonfinite":"abort"}})json",
       "b24fc4ab6ac5a556"},  // configs/fmnist_ddp.yaml
      {R"json({"data":{"batch_size":128,"csv":{"delimiter":",","header":"auto","label_column":""},"drop_last":false,"eval_batch_size":1000,"format":"synthetic","normalize":"auto","shuffle":true,"synthetic":{"classes":4,"features":32,"noise":0.5,"samples":10000,"seed":-1},"test":{"images":"","labels":"","path":""},"test_fraction":-1.0,"train":{"images":"","labels":"","path":""}},"distributed":{"backend":"inproc","bind":"","compression":{"error_feedback":true,"rank":4,"ratio":0.01,"type":"none"},"ddp":{"bucket_mb":1.0},"fsdp":{"layers_per_unit":1,"reshard_after_forward":true,"unit":"layer"},"heartbeat_s":10.0,"local_sgd":{"outer_lr":0.0,"outer_momentum":0.9,"sync_every":8,"sync_optimizer_state":false},"pipeline":{"activation_checkpointing":false,"micro_batches":4,"partition":"balanced","schedule":"1f1b","stages":2},"rendezvous_timeout_s":120.0,"shm":true,"strategy":"fsdp","timeout_s":300.0,"tls":{"ca":"","cert":"","key":""},"token_file":"","world_size":1},"model":{"activation":"relu","complexity":"","dropout":0.0,"hidden":[64,64],"init":"auto","input_features":0,"layer_norm":false,"loss":"cross_entropy","num_classes":0,"type":"mlp"},"optimizer":{"beta1":0.9,"beta2":0.999,"clip_grad_norm":0.0,"eps":1e-08,"lr":0.003,"momentum":0.0,"nesterov":false,"scale_lr":"none","schedule":{"gamma":0.1,"min_lr":0.0,"step_size":1000,"type":"constant","warmup_steps":0},"type":"adam","weight_decay":0.0},"runtime":{"threads":1},"seed":7,"train":{"checkpoint":{"every_steps":100,"keep_last":2},"epochs":3,"eval_every":0,"grad_accum_steps":1,"log_every":20,"max_steps":0,"nonfinite":"abort"}})json",
       "e23f895f9a4868de"},  // configs/smoke.yaml data={format: synthetic}
                             // distributed.strategy=zero3
      {R"json({"data":{"batch_size":128,"csv":{"delimiter":",","header":"auto","label_column":""},"drop_last":false,"eval_batch_size":1000,"format":"synthetic","normalize":"auto","shuffle":true,"synthetic":{"classes":4,"features":32,"noise":0.5,"samples":10000,"seed":-1},"test":{"images":"","labels":"","path":""},"test_fraction":-1.0,"train":{"images":"","labels":"","path":""}},"distributed":{"backend":"inproc","bind":"","compression":{"error_feedback":true,"rank":4,"ratio":0.01,"type":"none"},"ddp":{"bucket_mb":1.0},"fsdp":{"layers_per_unit":1,"reshard_after_forward":true,"unit":"layer"},"heartbeat_s":10.0,"local_sgd":{"outer_lr":0.0,"outer_momentum":0.9,"sync_every":8,"sync_optimizer_state":false},"pipeline":{"activation_checkpointing":false,"micro_batches":4,"partition":"balanced","schedule":"gpipe","stages":2},"rendezvous_timeout_s":120.0,"shm":true,"strategy":"pipeline","timeout_s":300.0,"tls":{"ca":"","cert":"","key":""},"token_file":"","world_size":2},"model":{"activation":"relu","complexity":"","dropout":0.0,"hidden":[64,64],"init":"auto","input_features":0,"layer_norm":false,"loss":"cross_entropy","num_classes":0,"type":"mlp"},"optimizer":{"beta1":0.9,"beta2":0.999,"clip_grad_norm":0.0,"eps":1e-08,"lr":0.003,"momentum":0.0,"nesterov":false,"scale_lr":"none","schedule":{"gamma":0.1,"min_lr":0.0,"step_size":1000,"type":"constant","warmup_steps":0},"type":"adam","weight_decay":0.0},"runtime":{"threads":1},"seed":7,"train":{"checkpoint":{"every_steps":100,"keep_last":2},"epochs":3,"eval_every":0,"grad_accum_steps":1,"log_every":20,"max_steps":0,"nonfinite":"abort"}})json",
       "0b6f23b57f244d75"},  // configs/smoke.yaml data={format: synthetic} distributed={strategy:
                             // pipeline, world_size: 2, pipeline: {stages: 2, schedule: gpipe}}
      {R"json({"data":{"batch_size":128,"csv":{"delimiter":";","header":"true","label_column":""},"drop_last":false,"eval_batch_size":1000,"format":"csv","normalize":"auto","shuffle":true,"synthetic":{"classes":4,"features":32,"noise":0.5,"samples":10000,"seed":-1},"test":{"images":"","labels":"","path":""},"test_fraction":-1.0,"train":{"images":"","labels":"","path":"a.csv"}},"distributed":{"backend":"inproc","bind":"","compression":{"error_feedback":true,"rank":4,"ratio":0.01,"type":"none"},"ddp":{"bucket_mb":1.0},"fsdp":{"layers_per_unit":1,"reshard_after_forward":true,"unit":"layer"},"heartbeat_s":10.0,"local_sgd":{"outer_lr":0.0,"outer_momentum":0.9,"sync_every":8,"sync_optimizer_state":false},"pipeline":{"activation_checkpointing":false,"micro_batches":4,"partition":"balanced","schedule":"1f1b","stages":2},"rendezvous_timeout_s":120.0,"shm":true,"strategy":"ddp","timeout_s":300.0,"tls":{"ca":"","cert":"","key":""},"token_file":"","world_size":1},"model":{"activation":"relu","complexity":"","dropout":0.0,"hidden":[64,64],"init":"auto","input_features":0,"layer_norm":false,"loss":"cross_entropy","num_classes":0,"type":"mlp"},"optimizer":{"beta1":0.9,"beta2":0.999,"clip_grad_norm":0.0,"eps":1e-08,"lr":0.003,"momentum":0.0,"nesterov":false,"scale_lr":"none","schedule":{"gamma":0.1,"min_lr":0.0,"step_size":1000,"type":"constant","warmup_steps":0},"type":"adam","weight_decay":0.0},"runtime":{"threads":1},"seed":7,"train":{"checkpoint":{"every_steps":100,"keep_last":2},"epochs":3,"eval_every":0,"grad_accum_steps":1,"log_every":20,"max_steps":0,"nonfinite":"abort"}})json",
       "8ba6afc1e2c519ff"},  // configs/smoke.yaml data={format: csv, train: {path: a.csv}, csv:
                             // {header: 'true', delimiter: ';'}}
  };
  for (const auto& [json_text, hash] : pinned) {
    const Config c = parse_config(json_text, "config.json");
    CHECK(config_to_json(c).dump() == json_text);
    CHECK(config_hash(c) == hash);
  }
}

TEST_CASE("config_differences: a stored config whose sections are not objects is shown as it is") {
  // A checkpoint's stored config is input: `model: 5` or a list for `optimizer` made the JSON
  // pointers of the omitted defaults throw (exit 1, "unresolved reference token 'layers'").
  const nlohmann::json now = config_to_json(Config{});
  for (const char* section : {"model", "optimizer", "distributed", "train"})
    for (const nlohmann::json& bad : {nlohmann::json(5), nlohmann::json::array({1, 2}),
                                      nlohmann::json(nullptr), nlohmann::json("x")}) {
      CAPTURE(section);
      CAPTURE(bad.dump());
      nlohmann::json before = now;
      before[section] = bad;
      std::vector<std::string> diff;
      REQUIRE_NOTHROW(diff = config_differences(before, now));
      CHECK(std::find(diff.begin(), diff.end(),
                      std::string(section) + ": " + bad.dump() + " -> (absent)") != diff.end());
      REQUIRE_NOTHROW(config_differences(now, before));
    }
  nlohmann::json nested = now;
  nested["train"]["checkpoint"] = nlohmann::json::array({1});
  CHECK_NOTHROW(config_differences(nested, now));
  CHECK_NOTHROW(config_differences(nlohmann::json(3), now));
  CHECK(config_differences(now, now).empty());
}

}  // namespace dtrain
