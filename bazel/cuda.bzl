"""cuda_library: compiles .cu files with nvcc into a cc_library.

Each .cu file becomes one position-independent object through a genrule (nvcc is invoked from the
execution root, so `#include "model/..."` resolves as in C++ sources). The objects then enter a
cc_library, which links them with the CUDA runtime (static) so dependants need nothing else.
"""

NVCC = "/usr/local/cuda/bin/nvcc"

# Machine code for sm_90 plus compute_90 PTX for later GPUs; a library whose kernels use Hopper's
# arch-specific instructions (wgmma) passes gencode = SM90A instead.
GENCODE = [
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

SM90A = ["-gencode=arch=compute_90a,code=sm_90a"]

NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-Xcompiler",
    "-fPIC",
    "--expt-relaxed-constexpr",
    "-I.",
]

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], gencode = GENCODE, **kwargs):
    """Compiles `srcs` (.cu) with nvcc; `hdrs` are nvcc inputs; the non-.cuh ones are exported."""
    objs = []
    for src in srcs:
        stem = src.replace("/", "_").rsplit(".", 1)[0]
        obj = "_cuda_objs/%s/%s.pic.o" % (name, stem)
        native.genrule(
            name = "%s_%s_nvcc" % (name, stem),
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = "%s %s %s %s -c $(location %s) -o $@" % (
                NVCC,
                " ".join(NVCC_FLAGS),
                " ".join(gencode),
                " ".join(copts),
                src,
            ),
            message = "nvcc %s" % src,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = [h for h in hdrs if not h.endswith(".cuh")],
        deps = deps + ["@cuda//:cudart_static"],
        alwayslink = True,
        **kwargs
    )
