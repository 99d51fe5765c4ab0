// Ops whose results are known ahead of their kernel (deferred.cpp), for the two users of that:
// asynchronous mode, which queues the kernel on a stream (the fallback, for every op it can), and
// fused eager (csrc/fused/fused.cpp, behind held_work.h), which records it into a group that runs later.
#pragma once

#include "launch.h"
#include "encoding.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Storage.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace torchneuron {

// A device storage's stand-ins: a meta storage (for the meta kernel, so that views and in-place
// results show as such) and a CPU storage over the same memory that does not own it (for the CPU
// kernel, run later).
struct StandIn {
  c10::Storage meta;
  c10::Storage host;
};

// Where a deferral finds its arguments' stand-ins and leaves its results' new storages: one op's
// own table (asynchronous mode), or a fused group's (csrc/fused/fused.cpp), shared by the group's ops so that
// each op's meta kernel sees the storages the earlier ones made.
class StandIns {
 public:
  virtual ~StandIns() = default;
  // The stand-ins of a device storage among an op's arguments (made the first time).
  virtual const StandIn& of(const c10::Storage& neuron, const at::Tensor& like) = 0;
  // A new device storage an op's results live on, with its stand-ins.
  virtual void made(const c10::Storage& neuron, StandIn standin) = 0;
};

// The CPU kernel of a deferred op over host views, then its new results copied into the device
// results allocated at the op. What the worker (asynchronous mode) or a fused group's op-by-op run
// calls.
struct DeferredKernel {
  c10::OperatorHandle op;
  torch::jit::Stack stack;  // the CPU kernel's arguments
  // Per result: its host view, and whether it is an argument or a view of one (nothing to fill; the
  // CPU kernel's result must be that memory too).
  c10::SmallVector<std::pair<at::Tensor, bool>, 2> results;
  std::vector<rt::MemoryRange> memory;  // strict mode: the device memory of its arguments and results

  void operator()();
};

// A deferred op: its kernel, and (for a fused group) the meta kernel's view of it.
struct Deferred {
  DeferredKernel kernel;
  c10::DeviceIndex device = -1;
  bool inference = false;            // the inference mode it was deferred in (its host views' kind)
  torch::jit::Stack meta_arguments;  // the arguments, neuron tensors as their meta stand-ins
  torch::jit::Stack meta_results;    // the results as the meta kernel gave them
};

// Whether an op's floating-point arguments can set its results' sizes (upsample's scales, arange's
// bounds): elsewhere they are values only.
bool floatsSetSizes(const c10::FunctionSchema& schema);

// An empty meta storage of `nbytes` bytes: a device storage's stand-in.
c10::Storage metaStorage(size_t nbytes);

// Asynchronous mode: queues a boxed op on its device's current stream when its results' sizes can
// be known ahead (from its meta kernel). The results are allocated now and returned on the stack;
// the CPU kernel runs on the stream's worker. False (the stack untouched) when the op must run
// synchronously: results whose sizes depend on data, host values returned, random ops, sparse or
// nested tensors, an out= argument resized, anything the meta kernel refuses.
bool enqueueOp(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Runs `op`'s meta kernel on stand-ins, allocates its new results on the device, and replaces the
// arguments on `stack` by the results. False (the stack untouched) when the op must run now: see
// enqueueOp.
bool deferOp(const c10::OperatorHandle& op, torch::jit::Stack* stack, StandIns& standins, Deferred* out,
             bool keep_meta);

}  // namespace torchneuron
