// The runtime's internal assertions: compiled in by the debug build (TORCHNEURON_DEBUG=1 at build time
// defines TORCHNEURON_DEBUG; setup.py), out of the release build. A failed one names the condition and
// the line and aborts, so a core dump or a debugger stops at the broken invariant.
#pragma once

#ifdef TORCHNEURON_DEBUG
#include <cstdio>
#include <cstdlib>

#define TORCHNEURON_RT_ASSERT(cond, what)                                                              \
  do {                                                                                                 \
    if (!(cond)) {                                                                                     \
      std::fprintf(stderr, "torchneuron runtime: internal assertion failed at %s:%d: %s (%s)\n",       \
                   __FILE__, __LINE__, #cond, what);                                                   \
      std::abort();                                                                                    \
    }                                                                                                  \
  } while (0)
#else
#define TORCHNEURON_RT_ASSERT(cond, what) \
  do {                                    \
  } while (0)
#endif
