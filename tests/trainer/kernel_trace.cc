// A CUPTI injection library: loaded by the CUDA driver into any CUDA program through
//   CUDA_INJECTION64_PATH=/path/libkernel_trace.so GTRON_KTRACE_OUT=trace.tsv <program>
// it records every kernel, memset and memcpy the GPU runs (those inside replayed CUDA graphs
// too, node by node) with its start and end on the GPU's clock, and writes them when the program
// exits, one line each:
//   kind  start_ns  end_ns  stream  graph  size  name
// kind K (kernel: size = blocks), S (memset: size = bytes) or C (memcpy: size = bytes, name
// memcpy_<kind>, e.g. memcpy_DtoD). scripts/trace_table.py reads it (scripts/trace_gpu.sh runs
// both over bench_gpu). Nsight Systems is not on the GPU machines; ncu times kernels one by one and
// sees neither copies, memsets nor the gaps between launches, which this trace shows.
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>

namespace {

FILE* out = nullptr;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = size_t{16} << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

const char* copy_kind(int kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "memcpy_HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "memcpy_DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "memcpy_DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return "memcpy_HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "memcpy_PtoP";
    default:
      return "memcpy_other";
  }
}

void write_kernel(const CUpti_ActivityKernel10& k) {
  int status = 0;
  char* name = abi::__cxa_demangle(k.name, nullptr, nullptr, &status);
  std::fprintf(out, "K\t%llu\t%llu\t%u\t%u\t%llu\t%s\n", static_cast<unsigned long long>(k.start),
               static_cast<unsigned long long>(k.end), k.streamId, k.graphId,
               static_cast<unsigned long long>(k.gridX) * k.gridY * k.gridZ,
               status == 0 && name != nullptr ? name : k.name);
  std::free(name);
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* r = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      write_kernel(*reinterpret_cast<const CUpti_ActivityKernel10*>(r));
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
      std::fprintf(out, "S\t%llu\t%llu\t%u\t%u\t%llu\tmemset\n",
                   static_cast<unsigned long long>(m->start),
                   static_cast<unsigned long long>(m->end), m->streamId, m->graphId,
                   static_cast<unsigned long long>(m->bytes));
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
      std::fprintf(out, "C\t%llu\t%llu\t%u\t%u\t%llu\t%s\n",
                   static_cast<unsigned long long>(m->start),
                   static_cast<unsigned long long>(m->end), m->streamId, m->graphId,
                   static_cast<unsigned long long>(m->bytes), copy_kind(m->copyKind));
    }
  }
  std::free(buffer);
}

void flush_at_exit() {
  cuptiActivityFlushAll(1);
  if (out != nullptr) std::fclose(out);
  out = nullptr;
}

}  // namespace

// Called by the CUDA driver when it loads this library (CUDA_INJECTION64_PATH).
extern "C" int InitializeInjection(void) {
  const char* path = std::getenv("GTRON_KTRACE_OUT");
  out = std::fopen(path != nullptr ? path : "kernel_trace.tsv", "w");
  if (out == nullptr) {
    std::fprintf(stderr, "kernel_trace: cannot write %s\n",
                 path != nullptr ? path : "kernel_trace.tsv");
    return 0;
  }
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_trace: CUPTI activity tracing could not start\n");
    return 0;
  }
  std::atexit(flush_at_exit);
  return 1;
}
