// The IDX loader (images + labels, each plain or gzip) on arbitrary pairs of files. Input: a
// 2-byte little-endian length L, then L bytes of images file, then the labels file (an input
// shorter than its L gives the images file what there is and an empty labels file).
#include <algorithm>

#include "data/dataset.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain;
  static fuzz::InputFile images("images"), labels("labels");
  const std::string_view in = fuzz::as_view(data, size);
  const size_t len = size < 2 ? 0 : std::min<size_t>(size - 2, data[0] | data[1] << 8);
  const std::string_view img = size < 2 ? in : in.substr(2, len);
  const std::string_view lab = size < 2 ? std::string_view() : in.substr(2 + len);
  const std::string& ip = images.write(img);
  const std::string& lp = labels.write(lab);
  (void)idx_label_count(lp);
  fuzz::expect_user_error_at_most([&] { (void)load_idx(ip, lp); });
  fuzz::expect_user_error_at_most([&] { (void)read_maybe_gzip(ip); });
  return 0;
}
