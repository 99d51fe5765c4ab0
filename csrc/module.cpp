// torchneuron._C: the Python binding of the device runtime.
#include "aten/neuron.h"
#include "distributed/collectives.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/util/Exception.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/autograd/python_variable.h>

namespace py = pybind11;

namespace torchneuron {
namespace {

py::dict deviceProperties(int index) {
  checkDevice(static_cast<c10::DeviceIndex>(index));
  rt::DeviceProperties props{};
  rt::getDeviceProperties(index, &props);
  py::dict d;
  d["name"] = std::string(props.name);
  d["total_memory"] = props.total_memory;
  d["core_count"] = props.core_count;
  return d;
}

py::tuple memGetInfo(int index) {
  checkDevice(static_cast<c10::DeviceIndex>(index));
  size_t free_bytes = 0, total = 0;
  rt::memGetInfo(index, &free_bytes, &total);
  return py::make_tuple(free_bytes, total);
}

py::dict transfers() {
  auto& s = transferStats();
  py::dict d;
  d["host_to_device_bytes"] = s.host_to_device_bytes.load();
  d["device_to_host_bytes"] = s.device_to_host_bytes.load();
  d["device_to_device_bytes"] = s.device_to_device_bytes.load();
  d["host_to_device_copies"] = s.host_to_device_copies.load();
  d["device_to_host_copies"] = s.device_to_host_copies.load();
  d["scalar_reads"] = s.scalar_reads.load();
  return d;
}

py::dict hostStats() {
  auto* allocator = static_cast<at::HostAllocator*>(hostAllocator());
  const auto stats = allocator->get_stats();
  py::dict d;
  auto put = [&](const char* name, const c10::CachingAllocator::Stat& s) {
    const std::string n(name);
    d[py::str(n + ".current")] = s.current;
    d[py::str(n + ".peak")] = s.peak;
    d[py::str(n + ".allocated")] = s.allocated;
    d[py::str(n + ".freed")] = s.freed;
  };
  put("active_requests", stats.active_requests);
  put("active_bytes", stats.active_bytes);
  put("allocations", stats.allocations);
  put("allocated_bytes", stats.allocated_bytes);
  d["num_host_alloc"] = stats.num_host_alloc;
  d["num_host_free"] = stats.num_host_free;
  return d;
}

void resetTransfers() {
  auto& s = transferStats();
  s.host_to_device_bytes = 0;
  s.device_to_host_bytes = 0;
  s.device_to_device_bytes = 0;
  s.host_to_device_copies = 0;
  s.device_to_host_copies = 0;
  s.scalar_reads = 0;
}

}  // namespace
}  // namespace torchneuron

PYBIND11_MODULE(_C, m) {
  using namespace torchneuron;
  m.doc() = "The emulated NeuronCore runtime and its PyTorch integration.";
  // c10 errors become PyTorch's Python exceptions (IndexError, OutOfMemoryError, ...).
  py::register_exception_translator([](std::exception_ptr e) {
    if (e) torch::translate_exception_to_python(e);
  });
  preferCpuKernels();
  m.def("_device_count", [] { return int(deviceCount()); });
  m.def("_current_device", [] { return int(currentDevice()); });
  m.def("_set_device", [](int i) { setDevice(static_cast<c10::DeviceIndex>(i)); });
  m.def("_check_device", [](int i) { checkDevice(static_cast<c10::DeviceIndex>(i)); });
  m.def("_device_properties", &deviceProperties);
  m.def("_mem_get_info", &memGetInfo);
  m.def("_synchronize", [](int i) {
    checkDevice(static_cast<c10::DeviceIndex>(i));
    rt::deviceSynchronize(i);
  });
  m.def("_default_generator", [](int i) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(defaultGenerator(static_cast<c10::DeviceIndex>(i))));
  });
  m.def("_cpu_view", &cpuView,
        "A CPU tensor over the memory of a neuron tensor (no copy); it keeps that memory alive.");
  m.def("_adopt", [](const at::Tensor& cpu, int device) {
    TORCH_CHECK(cpu.device().is_cpu(), "expected a CPU tensor, got one on ", cpu.device());
    return adoptOutput(cpu.contiguous().clone(), static_cast<c10::DeviceIndex>(device));
  }, "A neuron tensor holding a copy of a CPU tensor's values.");
  m.def("_register_collectives", &distributed::registerCollectives,
        "Register the neuron kernels of the c10d operators (once per process).");
  m.def("_live_work_count", &distributed::liveWorkCount,
        "Number of work handles of neuron collectives alive in this process.");
  m.def("_transfer_stats", &transfers);
  m.def("_host_memory_stats", &hostStats);
  m.def("_reset_transfer_stats", &resetTransfers);
}
