#include "duet/backend/cpu/isa.h"

#include <cstdlib>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#include "duet/backend/cpu/kernels.h"
#include "duet/core/error.h"

namespace duet::cpu {
namespace {

#if defined(__x86_64__)
// AMX-TILE and AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25), and the kernel's permission for this
// process to use the tile state (Linux grants it on request, once per process, for every thread;
// a kernel without AMX support refuses and the AVX-512 kernels are used).
bool amx_usable() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  if ((edx & (1u << 24)) == 0 || (edx & (1u << 25)) == 0) return false;
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#endif

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kGeneric: return "generic";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvxVnni: return "avxvnni";
    case Isa::kAvx512: return "avx512";
    case Isa::kAmx: return "amx";
    case Isa::kNeon: return "neon";
  }
  return "unknown";
}

std::vector<Isa> available_isas() {
  std::vector<Isa> isas{Isa::kGeneric};
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
    isas.push_back(Isa::kAvx2);
    // AVX-VNNI is CPUID leaf 7, sub-leaf 1, EAX bit 4 (GCC 12's __builtin_cpu_supports does not
    // see it); it uses the AVX registers, whose OS support the AVX2 check covers.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && (eax & (1u << 4)) != 0) isas.push_back(Isa::kAvxVnni);
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")) {
      isas.push_back(Isa::kAvx512);
      if (amx_usable()) isas.push_back(Isa::kAmx);
    }
  }
#endif
#if defined(__aarch64__)
  if ((getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0) isas.push_back(Isa::kNeon);
#endif
  return isas;
}

Isa selected_isa() {
  static const Isa chosen = [] {
    const std::vector<Isa> isas = available_isas();
    const char* forced = std::getenv("DUET_FORCE_ISA");
    if (forced == nullptr || *forced == '\0') return isas.back();
    std::string names;
    for (Isa isa : isas) {
      if (isa_name(isa) == forced) return isa;
      names += (names.empty() ? "" : ", ") + std::string(isa_name(isa));
    }
    fail(ErrorCode::kInvalidArgument, "DUET_FORCE_ISA={} is not available on this machine (available: {})", forced,
         names);
  }();
  return chosen;
}

const Kernels& kernels_for(Isa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case Isa::kAvx2: return kernels_avx2();
    case Isa::kAvxVnni: return kernels_avxvnni();
    case Isa::kAvx512: return kernels_avx512();
    case Isa::kAmx: return kernels_amx();
#endif
#if defined(__aarch64__)
    case Isa::kNeon: return kernels_neon();
#endif
    default: return kernels_generic();
  }
}

const Kernels& kernels() {
  static const Kernels& k = kernels_for(selected_isa());
  return k;
}

QGemmFn qgemm_fn(const Kernels& k, DType type) {
  switch (type) {
    case DType::kQ4_0: return k.gemm_q4_0_q8a;
    case DType::kQ8_0: return k.gemm_q8_0_q8a;
    case DType::kQ4_K: return k.gemm_q4_k_q8a;
    case DType::kQ6_K: return k.gemm_q6_k_q8a;
    default: return nullptr;
  }
}

PackedGemmFn packed_gemm_fn(const Kernels& k, DType type) {
  switch (type) {
    case DType::kQ4_0: return k.gemm_q4_0x16_q8a;
    case DType::kQ8_0: return k.gemm_q8_0x16_q8a;
    case DType::kQ4_K: return k.gemm_q4_kx16_q8a;
    case DType::kQ5_0: return k.gemm_q5_0x16_q8a;
    case DType::kQ6_K: return k.gemm_q6_kx16_q8a;
    case DType::kQ4_1: return k.gemm_q4_1x16_q8a;
    default: return nullptr;
  }
}

DequantizeRowFn dequantize_fn(const Kernels& k, DType type) {
  switch (type) {
    case DType::kF16: return k.dequantize_f16;
    case DType::kBF16: return k.dequantize_bf16;
    case DType::kQ8_0: return k.dequantize_q8_0;
    case DType::kQ4_0: return k.dequantize_q4_0;
    case DType::kQ4_1: return k.dequantize_q4_1;
    case DType::kQ5_0: return k.dequantize_q5_0;
    case DType::kQ5_1: return k.dequantize_q5_1;
    case DType::kQ4_K: return k.dequantize_q4_k;
    case DType::kQ5_K: return k.dequantize_q5_k;
    case DType::kQ6_K: return k.dequantize_q6_k;
    case DType::kFP8_E4M3_B128: return k.dequantize_fp8;
    default: return nullptr;
  }
}

}  // namespace duet::cpu
