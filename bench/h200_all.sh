#!/usr/bin/env bash
# Run GPU benchmark scripts and the GPU-marked tests in ONE device call, each step bounded by its own
# time limit, and pack every output into one archive (the device returns at most 8 files).
#
#   bash bench/h200_all.sh STEP [STEP ...]
#
# Steps (own limit in seconds): prebuild (150), runtime (120), evaluator (540), probe (420), agent (240),
# agent_cuda (240: the same with the plain-CUDA replies under backend cuda), beam (240: `cutegen bench
# --search beam:2,3` over three example tasks with hand-written recorded replies, backend torch),
# profile (300), bench_evaluate (480), knowledge (420), gpu_tests (420), baselines (560), throughput (560:
# `cutegen bench --evaluate` over full-size KernelBench tasks, THROUGHPUT_SELECT, THROUGHPUT_PART and
# THROUGHPUT_PROFILE pass its --select, --part and --profile, THROUGHPUT_ARGS more of its arguments, THROUGHPUT_TAIL_S the seconds kept for the profiles after the bench, default 45). `prebuild` builds every shipped
# CuTe kernel in parallel into the call's shared cache, so later steps find them built; name it first. A device call may run 10 minutes, so the
# steps of one call share TOTAL_S (default 570 s): each step gets the smaller of its own limit and
# what is left, and a step with under 30 s left is skipped (and says so in summary.txt).
# EVALUATOR_SECTIONS picks the evaluator's sections, GPU_TESTS the test files (default: all of tests/; each test's
# outcome, seconds and failure text go to gpu_tests/tests.txt as it ends, so a run cut off keeps them),
# PROFILE_ARGS, BENCH_EVALUATE_ARGS, EVALUATOR_ARGS and BASELINES_ARGS add arguments to those scripts.
# Needs the nvidia-cutlass wheel in .whl/ (installed offline into /tmp/site) and, for `probe` and
# `baselines`, a KernelBench copy in .kernelbench/. `baselines` (eager and torch.compile baselines, SOL
# bounds and probe flags of KernelBench L1+L2) resumes from bench/results/baselines-h200.json: copy the
# step's baselines-h200.json there before the next call; it fills a whole call, so name it alone.
# Writes $OUT/h200-results.tgz (one folder per step: the step's files plus stdout.txt) and
# $OUT/summary.txt (exit status and seconds of each step).
set -u
[ $# -gt 0 ] || { echo "name the steps to run (see the comment at the top)"; exit 2; }
OUT_DIR=${OUT:-/tmp/cutegen-h200}
mkdir -p "$OUT_DIR"
WORK=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH="$PWD/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# One cache root for every step of the call: builds and baselines measured by one step serve the next.
CACHE=${CUTEGEN_BENCH_CACHE:-$WORK/cache}
export CUTEGEN_BENCH_CACHE=$CACHE CUTEGEN_TEST_BUILD_CACHE=$CACHE/build

step_command() {  # step, output folder -> the command line (and its limit in seconds, first word)
  case "$1" in
    prebuild)       echo "150 python3 bench/prebuild.py --cache $CACHE" ;;
    runtime)        echo "120 python3 bench/runtime_build.py --out $2" ;;
    evaluator)      echo "540 python3 bench/evaluator_h200.py --out $2 --cache $CACHE --sections ${EVALUATOR_SECTIONS:-cheats,honest,faults,fidelity,throughput} ${EVALUATOR_ARGS:-}" ;;
    probe)          echo "420 python3 bench/probe_kernelbench_h200.py --out $2 --kernelbench .kernelbench" ;;
    agent)          echo "240 python3 bench/agent_replay_h200.py --out $2" ;;
    agent_cuda)     echo "240 python3 bench/agent_replay_h200.py --out $2 --backend cuda" ;;
    beam)           echo "240 python3 bench/beam_h200.py --out $2 --budget-s $(( ${STEP_S:-240} - 30 ))" ;;
    profile)        echo "300 python3 bench/profile_h200.py --out $2 --cache $CACHE ${PROFILE_ARGS:-}" ;;
    bench_evaluate) echo "480 python3 bench/bench_evaluate_h200.py --out $2 --budget-s $(( ${STEP_S:-480} - 20 )) ${BENCH_EVALUATE_ARGS:-}" ;;
    knowledge)      echo "420 python3 bench/knowledge_h200.py --out $2 --cache $CACHE" ;;
    baselines)      echo "560 python3 bench/baselines_kernelbench_h200.py --out $2 --kernelbench .kernelbench --cache $CACHE --budget-s $(( ${STEP_S:-560} - 30 )) ${BASELINES_ARGS:-}" ;;
    throughput)     echo "560 python3 bench/throughput_h200.py --out $2 --kernelbench .kernelbench --select ${THROUGHPUT_SELECT:-level1:19-32} --part ${THROUGHPUT_PART:-part1} --budget-s $(( ${STEP_S:-560} - ${THROUGHPUT_TAIL_S:-45} )) --profile=${THROUGHPUT_PROFILE:-} ${THROUGHPUT_ARGS:-}" ;;
    gpu_tests)      echo "420 env CUTEGEN_TEST_REPORT=$2/tests.txt python3 -m pytest -o addopts= -q -m gpu -rs --durations=40 -p no:cacheprovider --junitxml=$2/junit.xml ${GPU_TESTS:-tests}" ;;
    *)              return 1 ;;
  esac
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv \
  > "$WORK/nvidia-smi.csv" 2>&1
TOTAL_S=${TOTAL_S:-570}
began=$(date +%s)
for step in "$@"; do
  mkdir -p "$WORK/$step"
  if ! line=$(step_command "$step" "$WORK/$step"); then
    echo "$step unknown-step" | tee -a "$WORK/summary.txt"; continue
  fi
  limit=${line%% *}
  start=$(date +%s)
  left=$(( TOTAL_S - (start - began) ))
  if [ "$left" -lt 30 ]; then echo "$step skipped: ${left}s left" | tee -a "$WORK/summary.txt"; continue; fi
  [ "$left" -lt "$limit" ] && limit=$left
  [ -n "${STEP_LIMITS:-}" ] && for pair in $STEP_LIMITS; do  # e.g. STEP_LIMITS="knowledge=190 profile=120"
    [ "${pair%%=*}" = "$step" ] && [ "${pair#*=}" -lt "$limit" ] && limit=${pair#*=}
  done
  line=$(STEP_S=$limit step_command "$step" "$WORK/$step")  # a step may size its own budget by STEP_S
  # shellcheck disable=SC2086 # the command line is split on purpose
  timeout -k 10 "$limit" ${line#* } > "$WORK/$step/stdout.txt" 2>&1
  rc=$?
  echo "$step rc=$rc $(( $(date +%s) - start ))s" | tee -a "$WORK/summary.txt"
done
tar czf "$OUT_DIR/h200-results.tgz" -C "$WORK" --exclude=./cache .
cp "$WORK/summary.txt" "$OUT_DIR/summary.txt"
# The end of each step's output, for the reply of the device call.
for f in "$WORK"/*/stdout.txt; do echo "== $f"; tail -n "${TAIL_LINES:-12}" "$f" | cut -c1-300; done
cat "$WORK/summary.txt"
