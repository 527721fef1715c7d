// Every CUDA runtime and cuBLAS call of the backend goes through these: a failure is a
// duet::Error (kUnavailable) naming the call, the file and line and the runtime's own words, never
// an abort, so the engine can fail the device over.
#pragma once

#include <cuda_runtime.h>

#include "duet/core/error.h"

#define DUET_CUDA_CHECK(call)                                                                                \
  do {                                                                                                       \
    const cudaError_t duet_rc_ = (call);                                                                     \
    if (duet_rc_ != cudaSuccess) {                                                                           \
      (void)cudaGetLastError(); /* clears a non-sticky error */                                              \
      ::duet::fail(::duet::ErrorCode::kUnavailable, "{} failed at {}:{}: {} ({})", #call, __FILE__, __LINE__, \
                   cudaGetErrorString(duet_rc_), cudaGetErrorName(duet_rc_));                                \
    }                                                                                                        \
  } while (0)
