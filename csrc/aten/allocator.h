// Device memory (allocator.cpp): the caching allocator, allocation on a given device, and memory
// history in the structure of PyTorch's CUDA memory snapshots.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/util/ApproximateClock.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torchneuron {

c10::DeviceAllocator* deviceAllocator();
// Hands a host buffer that a CPU kernel produced over to a device, without a
// copy (host_addressable.cpp, where device memory is host memory): the bytes are charged to the device (raising OutOfMemoryError when it
// is full) and released when the returned DataPtr dies.
c10::DataPtr deviceBlockFromHostBuffer(c10::DataPtr host, size_t nbytes, c10::DeviceIndex device);
// Allocates device memory on a given device (not the current one).
c10::DataPtr allocateOn(c10::DeviceIndex device, size_t nbytes);
// An allocator that always allocates on `device`.
c10::Allocator* allocatorFor(c10::DeviceIndex device);
// Memory history, in the structure of PyTorch's CUDA memory snapshots.
struct MemoryHistoryOptions {
  bool enabled = false;     // blocks keep where they were allocated
  bool trace = false;       // each device also keeps a ring of the allocator's actions
  int context = 0;          // tracebacks for: 0 nothing, 1 live blocks, 2 and allocations, 3 and frees
  bool cpp_frames = false;  // C++ frames besides Python's
  size_t max_entries = SIZE_MAX;
  bool clear_history = false;
};
void recordMemoryHistory(const MemoryHistoryOptions& options);
bool memoryHistoryEnabled();
struct SnapshotBlock {
  uint64_t address = 0;
  size_t size = 0;
  size_t requested_size = 0;
  bool allocated = false;
  std::shared_ptr<c10::GatheredContext> context;  // a torch::CapturedTraceback, or none
};
struct SnapshotSegment {
  c10::DeviceIndex device = 0;
  uint64_t address = 0;
  size_t total_size = 0;
  bool large = false;
  bool adopted = false;  // a host buffer a kernel made, charged to the device
  std::vector<SnapshotBlock> blocks;
};
struct SnapshotTrace {
  const char* action;  // alloc, free_requested, free_completed, segment_alloc, segment_free, oom
  uint64_t addr;
  size_t size;
  int64_t stream;
  int64_t time_us;
  size_t device_free;  // oom only
  std::shared_ptr<c10::GatheredContext> context;
};
struct MemorySnapshot {
  std::vector<SnapshotSegment> segments;         // every device's, by device then address
  std::vector<std::vector<SnapshotTrace>> traces;  // per device, oldest first
};
MemorySnapshot memorySnapshot();
// Called (with no allocator lock held) when an allocation fails while the history is on: writes a
// snapshot and returns its path, which the OutOfMemoryError then names.
using OomSnapshotHook = std::string (*)(c10::DeviceIndex device);
void setOomSnapshotHook(OomSnapshotHook hook);

}  // namespace torchneuron
