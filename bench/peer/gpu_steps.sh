# Sourced by the GPU-machine scripts (run_gpu.sh, ../validate_gpu.sh): the log folder ($OUT, set by the
# device call), NCCL_NVLS_ENABLE=0, the staged executables unpacked once (stage_gpu.sh packs them into one
# archive for the carry limit) with their shared libraries on LD_LIBRARY_PATH, and `step NAME SECONDS
# COMMAND...`, which runs a command under its own time limit into $OUT/NAME.log and appends its exit code,
# duration and last lines to $OUT/summary.txt.
OUT=${OUT:?set OUT to the folder for the logs}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
G=.gpu
if [ -f $G/bins.tar.xz ]; then tar xJf $G/bins.tar.xz -C $G && rm -f $G/bins.tar.xz; fi
export LD_LIBRARY_PATH=$PWD/$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
step() {
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$OUT/summary.txt"
  tail -n 4 "$OUT/$name.log" | cut -c1-400 | tee -a "$OUT/summary.txt"
}
