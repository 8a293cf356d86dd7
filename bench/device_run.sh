#!/bin/bash
# device_run.sh: the bench matrix in one call on the GPU machine (see the device tool's README):
# optionally forge's test suite on the real GPU, then every preset of tools/make_bench_model.py
# written and measured with `forge bench -p 512 -n 128 -r 3`, then profiled (`-r 1 --profile`),
# and bench/RESULTS.md rewritten (bench/results.py) into $OUT/RESULTS.md: copy it over
# bench/RESULTS.md after the call. Binaries come prebuilt in .devbin (the GPU machine has no
# glslang), with the libraries of cJSON, PCRE2 and utf8proc beside them; the Vulkan loader and
# the GL dispatch libraries as .debs in .gl; the commit in .devbin/COMMIT (the machine has no
# .git). ../shared/quant-fixtures, for the suite, from .fx/shared when it is carried.
# llama.cpp beside forge: when .peer/lcv.tar.xz is carried (llama-bench and llama.cpp's prebuilt
# Vulkan libraries, from ../shared/tools/llama-cpp-peer/make_peer.sh; .peer/ is git-ignored), each
# GGUF preset is also measured by `llama-bench -m MODEL -p 512 -n 128 -r 3 -ngl 99 -o jsonl`
# right after forge's bench on the same file, after one unrecorded llama-bench run (its first run
# of a model compiles the pipelines); LLAMA_ARGS adds llama-bench options. Its pp512 / tg128
# lines go to $WORK/llama_PRESET.jsonl and $OUT/llama.jsonl, and RESULTS.md's section puts them
# beside forge's figures.
# $OUT gets few files (the device tool returns 8): RESULTS.md, bench.jsonl (one forge bench
# object a line), llama.jsonl (llama-bench's lines, when it ran), profile_PRESET.json of the two
# profiled files, tests.txt and log.txt (model writing and bench messages); the rest stays in
# $WORK.
#   usage: bash bench/device_run.sh [tests] [PRESET...]   (no PRESET: all of them)
#   e.g. the Qwen 3.5 pair (issue 36): bash bench/device_run.sh qwen35-2b-f16 qwen35moe-35b-a3b-q4_0
set -u
REPO=$(pwd)
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
BIN=$REPO/.devbin
export LD_LIBRARY_PATH=$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
OUT=${OUT:-/tmp/out}
MODELS=${MODELS:-/tmp/models}
WORK=${WORK:-/tmp/bench-work}
rm -rf "$WORK"
mkdir -p "$OUT" "$MODELS" "$WORK"
rm -f "$OUT/bench.jsonl" "$OUT/llama.jsonl"
LLAMA_BENCH=
if [ -f .peer/lcv.tar.xz ]; then
    tar xJf .peer/lcv.tar.xz -C "$WORK" && LLAMA_BENCH=$WORK/lcv/llama-bench
fi
if ! "$BIN/forge" devices > "$WORK/devices.txt" 2>&1; then  # the NVIDIA ICD may need its manifest named
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    "$BIN/forge" devices > "$WORK/devices.txt" 2>&1
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>/dev/null
RUN_TESTS=0
if [ "${1:-}" = tests ]; then RUN_TESTS=1; shift; fi
PRESETS=("$@")
[ ${#PRESETS[@]} -eq 0 ] && PRESETS=(llama8b-q4_0 llama1b-f16 llama1b-q4_0 llama1b-q8_0 qwen3-0.6b-f16 gemma3-1b-bf16)
# the models are written in the background while the tests run (a preset already there is kept)
for p in "${PRESETS[@]}"; do
    [ -e "$MODELS/$p/config.json" ] || [ -e "$MODELS/$p/model.gguf" ] ||
        python3 tools/make_bench_model.py "$p" "$MODELS/$p" > "$WORK/make_$p.log" 2>&1 &
done
if [ $RUN_TESTS = 1 ]; then
    [ -d .fx/shared/quant-fixtures ] && mkdir -p ../shared && cp -r .fx/shared/quant-fixtures ../shared/
    # in shards, a process each: on the H100 machine vkCreateInstance began to fail
    # (VK_ERROR_INCOMPATIBLE_DRIVER) after about 30 model loads in one process (2026-11-26, the
    # binaries of e3d950d and dee5d54 alike), which failed every test after that point
    rm -f "$OUT/tests.txt"
    SHARDS=${TEST_SHARDS:-8}
    for ((i = 0; i < SHARDS; i++)); do
        (mkdir -p /tmp/t && cd /tmp/t && GTEST_TOTAL_SHARDS=$SHARDS GTEST_SHARD_INDEX=$i FORGE_SOURCE_DIR=$REPO \
            timeout "${TEST_TIMEOUT:-400}" "$BIN/forge_tests" \
            --gtest_filter="${TESTS:--*QuantFixture*:Tok*:*Tokenizer*:*Chat*:*Cli*}" >> "$OUT/tests.txt" 2>&1)
        echo "tests, shard $i of $SHARDS: exit $?"
    done
    grep -E "^\[  (PASSED|FAILED) " "$OUT/tests.txt" | tail -12
fi
wait
for p in "${PRESETS[@]}"; do
    M=$MODELS/$p
    [ -f "$M/model.gguf" ] && M=$M/model.gguf
    "$BIN/forge" bench "$M" -p 512 -n 128 -r 3 ${BENCH_ARGS:-} > "$WORK/bench_$p.json" 2> "$WORK/bench_$p.err"
    echo "$p: $(cat "$WORK/bench_$p.json") $(tail -c 300 "$WORK/bench_$p.err")"
    cat "$WORK/bench_$p.json" >> "$OUT/bench.jsonl"
    if [ -n "$LLAMA_BENCH" ] && [ "${M%.gguf}" != "$M" ]; then
        # llama-bench finds its backends beside itself; the first run compiles pipelines
        LD_LIBRARY_PATH=$WORK/lcv "$LLAMA_BENCH" -m "$M" -p 512 -n 128 -r 1 -ngl 99 ${LLAMA_ARGS:-} \
            > /dev/null 2> "$WORK/llama_$p.err"
        LD_LIBRARY_PATH=$WORK/lcv "$LLAMA_BENCH" -m "$M" -p 512 -n 128 -r 3 -ngl 99 -o jsonl ${LLAMA_ARGS:-} \
            > "$WORK/llama_$p.jsonl" 2>> "$WORK/llama_$p.err"
        echo "$p, llama.cpp: $(grep -o '"n_prompt": [0-9]*, "n_gen": [0-9]*\|"avg_ts": [0-9.]*' "$WORK/llama_$p.jsonl" |
            tr '\n' ' ') $(tail -c 300 "$WORK/llama_$p.err")"
        cat "$WORK/llama_$p.jsonl" >> "$OUT/llama.jsonl"
    fi
    # every row profiled (results.py's decode account); the two Q4_0 files' profiles come back whole
    "$BIN/forge" bench "$M" -p 512 -n 128 -r 1 --profile ${BENCH_ARGS:-} > "$WORK/profile_$p.json" 2>> "$WORK/bench_$p.err"
    case $p in llama1b-q4_0 | llama8b-q4_0) cp "$WORK/profile_$p.json" "$OUT/" ;; esac
done
[ -f "$OUT/tests.txt" ] && cp "$OUT/tests.txt" "$WORK/"
tail -n 5 "$WORK"/*.log "$WORK"/*.err "$WORK/devices.txt" > "$OUT/log.txt" 2>/dev/null
python3 bench/results.py "$WORK" bench/RESULTS.md "$(cat "$BIN/COMMIT" 2>/dev/null || echo unknown)" > "$OUT/RESULTS.md" &&
    echo "wrote $OUT/RESULTS.md"
