/* The runtime's C API (csrc/runtime/neuron_runtime.h) from C: the header compiles as C, and what crosses
 * the boundary is plain: status codes, a failing launch's message from tnrtLastError(), an asynchronous
 * failure's from tnrtAsyncError(), activity records visited with C strings. Built by
 * tests/test_runtime_library.py against the runtime library alone and run in each mode. */
#include "neuron_runtime.h"

#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);      \
      ++failures;                                                                   \
    }                                                                               \
  } while (0)

static const char* writes(void* arg, void* context) {
  *(int*)arg = *(const int*)context;
  return NULL;
}

static const char* fails(void* arg, void* context) {
  (void)arg;
  (void)context;
  return "the C kernel failed";
}

static int drops = 0;
static void drop(void* arg) {
  (void)arg;
  ++drops;
}

static int visited = 0;
static int named = 0;
static void visit(const tnrtActivityRecord* record, void* context) {
  (void)context;
  ++visited;
  if (strcmp(record->name, "c kernel") == 0 && record->arg_count == 0 && record->kind == TNRT_ACTIVITY_KERNEL) ++named;
}

int main(void) {
  CHECK(tnrtApiVersion() == TNRT_API_VERSION_MAJOR * 1000 + TNRT_API_VERSION_MINOR);
  CHECK(tnrtDeviceCount() == 2);
  CHECK(strcmp(tnrtStatusString(TNRT_OUT_OF_MEMORY), "out of device memory") == 0);

  void* d = NULL;
  CHECK(tnrtMalloc(0, &d, 256) == TNRT_SUCCESS);
  CHECK(tnrtMalloc(7, &d, 256) == TNRT_INVALID_DEVICE);
  int value = 0, seven = 7;
  tnrtLaunchInfo info = {TNRT_ACTIVITY_KERNEL, "c kernel", 0, NULL, 0};

  /* A blocking launch runs the C kernel with its two pointers; a failure is a status and a message. */
  CHECK(tnrtLaunchKernel(0, 0, writes, &value, &seven, &info) == TNRT_SUCCESS);
  CHECK(value == 7);
  CHECK(tnrtLaunchKernel(0, 0, fails, NULL, NULL, NULL) == TNRT_LAUNCH_FAILED);
  CHECK(strcmp(tnrtLastError(), "the C kernel failed") == 0);
  CHECK(tnrtLaunchKernel(0, 0, NULL, NULL, NULL, NULL) == TNRT_INVALID_VALUE);

  /* An enqueued failure: this call's when synchronous, the device's (taken once) when asynchronous. */
  const tnrtStatus queued = tnrtEnqueueKernel(0, 1, fails, NULL, NULL, drop, &info);
  if (!tnrtAsyncMode()) {
    CHECK(queued == TNRT_LAUNCH_FAILED);
    CHECK(drops == 1);
  } else {
    CHECK(queued == TNRT_SUCCESS);
    CHECK(tnrtStreamSynchronize(0, 1) == TNRT_KERNEL_FAILED);
    CHECK(drops == 1);
    char small[4];
    const size_t length = tnrtAsyncError(0, small, sizeof(small)); /* too small: told the length, not taken */
    CHECK(length == strlen("c kernel: the C kernel failed"));
    char message[128];
    CHECK(tnrtAsyncError(0, message, sizeof(message)) == length);
    CHECK(strcmp(message, "c kernel: the C kernel failed") == 0);
    CHECK(tnrtAsyncError(0, message, sizeof(message)) == 0); /* taken */
  }
  CHECK(tnrtStreamSynchronize(0, 1) == TNRT_SUCCESS);
  CHECK(tnrtEnqueueKernel(5, 1, writes, &value, &seven, drop, NULL) == TNRT_INVALID_DEVICE);
  CHECK(drops == 2); /* a refused launch drops its argument too */

  /* Activity records, visited as C structs. */
  CHECK(tnrtActivityStart() == TNRT_SUCCESS);
  CHECK(tnrtActivityRecording());
  CHECK(tnrtLaunchKernel(0, 0, writes, &value, &seven, &info) == TNRT_SUCCESS);
  tnrtActivityStop();
  CHECK(tnrtActivityDrain(visit, NULL) == TNRT_SUCCESS);
  CHECK(visited == 1 && named == 1);
  CHECK(tnrtActivityDrain(NULL, NULL) == TNRT_INVALID_VALUE);

  /* Strict mode's windows, as handles. */
  tnrtAccessWindow window = NULL;
  const tnrtMemoryRange range = {d, 256};
  CHECK(tnrtDeviceAccessOpen(&range, 1, TNRT_ACCESS_THIS_THREAD, &window) == TNRT_SUCCESS);
  CHECK((window != NULL) == (tnrtStrictMode() != 0));
  tnrtMemoryRange open[2];
  CHECK(tnrtDeviceAccessRanges(open, 2) == (tnrtStrictMode() ? 1u : 0u));
  tnrtDeviceAccessClose(window);
  CHECK(tnrtFree(d) == TNRT_SUCCESS);

  printf("runtime C API: %s (async %d, strict %d)\n", failures == 0 ? "ok" : "FAILED", tnrtAsyncMode(),
         tnrtStrictMode());
  return failures == 0 ? 0 : 1;
}
