#!/usr/bin/env bash
# Run GPU benchmark scripts and the GPU-marked tests in ONE device call, each step bounded by its own
# time limit, and pack every output into one archive (the device returns at most 8 files).
#
#   bash bench/h200_all.sh [STEP ...]        default: agent profile bench_evaluate knowledge gpu_tests
#
# Steps: runtime evaluator probe agent profile bench_evaluate knowledge gpu_tests.
# Needs the nvidia-cutlass wheel in .whl/ (installed offline into /tmp/site) and, for `probe`, a
# KernelBench copy in .kernelbench/. Writes $OUT/h200-results.tgz (one folder per step: the step's
# files plus stdout.txt) and $OUT/summary.txt (exit status and seconds of each step).
set -u
OUT_DIR=${OUT:-/tmp/cutegen-h200}
mkdir -p "$OUT_DIR"
WORK=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH="$PWD/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

step_command() {  # step, output folder -> the command line (and its limit in seconds, first word)
  case "$1" in
    runtime)        echo "120 python3 bench/runtime_build.py --out $2" ;;
    evaluator)      echo "420 python3 bench/evaluator_h200.py --out $2" ;;
    probe)          echo "420 python3 bench/probe_kernelbench_h200.py --out $2 --kernelbench .kernelbench" ;;
    agent)          echo "240 python3 bench/agent_replay_h200.py --out $2" ;;
    profile)        echo "300 python3 bench/profile_h200.py --out $2" ;;
    bench_evaluate) echo "300 python3 bench/bench_evaluate_h200.py --out $2" ;;
    knowledge)      echo "420 python3 bench/knowledge_h200.py --out $2" ;;
    gpu_tests)      echo "420 python3 -m pytest -q -m gpu -rs -p no:cacheprovider --junitxml=$2/junit.xml" ;;
    *)              return 1 ;;
  esac
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv \
  > "$WORK/nvidia-smi.csv" 2>&1
for step in ${*:-agent profile bench_evaluate knowledge gpu_tests}; do
  mkdir -p "$WORK/$step"
  if ! line=$(step_command "$step" "$WORK/$step"); then
    echo "$step unknown-step" | tee -a "$WORK/summary.txt"; continue
  fi
  limit=${line%% *}
  start=$(date +%s)
  # shellcheck disable=SC2086 # the command line is split on purpose
  timeout -k 10 "$limit" ${line#* } > "$WORK/$step/stdout.txt" 2>&1
  rc=$?
  echo "$step rc=$rc $(( $(date +%s) - start ))s" | tee -a "$WORK/summary.txt"
done
tar czf "$OUT_DIR/h200-results.tgz" -C "$WORK" .
cp "$WORK/summary.txt" "$OUT_DIR/summary.txt"
