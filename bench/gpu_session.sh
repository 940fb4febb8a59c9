#!/usr/bin/env bash
# Every GPU check and figure in one device call (device time is scarce: one warm machine, one command).
#
#   bash bench/gpu_session.sh [tests|train|decode|ddp|rl|all]...     (default: all; ddp needs 2 GPUs)
#
# Writes each part's log to $OUT (or ./gpu-logs) and prints the JSON figures. Each part has its own timeout
# so one slow part cannot swallow the others' output. Run with the device tool, e.g. kind nvidia-h200-x2.
set -u
OUT="${OUT:-gpu-logs}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(tests train decode rl ddp)
run() {  # run NAME SECONDS CMD...: keep the log, show the JSON lines and the tail
    local name=$1 secs=$2
    shift 2
    echo "== $name: $*"
    timeout -k 10 "$secs" "$@" >"$OUT/$name.log" 2>&1
    echo "== $name exit $?"
    grep -E '^\{' "$OUT/$name.log" || tail -5 "$OUT/$name.log"
}
for part in "${parts[@]}"; do
    case $part in
        # only the files that hold GPU tests: others import packages the GPU machines lack (fastapi, openai, ...)
        tests) run gpu-tests 420 python3 -m pytest -q -rs -m gpu $(grep -l "pytest.mark.gpu" tests/test_*.py) ;;
        train) CUDA_VISIBLE_DEVICES=0 run train 240 python3 bench/bench_train.py --device cuda --variants cuda-graph
               CUDA_VISIBLE_DEVICES=0 run train-minimind 200 python3 bench/bench_train.py --device cuda --shape minimind \
                --seq 340 --variants cuda-graph
               CUDA_VISIBLE_DEVICES=0 run linear-ce 120 python3 bench/bench_linear_ce.py --no-sweep ;;
        decode) CUDA_VISIBLE_DEVICES=0 run decode 300 python3 bench/bench_decode.py
                CUDA_VISIBLE_DEVICES=0 run prefix 120 python3 bench/bench_prefix_cache.py --device cuda ;;
        rl) CUDA_VISIBLE_DEVICES=0 run rollout 150 python3 bench/bench_rollouts.py --preset gpt2-small --prompts 8 \
                --group-size 8 --new-tokens 256 ;;
        ddp) run ddp 420 torchrun --standalone --nproc_per_node 2 bench/bench_ddp.py --rounds 3 --bw \
                --setups 1gpu-whole ours-bf16-whole torch-bf16-whole torch-whole ;;
        *) echo "unknown part $part (tests|train|decode|ddp|rl)"; exit 2 ;;
    esac
done
