// Work held back above the runtime, and aten's only way to the runtime's waiting and copying calls.
//
// Fused eager holds recorded ops back from the runtime (csrc/fused/). Before the host asks the
// runtime for anything that must come after them, aten hands them over, saying what the host needs:
// launch() and enqueue() do (launch.h), and so do the wrappers below. The runtime never calls up.
#pragma once

#include "../runtime/neuron_runtime.h"

#include <cstddef>

namespace torchneuron {

enum class HostNeed {
  Launch,           // a kernel launched or queued
  HostCopy,         // a copy between host and device memory: a boundary of the host's
  DeviceCopy,       // a copy within device memory
  Synchronization,  // the host waits for, asks about or orders a stream's work: a boundary too
};
// Runs the group fused eager holds, if any; `what` names the need for its report (csrc/fused/fused.cpp).
void handOverHeldWork(HostNeed need, const char* what);

namespace runtime {  // the runtime's waiting and copying calls, after the held work
inline rt::Status synchronizeDevice(int device) {
  handOverHeldWork(HostNeed::Synchronization, "synchronize");
  return rt::deviceSynchronize(device);
}
inline rt::Status synchronizeStream(int device, rt::Stream stream) {
  handOverHeldWork(HostNeed::Synchronization, "stream synchronize");
  return rt::streamSynchronize(device, stream);
}
inline rt::Status queryStream(int device, rt::Stream stream) {
  handOverHeldWork(HostNeed::Synchronization, "stream query");
  return rt::streamQuery(device, stream);
}
inline rt::Status streamWaitEvent(int device, rt::Stream stream, rt::Event event) {
  handOverHeldWork(HostNeed::Synchronization, "wait_event");
  return rt::streamWaitEvent(device, stream, event);
}
inline rt::Status recordEvent(rt::Event event, int device, rt::Stream stream) {
  handOverHeldWork(HostNeed::Synchronization, "event record");  // after the ops recorded so far
  return rt::eventRecord(event, device, stream);
}
inline rt::Status copyMemory(void* dst, const void* src, size_t nbytes, rt::CopyKind kind) {
  if (kind != rt::CopyKind::HostToHost)
    handOverHeldWork(kind == rt::CopyKind::DeviceToDevice ? HostNeed::DeviceCopy : HostNeed::HostCopy, "copy");
  return rt::memcpy(dst, src, nbytes, kind);
}
}  // namespace runtime

}  // namespace torchneuron
