// The safetensors reader on arbitrary files: the 8-byte header length, the JSON header (dtypes,
// shapes, data_offsets, __metadata__ and its crc32 table) and the data section's layout and
// checksums. Both readers (whole file, metadata only) see every input.
#include "checkpoint/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain;
  static fuzz::InputFile file("safetensors");
  const std::string& path = file.write(fuzz::as_view(data, size));
  fuzz::expect_user_error_at_most([&] { (void)read_safetensors_metadata(path); });
  fuzz::expect_user_error_at_most([&] { (void)read_safetensors(path); });
  return 0;
}
