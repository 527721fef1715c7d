// The NCCL communicator on this machine's GPUs: built when CUDA and NCCL are found, reported
// skipped (exit 77) where no GPU is present. With one process it is a communicator of one rank
// per run (NCCL's calls, streams and deadlines all exercised); under mpirun, one rank per GPU.
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "duet/comm/communicator.h"
#include "duet/comm/mpi.h"
#include "duet/comm/nccl.h"

namespace {

int failures = 0;
void check(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what);
  if (!ok) ++failures;
}

}  // namespace

int main() {
  using namespace duet;
  if (!nccl_built()) {
    std::fprintf(stderr, "nccl_test: this build has no NCCL\n");
    return 77;
  }
  const int gpus = cuda_device_count();
  if (gpus < 1) {
    std::fprintf(stderr, "nccl_test: no GPU here, NCCL was compiled and linked but not run\n");
    return 77;
  }
  std::unique_ptr<Communicator> boot = launched_by_mpi() ? init_mpi_world() : make_single_communicator();
  boot->set_timeout(std::chrono::seconds(30));
  const int n = boot->size(), me = boot->rank();
  if (n > gpus) {
    std::fprintf(stderr, "nccl_test: %d ranks but %d GPUs\n", n, gpus);
    return 77;
  }
  {
    std::unique_ptr<Communicator> c = make_nccl_communicator(*boot, me);
    const int64_t count = 4097;
    std::vector<float> host(count);
    for (int64_t i = 0; i < count; ++i) host[i] = static_cast<float>(me + 1) * static_cast<float>(i % 13);
    float* dev = nullptr;
    cudaMalloc(&dev, count * sizeof(float));
    cudaMemcpy(dev, host.data(), count * sizeof(float), cudaMemcpyHostToDevice);
    c->allreduce_sum(dev, count);
    cudaMemcpy(host.data(), dev, count * sizeof(float), cudaMemcpyDeviceToHost);
    const float factor = static_cast<float>(n * (n + 1) / 2);
    bool ok = true;
    for (int64_t i = 0; i < count; ++i) ok = ok && host[i] == factor * static_cast<float>(i % 13);
    check(ok, "allreduce_sum on device memory");
    float* gathered = nullptr;
    cudaMalloc(&gathered, count * sizeof(float) * n);
    c->allgather(dev, gathered, count * sizeof(float));
    std::vector<float> all(static_cast<size_t>(count) * n);
    cudaMemcpy(all.data(), gathered, all.size() * sizeof(float), cudaMemcpyDeviceToHost);
    check(all[static_cast<size_t>(count) * (n - 1) + 5] == factor * 5.0f, "allgather on device memory");
    c->barrier();
    check(true, "barrier");
    cudaFree(gathered);
    cudaFree(dev);
  }
  boot.reset();
  mpi_finalize();
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
