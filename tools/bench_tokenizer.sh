#!/bin/sh
# Tokenizer speed, forge next to HuggingFace tokenizers, on the same text and machine.
#   tools/bench_tokenizer.sh [BUILD_DIR] [FAMILY ...]      (default: build, all four families)
# Writes ~1 MB of mixed-language text (bench/tokenizer_bench.js gen, deterministic), unpacks the
# real tokenizers from ../shared/tokenizers, installs the HF oracle from npm once, then for each
# family prints two JSON lines: `forge bench-tokenize` and the HF equivalent. Both: single thread
# (taskset to one core when available; HF with TOKENIZERS_PARALLELISM=false), whole text as one
# encode call, median of 3 after a warm-up, no special tokens; load_s is the tokenizer load.
set -eu
cd "$(dirname "$0")/.."
BUILD=${1:-build}
[ $# -gt 0 ] && shift
FAMILIES=${*:-llama3 qwen3 gemma3 gemma2}
SHARED=../shared
W=$BUILD/tokbench
mkdir -p "$W"
[ -x "$BUILD/forge" ] || { echo "build forge first (make)" >&2; exit 1; }
if [ ! -d "$W/hf/node_modules/tokenizers" ]; then
    mkdir -p "$W/hf" && cp "$SHARED/tools/hf-tokenizers/package.json" "$W/hf/"
    (cd "$W/hf" && npm install --no-save --no-package-lock --no-audit --no-fund >/dev/null 2>&1)
fi
[ -f "$W/text.txt" ] || node bench/tokenizer_bench.js gen "$W/text.txt" 1000000
PIN=""
command -v taskset >/dev/null 2>&1 && PIN="taskset -c 0"
for f in $FAMILIES; do
    [ -d "$W/$f" ] || tar xJf "$SHARED/tokenizers/$f.tar.xz" -C "$W"
    $PIN "$BUILD/forge" bench-tokenize "$W/$f" "$W/text.txt" -r 3
    TOKENIZERS_PARALLELISM=false NODE_PATH="$W/hf/node_modules" $PIN node bench/tokenizer_bench.js hf "$W/$f" "$W/text.txt" 3
done
