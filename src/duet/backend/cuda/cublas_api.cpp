#include "duet/backend/cuda/cublas_api.h"

#include <dlfcn.h>

#include "duet/core/error.h"

namespace duet::cuda {
namespace {

CublasApi load() {
  CublasApi api;
  void* lib = nullptr;
  std::string errors;
  for (const char* name : {"libcublas.so.13", "libcublas.so"}) {
    lib = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) {
      api.library = name;
      break;
    }
    const char* e = ::dlerror();
    errors += std::string(errors.empty() ? "" : "; ") + (e != nullptr ? e : name);
  }
  if (lib == nullptr) fail(ErrorCode::kUnavailable, "cuBLAS could not be loaded: {}", errors);
  // Kept loaded for the life of the process.
  const auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
    if (fn == nullptr) fail(ErrorCode::kUnavailable, "{} has no function {}", api.library, name);
  };
  sym(api.create, "cublasCreate_v2");
  sym(api.destroy, "cublasDestroy_v2");
  sym(api.set_stream, "cublasSetStream_v2");
  sym(api.sgemm, "cublasSgemm_v2");
  sym(api.set_workspace, "cublasSetWorkspace_v2");
  sym(api.gemm_ex, "cublasGemmEx");
  sym(api.status_string, "cublasGetStatusString");
  return api;
}

}  // namespace

const CublasApi& CublasApi::get() {
  static const CublasApi api = load();  // a failure throws here and is tried again next time
  return api;
}

}  // namespace duet::cuda
