#!/bin/bash
# embed_bench.sh: one call on the GPU machine (see the device tool's README): forge's embedding
# throughput next to sentence-transformers on the same checkpoints, texts and GPU. Two shapes
# (bench/embed_bench.py make: Qwen3-Embedding-0.6B and EmbeddingGemma-300M, random BF16
# weights, real tokenizers, 1,000 texts of 64-512 tokens); `forge embed MODEL --stdin-json
# --json` (a warm-up run, then the timed one: its metrics' texts_per_s), then
# sentence-transformers' encode() (batch 32, BF16, the best of 3) and how far its vectors are
# from forge's; then forge's device time per kernel (--profile). Binaries come prebuilt in
# .devbin (with the .so files of cJSON, PCRE2 and utf8proc), the Vulkan loader as .debs in .gl,
# as for bench/device_run.sh; the tokenizers as
# ../shared/tokenizers' qwen3.tar.xz and gemma3.tar.xz copied into build/embfx/tgz. One JSON line
# per run on stdout; every file in $OUT/embed_bench.tgz.
#   usage: bash bench/embed_bench.sh [tests]   (tests: forge_tests' Embed* and Rerank* on the GPU first)
set -u
REPO=$(pwd)
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
BIN=$REPO/.devbin
export LD_LIBRARY_PATH=$BIN:${LD_LIBRARY_PATH:-}
RES=/tmp/embed_bench
MODELS=/tmp/embed_models
mkdir -p "$RES" "$MODELS"
if ! "$BIN/forge" devices > "$RES/devices.txt" 2>&1; then  # the NVIDIA ICD may need its manifest named
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    "$BIN/forge" devices > "$RES/devices.txt" 2>&1
fi
head -3 "$RES/devices.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
mkdir -p "$MODELS/tok"
for t in qwen3 gemma3; do tar xJf "build/embfx/tgz/$t.tar.xz" -C "$MODELS/tok"; done
python3 bench/embed_bench.py make "$MODELS" "$MODELS/tok" > "$RES/make.log" 2>&1 &
if [ "${1:-}" = tests ]; then
    (mkdir -p /tmp/t && cd /tmp/t && FORGE_SOURCE_DIR=$REPO "$BIN/forge_tests" --gtest_filter='Embed*:Rerank*:Classify*' > "$RES/tests.txt" 2>&1)
    echo "tests exit $?"; grep -E "tests ran|PASSED|FAILED|worst" "$RES/tests.txt" | tail -16
fi
wait
tail -3 "$RES/make.log"
for m in qwen3-embedding-0.6b embeddinggemma-300m; do
    "$BIN/forge" embed "$MODELS/$m" --stdin-json --json < "$MODELS/texts.json" > /dev/null 2> "$RES/forge_${m}_warm.err"
    "$BIN/forge" embed "$MODELS/$m" --stdin-json --json < "$MODELS/texts.json" > "$RES/forge_$m.json" 2> "$RES/forge_$m.err"
    python3 - "$RES/forge_$m.json" "$RES/forge_$m.f32" "$m" <<'EOF'
import json, sys, struct
r = json.load(open(sys.argv[1]))
with open(sys.argv[2], "wb") as f:
    for v in r["embeddings"]:
        f.write(struct.pack("<%df" % len(v), *v))
print(json.dumps({"model": sys.argv[3], "forge": r.get("metrics"), "dim": r.get("dim"), "texts": len(r["embeddings"])}))
EOF
    tail -c 300 "$RES/forge_$m.err" >&2
    python3 bench/embed_bench.py peer "$MODELS" "$m" "$RES/peer_$m.json" "$RES/forge_$m.f32" 2> "$RES/peer_$m.err" | tail -1
    rm -f "$RES/forge_$m.f32"
    # where forge's time goes: device time per kernel (a run of its own: timestamps cost a little)
    "$BIN/forge" embed "$MODELS/$m" --stdin-json --profile < "$MODELS/texts.json" > /dev/null 2> "$RES/profile_$m.json"
    python3 - "$RES/profile_$m.json" <<'EOF'
import json, sys
t = open(sys.argv[1]).read()
try:
    p = json.loads(t[t.index("{"):])
except Exception:
    print("no profile:", t[-300:]); sys.exit(0)
rows = p.get("kernels", p) if isinstance(p, dict) else p
items = sorted(((k, v.get("ms", 0) if isinstance(v, dict) else v) for k, v in (rows.items() if isinstance(rows, dict) else [])), key=lambda e: -e[1])
print("profile:", ", ".join("%s %.1f ms" % (k, v) for k, v in items[:8]))
EOF
done
[ -n "${OUT:-}" ] && tar czf "$OUT/embed_bench.tgz" -C "$RES" .
