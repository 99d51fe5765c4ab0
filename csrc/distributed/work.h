// Work handles of collectives on neuron tensors: the backend's work, seen
// from the device.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <string>
#include <vector>

namespace torchneuron::distributed {

// A collective, named as torch.distributed names it, and where it ran.
struct Collective {
  const char* name;  // "all_reduce", "all_gather_into_tensor", ...
  int rank;
  int size;
};

// The message of a failed collective: which one, on which rank, why (the
// first line of `error`) and, for a peer that went away or a timeout, what to
// look at.
std::string describeFailure(const Collective& what, const std::string& error);

// The error to raise for a collective that failed with `error`: a
// c10::DistBackendError with describeFailure's message (`error` itself when it
// already is one).
std::exception_ptr collectiveError(const Collective& what, const std::exception_ptr& error);

// The handle of a collective that gloo runs on CPU views of neuron tensors.
// Gloo's own handle would give the CPU views as the result and raise gloo's
// bare errors; this one gives the neuron tensors (result(), and the value of
// getFuture(), which DDP's reducer and communication hooks read) and raises
// errors that say which collective failed where.
//
// It holds gloo's work and the output tensors, nothing else: once the
// collective has ended and the handle is dropped, the tensors are free to go,
// whether or not anyone waited.
class NeuronWork : public c10d::Work {
 public:
  NeuronWork(c10::intrusive_ptr<c10d::Work> backend_work, std::vector<at::Tensor> outputs, Collective what,
             c10d::OpType type);
  ~NeuronWork() override;

  // Blocks until the collective ended and raises its error. With a timeout,
  // raises once it has passed (the collective itself goes on).
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  // Completes with the neuron output tensors, or the collective's error.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // The sender of a recv (from any source).
  int sourceRank() const override;
  void synchronize() override {}
  void abort() override;
  uint64_t getSequencenumber() const override;

  // Number of handles alive in this process (for tests).
  static int64_t liveCount();

 private:
  static std::atomic<int64_t> live_;

  const c10::intrusive_ptr<c10d::Work> work_;
  const std::vector<at::Tensor> outputs_;
  const Collective what_;
  mutable std::exception_ptr error_;  // gloo's error, described; made on first use
  c10::intrusive_ptr<c10::ivalue::Future> future_;  // made by the first getFuture()
};

}  // namespace torchneuron::distributed
