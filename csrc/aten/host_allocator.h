// The pinned host allocator (host_allocator.cpp): page-locked host memory for non_blocking copies.
#pragma once

#include <c10/core/Allocator.h>

namespace torchneuron {

c10::Allocator* hostAllocator();

}  // namespace torchneuron
