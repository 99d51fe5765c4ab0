// torchneuron._C: the Python binding of the device runtime.
#include "aten/launch.h"
#include "aten/device_init.h"
#include "aten/allocator.h"
#include "aten/host_allocator.h"
#include "aten/generator.h"
#include "aten/fallback.h"
#include "aten/widening.h"
#include "aten/transfers.h"
#include "distributed/collectives.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/util/Exception.h>
#include <ATen/EmptyTensor.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/profiler/combined_traceback.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <unordered_map>

namespace torch {
// Exported by libtorch_python (torch/csrc/profiler/python/combined_traceback.h, whose JSON include
// the wheel does not ship): tracebacks as lists of {"filename", "line", "name"} dictionaries.
std::vector<pybind11::object> py_symbolize(std::vector<CapturedTraceback*>& to_symbolize);
}  // namespace torch

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
  useDevice(static_cast<c10::DeviceIndex>(index));
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

// Reads a tuple (or list) of Python ints into `out`; false if it is not one.
bool intSequence(PyObject* seq, c10::SmallVector<int64_t, 6>& out) {
  if (!PyTuple_Check(seq) && !PyList_Check(seq)) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  out.resize(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!PyLong_Check(items[i])) return false;
    out[i] = PyLong_AsLongLong(items[i]);
  }
  return true;
}

// _empty_strided(size, stride, dtype, device_index): an uninitialized neuron tensor, without the
// argument parsing and dispatch of torch.empty_strided. Inductor's wrapper allocates every buffer
// of a neuron graph with it (the CPU's wrapper has torch._C._dynamo.guards._empty_strided_cpu).
PyObject* emptyStridedFast(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  c10::SmallVector<int64_t, 6> size, stride;
  TORCH_CHECK_TYPE(nargs == 4 && intSequence(args[0], size) && intSequence(args[1], stride) &&
                   THPDtype_Check(args[2]) && PyLong_Check(args[3]),
                   "_empty_strided(size: tuple[int], stride: tuple[int], dtype: torch.dtype, device: int)");
  TORCH_CHECK_VALUE(size.size() == stride.size(), "_empty_strided: size has ", size.size(),
                    " dimensions but stride has ", stride.size());
  const auto index = static_cast<c10::DeviceIndex>(PyLong_AsLong(args[3]));
  checkDevice(index);
  const auto dtype = reinterpret_cast<THPDtype*>(args[2])->scalar_type;
  return THPVariable_Wrap(at::detail::empty_strided_generic(
      size, stride, allocatorFor(index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype));
  END_HANDLE_TH_ERRORS
}

// _launch(name, device_index, kernel, *args): calls kernel(*args) as a kernel named `name` of the
// device's current stream, through the runtime like every other kernel. Inductor's wrapper calls
// each C++ kernel of a neuron graph with it.
PyObject* launchKernelPy(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK_TYPE(nargs >= 3 && PyUnicode_Check(args[0]) && PyLong_Check(args[1]) && PyCallable_Check(args[2]),
                   "_launch(name: str, device: int, kernel: Callable, *args)");
  const char* name = PyUnicode_AsUTF8(args[0]);
  if (name == nullptr) return nullptr;
  const auto index = static_cast<c10::DeviceIndex>(PyLong_AsLong(args[1]));
  checkDevice(index);
  KernelArguments arguments;  // strict mode: the kernel reaches the memory of its tensor arguments
  if (rt::strictMode()) {
    for (Py_ssize_t i = 3; i < nargs; ++i)
      if (THPVariable_Check(args[i])) {
        const auto& t = THPVariable_Unpack(args[i]);
        if (t.device().type() == kNeuron && t.has_storage()) arguments.add(t.storage());
      }
  }
  PyObject* result = nullptr;
  launch(index, {rt::ActivityKind::Kernel, name},
         [&] { result = PyObject_Vectorcall(args[2], args + 3, static_cast<size_t>(nargs - 3), nullptr); });
  return result;  // nullptr with the kernel's Python error set
  END_HANDLE_TH_ERRORS
}

// _neuron_record_memory_history(enabled, context, stacks, max_entries, clear_history), with the
// values torch.cuda.memory._record_memory_history takes.
void recordMemoryHistoryPy(std::optional<std::string> enabled, std::optional<std::string> context,
                           const std::string& stacks, size_t max_entries, bool clear_history) {
  MemoryHistoryOptions o;
  TORCH_CHECK_VALUE(!enabled || *enabled == "state" || *enabled == "all",
                    "_record_memory_history: enabled must be None, 'state' or 'all', got '", *enabled, "'");
  TORCH_CHECK_VALUE(!context || *context == "state" || *context == "alloc" || *context == "all",
                    "_record_memory_history: context must be None, 'state', 'alloc' or 'all', got '", *context, "'");
  TORCH_CHECK_VALUE(stacks == "python" || stacks == "all",
                    "_record_memory_history: stacks must be 'python' or 'all', got '", stacks, "'");
  TORCH_CHECK_VALUE(max_entries > 0, "_record_memory_history: max_entries must be at least 1");
  o.enabled = enabled.has_value();
  o.trace = enabled && *enabled == "all";
  o.context = !context ? 0 : *context == "state" ? 1 : *context == "alloc" ? 2 : 3;
  o.cpp_frames = stacks == "all";
  o.max_entries = max_entries;
  o.clear_history = clear_history;
  recordMemoryHistory(o);
}

// The allocator's state and history as CUDA's snapshot dictionary: {"segments": [...],
// "device_traces": [[...] per device]}, tracebacks symbolized into frame dictionaries.
py::dict memorySnapshotPy() {
  MemorySnapshot snap;
  {
    py::gil_scoped_release no_gil;  // gathering takes the allocator's locks
    snap = memorySnapshot();
  }
  // Symbolize every traceback once.
  std::vector<torch::CapturedTraceback*> tracebacks;
  std::unordered_map<const c10::GatheredContext*, size_t> index;
  auto collect = [&](const std::shared_ptr<c10::GatheredContext>& c) {
    if (!c || index.count(c.get())) return;
    auto* tb = dynamic_cast<torch::CapturedTraceback*>(c.get());
    if (tb == nullptr) return;
    index.emplace(c.get(), tracebacks.size());
    tracebacks.push_back(tb);
  };
  for (auto& seg : snap.segments)
    for (auto& b : seg.blocks) collect(b.context);
  for (auto& dev : snap.traces)
    for (auto& e : dev) collect(e.context);
  const std::vector<py::object> frames = torch::py_symbolize(tracebacks);
  auto framesOf = [&](const std::shared_ptr<c10::GatheredContext>& c) -> py::object {
    if (c) {
      auto it = index.find(c.get());
      if (it != index.end()) return frames[it->second];
    }
    return py::list();
  };

  py::list segments;
  for (auto& seg : snap.segments) {
    py::list blocks;
    size_t allocated = 0, requested = 0;
    for (auto& b : seg.blocks) {
      py::dict block;
      block["address"] = b.address;
      block["size"] = b.size;
      block["requested_size"] = b.requested_size;
      block["state"] = b.allocated ? "active_allocated" : "inactive";
      block["frames"] = framesOf(b.context);
      blocks.append(block);
      if (b.allocated) {
        allocated += b.size;
        requested += b.requested_size;
      }
    }
    py::dict s;
    s["device"] = int(seg.device);
    s["address"] = seg.address;
    s["total_size"] = seg.total_size;
    s["allocated_size"] = allocated;
    s["active_size"] = allocated;
    s["requested_size"] = requested;
    s["stream"] = 0;
    s["segment_type"] = seg.large ? "large" : "small";
    s["segment_pool_id"] = py::make_tuple(0, 0);
    s["is_expandable"] = false;
    s["adopted"] = seg.adopted;
    s["frames"] = py::list();
    s["blocks"] = blocks;
    segments.append(s);
  }
  py::list traces;
  for (auto& dev : snap.traces) {
    py::list entries;
    for (auto& e : dev) {
      py::dict t;
      t["action"] = e.action;
      t["addr"] = e.addr;
      t["size"] = e.size;
      t["stream"] = e.stream;
      t["time_us"] = e.time_us;
      t["frames"] = framesOf(e.context);
      if (std::string(e.action) == "oom") t["device_free"] = e.device_free;
      entries.append(t);
    }
    traces.append(entries);
  }
  py::dict out;
  out["segments"] = segments;
  out["device_traces"] = traces;
  return out;
}

// The OOM hook: torchneuron.neuron._memory_history._dump_oom_snapshot(device) writes the file.
std::string dumpOomSnapshot(c10::DeviceIndex device) {
  if (!Py_IsInitialized()) return {};
  py::gil_scoped_acquire gil;
  try {
    auto mod = py::module_::import("torchneuron.neuron._memory_history");
    return mod.attr("_dump_oom_snapshot")(int(device)).cast<std::string>();
  } catch (py::error_already_set& e) {
    throw std::runtime_error(e.what());
  }
}

PyMethodDef kEmptyStrided = {"_empty_strided", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(
                                 &emptyStridedFast)), METH_FASTCALL,
                             "_empty_strided(size, stride, dtype, device_index): an uninitialized neuron tensor."};
PyMethodDef kLaunch = {"_launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&launchKernelPy)),
                       METH_FASTCALL, "_launch(name, device_index, kernel, *args): kernel(*args) as device work."};

}  // namespace

void bindFused(py::module& m);  // fused/binding.cpp
void installFusedEager();        // fused/fused.cpp: fused eager behind aten's held-work table (aten/held_work.h)

// The runtime _C runs on must implement the interface _C was built against: the same major
// version, at least the same minor one (neuron_runtime.h).
void checkRuntimeVersion() {
  const int built = rt::kApiVersionMajor * 1000 + rt::kApiVersionMinor;
  const int found = rt::apiVersion();
  if (found / 1000 != built / 1000 || found % 1000 < built % 1000) {
    throw std::runtime_error("torchneuron: the neuron runtime implements interface version " +
                             std::to_string(found / 1000) + "." + std::to_string(found % 1000) +
                             ", but this torchneuron was built for " + std::to_string(built / 1000) + "." +
                             std::to_string(built % 1000) + "; install a runtime of the same major version");
  }
}

}  // namespace torchneuron

PYBIND11_MODULE(_C, m) {
  using namespace torchneuron;
  m.doc() = "The emulated NeuronCore runtime and its PyTorch integration.";
  // c10 errors become PyTorch's Python exceptions (IndexError, OutOfMemoryError, ...).
  py::register_exception_translator([](std::exception_ptr e) {
    if (e) torch::translate_exception_to_python(e);
  });
  checkRuntimeVersion();
  installFusedEager();
  bindFused(m);
  registerFastOps();
  registerWidenedOps();
  preferCpuKernels();
  preferSparseCpuKernels();
  m.def("_runtime_api_version", [] { return py::make_tuple(rt::apiVersion() / 1000, rt::apiVersion() % 1000); });
  m.def("_device_count", [] { return int(deviceCount()); });
  m.def("_init", &initDevices,
        "Initialise the neuron devices (torch.neuron._lazy_init); raises in a process forked after they were.");
  m.def("_is_initialized", &devicesInitialized, "Whether this process initialised the neuron devices.");
  m.def("_is_in_bad_fork", &devicesInBadFork,
        "Whether this process was forked after its parent initialised the neuron devices.");
  m.def("_device_used", [](int i) { return deviceUsed(static_cast<c10::DeviceIndex>(i)); },
        "Whether this process has used a neuron device (the hooks' hasPrimaryContext).");
  m.def("_current_device", [] { return int(currentDevice()); });
  m.def("_set_device", [](int i) { setDevice(static_cast<c10::DeviceIndex>(i)); });
  m.def("_check_device", [](int i) { checkDevice(static_cast<c10::DeviceIndex>(i)); });
  m.def("_device_properties", &deviceProperties);
  m.def("_mem_get_info", &memGetInfo);
  m.def("_strict_mode", &rt::strictMode, "Whether TORCHNEURON_STRICT=1 protects device memory.");
  m.def("_install_strict_fault_handler", &rt::installStrictFaultHandler,
        "Puts the runtime's report of a host access to device memory before the current SIGSEGV handler.");
  m.def("_async_mode", &rt::asyncMode, "Whether streams run their work asynchronously (TORCHNEURON_ASYNC=1, strict mode).");
  m.def(
      "_synchronize",
      [](int i) {
        const auto index = static_cast<c10::DeviceIndex>(i);
        useDevice(index);
        checkRuntime(runtime::synchronizeDevice(i), index, "torch.neuron.synchronize()");
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_sleep",
      [](int64_t ns) {
        // Work that occupies the current stream for `ns` nanoseconds (torch.neuron._sleep).
        const auto device = currentDevice();
        enqueue(device, {rt::ActivityKind::Kernel, "sleep"},
                [ns] { std::this_thread::sleep_for(std::chrono::nanoseconds(std::max<int64_t>(ns, 0))); });
      },
      py::call_guard<py::gil_scoped_release>());
  m.def("_annotate_launch", [](const std::string& key, std::string value) {
    rt::activityAnnotate(key.c_str(), std::move(value));
  }, "Adds key: value to the event of the device work running on this thread (inside _launch's body), "
     "while torch.profiler records the device.");
  m.def("_default_generator", [](int i) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(defaultGenerator(static_cast<c10::DeviceIndex>(i))));
  });
  m.attr("_empty_strided") = py::reinterpret_steal<py::object>(PyCFunction_NewEx(&kEmptyStrided, nullptr, m.ptr()));
  m.attr("_launch") = py::reinterpret_steal<py::object>(PyCFunction_NewEx(&kLaunch, nullptr, m.ptr()));
  m.def("_register_collectives", &distributed::registerCollectives,
        "Register the neuron kernels of the c10d operators (once per process).");
  m.def("_live_work_count", &distributed::liveWorkCount,
        "Number of work handles of neuron collectives alive in this process.");
  m.def("_transfer_stats", &transfers);
  m.def("_host_memory_stats", &hostStats);
  m.def("_reset_transfer_stats", &resetTransfers);
  m.def("_neuron_record_memory_history", &recordMemoryHistoryPy, py::arg("enabled"), py::arg("context"),
        py::arg("stacks"), py::arg("max_entries"), py::arg("clear_history"));
  m.def("_neuron_memory_history_enabled", &memoryHistoryEnabled);
  m.def("_neuron_memory_snapshot", &memorySnapshotPy);
  setOomSnapshotHook(&dumpOomSnapshot);
}
