// Walking a boxed op's arguments and results, and the dispatcher's aten ops, for the fallbacks that
// run PyTorch's CPU kernels (fallback.cpp for dense and nested tensors, sparse.cpp for sparse ones).
#pragma once

#include "device.h"
#include "generator.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <optional>
#include <string>

namespace torchneuron {

// Replaces each tensor among `op`'s arguments on the stack (alone, in a list, or in a list of
// optional tensors) by tensor(t, argument, written), and each neuron Device argument by the CPU
// after checking it and passing it to note(device, argument). Returns whether an argument named
// the CPU as its device.
template <class TensorFn, class NoteFn>
bool convertArguments(const c10::OperatorHandle& op, torch::jit::Stack* stack, TensorFn&& tensor, NoteFn&& note) {
  bool cpu_device = false;
  const auto& args = op.schema().arguments();
  const size_t first = stack->size() - args.size();
  for (size_t i = 0; i < args.size(); ++i) {
    auto& iv = (*stack)[first + i];
    const auto& arg = args[i];
    const bool written = arg.alias_info() != nullptr && arg.alias_info()->isWrite();
    if (iv.isTensor()) {
      iv = tensor(iv.toTensor(), arg, written);
    } else if (iv.isTensorList()) {
      auto list = iv.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(list.size());
      for (const at::Tensor& t : list) out.push_back(tensor(t, arg, written));
      iv = std::move(out);
    } else if (iv.isList() && iv.toListRef().size() > 0 && iv.toListRef()[0].isTensor() ||
               iv.isList() && arg.type()->containedTypes().size() == 1 &&
                   arg.type()->containedType(0)->kind() == c10::TypeKind::OptionalType) {
      auto list = iv.toList();
      c10::impl::GenericList out(list.elementType());
      out.reserve(list.size());
      for (const c10::IValue& e : list) out.push_back(e.isTensor() ? c10::IValue(tensor(e.toTensor(), arg, written)) : e);
      iv = std::move(out);
    } else if (iv.isDevice() && iv.toDevice().type() == kNeuron) {
      const auto device = iv.toDevice();
      if (device.has_index()) checkDevice(device.index());
      note(device, arg);
      iv = c10::Device(c10::kCPU);
    } else if (iv.isDevice() && iv.toDevice().is_cpu()) {
      cpu_device = true;
    }
  }
  return cpu_device;
}

// Replaces each tensor among `op`'s results on the stack (alone or in a list) by result(t).
template <class ResultFn>
void convertResults(const c10::OperatorHandle& op, torch::jit::Stack* stack, ResultFn&& result) {
  const size_t n = op.schema().returns().size();
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    auto& iv = (*stack)[i];
    if (iv.isTensor()) {
      iv = result(std::move(iv).toTensor());
    } else if (iv.isTensorList()) {
      auto list = iv.toTensorList();
      iv = c10::IValue();  // the list's tensors are its own: results may then take their buffers
      c10::List<at::Tensor> out;
      out.reserve(list.size());
      for (size_t j = 0; j < list.size(); ++j) out.push_back(result(list.extract(j)));
      iv = std::move(out);
    }
  }
}

// Calls fn(op, name) for each aten op with a schema, `name` as torch::Library::impl takes it
// ("add.Tensor"), for registering a fallback where PyTorch's own kernels would otherwise win.
template <class Fn>
void forEachAtenOp(Fn&& fn) {
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasSchema()) continue;
    std::string qualified = name.name.substr(6);
    if (!name.overload_name.empty()) qualified += "." + name.overload_name;
    fn(*op, qualified);
  }
}

// Gives a CPU kernel's generator arguments a CPU generator keyed from the neuron device's stream
// (random numbers never come from the CPU's generator).
inline void replaceGenerators(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device) {
  const auto& args = op.schema().arguments();
  const size_t first = stack->size() - args.size();
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::Type* type = args[i].type().get();
    if (type->kind() == c10::TypeKind::OptionalType)
      type = static_cast<const c10::OptionalType*>(type)->getElementType().get();
    if (type->kind() != c10::TypeKind::GeneratorType) continue;
    auto& iv = (*stack)[first + i];
    iv = cpuGeneratorFor(iv.isNone() ? std::nullopt : std::optional<at::Generator>(iv.toGenerator()), device);
  }
}

}  // namespace torchneuron
