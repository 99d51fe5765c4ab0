// CUDA's dtype coverage on the device: ops whose CPU kernel lacks a dtype that CUDA's kernel has.
//
// Libraries take CUDA's code paths on any device that is not the CPU (MoE routing calls histc on
// integer expert ids, for one), so the device accepts the (op, dtype) pairs PyTorch's OpInfo
// database lists for CUDA but not for the CPU. The op runs through a dtype the CPU supports and
// that CUDA's kernel effectively computes in, and its results are cast back:
//
//   complex32 -> complex64, float16 -> float32  (CUDA computes in complex<float>/float: opmath)
//   bfloat16  -> float32
//   bool      -> uint8     (abs of bool stays bool; trace of bool is int64, as on CUDA)
//   integers  -> float64   (histc: exact for the counts; min and max truncated to the input's
//                            integer type first, as CUDA's kernel converts them)
//
// A returned tensor of a widened dtype (or of its real/complex twin: angle of complex32 is float16)
// is cast back; out= and in-place arguments get the widened result written back (resized first as
// out= would be). nansum of complex tensors (the CPU kernel refuses complex) is the sum of the
// tensor with NaN elements zeroed, as CUDA's NanSumOps does (an element is NaN if either part is).
//
// The table's ops get widenedFallback as their neuron kernel; the fast ops among them (sin, sum,
// ...) call it only when their CPU kernel raises. Other ops never come here.
#include "widening.h"

#include "fallback.h"
#include "arguments.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/Resize.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <string_view>

namespace torchneuron {
namespace {

enum Narrow : unsigned {
  kComplexHalf = 1,  // complex32 (and float16 beside it)
  kHalf = 2,         // float16 (and complex32 beside it)
  kBFloat16 = 4,
  kBool = 8,
  kIntegral = 16,    // uint8, int8, int16, int32, int64
  kComplex = 32,     // complex64 and complex128: nansum only (rewritten as a sum)
};

struct Rule {
  std::string_view name;  // schema name without "aten::" and without a trailing "_" (in-place)
  unsigned narrow;
};

// From OpInfo's dtypesIfCUDA minus dtypes (torch.testing._internal.common_methods_invocations,
// PyTorch 2.13), plus the backward ops of the same kernels.
constexpr Rule kRules[] = {
    // complex32 elementwise math, reductions and FFTs
    {"acos", kComplexHalf}, {"acosh", kComplexHalf}, {"asin", kComplexHalf}, {"asinh", kComplexHalf},
    {"atan", kComplexHalf}, {"atanh", kComplexHalf}, {"cos", kComplexHalf}, {"cosh", kComplexHalf},
    {"sin", kComplexHalf}, {"sinh", kComplexHalf}, {"tan", kComplexHalf}, {"tanh", kComplexHalf},
    {"exp", kComplexHalf}, {"log", kComplexHalf}, {"sqrt", kComplexHalf}, {"rsqrt", kComplexHalf},
    {"sigmoid", kComplexHalf}, {"angle", kComplexHalf}, {"div", kComplexHalf}, {"logaddexp", kComplexHalf},
    {"pow", kComplexHalf}, {"lerp", kComplexHalf}, {"prod", kComplexHalf}, {"sum", kComplexHalf},
    {"trace", kComplexHalf | kBool}, {"nansum", kComplexHalf | kComplex},
    {"_fft_c2c", kComplexHalf}, {"_fft_c2r", kComplexHalf}, {"_fft_r2c", kHalf},
    // half-precision pooling, losses, upsampling, rrelu
    {"avg_pool3d", kHalf | kBFloat16}, {"avg_pool3d_backward", kHalf | kBFloat16},
    {"multi_margin_loss", kHalf | kBFloat16}, {"multi_margin_loss_backward", kHalf | kBFloat16},
    {"multilabel_margin_loss_forward", kHalf | kBFloat16}, {"multilabel_margin_loss_backward", kHalf | kBFloat16},
    {"_upsample_bilinear2d_aa", kHalf | kBFloat16}, {"_upsample_bilinear2d_aa_backward", kHalf | kBFloat16},
    {"rrelu_with_noise", kHalf}, {"rrelu_with_noise_backward", kHalf},
    // bool and integers
    {"abs", kBool}, {"histc", kIntegral},
};

std::string_view ruleName(std::string_view schema_name) {
  if (schema_name.rfind("aten::", 0) == 0) schema_name.remove_prefix(6);
  if (schema_name.size() > 1 && schema_name.back() == '_') schema_name.remove_suffix(1);
  return schema_name;
}

const Rule* ruleFor(std::string_view schema_name) {
  const auto name = ruleName(schema_name);
  for (const auto& rule : kRules)
    if (rule.name == name) return &rule;
  return nullptr;
}

// Which narrow class of the rule a dtype triggers (0: none).
unsigned triggers(unsigned narrow, at::ScalarType t) {
  using S = at::ScalarType;
  if ((narrow & kComplexHalf) && t == S::ComplexHalf) return kComplexHalf;
  if ((narrow & kHalf) && t == S::Half) return kHalf;
  if ((narrow & kBFloat16) && t == S::BFloat16) return kBFloat16;
  if ((narrow & kBool) && t == S::Bool) return kBool;
  if ((narrow & kIntegral) && at::isIntegralType(t, /*includeBool=*/false)) return kIntegral;
  if ((narrow & kComplex) && (t == S::ComplexFloat || t == S::ComplexDouble)) return kComplex;
  return 0;
}

// The dtype map of one call: narrow -> wide, and back.
struct Widening {
  c10::SmallVector<std::pair<at::ScalarType, at::ScalarType>, 2> pairs;  // (narrow, wide)

  void add(at::ScalarType narrow, at::ScalarType wide) {
    for (const auto& p : pairs)
      if (p.first == narrow) return;
    pairs.emplace_back(narrow, wide);
  }
  std::optional<at::ScalarType> wide(at::ScalarType t) const {
    for (const auto& [n, w] : pairs)
      if (n == t) return w;
    return std::nullopt;
  }
  std::optional<at::ScalarType> narrow(at::ScalarType t) const {
    for (const auto& [n, w] : pairs)
      if (w == t && n != w) return n;
    return std::nullopt;
  }
};

void addClass(Widening& w, unsigned cls, at::ScalarType t) {
  using S = at::ScalarType;
  switch (cls) {
    case kComplexHalf:
    case kHalf:
      w.add(S::ComplexHalf, S::ComplexFloat);
      w.add(S::Half, S::Float);
      break;
    case kBFloat16: w.add(S::BFloat16, S::Float); break;
    case kBool: w.add(S::Bool, S::Byte); break;
    case kIntegral: w.add(t, S::Double); break;
    default: break;  // kComplex: no dtype change
  }
}

const c10::Type* elementType(const c10::Argument& arg) {
  const c10::Type* type = arg.real_type().get();
  if (type->kind() == c10::TypeKind::OptionalType)
    type = static_cast<const c10::OptionalType*>(type)->getElementType().get();
  return type;
}

bool isWritten(const c10::Argument& arg) { return arg.alias_info() != nullptr && arg.alias_info()->isWrite(); }

struct WrittenArg {
  at::Tensor original;
  at::Tensor wide;
};

// nansum of a complex tensor: sum of the tensor with its NaN elements zeroed.
void complexNansum(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t first) {
  auto& self = (*stack)[first];
  const auto t = self.toTensor();
  self = at::where(at::isnan(t), at::zeros({}, t.options()), t);
  const bool out = op.schema().overload_name() == "out";
  static const auto sum = c10::Dispatcher::singleton().findSchemaOrThrow("aten::sum", "dim_IntList");
  static const auto sum_out = c10::Dispatcher::singleton().findSchemaOrThrow("aten::sum", "IntList_out");
  (out ? sum_out : sum).callBoxed(stack);
}

}  // namespace

bool widens(const char* schema_name) { return ruleFor(schema_name) != nullptr; }

namespace {

void runWidened(const Rule* rule, const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t first = stack->size() - args.size();
  unsigned cls = 0;
  at::ScalarType trigger = at::ScalarType::Undefined;
  if (rule != nullptr) {
    for (size_t i = first; i < stack->size() && cls == 0; ++i) {
      const auto& iv = (*stack)[i];
      if (!iv.isTensor()) continue;
      const auto& t = iv.toTensor();
      if (t.defined()) {
        cls = triggers(rule->narrow, t.scalar_type());
        trigger = t.scalar_type();
      }
    }
  }
  if (cls == 0) return neuronFallback(op, keys, stack);

  Widening w;
  addClass(w, cls, trigger);
  c10::SmallVector<WrittenArg, 2> written;
  for (size_t i = 0; i < args.size(); ++i) {
    auto& iv = (*stack)[first + i];
    const auto& arg = args[i];
    if (iv.isTensor()) {
      const auto t = iv.toTensor();
      if (!t.defined()) continue;
      const auto wide = w.wide(t.scalar_type());
      if (!wide) continue;
      auto widened = t.to(*wide);
      if (isWritten(arg)) written.push_back({t, widened});
      iv = std::move(widened);
    } else if (iv.isInt() && elementType(arg)->kind() == c10::TypeKind::ScalarTypeType) {
      if (const auto wide = w.wide(static_cast<at::ScalarType>(iv.toInt()))) iv = static_cast<int64_t>(*wide);
    }
  }
  // histc on integers: CUDA's kernel converts min and max to the input's type (truncating).
  if (cls == kIntegral && ruleName(op.schema().name()) == "histc") {
    for (size_t i = 0; i < args.size(); ++i) {
      auto& iv = (*stack)[first + i];
      if ((args[i].name() == "min" || args[i].name() == "max") && iv.isScalar())
        iv = c10::Scalar(static_cast<double>(iv.toScalar().toLong()));
    }
  }

  if (cls == kComplex || (cls == kComplexHalf && ruleName(op.schema().name()) == "nansum")) {
    complexNansum(op, stack, first);
  } else {
    neuronFallback(op, keys, stack);
  }

  for (const auto& a : written) {
    if (!a.original.sizes().equals(a.wide.sizes())) at::native::resize_output(a.original, a.wide.sizes());
    a.original.copy_(a.wide);
  }
  const size_t n = op.schema().returns().size();
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    auto& iv = (*stack)[i];
    if (!iv.isTensor()) continue;
    const auto t = iv.toTensor();
    if (!t.defined()) continue;
    bool replaced = false;
    for (const auto& a : written) {
      if (a.wide.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        iv = a.original;
        replaced = true;
        break;
      }
    }
    if (replaced) continue;
    if (const auto back = w.narrow(t.scalar_type())) iv = t.to(*back);
  }
}

// The kernel registered for one op of the table: its rule found once, at registration.
class WidenedKernel final : public c10::OperatorKernel {
 public:
  explicit WidenedKernel(const Rule* rule) : rule_(rule) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    runWidened(rule_, op, keys, stack);
  }

 private:
  const Rule* rule_;
};

}  // namespace

void widenedFallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  runWidened(ruleFor(op.schema().name()), op, keys, stack);
}

void registerWidenedOps() {
  static torch::Library* library = nullptr;
  if (library != nullptr) return;
  library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  forEachAtenOp([&](const c10::OperatorHandle& op, const std::string& qualified) {
    const Rule* rule = ruleFor(op.schema().name());
    if (rule == nullptr) return;
    if (op.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) return;  // a fast op: it calls us on failure
    // A registration would take the decomposition away from the op's autograd.
    if (op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) return;
    library->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<WidenedKernel>(rule)));
  });
}

}  // namespace torchneuron
