#!/usr/bin/env bash
# The MoE checks and the MoE training step against the PyTorch peer, in one device call: the MoE kernel and
# engine GPU tests, the expert-GEMM comparison (bench_grouped_gemm_gpu), then for each micro-batch size
# bench_train_gpu perf --model mixtral-small beside bench/peer/torch_moe.py on the same shape. Logs and a
# summary go to $OUT (required).
#   bash bench/peer/moe_gpu.sh BINS_TAR_XZ [MBS...]     (the archive holds the binaries, lib/, torch_moe.py)
# SKIP_GEMM_BENCH=1 leaves out the expert-GEMM comparison.
set -u
archive=${1:?usage: $0 BINS_TAR_XZ [MBS...]}
out=${OUT:?set OUT to the folder for the logs}
shift
sizes=${*:-4}
work=$(mktemp -d)
tar xJf "$archive" -C "$work"
export LD_LIBRARY_PATH=$work/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
summary=$out/summary.txt
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader > "$summary"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >> "$summary" 2>&1
run() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - start))s" >> "$summary"
}
run kernel_moe_test 120 "$work/executor_kernel_moe_gpu_test"
run engine_moe_test 120 "$work/executor_engine_cuda_backend_gpu_test" --gtest_filter='*Moe*'
if [ "${SKIP_GEMM_BENCH:-0}" != 1 ]; then run grouped_gemm 120 "$work/bench_grouped_gemm_gpu" --tokens 8192; fi
for mbs in $sizes; do
  run "megatune_mbs$mbs" 180 "$work/bench_train_gpu" perf --model mixtral-small --mbs "$mbs" --seq 2048 --iters 10
  run "torch_mbs$mbs" 300 python3 "$work/torch_moe.py" --mbs "$mbs" --steps 16 --compile regional
done
grep -h "tests ran\|PASSED\|FAILED" "$out"/*_test.log >> "$summary"
grep -h "MEGATUNE\|ANCHOR\|grouped_mm check\|layer  \|changing\|round trips\|kernels:\|idle between\|in order" \
  "$out"/*.log >> "$summary"
cat "$summary"
tar cJf "$out/logs.tar.xz" -C "$out" --exclude=logs.tar.xz --exclude=summary.txt .
find "$out" -name '*.log' -delete
