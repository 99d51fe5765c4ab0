// Work held back above the runtime, and aten's only way to the runtime's waiting and copying calls.
//
// Something may hold ops back from the runtime, recording them instead of running them: fused eager
// (csrc/fused/) does, plugged in at start-up behind the table below (registerHeldWork). aten knows only
// the table: it offers each boxed op to record() while recording is on, and before the host asks the
// runtime for anything that must come after the held ops, it hands them over, saying what the host
// needs: launch() and enqueue() do (launch.h), and so do the wrappers below. The runtime never calls up.
//
// The cost on every op is one flag read inline: recording (ops are offered to record()) and engaged
// (work may be held: hand-overs go to the holder). Both stay off until the holder turns recording on;
// engaged then stays on, so a hand-over never misses work recorded just before recording was turned off.
#pragma once

#include "../runtime/neuron_runtime.h"

#include <ATen/core/stack.h>

#include <atomic>
#include <cstddef>

namespace c10 {
class OperatorHandle;
}  // namespace c10

namespace torchneuron {

enum class HostNeed {
  Launch,           // a kernel launched or queued
  HostCopy,         // a copy between host and device memory: a boundary of the host's
  DeviceCopy,       // a copy within device memory
  Synchronization,  // the host waits for, asks about or orders a stream's work: a boundary too
};

// What holds work back, registered once at start-up (module.cpp). The defaults (held_work.cpp) hold
// nothing: they record no op and have nothing to hand over.
struct HeldWork {
  // Whether the next op is to be recorded (asked only while recording is on; it may count the op).
  bool (*recordsNext)();
  // Records a boxed op (its results allocated now and left on the stack). False when it must run now.
  bool (*record)(const c10::OperatorHandle& op, torch::jit::Stack* stack);
  // Runs the held work before the host's `need`; `what` names it for the report.
  void (*handOver)(HostNeed need, const char* what);
  // Runs the held work, if any, for `reason` (the allocator's: out of memory, empty_cache, ...).
  void (*flush)(const char* reason);
  bool (*holding)();        // work is held
  bool (*recordingHere)();  // this thread is recording an op: the held work cannot run now
};
void registerHeldWork(const HeldWork& holder);
// The holder turns recording on and off (turning it off, it hands its work over first).
void setRecordingOps(bool on);

namespace held_work {  // the registered table and its flags (held_work.cpp): read through the calls below
extern HeldWork holder;
extern std::atomic<bool> recording;
extern std::atomic<bool> engaged;
}  // namespace held_work

inline bool recordingOpsOn() { return held_work::recording.load(std::memory_order_relaxed); }
// An op on neuron tensors is to be offered to recordOp() (the fast paths then box it for the fallback).
inline bool recordingOps() { return recordingOpsOn() && held_work::holder.recordsNext(); }
inline bool recordOp(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  return held_work::holder.record(op, stack);
}
inline void handOverHeldWork(HostNeed need, const char* what) {
  if (held_work::engaged.load(std::memory_order_acquire)) held_work::holder.handOver(need, what);
}
inline void flushHeldWork(const char* reason) {
  if (held_work::engaged.load(std::memory_order_acquire)) held_work::holder.flush(reason);
}
inline bool holdingWork() { return held_work::engaged.load(std::memory_order_acquire) && held_work::holder.holding(); }
inline bool recordingOpHere() {
  return held_work::engaged.load(std::memory_order_acquire) && held_work::holder.recordingHere();
}

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
