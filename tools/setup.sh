#!/usr/bin/env bash
# megatune set-up: install what is missing (Debian packages), build, then run one job:
#   tools/setup.sh plan   -> build and run the main job (plan a named model on a named cluster)
#   tools/setup.sh test   -> build and run the whole test suite (plain, sanitized, fuzzed)
set -euo pipefail
mode=${1:-plan}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc 2>/dev/null || echo 2)
all_rooms="base;layouts;cost_models;planner;calibration;executor;profiler;tools"

need=(build-essential cmake ninja-build git pkg-config libsqlite3-dev libeigen3-dev libcli11-dev libgtest-dev nlohmann-json3-dev
      libsentencepiece-dev sentencepiece)
# chromium: the compare test opens its HTML report headless (installing it took 25 s on the CPU machine).
# nodejs + npm: the tokenizer tests install their reference tokenizers (npm packages) into the build tree.
# Debian's, unless a Node.js with npm is already there (NodeSource's nodejs bundles npm and conflicts with
# Debian's npm package).
[ "$mode" = test ] && need+=(clang libclang-rt-dev chromium)
[ "$mode" = test ] && ! command -v npm > /dev/null 2>&1 && need+=(nodejs npm)
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

configure_and_build() {  # dir, extra cmake args... [-- targets...] (no targets: everything)
  local dir=$1; shift
  local args=() targets=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
  [ $# -gt 0 ] && { shift; targets=("$@"); }
  # Ninja when a build folder is new or already Ninja's (a folder made by an older set-up keeps Make).
  local generator=()
  if command -v ninja > /dev/null 2>&1 &&
     { [ ! -f "$dir/CMakeCache.txt" ] || grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$dir/CMakeCache.txt"; }; then
    generator=(-G Ninja)
  fi
  cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "${args[@]}" > "$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; exit 1; }
  if [ ${#targets[@]} -gt 0 ]; then
    cmake --build "$dir" -j "$jobs" --target "${targets[@]}"
  else
    cmake --build "$dir" -j "$jobs"
  fi
}

# phase NAME COMMAND...: runs one phase of the test command and prints its wall time; the summary at the end
# lists every phase (the whole command must stay within CI's budget on two cores).
phase_summary=()
phase() {
  local name=$1; shift
  local start=$SECONDS
  echo "setup: phase '$name' starts"
  "$@"
  local took=$((SECONDS - start))
  phase_summary+=("$(printf '%-34s %4d min %02d s' "$name" $((took / 60)) $((took % 60)))")
  echo "setup: phase '$name' took ${took} s"
}

run_tests() {  # dir, extra ctest args...
  local dir=$1; shift
  (cd "$dir" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -j "$jobs" --timeout 900 "$@")
}

# The CUDA-enabled executable on this machine: a plan, a short tp2 training run on the CPU backend (ranks as
# threads) and a layout report, each expected to succeed.
smoke_test() {
  local bin=$1 dir
  dir=$(mktemp -d)
  "$bin" plan --model llama3-8b --cluster 1x8xH200 --global-batch-size 64 --seq-length 4096 -o "$dir/plan.json" \
    > "$dir/plan.log" || { cat "$dir/plan.log"; exit 1; }
  "$bin" train --model tiny --mock-data --train-iters 3 --log-interval 1 --gbs 4 --mbs 2 --tp 2 --world-size 2 \
    --device cpu > "$dir/train.log" 2>&1 || { cat "$dir/train.log"; exit 1; }
  grep -q "iteration        3/       3" "$dir/train.log" || { cat "$dir/train.log"; exit 1; }
  "$bin" layout --model llama3-70b --tp 8 --pp 4 --world-size 64 --global-batch-size 256 > "$dir/layout.log" ||
    { cat "$dir/layout.log"; exit 1; }
  rm -rf "$dir"
  echo "setup: smoke run of $bin passed (plan, train, layout)"
}

build_fuzzers() {
  CC=clang CXX=clang++ configure_and_build build-fuzz -DMEGATUNE_CUDA=OFF -DMEGATUNE_FUZZ=ON -DMEGATUNE_TESTS=OFF \
    -DMEGATUNE_UNITY_BUILD=ON \
    -- megatune_fuzzers
}

# Inputs per fuzz target: each about a minute on two idle cores, and each checked clean at this count with
# the gate's seed.
fuzz_runs() {
  case "$1" in
    fuzz_cost_inputs) echo 60000 ;;
    fuzz_data_inputs) echo 500000 ;;
    fuzz_layout) echo 200000 ;;
    *) echo 100000 ;;
  esac
}

run_fuzzers() {
  for f in build-fuzz/bin/fuzz_*; do
    [ -x "$f" ] || continue
    local name source seeds
    name=$(basename "$f")
    source=$(find layouts cost_models executor -path "*/fuzz/$name.cpp" | head -n 1)
    seeds=$(dirname "${source:-layouts/fuzz/x}")/seeds
    mkdir -p build-fuzz/corpus/"$name"
    # A fixed seed and a fixed count of inputs: the gate replays the same mutations on every machine, so a
    # finding reproduces and a pass does not depend on speed (the time bound only caps a slow machine).
    # Longer searches set MEGATUNE_FUZZ_SEED, MEGATUNE_FUZZ_RUNS and MEGATUNE_FUZZ_SECONDS.
    "$f" -seed="${MEGATUNE_FUZZ_SEED:-1}" -runs="${MEGATUNE_FUZZ_RUNS:-$(fuzz_runs "$name")}" \
      -max_total_time="${MEGATUNE_FUZZ_SECONDS:-150}" -timeout=5 -rss_limit_mb=2048 \
      build-fuzz/corpus/"$name" "$seeds"
  done
}

case "$mode" in
  plan)
    # Only what the main job runs: the megatune executable (no tests, benchmarks or fuzz targets).
    configure_and_build build -- megatune
    shift || true
    if ./build/bin/megatune plan --help > /dev/null 2>&1; then
      ./build/bin/megatune plan --model llama3-70b --cluster 8x8xH200 --global-batch-size 512 --seq-length 4096 -o plan.json "$@"
    else
      ./build/bin/megatune layout --model llama3-8b --tp 2 --pp 4 --world-size 16 --global-batch-size 64 "$@"
    fi
    ;;
  test)
    # 1. The full build (CUDA too when nvcc is present, benchmarks, GPU tests) and its tests: the GPU ones
    #    (they skip without a GPU) and a smoke run of the CUDA-enabled executable (plan, then train and
    #    simulate on the CPU backend when no GPU is there). Every CPU test runs once, in step 2, where the
    #    sanitizers watch it (the CLI's tests run the sanitized executable there).
    phase "build" configure_and_build build -DMEGATUNE_CPU_TEST_ROOMS= -DMEGATUNE_UNITY_BUILD=ON
    phase "tests" run_tests build
    phase "smoke" smoke_test build/bin/megatune
    # 2. Every CPU test under AddressSanitizer + UndefinedBehaviorSanitizer: only the CPU libraries, the
    #    CLI the tools tests run, and the CPU test binaries (no CUDA, no benchmarks).
    phase "sanitizer build" configure_and_build build-asan -DMEGATUNE_CUDA=OFF -DMEGATUNE_SANITIZE=ON \
      -DMEGATUNE_UNITY_BUILD=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DMEGATUNE_CPU_TEST_ROOMS=$all_rooms" -- megatune megatune_cpu_tests
    phase "sanitizer tests" run_tests build-asan -L cpu
    # 3. libFuzzer, bounded time: layout strings and parallel configurations (layouts/fuzz), cluster files and
    #    CSV / JSON imports (cost_models/fuzz), JSONL lines, indexed datasets and checkpoint manifests
    #    (executor/data/fuzz); each target starts from the seeds next to its source. Only the fuzz targets
    #    are built.
    phase "fuzz build" build_fuzzers
    phase "fuzz" run_fuzzers
    echo "setup: phase times"
    printf '  %s\n' "${phase_summary[@]}"
    echo "setup: all tests passed"
    ;;
  *) echo "usage: tools/setup.sh plan|test" >&2; exit 2 ;;
esac
