// Emulated NeuronCore: the version of the interface this runtime implements.
#include "neuron_runtime.h"

namespace torchneuron::rt {

int apiVersion() { return kApiVersionMajor * 1000 + kApiVersionMinor; }

}  // namespace torchneuron::rt
