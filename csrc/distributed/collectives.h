// The c10d operators' kernels for neuron tensors.
#pragma once

#include <cstdint>

namespace torchneuron::distributed {

// Registers the neuron (PrivateUse1) kernels of the c10d operators in place
// of PyTorch's, once per process. They run the collective with the backend
// the process group holds for the neuron device; when that is gloo, on CPU
// views of the device memory, with a NeuronWork as the handle.
void registerCollectives();

// Number of NeuronWork handles alive in this process.
int64_t liveWorkCount();

}  // namespace torchneuron::distributed
