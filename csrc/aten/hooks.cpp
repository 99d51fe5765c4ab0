// PrivateUse1 hooks: how PyTorch's generic code asks about neuron devices. init() is the devices'
// lazy initialisation (device_init.cpp), which at::globalContext().lazyInitDevice(kPrivateUse1) calls
// once; the calls that use a device initialise it themselves (and raise in a bad fork), since that
// once is inherited by a forked child.
#include "device.h"
#include "device_init.h"
#include "held_work.h"
#include "allocator.h"
#include "host_allocator.h"
#include "generator.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Storage.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

namespace torchneuron {
namespace {

struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  // Neither initialises the devices (the number comes from the runtime's configuration).
  bool isAvailable() const override { return rt::deviceCount() > 0; }
  void init() const override { initDevices(); }
  // Whether this process has used the device (allocated, launched, made a stream on it).
  bool hasPrimaryContext(c10::DeviceIndex d) const override { return deviceUsed(d); }

  c10::DeviceIndex deviceCount() const override { return torchneuron::deviceCount(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { setDevice(d); }
  c10::DeviceIndex getCurrentDevice() const override { return currentDevice(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    const auto old = currentDevice();
    if (d != old) setDevice(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    return exchangeDevice(d);
  }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    initDevices();
    return defaultGenerator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    const auto device = index < 0 ? currentDevice() : index;
    useDevice(device);
    return newGenerator(index);
  }

  at::Device getDeviceFromPtr(void* data) const override {
    int device = 0;
    TORCH_CHECK(rt::pointerGetDevice(data, &device) == rt::Status::Success,
                "the pointer does not point to neuron device memory");
    return c10::Device(kNeuron, static_cast<c10::DeviceIndex>(device));
  }

  bool isPinnedPtr(const void* data) const override { return rt::isHostPinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    initDevices();  // pinned memory is the runtime's (PyTorch initialises the device first, once)
    return hostAllocator();
  }

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
    const auto device = storage.device().index();
    c10::DataPtr fresh = allocateOn(device, newsize);
    const size_t keep = std::min(newsize, storage.nbytes());
    if (keep > 0) runtime::copyMemory(fresh.get(), storage.data(), keep, rt::CopyKind::DeviceToDevice);
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

struct Registration {
  Registration() { at::RegisterPrivateUse1HooksInterface(new NeuronHooks()); }
} registration;

}  // namespace
}  // namespace torchneuron
