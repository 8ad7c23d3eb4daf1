// Thin, header-clean wrappers over the CUDA runtime for model/ (no CUDA headers leak out; handles
// are void*). Every call is checked with CUDA_CHECK semantics: a failure aborts with call, file,
// line and device.
#pragma once

#include <cstddef>

namespace gtron::cuda {

void* stream_create(int device);
void stream_destroy(void* stream);
void stream_synchronize(void* stream);
void* event_create(int device);
void event_destroy(void* event);
void event_record(void* event, void* stream);
void stream_wait_event(void* stream, void* event);
void event_synchronize(void* event);
void memcpy_async(void* dst, const void* src, size_t bytes, void* stream);
void memset_async(void* dst, int value, size_t bytes, void* stream);

}  // namespace gtron::cuda
