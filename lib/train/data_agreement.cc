#include "train/data_agreement.h"

#include <string>
#include <vector>

#include "train/stop.h"

namespace dtrain {

uint32_t check_same_data(Communicator& comm, const DataSplits& data) {
  const std::vector<int64_t> mine = {data.train.rows, data_fingerprint(data.train), data.test.rows,
                                     data_fingerprint(data.test)};
  const size_t world = static_cast<size_t>(comm.size());
  std::vector<int64_t> all(4 * world);
  comm.allgather(mine.data(), all.data(), std::vector<size_t>(world, 4));
  for (size_t r = 1; r < world; ++r)
    for (size_t split = 0; split < 2; ++split) {
      const int64_t* a = &all[2 * split];
      const int64_t* b = &all[4 * r + 2 * split];
      if (a[0] == b[0] && a[1] == b[1]) continue;
      const char* name = split == 0 ? "training" : "test";
      throw AgreedInputError(
          "rank " + std::to_string(r) + "'s " + name + " data differs from rank 0's (" +
          std::to_string(b[0]) + " rows against " + std::to_string(a[0]) +
          (a[0] == b[0] ? ", other contents" : "") +
          "): every rank must read the same files (on several machines: copies that are the "
          "same, or one shared folder)");
    }
  return static_cast<uint32_t>(mine[1]);
}

}  // namespace dtrain
