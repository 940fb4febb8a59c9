#!/usr/bin/env bash
# Every GPU check and figure in one device call (device time is scarce: one warm machine, one command).
#
#   bash bench/gpu_session.sh [tests|tests1|tests2|tests3|tests-par|train|decode|ddp|scale|rl|mfu|b8|qwen16|qwen32|masterw|fp8loss|fp8loss-fp8|fp8auto|cdtune|fsdp1|fastaccum|fastaccum32|fastaccum-check|fp8loss-fa|peerfp8|fp8loss-par|fp8loss-headgrad|qwen32-blocks|peerfp8fa|peerfp8gi|fp8loss-13b|rowwise32|asset13b|asset06b]...
#   (default: tests-par train decode rl ddp scale; ddp and scale need 2 GPUs)
#
# Writes each part's log to $OUT (or ./gpu-logs) and prints the JSON figures. Each part has its own timeout
# so one slow part cannot swallow the others' output. Run with the device tool, e.g. kind nvidia-h200-x2.
set -u
OUT="${OUT:-gpu-logs}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# packages the GPU image lacks (llguidance for the engine, torchao for FP8) travel as wheels in .whl/ (git-ignored;
# made here with `python3 -m pip download --no-deps llguidance==1.9.1 torchao==0.18.0 -d .whl`, the machine's
# platform and Python named as pip needs) and are installed for this call
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    echo "no .whl/ wheels: GPU tests and benches that need llguidance or torchao will fail or skip"
fi
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(tests-par train decode rl ddp scale)
run() {  # run NAME SECONDS CMD...: keep the log, show the JSON lines and the tail
    local name=$1 secs=$2
    shift 2
    echo "== $name: $*"
    timeout -k 10 "$secs" "$@" >"$OUT/$name.log" 2>&1
    echo "== $name exit $?"
    grep -E '^\{' "$OUT/$name.log" || tail -5 "$OUT/$name.log"
}
loss_par() {  # loss_par "NAME ARGS...;NAME ARGS...": bench_fp8_loss runs at once on GPU 0 (LOSS_SHAPE, default
    # qwen3-0.6b), then one verdict
    local r name
    IFS=';' read -ra loss_runs <<< "$1"
    for r in "${loss_runs[@]}"; do
        set -- $r
        name=$1
        shift
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True CUDA_VISIBLE_DEVICES=0 run "fp8-loss-par-$name" 540 \
            python3 bench/bench_fp8_loss.py --shape "${LOSS_SHAPE:-qwen3-0.6b}" --compile-scope blocks "$@" &
    done
    wait
    python3 bench/bench_fp8_loss.py --compare "$OUT"/fp8-loss-par-*.log
}
for part in "${parts[@]}"; do
    case $part in
        # only the files that hold GPU tests: others import packages the GPU machines lack (fastapi, openai, ...)
        # CUBLAS_WORKSPACE_CONFIG: tests that run under torch.use_deterministic_algorithms need it for cuBLAS
        # in three parts, each its own timeout: the whole set takes longer than one 10-minute device call
        # (session 17: the first 30 tests, align_grpo to part of train_fsdp, took the 420 s; tests3's 42 took 240 s)
        tests|tests1|tests2|tests3)
            gpu_files=$(grep -l "pytest.mark.gpu" tests/test_*.py)
            for i in 1 2 3; do
                [ "$part" != tests ] && [ "$part" != "tests$i" ] && continue
                files=$(for f in $gpu_files; do n=${f#tests/test_}
                    case $i in 1) [[ $n < l ]] ;; 2) [[ ! $n < l && $n < multi ]] ;; 3) [[ ! $n < multi ]] ;; esac \
                        && echo "$f"; done)
                CUBLAS_WORKSPACE_CONFIG=:4096:8 run "gpu-tests$i" 420 python3 -m pytest -q -rs -m gpu $files
            done ;;
        # every GPU test in one part, six pytest-xdist workers sharing the GPU (the tests are mostly compile
        # and launch bound, and the machine has 16 cores): one device call instead of three
        tests-par) CUBLAS_WORKSPACE_CONFIG=:4096:8 run gpu-tests-par 540 python3 -m pytest -q -rs -m gpu -n 6 \
                --durations 15 $(grep -l "pytest.mark.gpu" tests/test_*.py) ;;
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
        # FSDP2 at the 1.3B shape against one GPU, then the largest model per method at a 24 GiB cap per GPU
        scale) run scaling 560 python3 bench/bench_scaling.py --shape llama-1.3b --gpus 2 --methods fsdp --profile \
                --variants "" "fsdp_unit_blocks=2" "fsdp_unit_blocks=4,fsdp_prefetch=true"
               run max-model-1 150 torchrun --standalone --nproc_per_node 1 bench/bench_max_model.py --cap-gib 24 \
                --start-layers 8
               run max-model-2 240 torchrun --standalone --nproc_per_node 2 bench/bench_max_model.py --cap-gib 24 \
                --start-layers 16 ;;
        # #18's 1-GPU MFU levers: master weights (train.master_weights) with accumulation, as the preset recipes run
        # (the optimizer once per 8 micro-batches; the fp32 gradient adds per micro-batch), peer accumulating too
        # (session 15: 236 s and 275 s of device time, the second cut at its exit after printing every figure)
        mfu) CUDA_VISIBLE_DEVICES=0 run llama-accum 260 python3 bench/bench_train.py --device cuda --shape llama-1.3b \
                --accum 8 --steps 6 --warmup 4 --variants master-weights-graph
             CUDA_VISIBLE_DEVICES=0 run qwen-accum 290 python3 bench/bench_train.py --device cuda --shape qwen3-0.6b \
                --accum 4 --steps 6 --warmup 4 --variants master-weights-graph ;;
        # micro-batch 8 at 1.3B (the FP8 blocks' GEMMs pay at the larger M), Qwen3-0.6B with FP8 blocks and at B=16
        b8) CUDA_VISIBLE_DEVICES=0 run llama-b8 300 python3 bench/bench_train.py --device cuda --shape llama-1.3b \
                --batch 8 --steps 8 --warmup 3 --variants master-weights-graph
            CUDA_VISIBLE_DEVICES=0 run llama-b8-fp8 255 python3 bench/bench_train.py --device cuda --shape llama-1.3b \
                --no-peer --batch 8 --steps 6 --warmup 3 --variants master-weights-fp8
            CUDA_VISIBLE_DEVICES=0 run qwen-fp8 330 python3 bench/bench_train.py --device cuda --shape qwen3-0.6b \
                --no-peer --steps 6 --warmup 3 --variants master-weights-fp8
            CUDA_VISIBLE_DEVICES=0 run qwen-fp8-all-graph 280 python3 bench/bench_train.py --device cuda \
                --shape qwen3-0.6b --no-peer --no-plain --steps 8 --warmup 4 --variants master-weights-fp8-all-graph ;;
        # Qwen3-0.6B at micro-batch 16 (bf16 reached 58.2% there), and its FP8 blocks + head (they paid more at the
        # larger M at 1.3B: 65.7% at B=4, 72.3% at B=8); one call
        qwen16) CUDA_VISIBLE_DEVICES=0 run qwen-b16 200 python3 bench/bench_train.py --device cuda --shape qwen3-0.6b \
                --no-peer --no-plain --batch 16 --steps 8 --warmup 4 --variants master-weights-graph
            CUDA_VISIBLE_DEVICES=0 run qwen-b16-fp8-all-graph 330 python3 bench/bench_train.py --device cuda \
                --shape qwen3-0.6b --no-peer --no-plain --batch 16 --steps 8 --warmup 4 \
                --variants master-weights-fp8-all-graph ;;
        # the same FP8 run at micro-batch 32 (105 GiB): 67.7% in session 15, against 67.0% at B=16
        # the blocks' float8 scales per row instead of per tensor, beside the tensorwise recipe, at B=32 (#18)
        rowwise32) CUDA_VISIBLE_DEVICES=0 run qwen-b32-fp8-rowwise 330 python3 bench/bench_train.py --device cuda \
                --shape qwen3-0.6b --no-peer --no-plain --batch 32 --steps 6 --warmup 4 \
                --variants master-weights-fp8fa-graph,master-weights-fp8fa-rowwise-graph ;;
        # the README's qwen3-0.6b row as set (B=8), against transformers in the same run
        asset06b) CUDA_VISIBLE_DEVICES=0 run qwen06b-as-set 480 python3 bench/bench_train.py --device cuda \
                --shape qwen3-0.6b --variants master-weights-graph ;;
        # the README's llama-1.3b row as set (B=4), against transformers in the same run
        asset13b) CUDA_VISIBLE_DEVICES=0 run llama13b-as-set 260 python3 bench/bench_train.py --device cuda \
                --shape llama-1.3b --variants master-weights-graph ;;
        qwen32) CUDA_VISIBLE_DEVICES=0 run qwen-b32-fp8-all-graph 300 python3 bench/bench_train.py --device cuda \
                --shape qwen3-0.6b --no-peer --no-plain --batch 32 --steps 6 --warmup 4 \
                --variants master-weights-fp8-all-graph ;;
        # where an accumulating master-weights step goes, and FP8 blocks over master weights with accumulation
        masterw) CUDA_VISIBLE_DEVICES=0 run prof-mw-accum 150 python3 bench/profile_train.py --shape llama-1.3b \
                --which ours --accum 8 --master-weights
             # the same step under the CUDA graph (bench_train read 127.8 ms a micro-batch with the capture timed)
             CUDA_VISIBLE_DEVICES=0 run prof-mw-accum-graph 150 python3 bench/profile_train.py --shape llama-1.3b \
                --which ours --accum 8 --master-weights --cuda-graph
             CUDA_VISIBLE_DEVICES=0 run llama-accum-fp8 300 python3 bench/bench_train.py --device cuda \
                --shape llama-1.3b --no-peer --accum 8 --steps 6 --warmup 3 --variants master-weights-fp8 ;;
        # the FP8 loss check at Qwen3-0.6B, both compiled (needs build/fp8-loss carried: bench_fp8_loss.py --build);
        # one run a part, each may be its own call: then `python3 bench/bench_fp8_loss.py --compare A.log B.log`
        fp8loss) CUDA_VISIBLE_DEVICES=0 run fp8-loss-qwen-bf16 400 python3 bench/bench_fp8_loss.py --shape qwen3-0.6b \
                --compile-scope blocks --runs baseline ;;
        fp8loss-fp8) CUDA_VISIBLE_DEVICES=0 run fp8-loss-qwen-fp8 500 python3 bench/bench_fp8_loss.py \
                --shape qwen3-0.6b --compile-scope blocks --runs fp8
                [ -f "$OUT/fp8-loss-qwen-bf16.log" ] && python3 bench/bench_fp8_loss.py --compare \
                "$OUT/fp8-loss-qwen-bf16.log" "$OUT/fp8-loss-qwen-fp8.log" ;;
        # train.fp8_projections=auto (k/v/o/down stay bf16 at Qwen3-0.6B, k/v at 1.3B) beside all projections, one call
        fp8auto) CUDA_VISIBLE_DEVICES=0 run qwen16-fp8auto 450 python3 bench/bench_train.py --device cuda \
                --shape qwen3-0.6b --no-peer --no-plain --batch 16 --steps 8 --warmup 4 \
                --variants master-weights-fp8-all-graph,master-weights-fp8auto-all-graph ;;
        # inductor's coordinate-descent tuning of every pointwise/reduction kernel (the float8 casts are ~70 ms of the
        # B=16 step); session 16's try with 330 s did not finish compiling, so this part has the whole call
        cdtune) CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 run qwen16-fp8-cdtune 560 \
                python3 bench/bench_train.py --device cuda --shape qwen3-0.6b --no-peer --no-plain --batch 16 --steps 8 \
                --warmup 4 --variants master-weights-fp8-all-graph ;;
        # FSDP2's host work on one GPU (a one-rank group, no communication) against the plain Trainer, before and
        # with fsdp_unit_blocks/fsdp_prefetch and the local-shard optimizer (47c9b32 read 0.91x): the 2-GPU proxy
        fsdp1) run fsdp-one-rank 560 python3 bench/bench_scaling.py --shape llama-1.3b --gpus 1 --methods fsdp \
                --job-timeout-s 170 --variants "" "fsdp_unit_blocks=4,fsdp_prefetch=true" ;;
        # fast accumulation in the float8 GEMMs (train.fp8_fast_accum): each GEMM off/on, then Qwen3-0.6B B=16 with
        # torchao's default (the forward only) beside all three GEMMs fast, one call
        fastaccum) CUDA_VISIBLE_DEVICES=0 run probe-fast-accum-qwen 70 python3 bench/probe_fp8_fast_accum.py \
                --shape qwen3-0.6b --tokens 32768
            CUDA_VISIBLE_DEVICES=0 run probe-fast-accum-1.3b 45 python3 bench/probe_fp8_fast_accum.py \
                --shape llama-1.3b --tokens 16384
            CUDA_VISIBLE_DEVICES=0 run qwen16-fast-accum 420 python3 bench/bench_train.py --device cuda \
                --shape qwen3-0.6b --no-peer --no-plain --batch 16 --steps 8 --warmup 4 \
                --variants master-weights-fp8-all-graph,master-weights-fp8fa-all-graph ;;
        # the same at micro-batch 32 (67.7% in session 15 with the default), then B=16 with every GEMM fast alone
        fastaccum32) nvidia-smi --query-gpu=name,power.limit,power.max_limit,clocks.max.sm,clocks.sm --format=csv
            CUDA_VISIBLE_DEVICES=0 run qwen32-fast-accum 400 python3 bench/bench_train.py --device cuda \
                --shape qwen3-0.6b --no-peer --no-plain --batch 32 --steps 6 --warmup 4 \
                --variants master-weights-fp8-all-graph,master-weights-fp8fa-all-graph
            CUDA_VISIBLE_DEVICES=0 run qwen16-fast-accum-all 175 python3 bench/bench_train.py --device cuda \
                --shape qwen3-0.6b --no-peer --no-plain --batch 16 --steps 8 --warmup 4 \
                --variants master-weights-fp8fa-all-graph ;;
        # fast accumulation's GPU tests, its FP8 loss check (build/fp8-loss carried) and the B=32 figure again, one call
        fastaccum-check) CUBLAS_WORKSPACE_CONFIG=:4096:8 run gpu-tests-fast-accum 150 python3 -m pytest -q -rs -m gpu \
                tests/test_linear_ce_fp8.py tests/test_fp8_blocks.py -k "fast_accum or fast_accumulation or emulation"
            CUDA_VISIBLE_DEVICES=0 run fp8-loss-qwen-fp8fa 240 python3 bench/bench_fp8_loss.py \
                --shape qwen3-0.6b --compile-scope blocks --runs fp8 --fp8-fast-accum all
            CUDA_VISIBLE_DEVICES=0 run qwen32-fast-accum-all 185 python3 bench/bench_train.py --device cuda \
                --shape qwen3-0.6b --no-peer --no-plain --batch 32 --steps 6 --warmup 4 \
                --variants master-weights-fp8fa-all-graph ;;
        # the like-for-like FP8 peer at 1.3B B=8: transformers bf16, transformers + torchao float8 layers, our FP8 blocks
        peerfp8) CUDA_VISIBLE_DEVICES=0 run llama-b8-peer-fp8 560 python3 bench/bench_train.py --device cuda \
                --shape llama-1.3b --batch 8 --steps 6 --warmup 3 --peer-fp8 --no-plain --variants master-weights-fp8 ;;
        # the FP8 loss check with every float8 GEMM accumulating fast (needs build/fp8-loss carried); compared with
        # the bf16 run's log of an earlier call when given as BF16_LOG
        fp8loss-fa) CUDA_VISIBLE_DEVICES=0 run fp8-loss-qwen-fp8fa 500 python3 bench/bench_fp8_loss.py \
                --shape qwen3-0.6b --compile-scope blocks --runs fp8 --fp8-fast-accum all
                [ -f "${BF16_LOG:-$OUT/fp8-loss-qwen-bf16.log}" ] && python3 bench/bench_fp8_loss.py --compare \
                "${BF16_LOG:-$OUT/fp8-loss-qwen-bf16.log}" "$OUT/fp8-loss-qwen-fp8fa.log" ;;
        # the FP8 loss check at Qwen3-0.6B, several runs at once on the one GPU (needs build/fp8-loss carried): the
        # losses do not depend on sharing it, their tokens/s do (not figures); each compiles on its own CPU cores, so
        # three runs take about one's time (139 s, session 23). LOSS_RUNS: "NAME ARGS...;NAME ARGS..." (at most four:
        # 33 GiB each); default bf16, FP8 blocks and head with torchao's fast accumulation (output), the same with
        # every GEMM fast (all). Then the verdict of this call's logs, one per FP8 recipe
        fp8loss-par)
            loss_par "${LOSS_RUNS:-bf16 --runs baseline;fp8head --runs fp8 --fp8-head;fp8head-fa --runs fp8 --fp8-head --fp8-fast-accum all}" ;;
        # the FP8 head's loss gradient in e5m2 beside the shipped e4m3 (bench/probe_fp8_head_tail.py: e4m3 x256 rounds
        # the unused ids' small entries to zero), every GEMM fast, bf16 beside; each run also scores held-out windows
        fp8loss-headgrad)
            loss_par "${LOSS_RUNS:-bf16 --runs baseline;head-e4m3 --runs fp8 --fp8-head --fp8-fast-accum all;head-e5m2 --runs fp8 --fp8-head --fp8-head-grad e5m2 --fp8-fast-accum all;blocks-fa --runs fp8 --fp8-fast-accum all}" ;;
        # the FP8 blocks without the FP8 head (whose loss fails the check at Qwen3-0.6B, session 23) at B=32, torchao's
        # fast accumulation beside every GEMM fast, one call
        qwen32-blocks) CUDA_VISIBLE_DEVICES=0 run qwen32-fp8-blocks 560 python3 bench/bench_train.py --device cuda \
                --shape qwen3-0.6b --no-peer --no-plain --batch 32 --steps 6 --warmup 4 \
                --variants master-weights-fp8-graph,master-weights-fp8fa-graph ;;
        # the FP8 blocks at 1.3B with every GEMM fast and the CUDA graph, against the float8 peer as torchao
        # publishes it and with every GEMM fast too (like for like), one call
        peerfp8fa) CUDA_VISIBLE_DEVICES=0 run llama-b8-peer-fp8fa 570 python3 bench/bench_train.py --device cuda \
                --shape llama-1.3b --batch 8 --steps 6 --warmup 3 --peer-fp8 --peer-fp8-fast-accum output,all \
                --no-plain --variants master-weights-fp8fa-graph ;;
        # the recipes between: torchao's (only the forward GEMM fast) and the grad-input GEMM fast too, with the graph
        peerfp8gi) CUDA_VISIBLE_DEVICES=0 run llama-b8-peer-fp8gi 570 python3 bench/bench_train.py --device cuda \
                --shape llama-1.3b --batch 8 --steps 6 --warmup 3 --peer-fp8 --no-peer --no-plain \
                --variants master-weights-fp8-graph,master-weights-fp8fagi-graph ;;
        # the FP8 loss check at 1.3B: bf16, FP8 blocks (torchao's fast accumulation) and every GEMM fast, at once
        fp8loss-13b)
            LOSS_SHAPE=llama-1.3b loss_par "${LOSS_RUNS:-bf16 --runs baseline;blocks --runs fp8;blocks-fa --runs fp8 --fp8-fast-accum all}" ;;
        *) echo "unknown part $part (tests|tests1|tests2|tests3|tests-par|train|decode|ddp|scale|rl|mfu|b8|qwen16|qwen32|masterw|fp8loss|fp8loss-fp8|fp8auto|cdtune|fsdp1|fastaccum|fastaccum32|fastaccum-check|fp8loss-fa|peerfp8|fp8loss-par|fp8loss-headgrad|qwen32-blocks|peerfp8fa|peerfp8gi|fp8loss-13b)"; exit 2 ;;
    esac
done
