// Strict mode's device memory (protection.cpp), for memory.cpp.
#pragma once

#include <cstddef>

namespace torchneuron::emu {

size_t deviceCapacity();  // bytes per device (memory.cpp)

// In strict mode every device's memory is carved from one reserved mapping that is out of the
// host's reach outside the windows of running work (neuron_runtime.h). nullptr: no room left.
void* protectedAllocate(int device, size_t nbytes);
void protectedFree(int device, void* ptr, size_t nbytes);

}  // namespace torchneuron::emu
