// Counts of copies between host and device and of host reads of device values (kernels.cpp).
#pragma once

#include <atomic>
#include <cstdint>

namespace torchneuron {

struct TransferStats {
  std::atomic<int64_t> host_to_device_bytes{0};
  std::atomic<int64_t> device_to_host_bytes{0};
  std::atomic<int64_t> device_to_device_bytes{0};
  std::atomic<int64_t> host_to_device_copies{0};
  std::atomic<int64_t> device_to_host_copies{0};
  std::atomic<int64_t> scalar_reads{0};  // .item(), printing, data-dependent control flow
};
TransferStats& transferStats();

}  // namespace torchneuron
