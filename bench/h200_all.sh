#!/usr/bin/env bash
# The GPU machine's one driver: the GPU tests and the benchmark verbs in ONE device call, each step
# bounded by its own time limit, every output packed into one archive (the device returns few files).
#
#   bash bench/h200_all.sh STEP [STEP ...]
#
# Steps (own limit in seconds):
#   prebuild (150)   `cutegen prebuild DIR --arch sm_90a` over the folders the GPU tests judge, into the
#                    call's shared cache, so later steps find the kernels built; name it first.
#   machine (120)    `cutegen machine --json`: the manifest and the device's measured peaks (machine.json).
#   gpu_tests (420)  `pytest -m gpu` on GPU_TESTS (default tests/), results tables (with the manifest) in
#                    gpu_tests/results/ (or RESULTS_DIR); each test's outcome, seconds and failure text in
#                    gpu_tests/tests.txt as it ends, so a cut-off run keeps them. The whole set does not
#                    fit one call: split it, e.g. GPU_TESTS=tests/test_fixtures_gpu.py, then the rest.
#   survey (560)     `cutegen survey .kernelbench --select level1,level2`, resumed from
#                    bench/results/baselines-h200.json; copy the step's baselines-h200.json back there
#                    before the next call. It fills a call: name it alone. SURVEY_ARGS adds arguments.
#   throughput (560) bench/throughput_h200.py: `cutegen bench --evaluate` over full-size KernelBench tasks;
#                    THROUGHPUT_SELECT, THROUGHPUT_PART and THROUGHPUT_PROFILE pass its --select, --part and
#                    --profile, THROUGHPUT_ARGS more arguments, THROUGHPUT_TAIL_S the seconds kept for the
#                    profiles after the bench (default 45).
#   judge (560)      bench/judge_h200.py over JUDGE_SECTIONS (default cheats,honest,cuda,structure), one
#                    evaluation at a time, resumed from bench/results/judge-h200.jsonl less the lines that
#                    match JUDGE_RERUN; JUDGE_CACHE a cache root to start from (a `cutegen prebuild` output).
#   shared_gpu (300) bench/shared_gpu_h200.py: several `cutegen eval` at once on one GPU (SHARED_ARGS).
#   split_build (560) bench/split_build_h200.py: a split run's builds prebuilt without the GPU (SPLIT_ARGS,
#                    e.g. --prebuilt DIR for builds made on another machine).
# A device call may run 10 minutes, so the steps of one call share TOTAL_S (default 570 s): each gets the
# smaller of its own limit and what is left (STEP_LIMITS="gpu_tests=300 machine=60" lowers them), and a
# step with under 30 s left is skipped (summary.txt says so).
# Needs the nvidia-cutlass wheel in .whl/ (installed offline into /tmp/site) and, for survey and
# throughput, a KernelBench copy in .kernelbench/ (also CUTEGEN_KERNELBENCH for the kernelbench tests).
# Writes $OUT/h200-results.tgz (one folder per step: its files plus stdout.txt) and $OUT/summary.txt.
# The tables of record are then copied into bench/results/ (bench/results/README.md says which).
set -u

run_step() {  # step, output folder: the step's commands (run under the step's time limit)
  local out=$2
  case "$1" in
    prebuild)
      for folder in examples/candidates tests/fixtures/honest tests/fixtures/cheats tests/fixtures/bench_candidates; do
        python3 -m cutegen prebuild "$folder" --arch sm_90a --jobs "$(( $(nproc) > 2 ? $(nproc) - 2 : 1 ))" || return
      done ;;
    machine)    python3 -m cutegen machine --json > "$out/machine.json" && cat "$out/machine.json" ;;
    gpu_tests)  # shellcheck disable=SC2086 # GPU_TESTS is a list of paths
      CUTEGEN_TEST_REPORT=$out/tests.txt CUTEGEN_KERNELBENCH=${CUTEGEN_KERNELBENCH:-$PWD/.kernelbench} \
        python3 -m pytest -o addopts= -q -m gpu -rs --durations=40 -p no:cacheprovider \
        --junitxml="$out/junit.xml" --results-dir "${RESULTS_DIR:-$out/results}" ${GPU_TESTS:-tests} ;;
    survey)     # shellcheck disable=SC2086 # SURVEY_ARGS is a list of arguments
      python3 -m cutegen survey .kernelbench --select level1,level2 --out "$out/baselines-h200.json" \
        --state bench/results/baselines-h200.json --budget-s $(( STEP_S - 30 )) --work "$WORK/survey" ${SURVEY_ARGS:-} ;;
    throughput) # shellcheck disable=SC2086 # THROUGHPUT_ARGS is a list of arguments
      python3 bench/throughput_h200.py --out "$out" --kernelbench .kernelbench --select "${THROUGHPUT_SELECT:-level1:19-32}" \
        --part "${THROUGHPUT_PART:-part1}" --budget-s $(( STEP_S - ${THROUGHPUT_TAIL_S:-45} )) \
        --profile="${THROUGHPUT_PROFILE:-}" ${THROUGHPUT_ARGS:-} ;;
    judge)
      grep -v -E "${JUDGE_RERUN:-^$}" bench/results/judge-h200.jsonl > "$out/judge-h200.jsonl"
      python3 bench/judge_h200.py --out "$out" --sections "${JUDGE_SECTIONS:-cheats,honest,cuda,structure}" \
        --kernelbench .kernelbench --cache "${JUDGE_CACHE:-$WORK/cache}" ;;
    # shellcheck disable=SC2086 # SHARED_ARGS and SPLIT_ARGS are lists of arguments
    shared_gpu)  # the copies' caches stay in shared-work (not packed)
      python3 bench/shared_gpu_h200.py --out "$WORK/shared-work" ${SHARED_ARGS:-}
      cp "$WORK"/shared-work/*.md "$WORK"/shared-work/*.json "$WORK"/shared-work/*.log "$out/" ;;
    split_build) python3 bench/split_build_h200.py --out "$out" ${SPLIT_ARGS:-} ;;
  esac
}

limit_of() {
  case "$1" in
    prebuild) echo 150 ;; machine) echo 120 ;; gpu_tests) echo 420 ;; shared_gpu) echo 300 ;;
    survey|throughput|split_build|judge) echo 560 ;; *) return 1 ;;
  esac
}

if [ "${1:-}" = "--run-step" ]; then  # the script calling itself for one step, under `timeout`
  run_step "$2" "$3"
  exit $?
fi
[ $# -gt 0 ] || { echo "name the steps to run (see the comment at the top)"; exit 2; }
OUT_DIR=${OUT:-/tmp/cutegen-h200}
mkdir -p "$OUT_DIR"
WORK=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
# One cache root for every step of the call: builds and baselines measured by one step serve the next.
CACHE=${CUTEGEN_BENCH_CACHE:-$WORK/cache}
export PYTHONPATH="$PWD/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 WORK
export CUTEGEN_CACHE=$CACHE CUTEGEN_TEST_BUILD_CACHE=$CACHE/build
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv \
  > "$WORK/nvidia-smi.csv" 2>&1
TOTAL_S=${TOTAL_S:-570}
began=$(date +%s)
for step in "$@"; do
  mkdir -p "$WORK/$step"
  if ! limit=$(limit_of "$step"); then echo "$step unknown-step" | tee -a "$WORK/summary.txt"; continue; fi
  start=$(date +%s)
  left=$(( TOTAL_S - (start - began) ))
  if [ "$left" -lt 30 ]; then echo "$step skipped: ${left}s left" | tee -a "$WORK/summary.txt"; continue; fi
  [ "$left" -lt "$limit" ] && limit=$left
  for pair in ${STEP_LIMITS:-}; do
    [ "${pair%%=*}" = "$step" ] && [ "${pair#*=}" -lt "$limit" ] && limit=${pair#*=}
  done
  STEP_S=$limit timeout -k 10 "$limit" bash "$0" --run-step "$step" "$WORK/$step" > "$WORK/$step/stdout.txt" 2>&1
  rc=$?
  echo "$step rc=$rc $(( $(date +%s) - start ))s" | tee -a "$WORK/summary.txt"
done
tar czf "$OUT_DIR/h200-results.tgz" -C "$WORK" --exclude=./cache --exclude=./survey --exclude=./shared-work \
  --exclude='*/work/*cache*' --exclude='*/runs/*/candidates' .
cp "$WORK/summary.txt" "$OUT_DIR/summary.txt"
# The end of each step's output, for the reply of the device call.
for f in "$WORK"/*/stdout.txt; do echo "== $f"; tail -n "${TAIL_LINES:-12}" "$f" | cut -c1-300; done
cat "$WORK/summary.txt"
