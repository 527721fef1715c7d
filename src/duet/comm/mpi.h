// MPI as a Communicator (OpenMPI; any transport it has). Built when CMake finds MPI
// (DUET_HAVE_MPI); without it, launched_by_mpi() still answers and init_mpi_world() refuses.
#pragma once

#include <memory>

#include "duet/comm/communicator.h"

namespace duet {

// Whether this build has MPI.
bool mpi_built();
// Whether an MPI launcher (mpirun, srun) started this process as one of several ranks.
bool launched_by_mpi();
// Initializes MPI once (needs MPI_THREAD_MULTIPLE: parts and pipeline copies call it from the
// devices' threads) and returns a communicator over every rank. Throws kUnsupported without MPI
// or when the library lacks thread support.
std::unique_ptr<Communicator> init_mpi_world();
// Ends every rank of the job with `code` (what mpirun then exits with); returns only without MPI.
void mpi_abort(int code);
// Finalizes MPI if it was initialized (at exit).
void mpi_finalize();

}  // namespace duet
