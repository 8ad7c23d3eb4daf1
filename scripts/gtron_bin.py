"""Running a gtron binary from the Python check scripts (check_hf.py, check_hf_llama.py,
check_hf_generate.py, compare_tokenizers_llama.py, bench_hf_generate.py's callers).

A binary copied by scripts/gpu_tests.sh sits in .gpubin/ beside lib/, the shared libraries a GPU
machine may lack (Gloo and its dependencies). gtron needs them on LD_LIBRARY_PATH; Python itself
must not have them (they break torch), so only the child process gets them.
"""
import os


def gtron_env(binary):
    """os.environ with the binary's lib/ folder, if it has one, first on LD_LIBRARY_PATH."""
    env = dict(os.environ)
    lib = os.path.join(os.path.dirname(os.path.abspath(binary)), "lib")
    if os.path.isdir(lib):
        old = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = lib + (":" + old if old else "")
    return env
