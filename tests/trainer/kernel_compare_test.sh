#!/usr/bin/env bash
# scripts/kernel_compare.py on made-up profiler outputs whose sums are known: each kernel in its
# kind, the time bench_torch.py did not list as "unlisted", the totals; bad input exits 2.
set -euo pipefail
cmp="$1"
dir="${TEST_TMPDIR:-/tmp}/kernel_compare_test"
mkdir -p "$dir"
cat >"$dir/gtron.txt" <<'TXT'
{"tokens_per_s": 1.0, "ms_per_step": 12.0}
largest idle gaps (ms per step, gaps per step: op before -> op after), last 5 steps:
  0.0097    1.0  memcpy_HtoD -> hoisted_fills_kernel
ops (ms per step, count per step):
  5.0000   10.0  nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT
  1.5000    2.0  sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x128x64
  2.0000    2.0  wg_backward_kv_kernel<128, false>
  1.0000    2.0  wg_forward_kernel<128>
  1.2500    1.0  adamw_kernel
  0.2500    1.0  sumsq_kernel
  0.5000    1.0  onepass_kernel<__nv_bfloat16, 8, true>
  0.2000    4.0  memset
  0.3000    2.0  norm_resident_kernel<__nv_bfloat16, float, 8, 4, false>
{"steps": 5, "ms_per_step": 12.0}
TXT
cat >"$dir/torch.txt" <<'TXT'
  _warn_once(
torch kernels: 11.000 ms per step in 100 launches
   4.000 ms  36.4%   10.0x  nvjet_sm90_tst_192x192_64x3_2x1_v_bz_coopB_NTN
   2.000 ms  18.2%    2.0x  cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26
   0.500 ms   4.5%    2.0x  void cudnn::fusion::compute_dot_do_o_specialized<true, 128>(void const*)
   1.500 ms  13.6%    2.0x  void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::FusedOpti
   0.750 ms   6.8%    1.0x  triton_red_fused__log_softmax__to_copy_11
   1.000 ms   9.1%    2.0x  triton_per_fused__to_copy_add_native_layer_norm_backward_view_9
   0.250 ms   2.3%   50.0x  Memset (Device)
TXT
python3 "$cmp" "$dir/gtron.txt" "$dir/torch.txt" >"$dir/out.txt"
python3 - "$dir/out.txt" <<'PY'
import json, sys
text = open(sys.argv[1]).read().splitlines()
r = json.loads(text[-1])["kernel_compare"]
want_g = {"gemm": 6.5, "attention": 3.0, "optimizer": 1.5, "loss": 0.5, "memset_copy": 0.2,
          "other": 0.3}
want_t = {"gemm": 4.0, "attention": 2.5, "optimizer": 1.5, "loss": 0.75, "memset_copy": 0.25,
          "other": 1.0, "unlisted": 1.0}
assert r["gtron"] == want_g, r["gtron"]
assert r["torch"] == want_t, r["torch"]
assert r["gtron_total"] == 12.0 and r["torch_total"] == 11.0, r
# the table's first row: gemm, then the difference
assert text[1].split() == ["gemm", "6.500", "4.000", "+2.500"], text[1]
assert text[-2].split() == ["total", "12.000", "11.000", "+1.000"], text[-2]
print("kernel_compare: ok")
PY
# Bad input: each file swapped for the other's format, and a missing file, exit 2 with a message.
for args in "$dir/torch.txt $dir/torch.txt" "$dir/gtron.txt $dir/gtron.txt" "$dir/nope.txt $dir/torch.txt"; do
  rc=0
  # shellcheck disable=SC2086
  python3 "$cmp" $args >/dev/null 2>"$dir/err.txt" || rc=$?
  [[ $rc -eq 2 ]] || { echo "exit $rc, not 2, for $args" >&2; exit 1; }
  grep -q "kernel_compare.py: " "$dir/err.txt"
done
echo ok
