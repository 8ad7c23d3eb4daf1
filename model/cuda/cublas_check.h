// CUBLAS_CHECK for the cuBLASLt sources: the one error-check family of model/cuda/check.h.
#pragma once

#include <cublasLt.h>

#include "model/cuda/check.h"

#define CUBLAS_CHECK(expr)                                                               \
  do {                                                                                   \
    cublasStatus_t st_ = (expr);                                                         \
    GTRON_CHECK_CALL(st_ == CUBLAS_STATUS_SUCCESS, #expr, cublasLtGetStatusString(st_)); \
  } while (0)
