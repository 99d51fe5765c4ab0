// Emulated NeuronCore: device discovery and properties.
#include "runtime.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace torchneuron::emu {

const char* statusString(Status s) {
  switch (s) {
    case Status::Success: return "success";
    case Status::InvalidDevice: return "invalid device ordinal";
    case Status::OutOfMemory: return "out of device memory";
    case Status::InvalidValue: return "invalid argument";
    case Status::NotReady: return "device not ready";
    case Status::KernelFailed: return "work run asynchronously failed";
    case Status::LaunchFailed: return "the launched work failed";
    case Status::Internal: return "internal runtime error";
  }
  return "unknown status";
}

namespace {
thread_local std::string last_error;
}  // namespace

void setLastError(const char* message) {
  try {
    last_error = message != nullptr ? message : "";
  } catch (...) {
    last_error.clear();
  }
}

const char* lastError() { return last_error.c_str(); }

int deviceCount() {
  static const int count = [] {
    const char* env = std::getenv("TORCHNEURON_NUM_DEVICES");
    if (env == nullptr || *env == '\0') return 2;
    char* end = nullptr;
    long n = std::strtol(env, &end, 10);
    if (end == env || *end != '\0' || n < 0 || n > 64) {
      std::fprintf(stderr,
          "torchneuron: TORCHNEURON_NUM_DEVICES=%s is not a number from 0 to 64; using 2\n", env);
      return 2;
    }
    return static_cast<int>(n);
  }();
  return count;
}

size_t deviceCapacity();  // memory.cpp

Status getDeviceProperties(int device, DeviceProperties* props) {
  if (device < 0 || device >= deviceCount()) return Status::InvalidDevice;
  if (props == nullptr) return Status::InvalidValue;
  std::memset(props, 0, sizeof(*props));
  std::snprintf(props->name, sizeof(props->name), "NeuronCore (emulated)");
  props->total_memory = deviceCapacity();
  props->core_count = 1;
  return Status::Success;
}

}  // namespace torchneuron::emu
