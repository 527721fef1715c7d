// Device failures: the error a failed device raises, and faults injected for tests (DUET_FAULT,
// POST /admin/fault): "device=cpu[1];step=20;mode=fail" makes cpu[1] fail at its 20th unit of
// work from now (a segment of one micro-batch), `hang` makes it stop there without returning
// (until it is declared failed), `oom` makes that work run out of memory.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "duet/core/error.h"

namespace duet {

// A device that failed (or was declared failed when it stopped making progress). Work that
// reaches it throws this; the engine moves the device's parts to a spare.
class DeviceFailure : public Error {
 public:
  DeviceFailure(std::string device, const std::string& reason);
  const std::string& device() const { return device_; }

 private:
  std::string device_;
};

enum class FaultMode { kFail, kHang, kOom };
std::string_view fault_mode_name(FaultMode mode);

struct FaultSpec {
  std::string device;  // a device name as the device map spells it
  int64_t step = 1;    // the unit of work, counted from when the fault is armed, that it hits (>= 1)
  FaultMode mode = FaultMode::kFail;
};

// "device=NAME;step=N;mode=fail|hang|oom" (step defaults to 1, mode to fail). Throws
// kInvalidArgument naming the field.
FaultSpec parse_fault_spec(std::string_view text);

// Arms a fault (replacing one armed for the same device).
void arm_fault(const FaultSpec& spec);
// Arms DUET_FAULT's fault when the variable is set; throws like parse_fault_spec.
void arm_fault_from_env();
// Called by a device before each unit of work: counts it against the fault armed for `device`
// and returns the mode when this is the unit it hits (the fault is then disarmed).
bool take_fault(const std::string& device, FaultMode& mode);

}  // namespace duet
