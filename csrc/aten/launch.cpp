// Launching work on a device: what a refused launch raises.
#include "neuron.h"

#include <c10/util/Exception.h>

namespace torchneuron {

void failLaunch(rt::Status status, c10::DeviceIndex device, const char* name) {
  if (status == rt::Status::InvalidDevice) checkDevice(device);  // PyTorch's message for a bad index
  TORCH_CHECK(false, "neuron:", int(device), ": the runtime refused to launch ", name != nullptr ? name : "a kernel",
              ": ", rt::statusString(status));
}

}  // namespace torchneuron
