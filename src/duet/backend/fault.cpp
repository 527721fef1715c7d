#include "duet/backend/fault.h"

#include <atomic>
#include <charconv>
#include <cstdlib>
#include <map>
#include <mutex>

#include <fmt/format.h>

namespace duet {
namespace {

std::mutex g_mutex;
std::map<std::string, std::pair<int64_t, FaultMode>> g_armed;  // device -> (units left, mode)
std::atomic<int> g_num_armed{0};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

DeviceFailure::DeviceFailure(std::string device, const std::string& reason)
    : Error(ErrorCode::kUnavailable, fmt::format("device {} failed: {}", device, reason)), device_(std::move(device)) {}

std::string_view fault_mode_name(FaultMode mode) {
  switch (mode) {
    case FaultMode::kFail: return "fail";
    case FaultMode::kHang: return "hang";
    case FaultMode::kOom: return "oom";
  }
  return "?";
}

FaultSpec parse_fault_spec(std::string_view text) {
  FaultSpec spec;
  bool has_device = false;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(';', start), text.size());
    const std::string_view field = trim(text.substr(start, end - start));
    start = end + 1;
    if (field.empty()) continue;
    const size_t eq = field.find('=');
    if (eq == std::string_view::npos) fail(ErrorCode::kInvalidArgument, "fault '{}': '{}' is not KEY=VALUE", text, field);
    const std::string_view key = trim(field.substr(0, eq));
    const std::string_view value = trim(field.substr(eq + 1));
    if (key == "device") {
      if (value.empty()) fail(ErrorCode::kInvalidArgument, "fault '{}': the device is empty", text);
      spec.device = std::string(value);
      has_device = true;
    } else if (key == "step") {
      int64_t n = 0;
      const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec != std::errc() || p != value.data() + value.size() || n < 1) {
        fail(ErrorCode::kInvalidArgument, "fault '{}': step is '{}', expected an integer >= 1", text, value);
      }
      spec.step = n;
    } else if (key == "mode") {
      if (value == "fail") spec.mode = FaultMode::kFail;
      else if (value == "hang") spec.mode = FaultMode::kHang;
      else if (value == "oom") spec.mode = FaultMode::kOom;
      else fail(ErrorCode::kInvalidArgument, "fault '{}': mode is '{}', expected fail, hang or oom", text, value);
    } else {
      fail(ErrorCode::kInvalidArgument, "fault '{}': unknown field '{}' (device, step, mode)", text, key);
    }
  }
  if (!has_device) fail(ErrorCode::kInvalidArgument, "fault '{}': no device= given", text);
  return spec;
}

void arm_fault(const FaultSpec& spec) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_armed[spec.device] = {spec.step, spec.mode};
  g_num_armed.store(static_cast<int>(g_armed.size()));
}

void arm_fault_from_env() {
  const char* text = std::getenv("DUET_FAULT");
  if (text == nullptr || *text == '\0') return;
  arm_fault(parse_fault_spec(text));
}

bool take_fault(const std::string& device, FaultMode& mode) {
  if (g_num_armed.load(std::memory_order_relaxed) == 0) return false;
  const std::lock_guard<std::mutex> lock(g_mutex);
  const auto it = g_armed.find(device);
  if (it == g_armed.end() || --it->second.first > 0) return false;
  mode = it->second.second;
  g_armed.erase(it);
  g_num_armed.store(static_cast<int>(g_armed.size()));
  return true;
}

}  // namespace duet
