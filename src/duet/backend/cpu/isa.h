// Instruction sets the CPU kernels are built for, detected once at start-up.
// DUET_FORCE_ISA=generic|avx2|avxvnni|avx512|neon overrides the choice (for tests and comparisons).
#pragma once

#include <string_view>
#include <vector>

namespace duet::cpu {

enum class Isa { kGeneric, kAvx2, kAvxVnni, kAvx512, kNeon };

std::string_view isa_name(Isa isa);
// ISAs this build has kernels for and this CPU can run, best last.
std::vector<Isa> available_isas();
// The ISA in use: DUET_FORCE_ISA if set (an error if unavailable), else the best available.
Isa selected_isa();

}  // namespace duet::cpu
