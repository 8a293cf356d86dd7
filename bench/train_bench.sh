#!/bin/bash
# train_bench.sh: one call on the GPU machine (see the device tool's README): forge's LoRA
# training speed next to PyTorch + PEFT on the same checkpoint and GPU, batch 4 x 512 tokens,
# LoRA r 16 on all seven projections, with and without gradient checkpointing: `forge bench MODEL
# --train` and bench/train_torch.py (bf16 weights and autocast; attention as a PyTorch user gets
# it, sdpa, and eager beside it on the 1B row). Rows (tools/make_bench_model.py writes the files):
#   1b  the Llama-3.2-1B shape: forge on llama1b-f16 (safetensors) and llama1b-q4_0 (GGUF of the
#       same weights), PyTorch on llama1b-f16 with sdpa and with eager attention
#   8b  the Llama-3.1-8B shape: forge on llama8b-q4_0 (QLoRA), PyTorch on llama8b-bf16 (the same
#       weights in BF16, 16 GB) with sdpa
# Binaries come prebuilt in .devbin (with the .so files of cJSON, PCRE2 and utf8proc), the Vulkan
# loader as .debs in .gl, as for bench/device_run.sh. One JSON line per run on stdout; every file
# (JSON, logs, the test output) in $OUT/train_bench.tgz.
#   usage: bash bench/train_bench.sh [tests] [1b] [8b]   (no row named: 1b; tests: forge_tests on the GPU first)
#   env: BATCH, SEQ, RANK, REPS (4, 512, 16, 5); PROFILE=1 adds forge's per-kernel profile
set -u
REPO=$(pwd)
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
BIN=$REPO/.devbin
export LD_LIBRARY_PATH=$BIN:${LD_LIBRARY_PATH:-}
RES=/tmp/train_bench
mkdir -p "$RES" /tmp/models
if ! "$BIN/forge" devices > "$RES/devices.txt" 2>&1; then  # the NVIDIA ICD may need its manifest named
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    "$BIN/forge" devices > "$RES/devices.txt" 2>&1
fi
head -3 "$RES/devices.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
RUN_TESTS=0
if [ "${1:-}" = tests ]; then RUN_TESTS=1; shift; fi
ROWS=("$@")
[ ${#ROWS[@]} -eq 0 ] && ROWS=(1b)
FORGE_MODELS=() TORCH_RUNS=() # TORCH_RUNS: "preset attention"
for row in "${ROWS[@]}"; do
    case $row in
        1b) FORGE_MODELS+=(llama1b-f16 llama1b-q4_0); TORCH_RUNS+=("llama1b-f16 sdpa" "llama1b-f16 eager") ;;
        8b) FORGE_MODELS+=(llama8b-q4_0); TORCH_RUNS+=("llama8b-bf16 sdpa") ;;
        *) echo "train_bench.sh: unknown row '$row' (1b, 8b)" >&2; exit 2 ;;
    esac
done
for p in "${FORGE_MODELS[@]}" $(printf '%s\n' "${TORCH_RUNS[@]}" | cut -d' ' -f1 | sort -u); do
    [ -e "/tmp/models/$p" ] || python3 tools/make_bench_model.py "$p" "/tmp/models/$p" > "$RES/make_$p.log" 2>&1 &
done
if [ $RUN_TESTS = 1 ]; then
    (mkdir -p /tmp/t && cd /tmp/t && FORGE_SOURCE_DIR=$REPO "$BIN/forge_tests" --gtest_filter='-*QuantFixture*:Tok*:*Tokenizer*:*Chat*' > "$RES/tests.txt" 2>&1)
    echo "tests exit $?"; grep -E "tests ran|PASSED|FAILED|validation loss|named\|" "$RES/tests.txt" | tail -14
fi
wait
ARGS="--batch ${BATCH:-4} --seq ${SEQ:-512} --rank ${RANK:-16} --targets all -r ${REPS:-5}"
for p in "${FORGE_MODELS[@]}"; do
    M=/tmp/models/$p
    [ -f "$M/model.gguf" ] && M=$M/model.gguf
    for ck in no-grad-checkpoint grad-checkpoint; do
        "$BIN/forge" bench "$M" --train $ARGS --$ck ${PROFILE:+--profile} > "$RES/forge_${p}_$ck.json" 2> "$RES/forge_${p}_$ck.err"
        cat "$RES/forge_${p}_$ck.json"
        tail -c 300 "$RES/forge_${p}_$ck.err" >&2
    done
done
for run in "${TORCH_RUNS[@]}"; do
    read -r p attn <<< "$run"
    for ck in "" --grad-checkpoint; do
        name=torch_${p}_$attn${ck:+_ckpt}
        python3 bench/train_torch.py "/tmp/models/$p" --attn "$attn" --batch "${BATCH:-4}" --seq "${SEQ:-512}" --rank "${RANK:-16}" \
            --reps "${REPS:-5}" $ck > "$RES/$name.json" 2> "$RES/$name.err"
        cat "$RES/$name.json"
        [ -s "$RES/$name.json" ] || tail -c 300 "$RES/$name.err" >&2
    done
done
[ -n "${OUT:-}" ] && tar czf "$OUT/train_bench.tgz" -C "$RES" .
