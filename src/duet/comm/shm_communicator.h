// Collectives through one shared-memory segment, for ranks on one machine: each rank writes its
// part into its own slot and reads the others' (allreduce, allgather, all-to-all, broadcast,
// barrier), synchronised by two counters per rank in the segment. No system call on the way,
// which is what makes it faster than MPI for a decode step's small messages. Messages larger than
// `max_bytes` (and point to point, and split) go to the communicator underneath, which also
// creates the segment: rank 0 makes it, the others open it, and it is unlinked as soon as all
// have, so nothing is left behind however the ranks end.
#pragma once

#include <memory>

#include "duet/comm/communicator.h"

namespace duet {

// Default: messages up to this many bytes per rank take the shared-memory path (measured in
// bench/RESULTS.md: faster than MPI's shared-memory transport up to at least this size).
inline constexpr size_t kDefaultShmMaxBytes = size_t{4} << 20;

// `base` must have every rank on this machine (base->same_host()).
std::unique_ptr<Communicator> make_shm_communicator(std::unique_ptr<Communicator> base,
                                                    size_t max_bytes = kDefaultShmMaxBytes);

}  // namespace duet
