#!/bin/bash
# The profiler's one GPU-machine call (2x H200): GPU tests, the issue's checks, `megatune profile` of
# llama3-1b on 2 GPUs, a traced training run, and the exported tables. Executables come prebuilt in .gpu-profiler/
# (see profiler/scripts/stage_gpu.sh); everything lands in $OUT (log.txt, h200.db, CSVs).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
G=.gpu-profiler
LOG=$OUT/log.txt
step() { echo "=== $* ($(date -u +%T))" | tee -a "$LOG"; }
step "machine"
nvidia-smi -L 2>&1 | tee -a "$LOG"
step "CUPTI tracer / kernel runner GPU test"
timeout 60 $G/profiler_cupti_tracer_gpu_test 2>&1 | tail -25 | tee -a "$LOG"
step "checks (bench_profiler_gpu)"
timeout 90 $G/bench_profiler_gpu 2>&1 | tee -a "$LOG"
step "megatune profile --model llama3-1b --gpus 2"
timeout 230 $G/megatune profile --model llama3-1b --gpus 2 --db "$OUT/h200.db" 2>&1 | tee -a "$LOG"
step "megatune profile --trace"
timeout 50 $G/megatune profile --trace --model gpt-125m --mbs 4 --train-iters 3 --db "$OUT/h200.db" 2>&1 |
  tee -a "$LOG"
step "export"
for table in kernel_timings collective_timings fitted_models; do
  $G/megatune db --db "$OUT/h200.db" export --table $table -o "$OUT/h200_profile_$table.csv" 2>&1 | tee -a "$LOG"
done
$G/megatune db --db "$OUT/h200.db" info 2>&1 | tee -a "$LOG"
step "done"
