// cuBLAS, loaded when the first CUDA device is made rather than linked: linking libcublas (and
// through it the 540 MB libcublasLt) costs every duet process about a second at start-up, GPU or
// not, and most never use a GPU. The build still finds cuBLAS and compiles against its header.
#pragma once

#include <cublas_v2.h>

#include <string>

namespace duet::cuda {

struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  // cublasGemmEx with a cublasComputeType_t (the header also has an inline overload for old code).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
  std::string library;  // the file it was loaded from

  // Loaded once (libcublas.so.13, else libcublas.so); throws kUnavailable naming the library and
  // the loader's error when it or one of its functions is missing.
  static const CublasApi& get();
};

}  // namespace duet::cuda

// A cuBLAS call that returns a status: a failure is a duet::Error (kUnavailable) naming it.
#define DUET_CUBLAS_CHECK(api, call)                                                                   \
  do {                                                                                                 \
    const cublasStatus_t duet_st_ = (call);                                                            \
    if (duet_st_ != CUBLAS_STATUS_SUCCESS) {                                                           \
      ::duet::fail(::duet::ErrorCode::kUnavailable, "{} failed at {}:{}: {}", #call, __FILE__, __LINE__, \
                   (api).status_string(duet_st_));                                                     \
    }                                                                                                  \
  } while (0)
