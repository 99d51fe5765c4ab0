// PyTorch's DispatchStub as PyTorch's own x86-64 build declares it. Its CPU kernels exist per
// instruction set (DEFAULT, AVX2, AVX512), and the header declares those kernels, and the call that
// chooses among them, only when the build defines HAVE_*_CPU_DEFINITION. The wheel's headers do not,
// so a stub's CPU kernel could not be called from here. Include this before any other header that
// includes ATen/native/DispatchStub.h.
#pragma once

#if defined(__x86_64__)
#define HAVE_AVX512_CPU_DEFINITION
#define HAVE_AVX2_CPU_DEFINITION
#define TORCHNEURON_CPU_STUBS 1  // a stub's CPU kernel can be called: stub(c10::kCPU, ...)
#else
#define TORCHNEURON_CPU_STUBS 0
#endif

#include <ATen/native/DispatchStub.h>
