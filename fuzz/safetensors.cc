// The safetensors reader on arbitrary files: the 8-byte header length, the JSON header (dtypes,
// shapes, data_offsets, __metadata__ and its crc32 table) and the data section's layout and
// checksums. Every reader (whole file as dtrain's own, converting other dtypes as
// train.init_from reads, reading only some tensors, metadata only) sees every input.
#include "checkpoint/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain;
  static fuzz::InputFile file("safetensors");
  const std::string& path = file.write(fuzz::as_view(data, size));
  fuzz::expect_user_error_at_most([&] { (void)read_safetensors_metadata(path); });
  fuzz::expect_user_error_at_most([&] { (void)read_safetensors(path); });
  StReadOptions convert;
  convert.convert = true;
  fuzz::expect_user_error_at_most([&] { (void)read_safetensors(path, convert); });
  convert.wanted = [](const std::string& name) { return name.size() % 2 == 0; };
  fuzz::expect_user_error_at_most([&] { (void)read_safetensors(path, convert); });
  return 0;
}
