// Work handles of collectives on neuron tensors, and the errors they raise.
#include "work.h"

#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <array>
#include <string_view>
#include <thread>

namespace torchneuron::distributed {
namespace {

// Gloo's messages when the peer's end of a connection went away ...
constexpr std::array<std::string_view, 6> kPeerGone = {
    "closed by peer", "Connection reset", "Broken pipe", "Connection refused", "EOF", "read error"};
// ... and when a collective did not finish in time.
constexpr std::array<std::string_view, 4> kTimedOut = {"Timed out", "timed out", "Timeout", "timeout"};
constexpr std::string_view kPrefix = "neuron backend:";

template <size_t N>
bool mentions(const std::string& text, const std::array<std::string_view, N>& needles) {
  for (auto needle : needles) {
    if (text.find(needle) != std::string::npos) return true;
  }
  return false;
}

std::string firstLine(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  auto end = text.find_first_of("\r\n", begin);
  if (end == std::string::npos) end = text.size();
  while (end > begin && (text[end - 1] == ' ' || text[end - 1] == '\t')) --end;
  return text.substr(begin, end - begin);
}

std::string messageOf(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "";
  }
}

std::exception_ptr distBackendError(std::string message) {
  return std::make_exception_ptr(c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                                       std::move(message)));
}

c10::TypePtr tensorListType() {
  static const c10::TypePtr type = c10::ListType::ofTensors();
  return type;
}

}  // namespace

std::string describeFailure(const Collective& what, const std::string& error) {
  auto message = firstLine(error);
  if (message.empty()) message = "unknown error";
  auto out = c10::str("neuron backend: ", what.name, " failed on rank ", what.rank, " of ", what.size, ": ",
                      message);
  if (mentions(message, kPeerGone)) {
    out += " [another rank closed its connection, most likely because its process exited or crashed; "
           "its own log has the first error]";
  } else if (mentions(message, kTimedOut)) {
    out += " [not every rank reached this collective within the process group's timeout "
           "(init_process_group(timeout=...)): a rank may have died or hung, or the ranks are running "
           "different collectives]";
  }
  return out;
}

std::exception_ptr collectiveError(const Collective& what, const std::exception_ptr& error) {
  auto message = messageOf(error);
  if (message.compare(0, kPrefix.size(), kPrefix) == 0) {
    try {
      std::rethrow_exception(error);
    } catch (const c10::DistBackendError&) {
      return error;  // described already
    } catch (...) {
    }
  }
  return distBackendError(describeFailure(what, message));
}

// ---- NeuronWork ------------------------------------------------------------

std::atomic<int64_t> NeuronWork::live_{0};

NeuronWork::NeuronWork(c10::intrusive_ptr<c10d::Work> backend_work, std::vector<at::Tensor> outputs,
                       Collective what, c10d::OpType type)
    : c10d::Work(-1, type), work_(std::move(backend_work)), outputs_(std::move(outputs)), what_(what) {
  live_.fetch_add(1, std::memory_order_relaxed);
}

NeuronWork::~NeuronWork() {
  live_.fetch_sub(1, std::memory_order_relaxed);
}

int64_t NeuronWork::liveCount() {
  return live_.load(std::memory_order_relaxed);
}

bool NeuronWork::wait(std::chrono::milliseconds timeout) {
  try {
    work_->wait(timeout);
  } catch (...) {
    const auto caught = std::current_exception();
    if (!work_->isCompleted()) {  // the wait gave up; the collective goes on
      std::rethrow_exception(distBackendError(c10::str("neuron backend: ", what_.name, " on rank ", what_.rank,
                                                       " of ", what_.size, " did not finish within ",
                                                       timeout.count(), " ms")));
    }
    if (auto error = exception()) std::rethrow_exception(error);
    if (timeout == kNoTimeout) std::rethrow_exception(collectiveError(what_, caught));
    // It ended between the deadline and now.
  }
  return true;
}

bool NeuronWork::isCompleted() {
  return work_->isCompleted();
}

bool NeuronWork::isSuccess() const {
  return work_->isCompleted() && !work_->exception();
}

std::exception_ptr NeuronWork::exception() const {
  auto error = work_->exception();
  if (!error) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_) error_ = collectiveError(what_, error);
  return error_;
}

std::vector<at::Tensor> NeuronWork::result() {
  return outputs_;
}

c10::intrusive_ptr<c10::ivalue::Future> NeuronWork::getFuture() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (future_) return future_;
  auto future = c10::make_intrusive<c10::ivalue::Future>(tensorListType());
  c10::intrusive_ptr<c10::ivalue::Future> backend_future;
  try {
    backend_future = work_->getFuture();
  } catch (const c10::Error&) {  // gloo's send and recv have none
  }
  // The completion holds the future and the outputs, not this handle.
  if (backend_future) {
    backend_future->addCallback([future, outputs = outputs_, what = what_](c10::ivalue::Future& done) {
      if (done.hasError()) {
        future->setError(collectiveError(what, done.exception_ptr()));
      } else {
        future->markCompleted(c10::IValue(outputs));
      }
    });
  } else {
    std::thread([future, work = work_, outputs = outputs_, what = what_] {
      try {
        work->wait();
        future->markCompleted(c10::IValue(outputs));
      } catch (...) {
        future->setError(collectiveError(what, std::current_exception()));
      }
    }).detach();
  }
  future_ = std::move(future);
  return future_;
}

int NeuronWork::sourceRank() const {
  const auto type = retrieveOpType();
  TORCH_CHECK_VALUE(type == c10d::OpType::RECV || type == c10d::OpType::RECVANYSOURCE,
                    "source_rank() is only defined for a recv, not for ", what_.name);
  return work_->sourceRank();
}

void NeuronWork::abort() {
  work_->abort();
}

uint64_t NeuronWork::getSequencenumber() const {
  return work_->getSequencenumber();
}

}  // namespace torchneuron::distributed
