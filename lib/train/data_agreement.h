// Ranks that each load their own data (processes, each reading its files, perhaps its own node's
// copy of them) must train on the same data: same-sized files of other contents trained in
// silence, each rank normalising and sampling its own dataset.
#pragma once

#include "comm/communicator.h"
#include "data/dataset.h"

namespace dtrain {

// Collective over `comm` (one all-gather of 4 int64 per rank): every rank's training and test
// splits (rows and data_fingerprint) against rank 0's. Throws AgreedInputError (train/stop.h),
// the same message on every rank, naming the first rank whose data differs. Returns this rank's
// training-split fingerprint (a checkpoint records it: TrainLoop::train_crc).
uint32_t check_same_data(Communicator& comm, const DataSplits& data);

}  // namespace dtrain
