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

#include "arguments.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>

#include <utility>

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
      name == "aten::_embedding_bag_forward_only")
    return true;
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
  c10::SmallVector<std::pair<c10::Storage, StandIn>, 4> entries_;
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
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  } catch (const std::exception&) {
    return false;  // no meta kernel, sizes that depend on data, or an error the CPU kernel will raise
  }
  if (!deferral.writesKeepMetadata()) return false;

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
  stack->erase(first, stack->end());
  for (auto& r : results) stack->push_back(std::move(r));
  return true;
}

bool enqueueOp(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpStandIns standins;
  Deferred deferred{DeferredKernel{op, {}, {}}, -1, {}, {}};
  if (!deferOp(op, stack, standins, &deferred, false)) return false;
  enqueue(deferred.device, {rt::ActivityKind::Kernel, kernelName(op.schema().name())}, std::move(deferred.kernel));
  return true;
}

}  // namespace torchneuron
