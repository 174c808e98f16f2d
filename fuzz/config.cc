// The YAML config loader on arbitrary text: parsing, the schema's checks, cross-key validation,
// and for configs it accepts, their JSON form and hash (what config.json and rendezvous use).
// Lines of the input that start with "--set " are taken out and given as overrides, as
// `dtrain run --set KEY=VALUE` does.
#include "config/config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain;
  const std::string_view in = fuzz::as_view(data, size);
  std::string yaml;
  std::vector<std::string> overrides;
  for (size_t pos = 0; pos < in.size();) {
    size_t end = in.find('\n', pos);
    if (end == std::string_view::npos) end = in.size();
    const std::string_view line = in.substr(pos, end - pos);
    if (line.starts_with("--set "))
      overrides.emplace_back(line.substr(6));
    else
      yaml.append(line).push_back('\n');
    pos = end + 1;
  }
  fuzz::expect_user_error_at_most([&] {
    const Config c = parse_config(yaml, "fuzz.yaml", overrides);
    (void)config_to_json(c).dump();
    (void)config_hash(c);
  });
  return 0;
}
