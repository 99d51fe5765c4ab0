// Asynchronous ops: the boxed fallback's work queued on a stream (asynchronous mode).
//
// A real device's launch returns before the kernel runs, with the results already allocated: the
// host knows their sizes without running the kernel. Here the op's meta kernel says what they
// are. The op runs on meta tensors standing for its arguments (one meta storage per device
// storage, so that views and in-place results show as such); results that are new storage are
// allocated on the device at once and returned; the CPU kernel then runs on the stream's worker
// over host views of the arguments, and what it returns is copied into those results. Device
// memory is referred to by address only, as a real kernel's arguments are: a tensor freed while
// its kernel is queued goes back to the caching allocator, whose blocks belong to a stream.
#include "deferred.h"

#include "allocator.h"
#include "arguments.h"
#include "host_addressable.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <deque>
#include <cstring>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchneuron {
namespace {

bool isGenerator(const c10::Argument& arg) {
  const c10::Type* type = arg.type().get();
  if (type->kind() == c10::TypeKind::OptionalType)
    type = static_cast<const c10::OptionalType*>(type)->getElementType().get();
  return type->kind() == c10::TypeKind::GeneratorType;
}

// Ops whose meta kernel says other sizes or dtypes for some results than the CPU kernel gives
// (found by comparing both on OpInfo's samples): batch norm's saved statistics (empty in eval
// mode), embedding_bag's offsets, layer norm's statistics of half-precision inputs. They run
// synchronously, where the CPU kernel's results are the truth.
bool metaDisagrees(const c10::FunctionSchema& schema, const c10::IValue* args) {
  const auto& name = schema.name();
  if (name == "aten::native_batch_norm" || name == "aten::_embedding_bag" ||
      name == "aten::_embedding_bag_forward_only" || name.rfind("aten::quantize_per", 0) == 0)
    return true;  // quantize_per_*: the meta kernel says float results
  if (name == "aten::native_layer_norm" && args[0].isTensor()) {
    const auto dtype = args[0].toTensor().scalar_type();
    return dtype == c10::kHalf || dtype == c10::kBFloat16;
  }
  return false;
}

// Ops that can be queued, by schema: aten ops returning tensors (alone, in tuples or in a list)
// or nothing, without a generator (random ops draw on the host's generator state at the op, in
// random_ops.cpp's kernels or the synchronous path).
bool queueable(const c10::FunctionSchema& schema) {
  if (schema.name().rfind("aten::", 0) != 0) return false;
  for (const auto& r : schema.returns()) {
    const auto kind = r.type()->kind();
    if (kind == c10::TypeKind::TensorType) continue;
    if (kind == c10::TypeKind::ListType && r.type()->containedType(0)->kind() == c10::TypeKind::TensorType) continue;
    return false;
  }
  for (const auto& a : schema.arguments())
    if (isGenerator(a)) return false;
  return true;
}

class Deferral {
 public:
  Deferral(const c10::OperatorHandle& op, StandIns& standins) : op_(op), standins_(standins) {}

  bool failed() const { return failed_; }
  c10::DeviceIndex device() const { return device_ < 0 ? currentDevice() : device_; }

  void note(c10::DeviceIndex index) {
    if (device_ < 0) device_ = index;
    else if (index != device_) failed_ = true;  // two devices: the synchronous path raises
  }

  // The meta tensor standing for an argument.
  at::Tensor meta(const at::Tensor& t, bool written) {
    if (!t.defined()) return t;
    if (t.device().type() == kNeuron) {
      if (t.is_nested() || t.layout() != c10::kStrided || !t.has_storage()) return fail(t);
      note(t.device().index());
      for (auto& a : args_) {  // the same tensor twice (self and out=self): one stand-in, as on the CPU
        if (a.neuron.unsafeGetTensorImpl() != t.unsafeGetTensorImpl()) continue;
        a.written = a.written || written;
        return a.meta;
      }
      at::Tensor m = tensorOver(storageFor(t).meta, c10::DispatchKey::Meta, t);
      args_.push_back(Arg{t, m, written});
      return m;
    }
    // A CPU scalar joins as an input (read when the op is queued), and as itself in the meta kernel
    // (as in PyTorch's fake tensors); anything else runs synchronously.
    if (!t.device().is_cpu() || written || t.dim() > 0 || t.layout() != c10::kStrided) return fail(t);
    return t;
  }

  // The CPU kernel's argument for an argument: a host view of a neuron tensor, a copy of a CPU scalar.
  // CPU scalars are copies of their own: the worker never holds (and drops) a tensor that Python
  // may have seen, whose release would need the interpreter's lock the host may hold while it waits.
  at::Tensor host(const at::Tensor& t) {
    if (!t.defined()) return t;
    if (t.device().type() != kNeuron) {
      at::Tensor copy = t.clone();
      if (t.unsafeGetTensorImpl()->is_wrapped_number()) copy.unsafeGetTensorImpl()->set_wrapped_number(true);
      return copy;
    }
    for (const auto& v : views_)
      if (v.first == t.unsafeGetTensorImpl()) return v.second;
    views_.emplace_back(t.unsafeGetTensorImpl(), hostViewSharing(t, storageFor(t).host));
    return views_.back().second;
  }

  // Whether a written argument overlaps itself or shares memory with another argument: the CPU
  // kernel may refuse it (PyTorch's overlap checks), so it runs synchronously, raising at the op.
  bool writesOverlap() const {
    for (const auto& w : args_) {
      if (!w.written) continue;
      if (at::has_internal_overlap(w.neuron) == at::MemOverlap::Yes) return true;
      const auto* storage = w.neuron.storage().unsafeGetStorageImpl();
      for (const auto& o : args_) {
        if (&o == &w || o.neuron.storage().unsafeGetStorageImpl() != storage) continue;
        if (at::get_overlap_status(w.neuron, o.neuron) != at::MemOverlapStatus::No) return true;
      }
    }
    return false;
  }

  // After the meta kernel: false when it changed a written argument (an out= resized, restrided).
  bool writesKeepMetadata() const {
    for (const auto& a : args_) {
      if (!a.written) continue;
      const auto* m = a.meta.unsafeGetTensorImpl();
      if (m->sizes() != a.neuron.sizes() || m->strides() != a.neuron.strides() ||
          m->storage_offset() != a.neuron.storage_offset() ||
          m->storage().nbytes() != a.neuron.storage().nbytes() ||
          m->storage().unsafeGetStorageImpl() != storageFor(a.neuron).meta.unsafeGetStorageImpl())
        return false;
    }
    return true;
  }

  // The device result for a meta result, and (in `fill`) its host view: one to fill for new memory,
  // else one over an argument's memory (`alias`).
  at::Tensor result(const at::Tensor& m, at::Tensor* fill, bool* alias) {
    *alias = false;
    if (!m.defined()) return m;
    if (!m.is_meta() || m.layout() != c10::kStrided || c10::isQIntType(m.scalar_type())) {
      failed_ = true;
      return m;
    }
    for (const auto& a : args_) {  // an in-place op returns its argument
      if (a.meta.unsafeGetTensorImpl() != m.unsafeGetTensorImpl()) continue;
      *fill = hostViewSharing(a.neuron, storageFor(a.neuron).host);
      *alias = true;
      return a.neuron;
    }
    const auto* storage = m.storage().unsafeGetStorageImpl();
    for (const auto& s : storages_) {  // a view of an argument
      if (s.standin->meta.unsafeGetStorageImpl() != storage) continue;
      at::Tensor out = deviceTensorOver(s.neuron, m);
      *fill = hostViewSharing(out, s.standin->host);
      *alias = true;
      return out;
    }
    for (const auto& s : fresh_) {  // results sharing one new buffer
      if (s.meta.unsafeGetStorageImpl() != storage) continue;
      at::Tensor out = deviceTensorOver(s.neuron, m);
      *fill = hostViewSharing(out, s.host);
      return out;
    }
    const size_t nbytes = m.storage().nbytes();
    c10::Storage neuron(c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), nbytes, allocateOn(device(), nbytes), deviceAllocator(), true));
    at::Tensor out = deviceTensorOver(neuron, m);
    fresh_.push_back(Fresh{neuron, m.storage(), hostStorageOf(out)});
    standins_.made(neuron, StandIn{m.storage(), fresh_.back().host});
    *fill = hostViewSharing(out, fresh_.back().host);
    return out;
  }

 private:
  struct Argument {  // a device storage among the arguments
    c10::Storage neuron;
    const StandIn* standin;
  };
  struct Fresh {  // a new buffer among the results
    c10::Storage neuron;
    c10::Storage meta;
    c10::Storage host;
  };
  struct Arg {
    at::Tensor neuron;
    at::Tensor meta;
    bool written;
  };

  at::Tensor fail(const at::Tensor& t) {
    failed_ = true;
    return t;
  }

  const StandIn& storageFor(const at::Tensor& t) const {
    const auto* key = t.storage().unsafeGetStorageImpl();
    for (const auto& s : storages_)
      if (s.neuron.unsafeGetStorageImpl() == key) return *s.standin;
    const StandIn& standin = standins_.of(t.storage(), t);
    storages_.push_back(Argument{t.storage(), &standin});
    return standin;
  }

  const c10::OperatorHandle& op_;
  StandIns& standins_;
  mutable c10::SmallVector<Argument, 4> storages_;  // per device storage among the arguments
  c10::SmallVector<Fresh, 2> fresh_;                // per new buffer among the results
  c10::SmallVector<Arg, 4> args_;
  c10::SmallVector<std::pair<const c10::TensorImpl*, at::Tensor>, 4> views_;  // host views, per tensor
  c10::DeviceIndex device_ = -1;
  bool failed_ = false;
};

// ---- the meta cache ----------------------------------------------------------
// PyTorch's meta kernels are mostly Python (reference implementations): 100-700 us an op, more
// than most CPU kernels. What they say about the results follows from the op, its arguments'
// layouts and its other arguments, as PyTorch's fake tensors' cache assumes: so it is kept per
// such key. A result is an argument itself (in place), a view of an argument's storage, or new
// storage, with its layout. Floating-point arguments are left out of the key except for ops whose
// sizes they set (upsample's scales, arange's bounds, ...).

}  // namespace

bool floatsSetSizes(const c10::FunctionSchema& schema) {
  const auto& name = schema.name();
  for (const char* s : {"upsample", "arange", "range", "linspace", "logspace", "histc", "interpolate", "fractional"})
    if (name.find(s) != std::string::npos) return true;
  return false;
}

namespace {

struct MetaResult {
  int kind;       // 0 new storage (buffer `arg`), 1 argument `arg` itself, 2 a view of argument `arg`'s storage,
                  // 3 undefined, 4 a list of `arg` results (those that follow), 5 the op is not deferred
                  // (no meta kernel, sizes from data, or an `out=` it resizes): it runs at once
  int arg;
  c10::ScalarType dtype;
  std::vector<int64_t> sizes, strides;
  int64_t offset;
  size_t nbytes;  // new storage's size
};

using MetaKey = std::vector<int64_t>;

struct MetaCache {
  std::mutex mutex;
  std::unordered_map<MetaKey, std::vector<MetaResult>, TokensHash> entries;
};

MetaCache& metaCache() {
  static MetaCache* c = new MetaCache();
  return *c;
}

// The key of an op's arguments; false when an argument has no place in one.
bool metaKey(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first, MetaKey* key,
             std::vector<const c10::StorageImpl*>* storages) {
  const bool floats = floatsSetSizes(op.schema());
  key->push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(&op.schema())));
  TokenWriter w(*key);
  std::function<bool(const c10::IValue&)> add = [&](const c10::IValue& iv) -> bool {
    if (iv.isTensor()) {
      const at::Tensor& t = iv.toTensor();
      if (!t.defined()) return w.token(Token::Undefined), true;
      if (t.device().type() == kNeuron) {
        if (t.layout() != c10::kStrided || !t.has_storage()) return false;
        // Its place: the first argument on the same storage (-1: none before it), and the storage's size.
        const auto* storage = t.storage().unsafeGetStorageImpl();
        int64_t same = -1;
        for (size_t i = 0; i < storages->size(); ++i)
          if ((*storages)[i] == storage) { same = static_cast<int64_t>(i); break; }
        storages->push_back(storage);
        w.tensor(same, t);
        w.raw(static_cast<int64_t>(t.storage().nbytes()));
        return true;
      }
      if (t.dim() > 0 || t.layout() != c10::kStrided) return false;
      storages->push_back(nullptr);
      w.token(Token::CpuScalar, t.scalar_type(), t.unsafeGetTensorImpl()->is_wrapped_number());
      return true;
    }
    if (iv.isList()) return w.list(iv, add);
    return w.value(iv, floats);
  };
  for (size_t i = first; i < stack.size(); ++i)
    if (!add(stack[i])) return false;
  return true;
}

// The meta tensors among an op's arguments, in order (inside lists too).
void flatTensors(const torch::jit::Stack& stack, size_t first, std::vector<at::Tensor>* out) {
  for (size_t i = first; i < stack.size(); ++i) {
    const auto& iv = stack[i];
    if (iv.isTensor()) {
      out->push_back(iv.toTensor());
    } else if (iv.isList()) {
      for (const auto& e : iv.toListRef())
        if (e.isTensor()) out->push_back(e.toTensor());
    }
  }
}

// What a meta kernel's results say, as cache entries; false when a result has no place in one.
bool describeResults(const torch::jit::Stack& results, const std::vector<at::Tensor>& args,
                     std::vector<MetaResult>* out) {
  std::vector<const c10::StorageImpl*> fresh;
  auto one = [&](const at::Tensor& m) -> bool {
    if (!m.defined()) return out->push_back(MetaResult{3, 0, {}, {}, {}, 0, 0}), true;
    if (!m.is_meta() || m.layout() != c10::kStrided) return false;
    MetaResult r{0, 0, m.scalar_type(), m.sizes().vec(), m.strides().vec(), m.storage_offset(), m.storage().nbytes()};
    for (size_t k = 0; k < args.size(); ++k) {
      if (args[k].unsafeGetTensorImpl() == m.unsafeGetTensorImpl()) {
        r.kind = 1;
        r.arg = static_cast<int>(k);
        return out->push_back(std::move(r)), true;
      }
    }
    const auto* storage = m.storage().unsafeGetStorageImpl();
    for (size_t k = 0; k < args.size(); ++k) {
      if (args[k].defined() && args[k].is_meta() && args[k].storage().unsafeGetStorageImpl() == storage) {
        r.kind = 2;
        r.arg = static_cast<int>(k);
        return out->push_back(std::move(r)), true;
      }
    }
    auto it = std::find(fresh.begin(), fresh.end(), storage);
    r.arg = static_cast<int>(it - fresh.begin());
    if (it == fresh.end()) fresh.push_back(storage);
    return out->push_back(std::move(r)), true;
  };
  for (const auto& iv : results) {
    if (iv.isTensor()) {
      if (!one(iv.toTensor())) return false;
    } else if (iv.isTensorList()) {
      const auto list = iv.toTensorList();
      out->push_back(MetaResult{4, static_cast<int>(list.size()), {}, {}, {}, 0, 0});
      for (const at::Tensor& t : list)
        if (!one(t)) return false;
    } else {
      return false;
    }
  }
  return true;
}

at::Tensor metaTensorOver(const c10::Storage& storage, const MetaResult& r) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::Meta),
                                                    c10::scalarTypeToTypeMeta(r.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(r.sizes, r.strides, r.offset);
  return t;
}

// The results a cache entry says, over the arguments' meta stand-ins.
torch::jit::Stack metaResults(const std::vector<MetaResult>& entry, const std::vector<at::Tensor>& args) {
  torch::jit::Stack out;
  std::vector<c10::Storage> fresh;
  auto one = [&](const MetaResult& r) -> at::Tensor {
    switch (r.kind) {
      case 1: return args[r.arg];
      case 2: return metaTensorOver(args[r.arg].storage(), r);
      case 3: return at::Tensor();
      default:
        while (fresh.size() <= static_cast<size_t>(r.arg)) fresh.emplace_back();
        if (!fresh[r.arg]) fresh[r.arg] = metaStorage(r.nbytes);
        return metaTensorOver(fresh[r.arg], r);
    }
  };
  for (size_t i = 0; i < entry.size(); ++i) {
    if (entry[i].kind == 4) {
      c10::List<at::Tensor> list;
      for (int k = 0; k < entry[i].arg; ++k) list.push_back(one(entry[++i]));
      out.emplace_back(std::move(list));
    } else {
      out.emplace_back(one(entry[i]));
    }
  }
  return out;
}

// One op's stand-ins (asynchronous mode): the op's argument storages, kept while it is deferred.
class OpStandIns final : public StandIns {
 public:
  const StandIn& of(const c10::Storage& neuron, const at::Tensor& like) override {
    for (const auto& [storage, standin] : entries_)
      if (storage.unsafeGetStorageImpl() == neuron.unsafeGetStorageImpl()) return standin;
    entries_.emplace_back(neuron, StandIn{metaStorage(neuron.nbytes()), hostStorageOf(like)});
    return entries_.back().second;
  }
  void made(const c10::Storage&, StandIn) override {}

 private:
  std::deque<std::pair<c10::Storage, StandIn>> entries_;  // stable: deferrals keep pointers to entries
};

}  // namespace

c10::Storage metaStorage(size_t nbytes) {
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                            c10::DataPtr(nullptr, c10::Device(c10::kMeta)),
                                                            c10::GetAllocator(c10::kMeta), true));
}

void DeferredKernel::operator()() {
  at::init_num_threads();  // the worker follows torch.set_num_threads
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
  size_t k = 0;
  auto fill = [&](const at::Tensor& cpu) {
    const size_t i = k++;
    if (i >= results.size() || !results[i].first.defined() || !cpu.defined()) return;
    const auto& [out, alias] = results[i];
    if (alias) {
      TORCH_CHECK(cpu.numel() == 0 || cpu.const_data_ptr() == out.const_data_ptr(), op.schema().operator_name(),
                  ": the meta kernel said a result is an argument or a view of one; the CPU kernel returned other "
                  "memory (an op to run synchronously: deferred.cpp, metaDisagrees)");
      return;
    }
    if (cpu.data_ptr() == out.data_ptr() && cpu.strides() == out.strides()) return;
    TORCH_CHECK(cpu.sizes() == out.sizes() && cpu.scalar_type() == out.scalar_type(), op.schema().operator_name(),
                ": the CPU kernel returned a ", cpu.scalar_type(), " tensor of sizes ", cpu.sizes(),
                " where the meta kernel said ", out.scalar_type(), " and ", out.sizes(),
                " (an op to run synchronously: deferred.cpp, metaDisagrees)");
    out.copy_(cpu);
  };
  for (const auto& iv : stack) {
    if (iv.isTensor()) {
      fill(iv.toTensor());
    } else if (iv.isTensorList()) {
      for (const at::Tensor& t : iv.toTensorList()) fill(t);
    }
  }
}

bool deferOp(const c10::OperatorHandle& op, torch::jit::Stack* stack, StandIns& standins, Deferred* out,
             bool keep_meta) {
  KernelArguments arguments;  // the memory of the host views made below: the kernel's
  const auto& schema = op.schema();
  // Without a CPU kernel (GPU-only ops), the synchronous path says so at the op.
  if (!queueable(schema) || !op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU)) return false;
  const size_t nargs = schema.arguments().size();
  const auto first = stack->end() - static_cast<std::ptrdiff_t>(nargs);
  if (nargs > 0 && metaDisagrees(schema, &*first)) return false;
  Deferral deferral(op, standins);

  // The meta kernel on stand-ins: the results' sizes, which results are views or in place.
  torch::jit::Stack meta(first, stack->end());
  const bool cpu_device = convertArguments(
      op, &meta, [&](const at::Tensor& t, const c10::Argument&, bool written) { return deferral.meta(t, written); },
      [&](c10::Device d, const c10::Argument&) { deferral.note(d.has_index() ? d.index() : currentDevice()); });
  if (cpu_device || deferral.failed() || deferral.writesOverlap()) return false;
  for (auto& iv : meta)  // a neuron device argument (made the CPU above) stands for the meta device
    if (iv.isDevice()) iv = c10::Device(c10::kMeta);
  if (keep_meta) out->meta_arguments = meta;
  MetaKey key;
  std::vector<const c10::StorageImpl*> key_storages;
  const size_t first_index = static_cast<size_t>(first - stack->begin());
  const bool keyed = metaKey(op, *stack, first_index, &key, &key_storages);
  std::vector<at::Tensor> meta_args;
  flatTensors(meta, 0, &meta_args);
  const std::vector<MetaResult>* cached = nullptr;
  auto& cache = metaCache();
  if (keyed) {
    std::lock_guard<std::mutex> lock(cache.mutex);
    auto it = cache.entries.find(key);
    if (it != cache.entries.end()) cached = &it->second;  // entries are never erased
  }
  // Those that cannot be deferred are remembered too: their meta kernel (100 µs for `arange`'s
  // resized `out=`) runs once per key, not at every call.
  auto not_deferred = [&] {
    if (!keyed) return false;
    std::lock_guard<std::mutex> lock(cache.mutex);
    if (cache.entries.size() < 200000)
      cache.entries.emplace(std::move(key), std::vector<MetaResult>{MetaResult{5, 0, {}, {}, {}, 0, 0}});
    return false;
  };
  if (cached != nullptr) {
    if (!cached->empty() && cached->front().kind == 5) return false;
    meta = metaResults(*cached, meta_args);
  } else {
    try {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
    } catch (const std::exception&) {
      return not_deferred();  // no meta kernel, sizes that depend on data, or an error the CPU kernel will raise
    }
    if (!deferral.writesKeepMetadata()) return not_deferred();
    std::vector<MetaResult> entry;
    if (keyed && describeResults(meta, meta_args, &entry)) {
      std::lock_guard<std::mutex> lock(cache.mutex);
      if (cache.entries.size() < 200000) cache.entries.emplace(std::move(key), std::move(entry));
    }
  }

  // The device results, allocated now.
  DeferredKernel& kernel = out->kernel;

  torch::jit::Stack results;
  for (auto& iv : meta) {
    if (iv.isTensor()) {
      at::Tensor fill;
      bool alias = false;
      results.emplace_back(deferral.result(iv.toTensor(), &fill, &alias));
      kernel.results.emplace_back(std::move(fill), alias);
    } else if (iv.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : iv.toTensorList()) {
        at::Tensor fill;
        bool alias = false;
        list.push_back(deferral.result(t, &fill, &alias));
        kernel.results.emplace_back(std::move(fill), alias);
      }
      results.emplace_back(std::move(list));
    } else {
      return false;
    }
  }
  if (deferral.failed()) return false;
  if (keep_meta) out->meta_results = std::move(meta);

  // The CPU kernel's arguments: host views of the device's memory, copies of CPU scalars.
  kernel.stack.assign(first, stack->end());
  convertArguments(
      op, &kernel.stack, [&](const at::Tensor& t, const c10::Argument&, bool) { return deferral.host(t); },
      [](c10::Device, const c10::Argument&) {});
  out->device = deferral.device();
  out->inference = c10::InferenceMode::is_enabled();
  kernel.memory = arguments.take();
  stack->erase(first, stack->end());
  for (auto& r : results) stack->push_back(std::move(r));
  return true;
}

bool enqueueOp(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpStandIns standins;
  Deferred deferred{DeferredKernel{op, {}, {}}, -1, false, {}, {}};
  if (!deferOp(op, stack, standins, &deferred, false)) return false;
  const auto memory = deferred.kernel.memory;
  enqueue(deferred.device, withRanges({rt::ActivityKind::Kernel, kernelName(op.schema().name())}, memory),
          std::move(deferred.kernel));
  return true;
}

}  // namespace torchneuron
