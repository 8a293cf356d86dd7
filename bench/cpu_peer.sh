#!/bin/bash
# cpu_peer.sh: forge next to llama.cpp's CPU backend on this machine's CPU (forge through Mesa's
# lavapipe, a CPU Vulkan device), on the same GGUF files. For each model, alternating forge,
# llama.cpp, forge, llama.cpp (ROUNDS pairs, R repetitions inside each): llama.cpp as
# `llama-bench -m MODEL -p P -n N -r R -t T -ngl 0 -o jsonl` (avg_ts of its pp and tg tests,
# after its warm-up); forge in one of two ways (-f, or the model's default below):
#   bench: `forge bench MODEL -p P -n N -r R --json` (the median of R after a warm-up:
#          prefill_tok_s, decode_tok_s). forge bench also times forge_classify (64 prompts of
#          32 tokens, R + 1 times), which at lavapipe's ~2 prefill tok/s on the 1B shape is
#          ~20 minutes a run: hence
#   run:   R runs of `forge run MODEL --tokens "P ids" -n N --ctx P+N+1 --json` (the same
#          forge_metrics prefill_tok_s and decode_tok_s, model load not timed), their median;
#          one untimed run (-n 2) first per model.
# Prints a Markdown table (tok/s of the best run of each side, ratio forge / llama.cpp of the
# best and of the median runs) and writes one JSON line per model with every run's numbers.
# Models (default: all three):
#   stories260K    ../shared/models/stories260K/stories260K.gguf (F32); bench, P 128, N 128, R 5
#   llama1b-q4_0   the Llama-3.2-1B shape, Q4_0: WORK/llama1b-q4_0/model.gguf, made by
#                  tools/make_bench_model.py llama1b-q4_0; run, P 64, N 16, R 2
#   qwen3-0.6b     the Qwen3-0.6B shape: tools/make_bench_model.py qwen3-0.6b-f16 (HF safetensors,
#                  F16) into WORK/qwen3-0.6b-f16, converted by tools/hf_to_gguf.py --outtype q8_0
#                  (QWEN3_OUTTYPE: q8_0, f16, q4_0 or f32) to WORK/qwen3-0.6b-q8_0.gguf with
#                  make_bench_model.py's synthetic vocabulary added (hf_to_gguf writes none for a
#                  checkpoint without tokenizer files, and llama.cpp loads no GGUF without one);
#                  run, P 64, N 16, R 2
#   FILE.gguf      any other GGUF file; bench, P 64, N 16, R 2
# each optionally NAME:P:N[:R]. Files that exist are not made again (a make_bench_model.py
# still writing one is waited for). The peer: llama-bench built against node-llama-cpp 3.21.1's
# prebuilt libraries by ../shared/tools/llama-cpp-peer/make_peer.sh into .peer/ (ignored by
# git), made when .peer/lcv/llama-bench is missing; with no Vulkan device but lavapipe, its
# Vulkan backend finds none and llama.cpp runs on its CPU backend (libggml-cpu-*.so, picked by
# the processor). Threads: llama.cpp -t T, lavapipe LP_NUM_THREADS=T (unless already set).
#   usage: bash bench/cpu_peer.sh [-o OUT.md] [-j OUT.jsonl] [-w WORK] [-t THREADS] [-k ROUNDS]
#                                 [-f bench|run] [-p P] [-n N] [-r R] [MODEL[:P:N[:R]] ...]
#     -o: the Markdown (default: stdout); -j: the JSON lines (default: OUT.md's name with .jsonl,
#     else WORK/cpu_peer.jsonl); -w: models and logs (default /tmp/bench, never in the repo;
#     each call's logs in WORK/runs/TIME); -t: threads (default: nproc); -k: forge/llama.cpp
#     pairs a model (default 2); -f: how forge is timed, for every model; -p/-n/-r: for every model
#   env: FORGE (./build/forge), PEER_DIR (.peer), QWEN3_OUTTYPE (q8_0), PYTHON (/usr/bin/python3)
#   needs: ./build/forge, python3 with numpy; for the peer npm, git, g++ and xz (make_peer.sh's)
# Takes ~5 minutes on 2 idle cores (mostly forge on the 1B and Qwen3 shapes, 30-60 s a run),
# twice that when other jobs share the cores; the first time ~2 minutes more (building the
# peer, making the Qwen3 checkpoint and converting it).
set -eu
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
FORGE=${FORGE:-$REPO/build/forge}
PEER_DIR=$(realpath -m "${PEER_DIR:-$REPO/.peer}")
PYTHON=${PYTHON:-/usr/bin/python3}
QWEN3_OUTTYPE=${QWEN3_OUTTYPE:-q8_0}
OUT= JSONL= WORK=/tmp/bench THREADS=$(nproc) ROUNDS=2 MODE_ALL= P_ALL= N_ALL= R_ALL=
usage() { sed -n '/^#   usage:/,/^#   needs:/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while getopts "o:j:w:t:k:f:p:n:r:h" opt; do
    case $opt in
        o) OUT=$OPTARG ;; j) JSONL=$OPTARG ;; w) WORK=$OPTARG ;; t) THREADS=$OPTARG ;; k) ROUNDS=$OPTARG ;;
        f) MODE_ALL=$OPTARG ;; p) P_ALL=$OPTARG ;; n) N_ALL=$OPTARG ;; r) R_ALL=$OPTARG ;; *) usage ;;
    esac
done
shift $((OPTIND - 1))
case ${MODE_ALL:-bench} in bench|run) ;; *) usage ;; esac
[ $# -gt 0 ] || set -- stories260K llama1b-q4_0 qwen3-0.6b
WORK=$(realpath -m "$WORK")
case "$WORK/" in "$REPO"/*) echo "cpu_peer.sh: the work dir must be outside the repo" >&2; exit 2 ;; esac
[ -x "$FORGE" ] || { echo "cpu_peer.sh: $FORGE is missing: build forge first (make)" >&2; exit 1; }
[ -n "$JSONL" ] || { [ -n "$OUT" ] && JSONL=${OUT%.md}.jsonl || JSONL=$WORK/cpu_peer.jsonl; }
export LP_NUM_THREADS=${LP_NUM_THREADS:-$THREADS}
log() { echo "cpu_peer: $*" >&2; }
COMMIT=$(git rev-parse --short HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || COMMIT="$COMMIT (+ uncommitted changes)"
FORGE_BIN_TIME=$(date -u -r "$FORGE" +%Y-%m-%dT%H:%M:%SZ)
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
RUNS=$WORK/runs/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$RUNS"

# the peer: llama-bench and its libraries in $PEER_DIR/lcv
LCV=$PEER_DIR/lcv
if [ ! -x "$LCV/llama-bench" ]; then
    if [ ! -f "$PEER_DIR/lcv.tar.xz" ]; then
        log "building llama-bench into $PEER_DIR (make_peer.sh: a minute or two)"
        mkdir -p "$PEER_DIR"
        bash "$REPO/../shared/tools/llama-cpp-peer/make_peer.sh" "$PEER_DIR" > "$PEER_DIR/make_peer.log" 2>&1 \
            || { tail -20 "$PEER_DIR/make_peer.log" >&2; exit 1; }
    fi
    tar xJf "$PEER_DIR/lcv.tar.xz" -C "$PEER_DIR"
fi
llama_bench() { LD_LIBRARY_PATH=$LCV${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$LCV/llama-bench" "$@"; }

# waits for a make_bench_model.py writing DIR (started elsewhere), then makes DIR if missing
make_preset() {  # PRESET DIR FILE_IN_DIR
    while pgrep -f "make_bench_model.py $1 $2( |\$)" > /dev/null; do
        log "waiting for the make_bench_model.py writing $2"; sleep 10
    done
    [ -f "$2/$3" ] && return 0
    log "making $1 in $2"
    rm -rf "$2.part"
    "$PYTHON" -B tools/make_bench_model.py "$1" "$2.part" > "$RUNS/make_$1.log" 2>&1 \
        || { tail -5 "$RUNS/make_$1.log" >&2; return 1; }
    rm -rf "$2" && mv "$2.part" "$2"
}

# tools/hf_to_gguf.py's conversion plus make_bench_model.py's synthetic vocabulary (n_vocab tokens)
to_gguf() {  # HF_DIR OUT.gguf OUTTYPE
    [ -f "$2" ] && return 0
    log "converting $1 to $2 ($3)"
    local L=$RUNS/convert_$(basename "$2").log
    "$PYTHON" -B - "$1" "$2.part" "$3" > "$L" 2>&1 <<'EOF' || { tail -5 "$L" >&2; return 1; }
import sys
sys.path.insert(0, "tools")
import hf_to_gguf as gg
import make_bench_model as mb
base = gg.gguf_metadata
def metadata(w, config, outtype, name):
    base(w, config, outtype, name)
    mb.synthetic_vocab(w, gg.hparams_of(config)[0]["vocab_size"])
gg.gguf_metadata = metadata
gg.convert(sys.argv[1], sys.argv[2], sys.argv[3])
EOF
    mv "$2.part" "$2"
}

# MODEL[:P:N[:R]] -> "name path mode P N R", making the file if need be
resolve() {
    local name p n r path
    IFS=: read -r name p n r <<< "$1"
    case $name in
        stories260K|stories260k) name=stories260K; path=$REPO/../shared/models/stories260K/stories260K.gguf; set -- bench 128 128 5 ;;
        llama1b-q4_0)
            make_preset llama1b-q4_0 "$WORK/llama1b-q4_0" model.gguf
            path=$WORK/llama1b-q4_0/model.gguf; set -- run 64 16 2 ;;
        qwen3-0.6b*)
            make_preset qwen3-0.6b-f16 "$WORK/qwen3-0.6b-f16" config.json
            path=$WORK/qwen3-0.6b-$QWEN3_OUTTYPE.gguf
            to_gguf "$WORK/qwen3-0.6b-f16" "$path" "$QWEN3_OUTTYPE"
            name=qwen3-0.6b-$QWEN3_OUTTYPE; set -- run 64 16 2 ;;
        *.gguf) path=$(realpath "$name"); name=$(basename "$name" .gguf); set -- bench 64 16 2 ;;
        *) echo "cpu_peer.sh: unknown model $name" >&2; return 2 ;;
    esac
    [ -f "$path" ] || { echo "cpu_peer.sh: $path is missing" >&2; return 1; }
    echo "$name $path ${MODE_ALL:-$1} ${P_ALL:-${p:-$2}} ${N_ALL:-${n:-$3}} ${R_ALL:-${r:-$4}}"
}

MODELS=()
for spec in "$@"; do m=$(resolve "$spec"); MODELS+=("$m"); done

for m in "${MODELS[@]}"; do
    read -r name path mode P N R <<< "$m"
    IDS=$(for i in $(seq 0 $((P - 1))); do printf '%d ' $((259 + i * 37 % 253)); done)  # ids < 512: every vocab here
    if [ "$mode" = run ]; then
        log "$name: an untimed forge run first"
        "$FORGE" run "$path" --tokens "$IDS" -n 2 --ctx $((P + N + 1)) --json > /dev/null 2> "$RUNS/$name.forge.warmup.err" \
            || { log "forge failed:"; tail -3 "$RUNS/$name.forge.warmup.err" >&2; }
    fi
    for k in $(seq 1 "$ROUNDS"); do
        log "$name -p $P -n $N -r $R: forge $mode ($k/$ROUNDS)"
        t0=$(date +%s)
        if [ "$mode" = bench ]; then
            "$FORGE" bench "$path" -p "$P" -n "$N" -r "$R" --json > "$RUNS/$name.forge.$k.json" 2> "$RUNS/$name.forge.$k.err" \
                || { log "forge failed:"; tail -3 "$RUNS/$name.forge.$k.err" >&2; }
        else
            for i in $(seq 1 "$R"); do
                "$FORGE" run "$path" --tokens "$IDS" -n "$N" --ctx $((P + N + 1)) --json \
                    > "$RUNS/$name.forge.$k.$i.json" 2> "$RUNS/$name.forge.$k.$i.err" \
                    || { log "forge failed:"; tail -3 "$RUNS/$name.forge.$k.$i.err" >&2; }
            done
        fi
        log "  $(( $(date +%s) - t0 )) s; llama.cpp ($k/$ROUNDS)"
        t0=$(date +%s)
        llama_bench -m "$path" -p "$P" -n "$N" -r "$R" -t "$THREADS" -ngl 0 -o jsonl \
            > "$RUNS/$name.llama.$k.jsonl" 2> "$RUNS/$name.llama.$k.err" \
            || { log "llama-bench failed:"; tail -3 "$RUNS/$name.llama.$k.err" >&2; }
        log "  $(( $(date +%s) - t0 )) s"
    done
done

# the header's facts, then the table and the JSON lines
CPU=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
MESA=$(vulkaninfo --summary 2>/dev/null | sed -n 's/^[[:space:]]*driverInfo *= *//p' | head -1 || true)
FORGE_BIN_NOW=$(date -u -r "$FORGE" +%Y-%m-%dT%H:%M:%SZ)
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)
export COMMIT CPU MESA THREADS ROUNDS RUNS LP_NUM_THREADS FORGE_BIN_TIME FORGE_BIN_NOW LOAD0 LOAD1
"$PYTHON" -B - "$JSONL" "${MODELS[@]}" > "$RUNS/table.md" <<'EOF'
import glob, json, os, re, statistics, sys
env = os.environ
runs, jsonl_path = env["RUNS"], sys.argv[1]
rounds = int(env["ROUNDS"])

def read_json(path):
    try:
        t = open(path).read()
        return json.loads(t[t.index("{"):])
    except (OSError, ValueError):
        return None

def forge_round(name, k, mode, n_gen):
    """(prefill, decode, info) of round k: forge bench's medians, or the median of the forge runs."""
    if mode == "bench":
        d = read_json(f"{runs}/{name}.forge.{k}.json")
        return (d.get("prefill_tok_s"), d.get("decode_tok_s"), d) if d else (None, None, {})
    ds = [read_json(p) for p in sorted(glob.glob(f"{runs}/{name}.forge.{k}.*.json"))]
    ds = [d for d in ds if d and d.get("status") == "FORGE_OK"]
    short = [d["generated_tokens"] for d in ds if d.get("generated_tokens") != n_gen]
    if short:
        print(f"note: {name}: forge run stopped early ({short} of {n_gen} tokens)", file=sys.stderr)
    if not ds:
        return None, None, {}
    return (statistics.median(d["prefill_tok_s"] for d in ds), statistics.median(d["decode_tok_s"] for d in ds), ds[0])

def llama_round(name, k):
    pp = tg = None
    info = {}
    try:
        text = open(f"{runs}/{name}.llama.{k}.jsonl").read()
    except OSError:
        return None, None, info
    for line in re.findall(r"\{.*\}", text):  # its last line has no newline
        try:
            d = json.loads(line)
        except ValueError:
            continue
        info = d
        if d.get("n_prompt", 0) > 0 and d.get("n_gen", 0) == 0:
            pp = d["avg_ts"]
        elif d.get("n_gen", 0) > 0 and d.get("n_prompt", 0) == 0:
            tg = d["avg_ts"]
    return pp, tg, info

def backend_of(errs):
    for e in errs:
        t = open(e).read()
        m = re.findall(r"loaded CPU backend from \S*/(\S+)", t)
        if m:
            return f"its CPU backend, {m[-1]} ({'Vulkan: no devices' if 'No devices found' in t else 'a Vulkan device was found'})"
    return "?"

def best_median(v):
    v = [x for x in v if x]
    return (max(v), statistics.median(v)) if v else (None, None)

def ratio(a, b):
    return a / b if a and b else None

def f(x):  # tok/s
    return "—" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"

def fr(x):  # a ratio
    return "—" if x is None else f"{x:.3g}"

rows, lines, forge_info, llama_info = [], [], {}, {}
for spec in sys.argv[2:]:
    name, path, mode, P, N, R = spec.split()
    fo = [forge_round(name, k, mode, int(N)) for k in range(1, rounds + 1)]
    lo = [llama_round(name, k) for k in range(1, rounds + 1)]
    forge_info.update(next((x[2] for x in fo if x[2].get("device")), {}))
    llama_info.update(next((x[2] for x in lo if x[2]), {}))
    fi = next((x[2] for x in fo if x[2]), {})
    li = next((x[2] for x in lo if x[2]), {})
    s = {"f_pp": best_median([x[0] for x in fo]), "f_tg": best_median([x[1] for x in fo]),
         "l_pp": best_median([x[0] for x in lo]), "l_tg": best_median([x[1] for x in lo])}
    rec = {"model": name, "path": path, "forge_mode": mode, "n_prompt": int(P), "n_gen": int(N), "reps": int(R),
           "rounds": rounds, "threads": int(env["THREADS"]), "lp_num_threads": int(env["LP_NUM_THREADS"]),
           "forge": {"prefill_tok_s": [x[0] for x in fo], "decode_tok_s": [x[1] for x in fo],
                     "best": {"prefill": s["f_pp"][0], "decode": s["f_tg"][0]},
                     "median": {"prefill": s["f_pp"][1], "decode": s["f_tg"][1]},
                     "dtype": fi.get("dtype"), "kv_type": fi.get("kv_type")},
           "llama_cpp": {"prefill_tok_s": [x[0] for x in lo], "decode_tok_s": [x[1] for x in lo],
                         "best": {"prefill": s["l_pp"][0], "decode": s["l_tg"][0]},
                         "median": {"prefill": s["l_pp"][1], "decode": s["l_tg"][1]},
                         "model_type": li.get("model_type"), "type_k": li.get("type_k")},
           "ratio_best": {"prefill": ratio(s["f_pp"][0], s["l_pp"][0]), "decode": ratio(s["f_tg"][0], s["l_tg"][0])},
           "ratio_median": {"prefill": ratio(s["f_pp"][1], s["l_pp"][1]), "decode": ratio(s["f_tg"][1], s["l_tg"][1])},
           "commit": env["COMMIT"], "cpu": env["CPU"], "mesa": env.get("MESA") or fi.get("driver"), "runs_dir": runs}
    lines.append(json.dumps(rec))
    rb, rm = rec["ratio_best"], rec["ratio_median"]
    rows.append(f"| {name} | {mode} | {P} / {N} / {R} | {f(s['f_pp'][0])} | {f(s['l_pp'][0])} | **{fr(rb['prefill'])}** ({fr(rm['prefill'])}) "
                f"| {f(s['f_tg'][0])} | {f(s['l_tg'][0])} | **{fr(rb['decode'])}** ({fr(rm['decode'])}) |")
with open(jsonl_path, "w") as out:
    out.write("".join(l + "\n" for l in lines))
print(f"forge vs llama.cpp on the CPU: commit {env['COMMIT']}, build/forge of {env['FORGE_BIN_TIME']}")
print()
if env["FORGE_BIN_NOW"] != env["FORGE_BIN_TIME"]:
    print(f"**warning: build/forge changed during the runs (now {env['FORGE_BIN_NOW']}): some runs used the new binary**")
    print()
print(f"- CPU: {env['CPU']}, {os.cpu_count()} cores; load average (1, 5, 15 min) {env['LOAD0']} at the start, "
      f"{env['LOAD1']} at the end (other jobs on the cores skew both sides, llama.cpp's spinning threads most)")
print(f"- forge: {forge_info.get('device', '?')}, {env.get('MESA') or forge_info.get('driver', '?')}, "
      f"LP_NUM_THREADS={env['LP_NUM_THREADS']}")
print(f"- llama.cpp: llama-bench on node-llama-cpp 3.21.1's prebuilt libraries, -t {env['THREADS']} -ngl 0, "
      f"{backend_of(sorted(glob.glob(f'{runs}/*.llama.*.err')))}")
print(f"- {rounds} runs a side, alternating (forge, llama.cpp, forge, ...); tok/s of the best run; ratio forge / "
      f"llama.cpp of the best runs (of the median runs). forge bench: the median of R after a warm-up; forge run: "
      f"the median of R processes; llama-bench: the mean of R after a warm-up")
print()
print("| model | forge | P / N / R | prefill forge | prefill llama.cpp | ratio | decode forge | decode llama.cpp | ratio |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|")
print("\n".join(rows))
print()
print("prefill: P prompt tokens from an empty cache (forge: through the first sampled token); decode: forge's N - 1 "
      "greedy tokens after the prompt, llama-bench's tg test of N tokens from an empty cache.")
EOF
if [ -n "$OUT" ]; then cp "$RUNS/table.md" "$OUT"; log "wrote $OUT and $JSONL"; else cat "$RUNS/table.md"; log "wrote $JSONL"; fi
