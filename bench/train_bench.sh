#!/bin/bash
# train_bench.sh: one call on the GPU machine (see the device tool's README): forge's LoRA
# training speed next to PyTorch + PEFT on the same checkpoint and GPU. The Llama-3.2-1B shape
# (tools/make_bench_model.py: llama1b-f16 safetensors, llama1b-q4_0 GGUF of the same weights),
# batch 4 x 512 tokens, LoRA r 16 on all seven projections, with and without gradient
# checkpointing: `forge bench MODEL --train` and bench/train_torch.py (bf16 autocast, eager
# attention). Binaries come prebuilt in .devbin (with the .so files of cJSON, PCRE2 and
# utf8proc), the Vulkan loader as .debs in .gl, as for bench/device_run.sh. One JSON line per
# run on stdout; every file (JSON, logs, the test output) in $OUT/train_bench.tgz.
#   usage: bash bench/train_bench.sh [tests]     (tests: run forge_tests on the GPU first)
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
for p in llama1b-f16 llama1b-q4_0; do
    python3 tools/make_bench_model.py "$p" "/tmp/models/$p" > "$RES/make_$p.log" 2>&1 &
done
if [ "${1:-}" = tests ]; then
    (mkdir -p /tmp/t && cd /tmp/t && FORGE_SOURCE_DIR=$REPO "$BIN/forge_tests" --gtest_filter='-*QuantFixture*:Tok*:*Tokenizer*:*Chat*' > "$RES/tests.txt" 2>&1)
    echo "tests exit $?"; grep -E "tests ran|PASSED|FAILED|validation loss|named\|" "$RES/tests.txt" | tail -14
fi
wait
ARGS="--batch ${BATCH:-4} --seq ${SEQ:-512} --rank ${RANK:-16} --targets all -r ${REPS:-5}"
for p in llama1b-f16 llama1b-q4_0; do
    M=/tmp/models/$p
    [ -f "$M/model.gguf" ] && M=$M/model.gguf
    for ck in no-grad-checkpoint grad-checkpoint; do
        "$BIN/forge" bench "$M" --train $ARGS --$ck ${PROFILE:+--profile} > "$RES/forge_${p}_$ck.json" 2> "$RES/forge_${p}_$ck.err"
        cat "$RES/forge_${p}_$ck.json"
        tail -c 300 "$RES/forge_${p}_$ck.err" >&2
    done
done
for ck in "" --grad-checkpoint; do
    python3 bench/train_torch.py /tmp/models/llama1b-f16 --batch "${BATCH:-4}" --seq "${SEQ:-512}" --rank "${RANK:-16}" --reps "${REPS:-5}" $ck \
        > "$RES/torch${ck:+_ckpt}.json" 2> "$RES/torch${ck:+_ckpt}.err"
    cat "$RES/torch${ck:+_ckpt}.json"
done
[ -n "${OUT:-}" ] && tar czf "$OUT/train_bench.tgz" -C "$RES" .
