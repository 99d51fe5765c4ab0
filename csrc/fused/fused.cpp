// Fused eager: ops on neuron tensors recorded into a group instead of run; the group runs at a cut,
// as one compiled graph once the same group has been seen again and compiling it pays (the pay-off
// rule, runGroup), else op by op.
//
// aten sees fused eager only through its held-work table (aten/held_work.h), which installFusedEager
// fills at start-up: aten offers each op to record() while fused mode is on, and hands the held group
// over (handOver) before anything that must come after it.
//
// Recording is the asynchronous mode's deferral (aten/deferred.cpp) with one table of stand-ins for
// the whole group: each op's meta kernel sizes its results, which are allocated now and returned, and
// its CPU kernel is kept for later. A group is cut when anything reaches the runtime (a launch that
// is not recorded, a copy, a synchronization: the hand-over), when the device or stream changes, and
// at a size bound: cut points follow the program's order of ops alone, never timing.
//
// A group is known by its signature: its ops, their non-tensor arguments, their tensors' sizes,
// strides, offsets and dtypes, which storages they share, and which of the storages the group made
// are still referred to when it runs. The compiled graph (torchneuron/compile/fused.py) reads the
// storages from before the group and writes those still referred to; the others (intermediates)
// live only inside it. A group seen too seldom, not yet paying for its compile, or that does not
// compile, runs op by op, exactly as the ops would have run.
#include "compiler.h"
#include "fused_mode.h"
#include "../aten/host_addressable.h"
#include "../runtime/neuron_runtime.h"

#include <ATen/Context.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <cstring>
#include <chrono>
#include <deque>
#include <mutex>
#include <unordered_map>

namespace torchneuron {

namespace {

thread_local bool running_group = false;  // recording is off while a group runs (its own ops run)
thread_local bool recording_op = false;   // an op is being recorded: the group cannot run now

struct Slot {  // a storage the group's ops touch
  c10::Storage before;                               // from before the group: kept until it runs
  c10::weak_intrusive_ptr<c10::StorageImpl> made{c10::intrusive_ptr<c10::StorageImpl>()};  // made by it
  StandIn standin;
  c10::Storage kept;  // made by it and still referred to when it runs (settle()): kept while it runs
  int index = -1;  // in order of first use by a recorded op
  caffe2::TypeMeta dtype;
  bool is_made = false;
};

class Group final : public StandIns {
 public:
  const StandIn& of(const c10::Storage& neuron, const at::Tensor& like) override {
    auto it = by_storage_.find(neuron.unsafeGetStorageImpl());
    if (it != by_storage_.end()) return it->second->standin;
    slots_.push_back(Slot{neuron, c10::weak_intrusive_ptr<c10::StorageImpl>(c10::intrusive_ptr<c10::StorageImpl>()),
                          StandIn{metaStorage(neuron.nbytes()), hostStorageOf(like)}});
    return add(neuron.unsafeGetStorageImpl());
  }

  void made(const c10::Storage& neuron, StandIn standin) override {
    slots_.push_back(Slot{c10::Storage(), c10::weak_intrusive_ptr<c10::StorageImpl>(neuron.getWeakStorageImpl()),
                          std::move(standin)});
    slots_.back().is_made = true;
    add(neuron.unsafeGetStorageImpl());
  }

  bool empty() const { return ops_.empty(); }
  size_t size() const { return ops_.size(); }
  c10::DeviceIndex device() const { return device_; }
  c10::StreamId stream() const { return stream_; }

  void start(c10::DeviceIndex device, c10::StreamId stream, std::string where) {
    device_ = device;
    stream_ = stream;
    where_ = std::move(where);
  }
  const std::string& where() const { return where_; }

  void append(Deferred op) {
    op_at_.push_back(tokens_.size());
    tokens_.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(&op.kernel.op.schema())));
    lift_ = !floatsSetSizes(op.kernel.op.schema());
    lifts_.push_back(lift_);
    const auto& args = op.kernel.op.schema().arguments();
    for (size_t i = 0; i < op.meta_arguments.size(); ++i)
      token(op.meta_arguments[i], i < args.size() && scalarArgument(args[i].type()));
    TokenWriter(tokens_).token(Token::ArgumentsEnd);
    for (const auto& iv : op.meta_results) token(iv, false);
    TokenWriter(tokens_).token(Token::ResultsEnd);
    ops_.push_back(std::move(op));
  }

  // Decides, once, which storages it made are still referred to (and keeps them while it runs): a
  // storage dropped later (by another thread, or a garbage collection while a graph compiles) must
  // not change the graph's inputs half-way.
  void settle() {
    for (Slot* s : ordered_)
      if (s->is_made) s->kept = c10::Storage(s->made.lock());
  }

  // The signature, with which of the storages it made are still referred to.
  std::vector<int64_t> signature() const {
    std::vector<int64_t> key = tokens_;
    TokenWriter(key).token(Token::GroupEnd, device_);
    for (const Slot* s : ordered_) key.push_back(s->is_made ? (alive(*s) ? 1 : 0) : 2);
    return key;
  }

  // The signature as another process would write it (op names for the schemas' addresses): what
  // earlier processes learned of the group is kept under it.
  uint64_t stableKey() const {
    std::vector<int64_t> key = signature();
    for (size_t i = 0; i < ops_.size(); ++i) {
      const auto& schema = ops_[i].kernel.op.schema();
      key[op_at_[i]] = static_cast<int64_t>(std::hash<std::string>()(schema.name() + "." + schema.overload_name()));
    }
    uint64_t h = 1469598103934665603ULL;  // FNV-1a over the tokens' bytes
    for (int64_t t : key) {
      for (int b = 0; b < 8; ++b) {
        h ^= static_cast<uint64_t>(t >> (8 * b)) & 0xff;
        h *= 1099511628211ULL;
      }
    }
    return h;
  }

  FusedDescription describe() const {
    FusedDescription d;
    for (const auto& op : ops_) d.ops.push_back(&op);
    d.lifts = lifts_;
    for (const Slot* s : ordered_) {
      d.storages.push_back(flat(s->standin.meta, s->dtype, c10::DispatchKey::Meta));
      d.made.push_back(s->is_made);
      d.input.push_back(!s->is_made || alive(*s));
    }
    return d;
  }

  // The compiled graph's inputs: flat neuron tensors over the storages it reads or writes.
  std::vector<at::Tensor> inputs(const std::vector<bool>& lifted) const {
    std::vector<at::Tensor> in;
    for (const Slot* s : ordered_) {
      if (!s->is_made) {
        in.push_back(flat(s->before, s->dtype, c10::DispatchKey::PrivateUse1));
      } else if (s->kept) {
        in.push_back(flat(s->kept, s->dtype, c10::DispatchKey::PrivateUse1));
      }
    }
    for (size_t k = 0; k < scalars_.size(); ++k)
      if (lifted[k]) in.push_back(at::scalar_tensor(scalars_[k], at::TensorOptions().dtype(c10::kDouble)));
    return in;
  }

  bool compilable() const { return compilable_; }
  const std::vector<double>& scalars() const { return scalars_; }
  std::vector<Deferred>& ops() { return ops_; }

 private:
  static bool alive(const Slot& s) { return static_cast<bool>(s.kept); }

  static at::Tensor flat(c10::Storage storage, caffe2::TypeMeta dtype, c10::DispatchKey key) {
    const auto n = static_cast<int64_t>(storage.nbytes() / dtype.itemsize());
    auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key), dtype);
    t.unsafeGetTensorImpl()->set_sizes_contiguous({n});
    return t;
  }

  const StandIn& add(const c10::StorageImpl* key) {
    Slot* slot = &slots_.back();
    by_storage_[key] = slot;
    by_meta_[slot->standin.meta.unsafeGetStorageImpl()] = slot;
    return slot->standin;
  }

  // A Scalar argument (alone, optional or in a list): its floats can be the graph's inputs. A `float`
  // argument (an epsilon) cannot take one, and stays part of the op.
  static bool scalarArgument(const c10::TypePtr& type) {
    const c10::Type* t = type.get();
    if (t->kind() == c10::TypeKind::OptionalType) t = static_cast<const c10::OptionalType*>(t)->getElementType().get();
    if (t->kind() == c10::TypeKind::ListType) t = t->containedType(0).get();
    return t->kind() == c10::TypeKind::NumberType;
  }

  // Appends a value's tokens (encoding.h) to the signature; `scalar`: a float there is the graph's input.
  void token(const c10::IValue& iv, bool scalar) {
    TokenWriter w(tokens_);
    if (iv.isTensor()) {
      const at::Tensor& t = iv.toTensor();
      if (!t.defined()) return w.token(Token::Undefined);
      if (!t.is_meta() && lift_ && t.unsafeGetTensorImpl()->is_wrapped_number() && t.is_floating_point()) {
        w.token(Token::LiftedTensorFloat);  // a Python float: an input of the graph, as floats are
        scalars_.push_back(t.item<double>());
        return;
      }
      if (!t.is_meta()) {  // a CPU scalar: its value is part of the op
        if (t.is_complex()) compilable_ = false;
        return w.token(Token::CpuScalar, t.scalar_type(), TokenWriter::floatBits(t.is_complex() ? 0.0 : t.item<double>()));
      }
      auto it = by_meta_.find(t.storage().unsafeGetStorageImpl());
      if (it == by_meta_.end()) {  // a meta kernel's scratch (no device storage): nothing to compile
        compilable_ = false;
        return w.token(Token::Scratch);
      }
      Slot& s = *it->second;
      if (s.index < 0) {
        s.index = static_cast<int>(ordered_.size());
        s.dtype = t.dtype();
        ordered_.push_back(&s);
        if (s.standin.meta.nbytes() % t.dtype().itemsize() != 0) compilable_ = false;
      } else if (s.dtype != t.dtype()) {
        compilable_ = false;  // one storage read as two dtypes
      }
      if (t.is_conj() || t.is_neg()) compilable_ = false;
      return w.tensor(s.index, t);  // its place: the group's storage it is on
    }
    if (iv.isDouble() && lift_ && scalar) {  // an input of the graph: a learning rate may change every step
      w.token(Token::LiftedFloat);
      scalars_.push_back(iv.toDouble());
      return;
    }
    if (iv.isList()) {
      w.list(iv, [&](const c10::IValue& e) { return token(e, scalar), true; });
      return;
    }
    if (w.value(iv, /*float_value=*/true)) return;
    compilable_ = false;  // complex scalars, tuples, ...: run op by op
    w.token(Token::Other, iv.tagKind().size());
  }

  std::deque<Slot> slots_;
  std::unordered_map<const c10::StorageImpl*, Slot*> by_storage_;
  std::unordered_map<const c10::StorageImpl*, Slot*> by_meta_;
  std::vector<Slot*> ordered_;
  std::vector<Deferred> ops_;
  std::vector<int64_t> tokens_;
  std::vector<size_t> op_at_;    // where each op's tokens begin (its schema's address)
  std::vector<double> scalars_;  // the floats the graph takes as inputs, in order
  std::vector<bool> lifts_;      // per op: whether its floats are inputs
  bool lift_ = true;
  c10::DeviceIndex device_ = -1;
  c10::StreamId stream_ = 0;
  std::string where_;  // the Python line its first op was recorded at
  bool compilable_ = true;
};

struct Known {  // a signature seen before
  FusedGroupStats stats;
  std::shared_ptr<void> graph;
  bool failed = false;
  // The group's Scalar floats: their values the first time, and which have changed since. Those are
  // the graph's inputs; the others are constants in it (a graph is compiled again when one changes).
  std::vector<double> floats;
  std::vector<bool> varies;
  uint64_t stable = 0;   // its key across processes (Group::stableKey), found when the policy is asked
  bool told = false;     // what its compiled runs measured has been told to the policy
  int64_t first_op_ns = 0;  // its first op-by-op run (first-time costs: left out of what it measured)
  int64_t last_boundary = -1;   // the host's boundaries (copies, synchronizations) when it was last cut,
  int64_t boundaries_between = 1;  // and how many come between two of its cuts
  int64_t skipping = 0;   // occurrences it let run unrecorded from its last cut on (at most)

  // Its op-by-op runs after the first (first-time costs, which compiling does not save, left out):
  // their time in all, and their mean (0 when there are none).
  int64_t laterOpNs() const { return stats.op_ns - first_op_ns; }
  double meanLaterOpNs() const {
    return stats.op_runs > 1 ? double(laterOpNs()) / double(stats.op_runs - 1) : 0.0;
  }
};

bool sameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

struct State {
  std::recursive_mutex mutex;
  std::unique_ptr<Group> group = std::make_unique<Group>();
  std::unordered_map<std::vector<int64_t>, Known, TokensHash> known;
  std::vector<const Known*> order;  // for the report, first seen first
  std::map<std::string, int64_t> cuts;
  int64_t recorded = 0;
  // Adaptive: after a run of groups that fusing does not pay for (run op by op, and never compiled:
  // too small, or not seen before), the next ops run op by op, without recording; then it tries again.
  // Counted in ops and groups, so where groups are cut still depends on the order of ops alone.
  int64_t unprofitable = 0;  // such groups in a row
  int64_t backoff = 0;       // times in a row recording was tried again and did not pay: the bypass doubles
  FusedCompile compile = nullptr;
  FusedRun run = nullptr;
  FusedExpect expect = nullptr;
  FusedLearned learned = nullptr;
};


int64_t since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
}

std::atomic<FusedInterpreterLock> interpreter_lock{nullptr};
std::atomic<FusedWhere> where_hook{nullptr};

// The group's lock; a thread that has to wait for it waits without the interpreter's lock.
struct GroupLock {
  std::unique_lock<std::recursive_mutex> lock;
  explicit GroupLock(std::recursive_mutex& m) : lock(m, std::try_to_lock) {
    if (lock.owns_lock()) return;
    auto release = interpreter_lock.load(std::memory_order_acquire);
    std::shared_ptr<void> released = release != nullptr ? release() : nullptr;
    lock.lock();
  }  // the interpreter's lock is taken back (if it was held) with the group's held
};

State& state() {
  static State* s = new State();  // lives until exit (groups may run at exit)
  return *s;
}

std::atomic<bool> pending{false};    // a group is being recorded
// The bypass, read before an op is boxed, so that an op it runs unrecorded costs what it costs in op
// mode (the unboxed kernels keep their own path).
std::atomic<int64_t> bypass_left{0};  // ops left to run without recording
std::atomic<int64_t> bypassed{0};
std::atomic<int> in_flight{0};       // a group is running (on some thread): a cut waits for it
// The host's boundaries: copies to or from the host and synchronizations, where a group is always cut
// (they also come with nothing recorded). While a group waits for its compile to pay, most of its
// occurrences run unrecorded: recording resumes after this many more boundaries, where a group begins.
std::atomic<int64_t> boundaries{0};
std::atomic<int64_t> skip_boundaries{0};

// aten's hand-over (aten/held_work.h): counts the host's boundaries, and runs the pending group.
void handOver(HostNeed need, const char* what) {
  const bool boundary = need == HostNeed::HostCopy || need == HostNeed::Synchronization;
  if (fusedMode() && !running_group && boundary) {  // (only fused mode skips; op mode's launches pay nothing)
    boundaries.fetch_add(1, std::memory_order_relaxed);
    if (skip_boundaries.load(std::memory_order_relaxed) > 0) skip_boundaries.fetch_sub(1, std::memory_order_relaxed);
  }
  if (pending.load(std::memory_order_acquire) || in_flight.load(std::memory_order_acquire) > 0) flushFused(what);
}

c10::DeviceIndex deviceOfArguments(const torch::jit::Stack& stack, size_t nargs) {
  for (size_t i = stack.size() - nargs; i < stack.size(); ++i) {
    const auto& iv = stack[i];
    if (iv.isTensor() && iv.toTensor().defined() && iv.toTensor().device().type() == kNeuron)
      return iv.toTensor().device().index();
  }
  return currentDevice();
}

std::vector<std::string> firstOps(const std::vector<Deferred>& ops) {
  std::vector<std::string> names;
  for (size_t i = 0; i < ops.size() && i < 8; ++i) names.push_back(kernelName(ops[i].kernel.op.schema().name()));
  return names;
}

void runGroup(State& st, Group& g, const char* reason) {
  st.cuts[reason != nullptr ? reason : "cut"]++;
  g.settle();
  auto key = g.signature();
  auto [it, fresh] = st.known.try_emplace(std::move(key));
  Known& known = it->second;
  if (fresh) {
    known.stats.ops = g.size();
    known.stats.first_cut = reason != nullptr ? reason : "cut";
    known.stats.op_names = firstOps(g.ops());
    st.order.push_back(&known);
  }
  known.stats.seen++;
  const int64_t now = boundaries.load(std::memory_order_relaxed);
  if (known.skipping > 0) {  // the occurrences skipped since its last cut, credited with its mean op-by-op time
    const int64_t skipped = std::clamp<int64_t>((now - known.last_boundary) / known.boundaries_between - 1, 0,
                                                known.skipping);
    known.stats.skipped_runs += skipped;
    known.stats.credited_ns += static_cast<int64_t>(double(skipped) * known.meanLaterOpNs());
    known.skipping = 0;
  } else if (known.last_boundary >= 0) {
    known.boundaries_between = std::max<int64_t>(now - known.last_boundary, 1);
  }
  known.last_boundary = now;
  if (fresh) {
    known.floats = g.scalars();
    known.varies.assign(known.floats.size(), false);
  } else {
    for (size_t k = 0; k < known.floats.size(); ++k) {
      if (known.varies[k] || sameBits(known.floats[k], g.scalars()[k])) continue;
      known.varies[k] = true;  // a constant of the graph changed: compile again with it as an input
      known.graph = nullptr;
      known.stats.compiled = false;
    }
  }
  const auto& config = fusedConfig();
  bool compile = !known.graph && !known.failed && known.stats.seen >= config.compile_after &&
                 static_cast<int64_t>(g.size()) >= config.min_ops && st.compile != nullptr;
  bool waiting = false;
  if (compile && config.payoff && !config.timing_free) {  // the pay-off rule
    if (known.stats.expected_compile_seconds < 0) {
      known.stable = g.stableKey();
      FusedExpectation e;
      if (st.expect != nullptr) e = st.expect(known.stable, g.size());
      if (e.compile_seconds < 0)  // no measurement to go by: the learning rule on the policy's figures alone
        e = fusedExpect(config, FusedMachineHistory{}, nullptr, g.size());
      known.stats.expected_compile_seconds = e.compile_seconds;
      known.stats.expected_gain = e.gain;
    }
    const int64_t ran = known.laterOpNs() + known.stats.credited_ns;
    compile = static_cast<double>(ran) * 1e-9 * known.stats.expected_gain >= known.stats.expected_compile_seconds;
    waiting = !compile && known.stats.expected_gain > 0;
  }
  if (compile) {
    if (!g.compilable()) {
      known.failed = true;
      known.stats.error = "an argument the graph compiler does not take (a storage read as two dtypes, a complex "
                          "scalar, a conjugate view, ...)";
    } else {
      const auto start = std::chrono::steady_clock::now();
      std::string error;
      FusedDescription description = g.describe();
      description.inputs = g.inputs(known.varies);
      description.floats = g.scalars();
      description.lifted = known.varies;
      known.graph = st.compile(description, &error);
      known.stats.compile_ns += since(start);
      known.stats.compiled = known.graph != nullptr;
      if (!known.graph) {
        known.failed = true;
        known.stats.error = error;
      }
    }
  }
  c10::StreamGuard guard(c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, g.device()), g.stream()));
  // A group may run inside the launch of the op that cut it, whose CPU kernel's buffers come from the
  // device's cache: the group's own kernels' buffers must not, since a block its dead intermediates
  // gave back is still theirs until the group has run.
  DeviceOutputScope host_buffers(-1);
  if (known.graph) {
    st.unprofitable = 0;
    st.backoff = 0;
    auto inputs = g.inputs(known.varies);
    const auto start = std::chrono::steady_clock::now();
    st.run(known.graph.get(), inputs);
    if (known.stats.fused_runs++ > 0) known.stats.fused_ns += since(start);
    if (known.stats.fused_runs == fusedConfig().timed_runs + 1 && !known.told && st.learned != nullptr) {
      known.told = true;
      if (known.stable == 0) known.stable = g.stableKey();
      st.learned(known.stable, g.size(), double(known.stats.compile_ns) * 1e-9, known.meanLaterOpNs() * 1e-9,
                 double(known.stats.fused_ns) * 1e-9 / double(fusedConfig().timed_runs));
    }
    return;
  }
  const bool never_pays = known.stats.expected_compile_seconds >= 0 && known.stats.expected_gain <= 0;
  if (static_cast<int64_t>(g.size()) < config.min_ops || known.stats.seen < 2 || known.failed || never_pays) {
    if (++st.unprofitable >= config.patience) {
      st.unprofitable = 0;
      bypass_left.store(config.bypass_ops << std::min<int64_t>(st.backoff++, 10), std::memory_order_relaxed);
    }
  }
  const auto start = std::chrono::steady_clock::now();  // the op-by-op run's time, for the pay-off rule
  for (auto& op : g.ops()) {
    const char* name = kernelName(op.kernel.op.schema().name());
    try {
      c10::InferenceMode mode(op.inference);  // as when it was recorded
      const auto memory = op.kernel.memory;
      enqueue(op.device, withRanges({rt::ActivityKind::Kernel, name}, memory), std::move(op.kernel));
    } catch (c10::Error& e) {
      e.add_context(std::string("fused eager: the error comes from ") + name + ", recorded earlier" +
                    (g.where().empty() ? std::string() : " in the group that began at " + g.where()) +
                    ", and run when its group was cut by " + (reason ? reason : "a cut") +
                    "; TORCHNEURON_EAGER=op raises it at the op");
      throw;
    }
  }
  const auto took = since(start);
  if (known.stats.op_runs++ == 0) known.first_op_ns = took;
  known.stats.op_ns += took;
  if (waiting && config.skip_ahead > 0 && known.stats.op_runs >= 2) {
    // Far from paying: its next occurrences (a quarter of those still needed, at most skip_ahead) run
    // unrecorded, through op mode's path, and are credited with its mean op-by-op time when it is next
    // seen. Recording resumes at a boundary, so the groups recorded after it begin where they would have.
    const double still = known.stats.expected_compile_seconds * 1e9 / known.stats.expected_gain -
                         double(known.laterOpNs() + known.stats.credited_ns);
    const auto skip = std::min<int64_t>(static_cast<int64_t>(still / known.meanLaterOpNs() / 4), config.skip_ahead);
    if (skip >= 2) {
      known.skipping = skip;  // its mean stays as it is until it is seen again: the credit's rate
      skip_boundaries.store(skip * known.boundaries_between, std::memory_order_relaxed);
    }
  }
}

bool recordsNext() {
  if (running_group || rt::insideKernel()) return false;  // see tnrtInsideKernel (neuron_runtime.h)
  if (skip_boundaries.load(std::memory_order_relaxed) > 0 && !pending.load(std::memory_order_acquire)) {
    bypassed.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  if (bypass_left.load(std::memory_order_relaxed) <= 0 || pending.load(std::memory_order_acquire)) return true;
  if (bypass_left.fetch_sub(1, std::memory_order_relaxed) <= 0) {  // another thread took the last one
    bypass_left.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  bypassed.fetch_add(1, std::memory_order_relaxed);
  return false;
}
bool holding() { return pending.load(std::memory_order_acquire); }
bool recordingHere() { return recording_op; }

}  // namespace

void setFusedHooks(FusedCompile compile, FusedRun run, FusedInterpreterLock interpreter, FusedWhere where) {
  auto& st = state();
  std::lock_guard<std::recursive_mutex> lock(st.mutex);
  st.compile = compile;
  st.run = run;
  interpreter_lock.store(interpreter, std::memory_order_release);
  where_hook.store(where, std::memory_order_release);
}

void setFusedPolicy(FusedExpect expect, FusedLearned learned) {
  auto& st = state();
  std::lock_guard<std::recursive_mutex> lock(st.mutex);
  st.expect = expect;
  st.learned = learned;
}

void setFusedMode(bool on) {
  if (!on) flushFused("eager mode op");
  setRecordingOps(on);
}

namespace {

bool record(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (running_group || at::globalContext().deterministicAlgorithms()) return false;
  // Where a group begins, found before its lock is taken (it runs Python, which may collect garbage
  // whose finalizers run ops): a few microseconds, once a group.
  std::string where;
  if (!pending.load(std::memory_order_acquire)) {
    const auto hook = where_hook.load(std::memory_order_acquire);
    if (hook != nullptr) where = hook();
  }
  auto& st = state();
  GroupLock lock(st.mutex);
  const auto device = deviceOfArguments(*stack, op.schema().arguments().size());
  const auto stream = currentStream(device).id();
  if (!st.group->empty() && (st.group->device() != device || st.group->stream() != stream))
    flushFused("another device or stream");
  Group& g = *st.group;
  Deferred d{DeferredKernel{op, {}, {}}, -1, false, {}, {}};
  bool deferred = false;
  try {
    recording_op = true;
    deferred = deferOp(op, stack, g, &d, true);
    recording_op = false;
  } catch (const c10::OutOfMemoryError&) {
    // The group may hold cached blocks the allocator could not free while recording: run it, then
    // the op on its own, which retries with the cache freed.
    recording_op = false;
    flushFused("out of memory");
    return false;
  } catch (...) {
    recording_op = false;
    throw;
  }
  if (!deferred) {
    if (g.empty()) st.group = std::make_unique<Group>();  // lets go of the storages it looked at
    return false;
  }
  if (g.empty()) g.start(d.device, stream, std::move(where));
  g.append(std::move(d));
  st.recorded++;
  pending.store(true, std::memory_order_release);
  if (static_cast<int64_t>(g.size()) >= fusedConfig().max_ops) flushFused("size bound");
  return true;
}

}  // namespace

void flushFused(const char* reason) {
  if (running_group) return;
  if (!pending.load(std::memory_order_acquire) && in_flight.load(std::memory_order_acquire) == 0) return;
  auto& st = state();
  GroupLock lock(st.mutex);  // also waits for a group another thread is running
  if (st.group->empty()) return;
  std::unique_ptr<Group> group = std::exchange(st.group, std::make_unique<Group>());
  struct Running {
    Running() {
      running_group = true;
      in_flight.fetch_add(1, std::memory_order_acq_rel);
      pending.store(false, std::memory_order_release);
    }
    ~Running() {
      running_group = false;
      in_flight.fetch_sub(1, std::memory_order_acq_rel);
    }
  } running;
  runGroup(st, *group, reason);
}

FusedStats fusedStats() {
  auto& st = state();
  std::lock_guard<std::recursive_mutex> lock(st.mutex);
  FusedStats s;
  for (const Known* k : st.order) s.groups.push_back(k->stats);
  s.cuts = st.cuts;
  s.recorded_ops = st.recorded;
  s.bypassed_ops = bypassed.load(std::memory_order_relaxed);
  return s;
}

void resetFusedStats() {
  flushFused("reset");
  auto& st = state();
  std::lock_guard<std::recursive_mutex> lock(st.mutex);
  st.known.clear();
  st.order.clear();
  st.cuts.clear();
  st.recorded = 0;
  bypassed.store(0, std::memory_order_relaxed);
  bypass_left.store(0, std::memory_order_relaxed);
  skip_boundaries.store(0, std::memory_order_relaxed);
  st.unprofitable = 0;
  st.backoff = 0;
}

void installFusedEager() {
  registerHeldWork(HeldWork{&recordsNext, &record, &handOver, &flushFused, &holding, &recordingHere});
}

}  // namespace torchneuron
