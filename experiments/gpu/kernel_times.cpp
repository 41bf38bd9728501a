// Every CUDA kernel a process runs, with its start and end on the GPU's clock, recorded without
// serialising anything: a CUPTI activity trace loaded by the CUDA driver itself
// (CUDA_INJECTION64_PATH), so it works on a C++ program such as llama-bench with no change to it.
//
//   build: g++ -O2 -shared -fPIC -I$CUDA/include kernel_times.cpp -o libkernel_times.so
//          -L$CUPTI_LIB -lcupti (experiments/gpu/llamacpp_heldout.sh builds it with TRACE=1)
//   run:      CUDA_INJECTION64_PATH=$PWD/libkernel_times.so KERNEL_TIMES_OUT=k.tsv llama-bench ...
//
// Why by hand: Nsight Systems (the kept tool for this) cannot make a report on the lent
// machines (device KINDS.md), and Nsight Compute times each kernel alone, serialised, which on
// llama.cpp's decode graph adds 7-27 % to the step (call 5). CUPTI's concurrent-kernel activity
// records are what nsys itself reads. Output: one line per kernel, "start_ns<TAB>end_ns<TAB>
// graph_id<TAB>stream<TAB>demangled name", in the order CUPTI delivers them (sort by start).
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace {

FILE *out = nullptr;
std::mutex lock;
size_t dropped_total = 0;
constexpr size_t kBuffer = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  *size = kBuffer;
  *buffer = static_cast<uint8_t *>(aligned_alloc(8, kBuffer));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t,
                               size_t valid) {
  CUpti_Activity *rec = nullptr;
  std::lock_guard<std::mutex> g(lock);
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL)
      continue;
    auto *k = reinterpret_cast<CUpti_ActivityKernel10 *>(rec);
    int status = 0;
    char *name = abi::__cxa_demangle(k->name, nullptr, nullptr, &status);
    if (out)
      fprintf(out, "%llu\t%llu\t%u\t%u\t%s\n", (unsigned long long)k->start,
              (unsigned long long)k->end, k->graphId, k->streamId,
              status == 0 && name ? name : k->name);
    free(name);
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS)
    dropped_total += dropped;
  free(buffer);
}

void finish() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> g(lock);
  if (out) {
    fprintf(out, "# dropped %zu\n", dropped_total);
    fclose(out);
    out = nullptr;
  }
}

}  // namespace

extern "C" int InitializeInjection(void) {
  const char *path = getenv("KERNEL_TIMES_OUT");
  out = fopen(path ? path : "kernel_times.tsv", "w");
  if (!out) return 0;
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    fprintf(out, "# cupti refused the trace\n");
    fclose(out);
    out = nullptr;
    return 0;
  }
  atexit(finish);
  return 1;
}
