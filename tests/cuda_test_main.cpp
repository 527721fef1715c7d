// The main of the tests that run on a GPU: without one they report themselves skipped (exit 77,
// with the reason), having been compiled and linked.
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "duet/backend/cuda_device.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const duet::CudaDeviceCount gpus = duet::probe_cuda_devices();
  if (gpus.count == 0) {
    const std::string name = argc > 0 ? std::string(argv[0]) : "this test";
    std::fprintf(stderr, "%s: skipped, no GPU (%s); compiled and linked, not run\n",
                 name.substr(name.find_last_of('/') + 1).c_str(), gpus.error.c_str());
    return 77;
  }
  return RUN_ALL_TESTS();
}
