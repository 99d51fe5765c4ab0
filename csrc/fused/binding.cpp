// The Python side of fused eager: the mode, the report, and the hooks that hand a recorded group to
// torchneuron.compile.fused (which builds and compiles its graph) and run what it returns.
#include "compiler.h"
#include "fused_mode.h"

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace torchneuron {
namespace {

py::object* compiler = nullptr;  // torchneuron.compile.fused.compile_group, set by Python (kept until exit)
py::object* expecter = nullptr;  // ... its pay-off rule's expect() and learned() (kept until exit)
py::object* learner = nullptr;

c10::TypeKind elementKind(const c10::TypePtr& type) {
  const c10::Type* t = type.get();
  if (t->kind() == c10::TypeKind::OptionalType) t = static_cast<const c10::OptionalType*>(t)->getElementType().get();
  return t->kind();
}

py::object toPython(const c10::IValue& iv, c10::TypeKind kind) {
  if (iv.isNone()) return py::none();
  if (iv.isTensor()) {
    const at::Tensor& t = iv.toTensor();
    if (!t.defined()) return py::none();
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) {  // a Python number, promoting as one
      if (t.is_floating_point()) return py::float_(t.item<double>());
      if (t.scalar_type() == c10::kBool) return py::bool_(t.item<bool>());
      if (!t.is_complex()) return py::int_(t.item<int64_t>());
    }
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
  }
  if (iv.isInt()) {
    if (kind == c10::TypeKind::ScalarTypeType)
      return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(iv.toScalarType())));
    if (kind == c10::TypeKind::LayoutType)
      return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPLayout(iv.toLayout())));
    if (kind == c10::TypeKind::MemoryFormatType)
      return py::reinterpret_borrow<py::object>(torch::utils::getTHPMemoryFormat(iv.toMemoryFormat()));
    return py::int_(iv.toInt());
  }
  if (iv.isBool()) return py::bool_(iv.toBool());
  if (iv.isDouble()) return py::float_(iv.toDouble());
  if (iv.isComplexDouble()) {
    const auto c = iv.toComplexDouble();
    return py::reinterpret_steal<py::object>(PyComplex_FromDoubles(c.real(), c.imag()));
  }
  if (iv.isString()) return py::str(std::string(iv.toStringView()));
  if (iv.isDevice()) return py::cast(iv.toDevice());
  if (iv.isList()) {
    py::list out;
    for (const auto& e : iv.toListRef()) out.append(toPython(e, kind));
    return out;
  }
  TORCH_CHECK(false, "fused eager: an argument of kind ", iv.tagKind(), " the graph compiler does not take");
}

py::list values(const torch::jit::Stack& stack, const std::vector<c10::Argument>& schema) {
  py::list out;
  for (size_t i = 0; i < stack.size(); ++i) {
    const auto kind = i < schema.size() ? elementKind(schema[i].type()) : c10::TypeKind::AnyType;
    out.append(toPython(stack[i], kind));
  }
  return out;
}

std::shared_ptr<void> compileGroup(const FusedDescription& group, std::string* error) {
  py::gil_scoped_acquire gil;
  if (compiler == nullptr || !*compiler) {
    *error = "no graph compiler";
    return nullptr;
  }
  try {
    py::list ops;
    for (size_t i = 0; i < group.ops.size(); ++i) {
      const Deferred* d = group.ops[i];
      const auto& schema = d->kernel.op.schema();
      ops.append(py::make_tuple(schema.name(), schema.overload_name(), values(d->meta_arguments, schema.arguments()),
                                values(d->meta_results, schema.returns()), bool(group.lifts[i])));
    }
    py::list storages;
    for (size_t i = 0; i < group.storages.size(); ++i)
      storages.append(py::make_tuple(py::reinterpret_steal<py::object>(THPVariable_Wrap(group.storages[i])),
                                     bool(group.made[i]), bool(group.input[i])));
    py::list inputs;
    for (const auto& t : group.inputs) inputs.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(t)));
    py::list floats;
    for (size_t k = 0; k < group.floats.size(); ++k)
      floats.append(py::make_tuple(group.floats[k], bool(group.lifted[k])));
    py::object graph = (*compiler)(ops, storages, floats, inputs);
    return std::shared_ptr<void>(new py::object(std::move(graph)), [](void* p) {
      if (!Py_IsInitialized()) return;  // at exit: left to the interpreter
      py::gil_scoped_acquire gil;
      delete static_cast<py::object*>(p);
    });
  } catch (py::error_already_set& e) {
    *error = e.what();
  } catch (const std::exception& e) {
    *error = e.what();
  }
  return nullptr;
}

void runGraph(void* graph, std::vector<at::Tensor>& inputs) {
  py::gil_scoped_acquire gil;
  py::list args;
  for (auto& t : inputs) args.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t))));
  try {
    (*static_cast<py::object*>(graph))(args);
  } catch (py::error_already_set& e) {
    TORCH_CHECK(false, "fused eager: a compiled group failed: ", e.what());
  }
}

FusedExpectation expect(uint64_t key, size_t ops) {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return {};
  py::gil_scoped_acquire gil;
  try {
    auto [seconds, gain] = (*expecter)(key, ops).cast<std::pair<double, double>>();
    return {seconds, gain};
  } catch (py::error_already_set& e) {  // the rule's defaults, and a warning
    PyErr_WarnEx(PyExc_RuntimeWarning, (std::string("fused eager: the pay-off rule failed: ") + e.what()).c_str(), 1);
  }
  return {};
}

void learned(uint64_t key, size_t ops, double compile_seconds, double op_seconds, double fused_seconds) {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
  py::gil_scoped_acquire gil;
  try {
    (*learner)(key, ops, compile_seconds, op_seconds, fused_seconds);
  } catch (py::error_already_set& e) {
    PyErr_WarnEx(PyExc_RuntimeWarning, (std::string("fused eager: keeping what a group measured failed: ") + e.what()).c_str(), 1);
  }
}

std::shared_ptr<void> releaseInterpreter() {
  if (!Py_IsInitialized() || !PyGILState_Check()) return nullptr;
  return std::make_shared<py::gil_scoped_release>();
}

// The innermost Python frame outside PyTorch and torchneuron, as "file:line in function". PyTorch's
// bindings let go of the interpreter's lock while an op runs: it is taken back (as a Python meta
// kernel does) on a thread Python knows; other threads have no Python line.
std::string where() {
  if (!Py_IsInitialized() || _Py_IsFinalizing() || PyGILState_GetThisThreadState() == nullptr) return {};
  py::gil_scoped_acquire gil;
  try {
    static const std::vector<std::string> libraries = [] {
      std::vector<std::string> dirs;
      for (const char* name : {"torch", "torchneuron"})
        dirs.push_back(py::module_::import(name).attr("__path__").cast<py::list>()[0].cast<std::string>() + "/");
      return dirs;
    }();
    auto frame = py::reinterpret_steal<py::object>(  // new references, or null at the outermost frame
        reinterpret_cast<PyObject*>(PyThreadState_GetFrame(PyThreadState_Get())));
    while (frame) {
      auto* f = reinterpret_cast<PyFrameObject*>(frame.ptr());
      auto code = py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(PyFrame_GetCode(f)));
      const char* file = PyUnicode_AsUTF8(reinterpret_cast<PyCodeObject*>(code.ptr())->co_filename);
      if (file == nullptr) {
        PyErr_Clear();
        break;
      }
      const std::string_view path(file);
      const bool library = std::any_of(libraries.begin(), libraries.end(),
                                       [&](const std::string& dir) { return path.rfind(dir, 0) == 0; });
      if (!library) {
        const char* name = PyUnicode_AsUTF8(reinterpret_cast<PyCodeObject*>(code.ptr())->co_name);
        if (name == nullptr) PyErr_Clear();
        return std::string(path) + ":" + std::to_string(PyFrame_GetLineNumber(f)) + " in " + (name ? name : "?");
      }
      frame = py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(PyFrame_GetBack(f)));
    }
  } catch (const std::exception&) {
    PyErr_Clear();
  }
  return {};
}

py::dict stats() {
  const FusedStats s = fusedStats();
  py::list groups;
  for (const auto& g : s.groups) {
    py::dict d;
    d["ops"] = g.ops;
    d["seen"] = g.seen;
    d["fused_runs"] = g.fused_runs;
    d["compiled"] = g.compiled;
    d["compile_seconds"] = double(g.compile_ns) * 1e-9;
    d["error"] = g.error;
    d["first_cut"] = g.first_cut;
    d["first_ops"] = g.op_names;
    d["op_runs"] = g.op_runs;
    d["op_seconds"] = double(g.op_ns) * 1e-9;
    d["fused_seconds"] = double(g.fused_ns) * 1e-9;
    d["expected_compile_seconds"] = g.expected_compile_seconds;
    d["expected_gain"] = g.expected_gain;
    d["skipped_runs"] = g.skipped_runs;
    d["credited_seconds"] = double(g.credited_ns) * 1e-9;
    groups.append(d);
  }
  py::dict out;
  out["groups"] = groups;
  out["cuts"] = s.cuts;
  out["recorded_ops"] = s.recorded_ops;
  out["bypassed_ops"] = s.bypassed_ops;
  return out;
}

// Each figure of FusedConfig by its name, for torchneuron._C._fused_config.
using ConfigField = std::variant<int64_t FusedConfig::*, double FusedConfig::*, bool FusedConfig::*>;
const std::vector<std::pair<const char*, ConfigField>>& configFields() {
  static const std::vector<std::pair<const char*, ConfigField>> fields = {
      {"compile_after", &FusedConfig::compile_after}, {"payoff", &FusedConfig::payoff},
      {"timing_free", &FusedConfig::timing_free},     {"skip_ahead", &FusedConfig::skip_ahead},
      {"min_ops", &FusedConfig::min_ops},             {"max_ops", &FusedConfig::max_ops},
      {"patience", &FusedConfig::patience},           {"bypass_ops", &FusedConfig::bypass_ops},
      {"cold_seconds", &FusedConfig::cold_seconds},   {"cold_seconds_per_op", &FusedConfig::cold_seconds_per_op},
      {"rate_ops", &FusedConfig::rate_ops},           {"warm_seconds_per_op", &FusedConfig::warm_seconds_per_op},
      {"gain", &FusedConfig::gain},                   {"timed_runs", &FusedConfig::timed_runs},
  };
  return fields;
}

py::dict configure(const py::dict& changes) {
  auto& config = fusedConfig();
  py::dict before;
  for (const auto& [name, field] : configFields())
    std::visit([&, name = name](auto member) { before[name] = config.*member; }, field);
  FusedConfig updated = config;  // every change checked before any is made
  for (const auto& [key, value] : changes) {
    const auto name = py::cast<std::string>(key);
    const auto it = std::find_if(configFields().begin(), configFields().end(),
                                 [&](const auto& f) { return name == f.first; });
    TORCH_CHECK_TYPE(it != configFields().end(), "_fused_config() got an unexpected keyword argument '", name, "'");
    std::visit([&](auto member) {
      using T = std::remove_reference_t<decltype(config.*member)>;
      const T v = py::cast<T>(value);
      if constexpr (std::is_same_v<T, int64_t>) {  // counts: bypass_ops and skip_ahead may be 0 (none)
        TORCH_CHECK_VALUE(v > 0 || (v == 0 && (name == "bypass_ops" || name == "skip_ahead")),
                          "_fused_config: ", name, " must be positive, got ", v);
      } else if constexpr (std::is_same_v<T, double>) {
        TORCH_CHECK_VALUE(v >= 0, "_fused_config: ", name, " must be 0 or more, got ", v);
      }
      updated.*member = v;
    }, it->second);
  }
  config = updated;
  return before;
}

// The policy as Python sees it (torchneuron._C._fused_policy()): its figures live, its learning rule
// and its cut rules (policy.h). `changed(**figures)` changes figures for a `with` block.
struct PolicyView {};
struct PolicyChange {
  py::dict changes;
  py::dict before;
};

std::optional<double> entry(const py::dict& d, const char* key) {
  if (!d.contains(key) || d[key].is_none()) return std::nullopt;
  return py::cast<double>(d[key]);
}

py::list cutRules() {
  py::list rules;
  for (const auto& r : fusedCutRules()) {
    py::dict d;
    d["key"] = r.key;
    d["name"] = r.name;
    d["runs_alone"] = r.runs_alone;
    d["tags"] = py::cast(std::vector<std::string>(r.tags.begin(), r.tags.end()));
    d["ops"] = py::cast(std::vector<std::string>(r.ops.begin(), r.ops.end()));
    d["why"] = r.why;
    rules.append(d);
  }
  return rules;
}

void bindPolicy(py::module& m) {
  py::class_<PolicyChange>(m, "_FusedPolicyChange")
      .def("__enter__", [](PolicyChange& c) {
        c.before = configure(c.changes);
        return configure(py::dict());
      })
      .def("__exit__", [](PolicyChange& c, const py::args&) {
        configure(c.before);
        return false;
      });
  py::class_<PolicyView>(m, "_FusedPolicy",
                         "Fused eager's policy (csrc/fused/policy.h): its figures, learning rule and cut rules.")
      .def("figures", [](PolicyView&) { return configure(py::dict()); }, "The figures by name, as they are now.")
      .def("__getitem__", [](PolicyView&, const std::string& name) {
        py::dict figures = configure(py::dict());
        TORCH_CHECK_INDEX(figures.contains(name), "fused eager's policy has no figure '", name, "'");
        return py::object(figures[py::str(name)]);
      })
      .def("set", [](PolicyView&, const py::kwargs& changes) { return configure(changes); },
           "Sets the figures given by name (all checked before any is set); returns them all as they were.")
      .def("changed", [](PolicyView&, const py::kwargs& changes) { return PolicyChange{changes, py::dict()}; },
           "The figures given by name, changed for a `with` block and restored after it.")
      .def_property_readonly("cuts", [](PolicyView&) { return cutRules(); },
                             "The cut rules, in the order an op is tested against them.")
      .def("expect",
           [](PolicyView&, size_t ops, std::optional<double> cold_seconds_per_op, const py::object& group) {
             FusedGroupHistory g;
             if (!group.is_none()) {
               const auto d = group.cast<py::dict>();
               g = {entry(d, "warm_seconds"), entry(d, "gain")};
             }
             const auto e = fusedExpect(fusedConfig(), FusedMachineHistory{cold_seconds_per_op},
                                        group.is_none() ? nullptr : &g, ops);
             return std::make_pair(e.compile_seconds, e.gain);
           },
           py::arg("ops"), py::arg("cold_seconds_per_op") = py::none(), py::arg("group") = py::none(),
           "The learning rule: (compile seconds, gain) expected for a group of `ops` ops, given the machine's "
           "measured cold compile time per op and the group's history (None: never compiled here).")
      .def("learn",
           [](PolicyView&, size_t ops, double compile_seconds, double op_seconds, double fused_seconds,
              std::optional<double> cold_seconds_per_op, const py::object& group) {
             FusedMachineHistory machine{cold_seconds_per_op};
             FusedGroupHistory g;
             py::dict out;
             if (group.is_none()) {
               out["ops"] = ops;
             } else {
               out = group.attr("copy")().cast<py::dict>();
               g = {entry(out, "warm_seconds"), entry(out, "gain")};
             }
             fusedLearn(fusedConfig(), machine, g, group.is_none(), ops, compile_seconds, op_seconds, fused_seconds);
             if (g.warm_seconds) out["warm_seconds"] = *g.warm_seconds;
             if (g.gain) out["gain"] = *g.gain;
             return py::make_tuple(machine.cold_seconds_per_op ? py::object(py::float_(*machine.cold_seconds_per_op))
                                                               : py::object(py::none()),
                                   out);
           },
           py::arg("ops"), py::arg("compile_seconds"), py::arg("op_seconds"), py::arg("fused_seconds"),
           py::arg("cold_seconds_per_op") = py::none(), py::arg("group") = py::none(),
           "The learning rule: what a compiled group measured, kept. Returns the machine's cold compile time "
           "per op (None: still not measured) and the group's history, updated (a new one when `group` is None).");
  m.def("_fused_policy", [] { return PolicyView{}; }, "Fused eager's policy: one object (csrc/fused/policy.h).");
}

}  // namespace

void bindFused(py::module& m) {
  m.def("_set_fused_mode", [](bool on) {
    py::gil_scoped_release release;  // the pending group may run
    setFusedMode(on);
  });
  m.def("_fused_mode", &fusedMode);
  m.def("_fused_flush", [] { flushFused("flush"); });
  m.def("_fused_stats", &stats);
  m.def("_fused_reset", &resetFusedStats);
  m.def("_fused_config", [](const py::kwargs& changes) { return configure(changes); },
        "Fused eager's policy's figures (csrc/fused/policy.h; _fused_policy().set): sets the figures given by "
        "name, returns them all as they were.");
  bindPolicy(m);
  m.def("_set_fused_policy", [](py::object expect_fn, py::object learned_fn) {
    if (expecter == nullptr) expecter = new py::object(), learner = new py::object();
    *expecter = std::move(expect_fn);
    *learner = std::move(learned_fn);
    setFusedPolicy(&expect, &learned);
  });
  m.def("_set_fused_compiler", [](py::object fn) {
    if (compiler == nullptr) compiler = new py::object();
    *compiler = std::move(fn);
    setFusedHooks(&compileGroup, &runGraph, &releaseInterpreter, &where);
  });
}

}  // namespace torchneuron
