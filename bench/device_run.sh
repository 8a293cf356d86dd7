#!/bin/bash
# device_run.sh: one call on the GPU machine (see the device tool's README): checks forge's
# test suite on the real GPU, writes the benchmark models (tools/make_bench_model.py) and runs
# `forge bench` on each. Binaries come prebuilt in .devbin (this machine has no glslang);
# the Vulkan loader comes as a .deb in .gl. Results go to $OUT.
#   usage: bash bench/device_run.sh [tests] [PRESET...]
set -u
REPO=$(pwd)
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
BIN=$REPO/.devbin
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/models
if ! "$BIN/forge" devices > "$OUT/devices.txt" 2>&1; then  # the NVIDIA ICD may need its manifest named
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    "$BIN/forge" devices > "$OUT/devices.txt" 2>&1
fi
cat "$OUT/devices.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>/dev/null
RUN_TESTS=0
if [ "${1:-}" = tests ]; then RUN_TESTS=1; shift; fi
PRESETS=("$@")
# write the models in the background while the tests run
for p in "${PRESETS[@]}"; do
    python3 tools/make_bench_model.py "$p" "/tmp/models/$p" > "$OUT/make_$p.log" 2>&1 &
done
if [ $RUN_TESTS = 1 ]; then
    (mkdir -p /tmp/t && cd /tmp/t && FORGE_SOURCE_DIR=$REPO "$BIN/forge_tests" --gtest_filter='-*QuantFixture*:Tok*:*Tokenizer*:*Chat*' > "$OUT/tests.txt" 2>&1)
    echo "tests exit $?"; grep -E "PASSED|FAILED|tests ran" "$OUT/tests.txt" | tail -12
fi
wait
for p in "${PRESETS[@]}"; do
    M=/tmp/models/$p
    [ -f "$M/model.gguf" ] && M=$M/model.gguf
    "$BIN/forge" bench "$M" -p 512 -n 128 -r 3 ${BENCH_ARGS:-} > "$OUT/bench_$p.json" 2> "$OUT/bench_$p.err"
    echo "$p: $(cat "$OUT/bench_$p.json") $(tail -c 300 "$OUT/bench_$p.err")"
done
