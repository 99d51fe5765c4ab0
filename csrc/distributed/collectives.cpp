// The c10d operators' kernels for neuron tensors.
//
// Every road into a communication backend goes through the c10d operators
// (c10d::allreduce_, c10d::_allgather_base_, ...): torch.distributed's
// functions, ProcessGroup methods called from C++ (DDP's reducer), functional
// collectives (DTensor) and FSDP2. The dispatcher picks their kernel by the
// tensors' device; for neuron tensors these replace PyTorch's own PrivateUse1
// kernels, which hand the tensors to the backend as they are.
//
// When the backend the process group holds for the neuron device is gloo (or
// the checking wrapper TORCH_DISTRIBUTED_DEBUG=DETAIL puts around it), gloo
// gets a CPU view of each neuron tensor: a CPU tensor over the same device
// memory, which gloo reads and writes in place. Nothing is copied. Any other
// backend gets the neuron tensors unchanged, as from PyTorch's kernels.
//
// The signatures are those of PyTorch's kernels (torch/csrc/distributed/c10d/
// Ops.cpp): the dispatcher insists on the same C++ types.
#include "collectives.h"

#include "../aten/launch.h"
#include "../aten/host_addressable.h"
#include "work.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <tuple>

namespace torchneuron::distributed {
namespace {

using c10d::OpType;
using GroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;
using ReduceOpPtr = c10::intrusive_ptr<c10d::ReduceOp>;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using TensorLists = std::vector<std::vector<at::Tensor>>;

// One collective call: the group's neuron backend, and how tensors and the
// work handle cross to and from it.
class Call {
 public:
  Call(const GroupPtr& group, const char* name, OpType type)
      : group_(*group), backend_(group->getBackend(kNeuron)), name_(name), type_(type) {
    // Gloo's checking wrapper reports the name of the backend it wraps.
    gloo_ = backend_->getBackendName() == "gloo";
    if (rt::activityRecording()) activity_ = rt::activityBegin(-1, 0, {rt::ActivityKind::Collective, name_, 0});
  }

  c10d::Backend* operator->() const {
    return backend_.get();
  }

  // A tensor as the backend takes it: for gloo, a CPU view of a neuron tensor
  // once the device's queued work has written it.
  at::Tensor host(const at::Tensor& t) {
    if (!gloo_ || !t.defined() || t.device().type() != kNeuron) return t;
    const auto index = t.device().index();
    if (index != synced_) {
      runtime::synchronizeDevice(index);
      synced_ = index;
    }
    return hostViewHolding(t, /*open=*/true);
  }

  std::vector<at::Tensor> host(at::TensorList tensors) {
    std::vector<at::Tensor> out;
    out.reserve(tensors.size());
    for (const auto& t : tensors) out.push_back(host(t));
    return out;
  }

  TensorLists host(const TensorLists& lists) {
    TensorLists out;
    out.reserve(lists.size());
    for (const auto& ts : lists) out.push_back(host(at::TensorList(ts)));
    return out;
  }

  // The reduction to hand the backend. Gloo has no PREMUL_SUM(f): it becomes SUM, and premul()
  // multiplies the inputs by f (FSDP2 reduces gradients with it).
  c10d::ReduceOp reduceOp(const ReduceOpPtr& op) {
    if (!gloo_ || op->op_ != c10d::ReduceOp::PREMUL_SUM) return *op;
    TORCH_CHECK_VALUE(type_ != OpType::REDUCE, "ReduceOp.PREMUL_SUM is not supported by the neuron backend's ",
                      name_, ": multiply the tensor by the factor and use ReduceOp.SUM");
    const auto* factor = dynamic_cast<const c10d::PreMulSumSupplement*>(op->supplement_.get());
    TORCH_CHECK_VALUE(factor != nullptr, name_, ": ReduceOp.PREMUL_SUM without its factor");
    factor_ = factor->tensor_factor.defined() ? factor->tensor_factor.item<double>() : factor->double_factor;
    return c10d::ReduceOp(c10d::ReduceOp::SUM);
  }

  // Host inputs multiplied by PREMUL_SUM's factor (none else): in place for a collective that
  // overwrites its inputs with the result, else as copies the backend keeps until it is done.
  std::vector<at::Tensor> premul(std::vector<at::Tensor> inputs, bool in_place) const {
    if (!factor_) return inputs;
    for (auto& t : inputs) t = in_place ? t.mul_(*factor_) : t.mul(*factor_);
    return inputs;
  }
  at::Tensor premul(const at::Tensor& input, bool in_place) const { return premul(std::vector{input}, in_place)[0]; }
  TensorLists premul(TensorLists lists) const {
    for (auto& inputs : lists) inputs = premul(std::move(inputs), /*in_place=*/false);
    return lists;
  }

  // The handle to return for the backend's `work`, whose results are the
  // neuron `outputs`.
  //
  // It is returned in flight even with async_op=False, as PyTorch's CPU
  // kernels return gloo's: the caller waits on it right away, and its wait()
  // raises the described error. Waiting here instead would keep the caller
  // from doing its own part of the call (returning through the dispatcher and
  // pybind, making the Python handle) while gloo runs, which costs a few
  // percent of a small all_reduce's time.
  WorkPtr done(WorkPtr work, std::vector<at::Tensor> outputs) {
    if (!gloo_) return work;  // another backend took the neuron tensors as they are
    if (activity_ && !outputs.empty()) record(*work, outputs);
    if (rt::asyncMode() && !outputs.empty() && !pointToPoint()) onStream(work, outputs.front());
    return c10::make_intrusive<NeuronWork>(std::move(work), std::move(outputs),
                                           Collective{name_, group_.getRank(), group_.getSize()}, type_);
  }

 private:
  // A send or receive ends when its peer gets to the matching call, which may come after this rank's
  // next collective: a stream waiting for it would hold up the wait for the device before that one.
  // Its result is the caller's once wait() returns, as with gloo on the CPU.
  bool pointToPoint() const {
    return type_ == OpType::SEND || type_ == OpType::RECV || type_ == OpType::RECVANYSOURCE;
  }

  // Asynchronous mode: the collective as work of the outputs' current stream, which waits for it to
  // end, as a collective launched on a stream does: work queued after it, and events recorded after
  // it, follow it. Its errors are the caller's, from wait().
  static void onStream(const WorkPtr& work, const at::Tensor& output) {
    if (!output.defined() || output.device().type() != kNeuron) return;
    enqueue(output.device().index(), {rt::ActivityKind::Kernel, "wait_collective"}, [work] {
      try {
        work->wait();
      } catch (const std::exception&) {
      }
    });
  }

  // The collective as work of the outputs' device and current stream, from its call to its end.
  void record(c10d::Work& work, const std::vector<at::Tensor>& outputs) {
    auto& activity = *activity_;
    activity.device = outputs.front().device().index();
    activity.stream = currentStream(activity.device).id();
    for (const auto& t : outputs) activity.bytes += t.defined() ? t.nbytes() : 0;
    c10::intrusive_ptr<c10::ivalue::Future> future;
    try {
      future = work.getFuture();
    } catch (const std::exception&) {  // a backend without futures: the call's end stands for it
      rt::activityEnd(std::move(activity));
      return;
    }
    future->addCallback([activity](c10::ivalue::Future&) mutable { rt::activityEnd(std::move(activity)); });
  }

  c10d::ProcessGroup& group_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  const char* name_;
  OpType type_;
  bool gloo_ = false;
  c10::DeviceIndex synced_ = -1;
  std::optional<double> factor_;
  std::optional<rt::ActivityRecord> activity_;  // while activity is recorded
};

// A collective's options with the caller's async_op and, where the operator takes one, timeout.
template <class Options>
Options options(bool async_op) {
  Options opts;
  opts.asyncOp = async_op;
  return opts;
}

template <class Options>
Options options(bool async_op, int64_t timeout) {
  auto opts = options<Options>(async_op);
  opts.timeout = std::chrono::milliseconds(timeout);
  return opts;
}

std::vector<at::Tensor> flat(const TensorLists& lists) {
  std::vector<at::Tensor> out;
  for (const auto& ts : lists) out.insert(out.end(), ts.begin(), ts.end());
  return out;
}

// ---- the kernels -------------------------------------------------------------

std::tuple<std::vector<at::Tensor>, WorkPtr> broadcast(at::TensorList tensors, const GroupPtr& group,
                                                      int64_t root_rank, int64_t root_tensor, bool async_op,
                                                      int64_t timeout) {
  Call c(group, "broadcast", OpType::BROADCAST);
  auto opts = options<c10d::BroadcastOptions>(async_op, timeout);
  opts.rootRank = root_rank;
  opts.rootTensor = root_tensor;
  auto host = c.host(tensors);
  auto outputs = tensors.vec();
  auto work = c.done(c->broadcast(host, opts), outputs);
  return {std::move(outputs), std::move(work)};
}

std::tuple<std::vector<at::Tensor>, WorkPtr> allreduce(at::TensorList tensors, const GroupPtr& group,
                                                      const ReduceOpPtr& reduce_op,
                                                      const std::optional<at::Tensor>& sparse_indices,
                                                      bool async_op, int64_t timeout) {
  Call c(group, "all_reduce", OpType::ALLREDUCE);
  auto opts = options<c10d::AllreduceOptions>(async_op, timeout);
  opts.reduceOp = c.reduceOp(reduce_op);
  auto host = c.premul(c.host(tensors), /*in_place=*/true);
  auto outputs = tensors.vec();
  auto work = c.done(c->allreduce(host, opts), outputs);
  return {std::move(outputs), std::move(work)};
}

WorkPtr allreduceCoalesced(at::TensorList tensors, const GroupPtr& group, const ReduceOpPtr& reduce_op,
                           bool async_op, int64_t timeout) {
  Call c(group, "all_reduce_coalesced", OpType::ALLREDUCE_COALESCED);
  auto opts = options<c10d::AllreduceCoalescedOptions>(async_op, timeout);
  opts.reduceOp = c.reduceOp(reduce_op);
  auto host = c.premul(c.host(tensors), /*in_place=*/true);
  return c.done(c->allreduce_coalesced(host, opts), tensors.vec());
}

std::tuple<TensorLists, WorkPtr> allgather(const TensorLists& output_tensors, at::TensorList input_tensors,
                                           const GroupPtr& group, bool async_op, int64_t timeout) {
  Call c(group, "all_gather", OpType::ALLGATHER);
  auto opts = options<c10d::AllgatherOptions>(async_op, timeout);
  auto outputs = c.host(output_tensors);
  auto inputs = c.host(input_tensors);
  auto work = c.done(c->allgather(outputs, inputs, opts), flat(output_tensors));
  return {output_tensors, std::move(work)};
}

std::tuple<at::Tensor, WorkPtr> allgatherBase(at::Tensor& output_tensor, at::Tensor& input_tensor,
                                              const GroupPtr& group, bool async_op, int64_t timeout) {
  Call c(group, "all_gather_into_tensor", OpType::_ALLGATHER_BASE);
  auto opts = options<c10d::AllgatherOptions>(async_op, timeout);
  auto output = c.host(output_tensor);
  auto input = c.host(input_tensor);
  auto work = c.done(c->_allgather_base(output, input, opts), {output_tensor});
  return {output_tensor, std::move(work)};
}

WorkPtr allgatherCoalesced(const TensorLists& output_lists, const at::TensorList& input_list,
                           const GroupPtr& group, bool async_op) {
  Call c(group, "all_gather_coalesced", OpType::ALLGATHER_COALESCED);
  auto opts = options<c10d::AllgatherOptions>(async_op);
  auto outputs = c.host(output_lists);
  auto inputs = c.host(input_list);
  return c.done(c->allgather_coalesced(outputs, inputs, opts), flat(output_lists));
}

WorkPtr allgatherIntoTensorCoalesced(at::TensorList outputs, at::TensorList inputs, const GroupPtr& group,
                                     bool async_op) {
  Call c(group, "all_gather_into_tensor_coalesced", OpType::COALESCED);
  auto opts = options<c10d::AllgatherOptions>(async_op);
  auto host_outputs = c.host(outputs);
  auto host_inputs = c.host(inputs);
  return c.done(c->allgather_into_tensor_coalesced(host_outputs, host_inputs, opts), outputs.vec());
}

std::tuple<std::vector<at::Tensor>, WorkPtr> reduceScatter(const at::TensorList& output_tensors,
                                                          const TensorLists& input_tensors, const GroupPtr& group,
                                                          const ReduceOpPtr& reduce_op, bool async_op,
                                                          int64_t timeout) {
  Call c(group, "reduce_scatter", OpType::REDUCE_SCATTER);
  auto opts = options<c10d::ReduceScatterOptions>(async_op, timeout);
  opts.reduceOp = c.reduceOp(reduce_op);
  auto outputs = c.host(output_tensors);
  auto inputs = c.premul(c.host(input_tensors));
  auto result = output_tensors.vec();
  auto work = c.done(c->reduce_scatter(outputs, inputs, opts), result);
  return {std::move(result), std::move(work)};
}

std::tuple<at::Tensor, WorkPtr> reduceScatterBase(at::Tensor& output_tensor, at::Tensor& input_tensor,
                                                  const GroupPtr& group, const ReduceOpPtr& reduce_op,
                                                  bool async_op, int64_t timeout) {
  Call c(group, "reduce_scatter_tensor", OpType::_REDUCE_SCATTER_BASE);
  auto opts = options<c10d::ReduceScatterOptions>(async_op, timeout);
  opts.reduceOp = c.reduceOp(reduce_op);
  auto output = c.host(output_tensor);
  auto input = c.premul(c.host(input_tensor), /*in_place=*/false);
  auto work = c.done(c->_reduce_scatter_base(output, input, opts), {output_tensor});
  return {output_tensor, std::move(work)};
}

WorkPtr reduceScatterTensorCoalesced(at::TensorList outputs, at::TensorList inputs, const GroupPtr& group,
                                     const ReduceOpPtr& reduce_op, bool async_op, int64_t timeout) {
  Call c(group, "reduce_scatter_tensor_coalesced", OpType::REDUCE_SCATTER_TENSOR_COALESCED);
  auto opts = options<c10d::ReduceScatterOptions>(async_op, timeout);
  opts.reduceOp = c.reduceOp(reduce_op);
  auto host_outputs = c.host(outputs);
  auto host_inputs = c.premul(c.host(inputs), /*in_place=*/false);
  return c.done(c->reduce_scatter_tensor_coalesced(host_outputs, host_inputs, opts), outputs.vec());
}

WorkPtr reduce(at::TensorList tensors, const GroupPtr& group, const ReduceOpPtr& reduce_op, int64_t root_rank,
               int64_t root_tensor, bool async_op, int64_t timeout) {
  Call c(group, "reduce", OpType::REDUCE);
  auto opts = options<c10d::ReduceOptions>(async_op, timeout);
  opts.reduceOp = c.reduceOp(reduce_op);
  opts.rootRank = root_rank;
  opts.rootTensor = root_tensor;
  auto host = c.host(tensors);
  return c.done(c->reduce(host, opts), tensors.vec());
}

WorkPtr gather(const TensorLists& output_tensors, const at::TensorList& input_tensors, const GroupPtr& group,
               int64_t root_rank, bool async_op, int64_t timeout) {
  Call c(group, "gather", OpType::GATHER);
  auto opts = options<c10d::GatherOptions>(async_op, timeout);
  opts.rootRank = root_rank;
  auto outputs = c.host(output_tensors);
  auto inputs = c.host(input_tensors);
  return c.done(c->gather(outputs, inputs, opts), flat(output_tensors));
}

std::tuple<std::vector<at::Tensor>, WorkPtr> scatter(const at::TensorList& output_tensors,
                                                    const TensorLists& input_tensors, const GroupPtr& group,
                                                    int64_t root_rank, bool async_op, int64_t timeout) {
  Call c(group, "scatter", OpType::SCATTER);
  auto opts = options<c10d::ScatterOptions>(async_op, timeout);
  opts.rootRank = root_rank;
  auto outputs = c.host(output_tensors);
  auto inputs = c.host(input_tensors);
  auto result = output_tensors.vec();
  auto work = c.done(c->scatter(outputs, inputs, opts), result);
  return {std::move(result), std::move(work)};
}

std::tuple<std::vector<at::Tensor>, WorkPtr> alltoall(const at::TensorList& output_tensors,
                                                     const at::TensorList& input_tensors, const GroupPtr& group,
                                                     bool async_op, int64_t timeout) {
  Call c(group, "all_to_all", OpType::ALLTOALL);
  auto opts = options<c10d::AllToAllOptions>(async_op, timeout);
  auto outputs = c.host(output_tensors);
  auto inputs = c.host(input_tensors);
  auto result = output_tensors.vec();
  auto work = c.done(c->alltoall(outputs, inputs, opts), result);
  return {std::move(result), std::move(work)};
}

WorkPtr alltoallBase(at::Tensor& output, at::Tensor& input, const GroupPtr& group,
                     std::vector<int64_t> output_split_sizes, std::vector<int64_t> input_split_sizes,
                     bool async_op, int64_t timeout) {
  Call c(group, "all_to_all_single", OpType::ALLTOALL_BASE);
  auto opts = options<c10d::AllToAllOptions>(async_op, timeout);
  auto host_output = c.host(output);
  auto host_input = c.host(input);
  auto work = c->alltoall_base(host_output, host_input, output_split_sizes, input_split_sizes, opts);
  return c.done(std::move(work), {output});
}

WorkPtr barrier(at::Tensor /* selects the device */, const GroupPtr& group, const std::vector<int64_t>& device_ids,
                bool async_op, int64_t timeout) {
  Call c(group, "barrier", OpType::BARRIER);
  auto opts = options<c10d::BarrierOptions>(async_op, timeout);
  opts.device_ids = device_ids;
  return c.done(c->barrier(opts), {});
}

WorkPtr send(at::TensorList tensors, const GroupPtr& group, int64_t dst_rank, int64_t tag) {
  Call c(group, "send", OpType::SEND);
  auto host = c.host(tensors);
  return c.done(c->send(host, static_cast<int>(dst_rank), static_cast<int>(tag)), tensors.vec());
}

WorkPtr recv(at::TensorList tensors, const GroupPtr& group, int64_t src_rank, int64_t tag) {
  Call c(group, "recv", OpType::RECV);
  auto host = c.host(tensors);
  return c.done(c->recv(host, static_cast<int>(src_rank), static_cast<int>(tag)), tensors.vec());
}

WorkPtr recvAnySource(at::TensorList tensors, const GroupPtr& group, int64_t tag) {
  Call c(group, "recv", OpType::RECVANYSOURCE);
  auto host = c.host(tensors);
  return c.done(c->recvAnysource(host, static_cast<int>(tag)), tensors.vec());
}

// PyTorch registers a PrivateUse1 kernel for each of these operators, so the
// dispatcher warns that ours replace them; replacing them is the point.
class QuietOverrides : public c10::WarningHandler {
 public:
  explicit QuietOverrides(c10::WarningHandler* next) : next_(next) {}
  void process(const c10::Warning& warning) override {
    if (warning.msg().find("Overriding a previously registered kernel") != std::string::npos) return;
    next_->process(warning);
  }

 private:
  c10::WarningHandler* next_;
};

}  // namespace

void registerCollectives() {
  static std::once_flag once;
  std::call_once(once, [] {
    QuietOverrides quiet(c10::WarningUtils::get_warning_handler());
    c10::WarningUtils::WarningHandlerGuard guard(&quiet);
    // Never destroyed: the kernels stay registered until the process ends.
    auto* m = new torch::Library(torch::Library::IMPL, "c10d", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    m->impl("broadcast_", TORCH_FN(broadcast));
    m->impl("allreduce_", TORCH_FN(allreduce));
    m->impl("allreduce_coalesced_", TORCH_FN(allreduceCoalesced));
    m->impl("allgather_", TORCH_FN(allgather));
    m->impl("_allgather_base_", TORCH_FN(allgatherBase));
    m->impl("allgather_coalesced_", TORCH_FN(allgatherCoalesced));
    m->impl("allgather_into_tensor_coalesced_", TORCH_FN(allgatherIntoTensorCoalesced));
    m->impl("reduce_scatter_", TORCH_FN(reduceScatter));
    m->impl("_reduce_scatter_base_", TORCH_FN(reduceScatterBase));
    m->impl("reduce_scatter_tensor_coalesced_", TORCH_FN(reduceScatterTensorCoalesced));
    m->impl("reduce_", TORCH_FN(reduce));
    m->impl("gather_", TORCH_FN(gather));
    m->impl("scatter_", TORCH_FN(scatter));
    m->impl("alltoall_", TORCH_FN(alltoall));
    m->impl("alltoall_base_", TORCH_FN(alltoallBase));
    m->impl("barrier", TORCH_FN(barrier));
    m->impl("send", TORCH_FN(send));
    m->impl("recv_", TORCH_FN(recv));
    m->impl("recv_any_source_", TORCH_FN(recvAnySource));
  });
}

int64_t liveWorkCount() {
  return NeuronWork::liveCount();
}

}  // namespace torchneuron::distributed
