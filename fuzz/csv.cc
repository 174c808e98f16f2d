// The CSV loaders (training data, predict inputs) on arbitrary files and options. Input: one
// byte of options (bits 0-1 header auto/true/false, 2-3 delimiter , ; tab |, 4-5 label column
// last/"0"/"1"/"label", 6-7 the feature count predict expects: 1..4), then the file.
#include "data/dataset.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain;
  if (size == 0) return 0;
  static fuzz::InputFile file("csv");
  const uint8_t o = data[0];
  CsvOptions opts;
  opts.header = (o & 3) == 1   ? CsvHeader::kTrue
                : (o & 3) == 2 ? CsvHeader::kFalse
                               : CsvHeader::kAuto;
  opts.delimiter = ",;\t|"[(o >> 2) & 3];
  static const char* const kLabel[] = {"", "0", "1", "label"};
  opts.label_column = kLabel[(o >> 4) & 3];
  const int64_t features = 1 + ((o >> 6) & 3);
  const std::string& path = file.write(fuzz::as_view(data + 1, size - 1));
  fuzz::expect_user_error_at_most([&] { (void)load_csv(path, opts); });
  int64_t rows = 0;
  fuzz::expect_user_error_at_most([&] { (void)load_csv_features(path, opts, features, &rows); });
  return 0;
}
