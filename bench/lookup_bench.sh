#!/bin/bash
# lookup_bench.sh: prompt lookup (forge run --lookup N) against plain decoding, on the GPU
# machine in one call (binaries in .devbin and the Vulkan loader in .gl, as bench/device_run.sh)
# or here (FORGE=build/forge). Each row runs `forge run --json` with and without --lookup on the
# same model, prompt and seed, alternating, REPS times, and prints one JSON line a run: model,
# workload, lookup, decode_tok_s, generated_tokens, draft_tokens, draft_accepted, and whether
# the ids equal the plain run's (greedy: they must).
# Workloads:
#   repeat  stories260K (the one trained model here) on a prompt of a story twice and its start
#           again: the continuation repeats the prompt, which is what editing a given text does
#   free    stories260K from BOS alone: free generation, where drafts come from the model's own
#           repeats only
#   tokens  each bench preset named (tools/make_bench_model.py: random weights) on a prompt of
#           a 32-token pattern repeated 8 times; random weights do not copy text, so this row
#           measures what a verification pass of N + 1 rows costs against a decode step, and
#           its acceptance is whatever loops the random model falls into
#   draft   each TARGET:DRAFT pair of presets in DRAFTS (e.g. llama8b-q4_0:llama1b-q4_0, the same
#           vocabulary): the tokens prompt at temperature 0, the target alone against the target
#           with --draft DRAFT (--lookup N tokens a step). Random weights do not agree, so the
#           acceptance here is near nothing: the row measures what drafting and verifying cost,
#           which with the plain step time gives the speed-up at any acceptance rate
#   usage: bash bench/lookup_bench.sh [PRESET...]   env: N (lookup, 8), TOKENS (256), REPS (3),
#          DRAFTS (none)
set -u
REPO=$(pwd)
N=${N:-8} TOKENS=${TOKENS:-256} REPS=${REPS:-3}
MODELS=${MODELS:-/tmp/models}
if [ -z "${FORGE:-}" ]; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    export LD_LIBRARY_PATH=$REPO/.devbin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    FORGE=$REPO/.devbin/forge
    "$FORGE" devices > /dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
"$FORGE" devices 2>&1 | head -2
STORY="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day, she found a big red ball under a tree."
PROMPT_REPEAT="$STORY $STORY Once upon a time,"
PATTERN=$(python3 -c "print(' '.join(str(100 + (i * 7919) % 3000) for i in range(32)))")
PROMPT_TOKENS=$(for i in 1 2 3 4 5 6 7 8; do printf '%s ' "$PATTERN"; done)

# one run: model workload lookup args... -> a JSON line (ids kept for the comparison)
run() {
    local model=$1 workload=$2 lookup=$3
    shift 3
    local extra=()
    [ "$lookup" -gt 0 ] && extra=(--lookup "$lookup")
    [ "$lookup" -gt 0 ] && [ -n "${DRAFT_MODEL:-}" ] && extra+=(--draft "$DRAFT_MODEL")
    "$FORGE" run "$model" "$@" -n "$TOKENS" --json "${extra[@]}" 2> /tmp/lookup_err.txt |
        python3 -c "
import json, sys
d = json.loads(sys.stdin.read())
print(json.dumps({'model': sys.argv[1], 'workload': sys.argv[2], 'lookup': int(sys.argv[3]), 'decode_tok_s': d['decode_tok_s'],
                  'generated_tokens': d['generated_tokens'], 'draft_tokens': d.get('draft_tokens', 0),
                  'draft_accepted': d.get('draft_accepted', 0), 'ids': d['ids']}))" "$(basename "$model")" "$workload" "$lookup" ||
        { echo "lookup_bench: forge run failed on $model:" >&2; cat /tmp/lookup_err.txt >&2; }
}

# REPS alternations of plain and lookup; prints each run with same_ids against the plain run
row() {
    local model=$1 workload=$2
    shift 2
    for r in $(seq "$REPS"); do
        local plain looked
        plain=$(run "$model" "$workload" 0 "$@")
        looked=$(run "$model" "$workload" "$N" "$@")
        python3 -c "
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
same = a['ids'] == b['ids']
for d in (a, b):
    d['same_ids'] = same
    del d['ids']
    print(json.dumps(d))" "$plain" "$looked"
    done
}

STORIES=$REPO/models/stories260K/stories260K.gguf
"$FORGE" run "$STORIES" -n 8 > /dev/null 2>&1 # compiles the kernels (the first run only)
"$FORGE" run "$STORIES" -n 8 --lookup "$N" -p "$STORY $STORY" > /dev/null 2>&1
row "$STORIES" repeat -p "$PROMPT_REPEAT"
row "$STORIES" free
# a preset's model file, written when it is not there yet (empty when writing failed)
model_of() {
    local p=$1
    [ -e "$MODELS/$p" ] || python3 tools/make_bench_model.py "$p" "$MODELS/$p" > /tmp/lookup_make_$p.log 2>&1 ||
        { echo "lookup_bench: making $p failed" >&2; cat /tmp/lookup_make_$p.log >&2; return; }
    local m=$MODELS/$p
    [ -f "$m.gguf" ] && m=$m.gguf
    [ -d "$m" ] && [ -f "$m/model.gguf" ] && m=$m/model.gguf
    echo "$m"
}

for p in "$@"; do
    m=$(model_of "$p")
    [ -n "$m" ] || continue
    "$FORGE" run "$m" --tokens "1 2 3" -n 4 --lookup "$N" > /dev/null 2>&1 # warm-up: the pipelines
    row "$m" tokens --tokens "$PROMPT_TOKENS"
done
for pair in ${DRAFTS:-}; do
    m=$(model_of "${pair%%:*}") d=$(model_of "${pair#*:}")
    [ -n "$m" ] && [ -n "$d" ] || continue
    "$FORGE" run "$m" --tokens "1 2 3" -n 4 --lookup "$N" --draft "$d" > /dev/null 2>&1 # warm-up
    DRAFT_MODEL=$d row "$m" "draft:${pair#*:}" --tokens "$PROMPT_TOKENS"
done
