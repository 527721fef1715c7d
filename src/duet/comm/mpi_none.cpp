// The MPI entry points of a build without MPI.
#include <cstdlib>

#include "duet/comm/mpi.h"
#include "duet/core/error.h"

namespace duet {

bool mpi_built() { return false; }

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

std::unique_ptr<Communicator> init_mpi_world() {
  fail(ErrorCode::kUnsupported,
       "this duet was built without MPI (install libopenmpi-dev, scripts/install-deps.sh does, and rebuild)");
}

void mpi_abort(int) {}
void mpi_finalize() {}

}  // namespace duet
