// Pinned (page-locked) host memory, for Tensor.pin_memory() and fast copies.
#include "device.h"
#include "host_allocator.h"
#include "../runtime/neuron_runtime.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/util/Exception.h>

#include <mutex>

namespace torchneuron {
namespace {

void freePinned(void* ptr);

class NeuronHostAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nullptr;
    TORCH_CHECK_WITH(OutOfMemoryError, rt::hostMalloc(&ptr, nbytes) == rt::Status::Success,
                     "could not allocate ", nbytes, " bytes of pinned host memory");
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.active_requests.increase(1);
      stats_.allocations.increase(1);
      stats_.active_bytes.increase(nbytes);
      stats_.allocated_bytes.increase(nbytes);
      stats_.num_host_alloc++;
      sizes_[ptr] = nbytes;
    }
    return {ptr, ptr, &freePinned, c10::Device(c10::DeviceType::CPU)};
  }

  void release(void* ptr) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = sizes_.find(ptr);
      if (it != sizes_.end()) {
        stats_.active_requests.decrease(1);
        stats_.allocations.decrease(1);
        stats_.active_bytes.decrease(it->second);
        stats_.allocated_bytes.decrease(it->second);
        stats_.num_host_free++;
        sizes_.erase(it);
      }
    }
    rt::hostFree(ptr);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &freePinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    rt::memcpy(dest, src, count, rt::CopyKind::HostToHost);
  }
  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* s : {&stats_.active_requests, &stats_.active_bytes, &stats_.allocations, &stats_.allocated_bytes})
      s->reset_accumulated();
  }
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* s : {&stats_.active_requests, &stats_.active_bytes, &stats_.allocations, &stats_.allocated_bytes})
      s->reset_peak();
  }

 private:
  std::mutex mutex_;
  at::HostStats stats_;
  std::unordered_map<void*, size_t> sizes_;
};

NeuronHostAllocator& instance() {
  static NeuronHostAllocator* a = new NeuronHostAllocator();
  return *a;
}

void freePinned(void* ptr) { instance().release(ptr); }

struct Registration {
  Registration() { at::setHostAllocator(kNeuron, &instance()); }
} registration;

}  // namespace

c10::Allocator* hostAllocator() { return &instance(); }

}  // namespace torchneuron
