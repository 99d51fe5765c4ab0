// Emulated NeuronCore: the version of the interface this runtime implements.
#include "runtime.h"

namespace torchneuron::emu {

int apiVersion() { return kApiVersionMajor * 1000 + kApiVersionMinor; }

}  // namespace torchneuron::emu
