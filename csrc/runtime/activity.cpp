// Emulated NeuronCore: activity records of the work the device runs.
//
// Work runs on the launching thread, so the device's clock is the host's
// (nanoseconds since the Unix epoch, the clock profilers put host events on).
#include "runtime.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <utility>

namespace torchneuron::emu {

std::atomic<bool> activity_recording{false};

namespace {

std::mutex records_mutex;
std::vector<ActivityRecord> records;  // guarded by records_mutex
std::atomic<uint64_t> launches{0};
thread_local std::vector<uint64_t> external_correlation;
thread_local ActivityRecord* running = nullptr;  // the record of the work this thread runs, while recording

int32_t hostThread() {
  thread_local const auto id = static_cast<int32_t>(::syscall(SYS_gettid));
  return id;
}

}  // namespace

void activityStart() {
  std::lock_guard<std::mutex> lock(records_mutex);
  records.clear();
  activity_recording.store(true, std::memory_order_release);
}

void activityStop() { activity_recording.store(false, std::memory_order_release); }

std::vector<ActivityRecord> activityDrain() {
  std::lock_guard<std::mutex> lock(records_mutex);
  return std::exchange(records, {});
}

ActivityRecord* activitySwapRunning(ActivityRecord* record) { return std::exchange(running, record); }

void activityAnnotate(const char* key, std::string value) {
  if (running != nullptr && key != nullptr) running->args.emplace_back(key, std::move(value));
}

void activityPushExternalCorrelation(uint64_t id) { external_correlation.push_back(id); }

void activityPopExternalCorrelation() {
  if (!external_correlation.empty()) external_correlation.pop_back();
}

int64_t activityClockNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ActivityRecord activityBegin(int device, Stream stream, const LaunchInfo& info) {
  const int64_t now = activityClockNs();
  return ActivityRecord{info.kind,
                        info.name != nullptr ? info.name : "kernel",
                        device,
                        stream,
                        info.bytes,
                        now,
                        now,
                        0,
                        external_correlation.empty() ? 0 : external_correlation.back(),
                        launches.fetch_add(1, std::memory_order_relaxed) + 1,
                        hostThread()};
}

void activityEnd(ActivityRecord record) {
  record.end_ns = activityClockNs();
  if (!activityRecording()) return;  // recording stopped while the work ran
  std::lock_guard<std::mutex> lock(records_mutex);
  records.push_back(std::move(record));
}

}  // namespace torchneuron::emu
