// Instruction sets the CPU kernels are built for, detected once at start-up.
// DUET_FORCE_ISA=generic|avx2|avxvnni|avx512|amx|neon overrides the choice (for tests and comparisons).
#pragma once

#include <string_view>
#include <vector>

namespace duet::cpu {

// kAmx is AVX-512 with Intel's AMX tile unit (AMX-INT8) for the packed GEMM.
enum class Isa { kGeneric, kAvx2, kAvxVnni, kAvx512, kAmx, kNeon };

std::string_view isa_name(Isa isa);
// ISAs this build has kernels for and this CPU can run, best last.
std::vector<Isa> available_isas();
// The ISA in use: DUET_FORCE_ISA if set (an error if unavailable), else the best available.
Isa selected_isa();

}  // namespace duet::cpu
