#!/usr/bin/env python3
"""results.py: bench/RESULTS.md's generated section from one bench/device_run.sh call.

    python3 bench/results.py OUT_DIR RESULTS.md COMMIT > NEW_RESULTS.md
    python3 bench/results.py --readme SOURCE README.md [COMMIT] > NEW_README.md

OUT_DIR holds what device_run.sh wrote: bench_PRESET.json (`forge bench MODEL -p 512 -n 128
-r 3`), profile_PRESET.json (the same with --profile, -r 1), llama_PRESET.jsonl (llama-bench's
pp512 / tg128 on the same file, when llama.cpp was carried: a table of both, measured) and
tests.txt when the suite ran.
The section (between the two MARK lines) replaces the one RESULTS.md has, or goes after its
title; the hand-written history below it stays. Targets and llama.cpp's figures are issue
10's (llama.cpp 3f545be, Vulkan with NV_coopmat2, the same machine kind and shapes).

--readme writes README.md with its speed table (between the two README_* MARK lines) made from
the same data: SOURCE is an OUT_DIR (then COMMIT is needed, as above) or a RESULTS.md, whose
generated section is read back (its device, date, commit and matrix rows). After a device run:

    python3 bench/results.py --readme bench/RESULTS.md README.md > README.new && mv README.new README.md

tests/test_docs.cpp checks that README.md's table is what this writes from bench/RESULTS.md."""
import json
import os
import re
import sys
import time

BEGIN = "<!-- bench/results.py: generated section, begin -->"
END = "<!-- bench/results.py: generated section, end -->"
README_BEGIN = "<!-- speed-table:begin: written by bench/results.py --readme from bench/RESULTS.md -->"
README_END = "<!-- speed-table:end -->"

# preset: (what it is, target pp512, target tg128, llama.cpp pp512, llama.cpp tg128)
ROWS = [
    ("llama8b-q4_0", "Llama-3.1-8B shape Q4_0", 10000, 500, 5000, 250),
    ("llama1b-f16", "Llama-3.2-1B shape F16", 27000, 900, 18055, 576),
    ("llama1b-q4_0", "Llama-3.2-1B shape Q4_0", 21000, 1200, 13860, 677),
    ("llama1b-q8_0", "Llama-3.2-1B shape Q8_0", None, None, 14837, 665),
    ("qwen3-0.6b-f16", "Qwen3-0.6B shape F16", 21000, 900, 14400, 512),
    ("gemma3-1b-bf16", "Gemma3-1B shape BF16", 20000, 700, None, None),
]
# presets outside the matrix, named in the table of figures measured beside llama.cpp; the ratio each
# must reach over llama.cpp's figure measured in the same call (issue 36: 1.2 x on the Qwen 3.5 pair)
OTHER = {"qwen35-2b-f16": ("Qwen3.5-2B shape F16", 1.2), "qwen35moe-35b-a3b-q4_0": ("Qwen3.5-35B-A3B shape Q4_0", 1.2),
         "qwen3moe-30b-a3b-q4_0": ("Qwen3-30B-A3B shape Q4_0", None), "gemma4-e2b-bf16": ("Gemma-4-E2B shape BF16", None),
         "llama1b-mlx4": ("Llama-3.2-1B shape MLX 4-bit", None)}
PROFILED = ["llama1b-q4_0", "llama8b-q4_0"]  # kernel and product tables; every row gets the decode token's account
READ_TB_S = 3.06  # what the H100 reads through Vulkan (research-notes/performance.md)


def load(path):
    try:
        with open(path) as f:
            lines = [l for l in f.read().splitlines() if l.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def num(v, digits=0):
    return "n/a" if v is None else f"{v:,.{digits}f}"


def verdict(got, target, ref):
    if got is None:
        return "not run"
    bar = max(x for x in (target, ref) if x is not None) if (target or ref) else None
    if bar is None:
        return ""
    return "met" if got >= bar else f"{got / bar:.2f} of it"


def what_is(preset):
    row = next((r for r in ROWS if r[0] == preset), None)
    return row[1] if row else OTHER.get(preset, (preset, None))[0]


def presets_run(out_dir):
    """The presets this call measured: the matrix's in its order, then the others by name."""
    names = {f[len("bench_"):-len(".json")] for f in os.listdir(out_dir) if f.startswith("bench_") and f.endswith(".json")}
    names |= {f[len("llama_"):-len(".jsonl")] for f in os.listdir(out_dir) if f.startswith("llama_") and f.endswith(".jsonl")}
    ordered = [p for p, *_ in ROWS if p in names]
    return ordered + sorted(names - set(ordered))


def load_llama(path):
    """llama-bench's `-o jsonl` lines: (pp tok/s, tg tok/s, backends and GPU) or None."""
    try:
        with open(path) as f:
            lines = [json.loads(l) for l in f.read().splitlines() if l.startswith("{")]
    except (OSError, ValueError):
        return None
    pp = next((r["avg_ts"] for r in lines if r.get("n_prompt") and not r.get("n_gen")), None)
    tg = next((r["avg_ts"] for r in lines if r.get("n_gen") and not r.get("n_prompt")), None)
    if not lines or (pp is None and tg is None):
        return None
    first = lines[0]
    # gpu_info is empty where the Vulkan backend found no device and llama.cpp ran on the CPU
    where = f"on {first['gpu_info']}" if first.get("gpu_info") else f"no GPU found: on the CPU ({first.get('cpu_info', '?')})"
    return pp, tg, f"llama.cpp {first.get('build_commit', '?')}, backends {first.get('backends', '?')}, {where}"


def ratio(got, ref, want):
    if got is None or not ref:
        return "n/a"
    text = f"{got / ref:.2f} x"
    return text + (f" ({'met' if got >= want * ref else 'short of'} {want} x)" if want else "")


def beside_llama(out_dir):
    """forge's figures beside llama-bench's, both measured in this call on the same GGUF file."""
    rows = []
    for p in presets_run(out_dir):
        peer = load_llama(os.path.join(out_dir, f"llama_{p}.jsonl"))
        if peer is None:
            continue
        r = load(os.path.join(out_dir, f"bench_{p}.json")) or {}
        pp, tg = r.get("prefill_tok_s"), r.get("decode_tok_s")
        want = OTHER.get(p, (None, None))[1]
        rows.append(f"| {what_is(p)} (`{p}`) | {num(pp)} | {num(peer[0])} | {ratio(pp, peer[0], want)} "
                    f"| {num(tg, 1)} | {num(peer[1], 1)} | {ratio(tg, peer[1], want)} |")
        backend = peer[2]
    if not rows:
        return []
    return ["", "### Beside llama.cpp, measured in this call on the same files", "",
            "`llama-bench -m MODEL -p 512 -n 128 -r 3 -ngl 99` right after forge's bench of the same GGUF file,",
            f"after one unrecorded run that compiles its pipelines (mean of 3; {backend}).", "",
            "| model (preset) | forge prefill tok/s | llama.cpp pp512 | forge / llama.cpp "
            "| forge decode tok/s | llama.cpp tg128 | forge / llama.cpp |",
            "|---|---|---|---|---|---|---|"] + rows


def decode_account(out_dir):
    """Where one decode token's time goes, every row, from its profile run (timestamps after every
    dispatch make that run slower than the bench's): the one-token products (rows a call 1), the
    decode attention, and the rest (the other kernels and the gaps between dependent dispatches)
    against what reading the weights would take at READ_TB_S."""
    o = ["", "### A decode token, every row (`forge bench -p 512 -n 128 -r 1 --profile`: the warm-up's and the run's"
         " decode steps)", "",
         "| model (preset) | decode tok/s profiled | ms a token | one-token products: ms (GB, TB/s) | attention ms "
         "| the rest ms | the weights at 3.06 TB/s, ms |", "|---|---|---|---|---|---|---|"]
    rows = 0
    for p in presets_run(out_dir):
        what = what_is(p)
        prof = load(os.path.join(out_dir, f"profile_{p}.json"))
        if not prof or "profile" not in prof or not prof.get("decode_tok_s"):
            continue
        pr, steps = prof["profile"], 2 * (prof.get("n_gen", 128) - 1)
        one = [v for k, v in pr.items() if " " in k and v.get("rows", 0) == v["calls"]]
        prod_ms = sum(v["ms"] for v in one) / steps
        prod_gb = sum(v.get("gb_s", 0) * v["ms"] for v in one) / 1e3 / steps
        attn_ms = sum(v["ms"] for k, v in pr.items() if " " not in k and k.startswith("attention_decode")) / steps
        token_ms = 1000 / prof["decode_tok_s"]
        o.append(f"| {what} (`{p}`) | {prof['decode_tok_s']:.1f} | {token_ms:.2f} | {prod_ms:.2f} ({prod_gb:.2f}, "
                 f"{prod_gb / prod_ms if prod_ms else 0:.2f}) | {attn_ms:.2f} | {token_ms - prod_ms - attn_ms:.2f} "
                 f"| {prod_gb / READ_TB_S:.2f} |")
        rows += 1
    return o if rows else []


def matrix(out_dir, commit):
    """The matrix of one device_run.sh call: its device, driver, date, commit and per preset
    (prefill tok/s, decode tok/s), None where a preset did not run."""
    runs = {p: load(os.path.join(out_dir, f"bench_{p}.json")) for p, *_ in ROWS}
    # (the device from any preset's run: a call may measure only presets outside the matrix)
    any_run = next((r for r in runs.values() if r), None) or next(
        (r for r in (load(os.path.join(out_dir, f"bench_{p}.json")) for p in presets_run(out_dir)) if r), None)
    return {"device": any_run["device"] if any_run else "unknown device",
            "driver": any_run["driver"] if any_run else "unknown driver",
            "day": time.strftime("%Y-%m-%d", time.gmtime()), "commit": commit,
            "rows": {p: ((runs[p] or {}).get("prefill_tok_s"), (runs[p] or {}).get("decode_tok_s")) for p, *_ in ROWS}}


def matrix_from_results(text):
    """The matrix back from a RESULTS.md's generated section (what section() wrote)."""
    if BEGIN not in text or END not in text:
        sys.exit("results.py: no generated section in the RESULTS.md given")
    gen = text[text.index(BEGIN):text.index(END)]
    head = re.search(r"^## Now: the bench matrix \((\S+), commit (\S+)\)$", gen, re.M)
    where = re.search(r" call on (.*) \((.*)\):$", gen, re.M)
    if not head or not where:
        sys.exit("results.py: the generated section has no date, commit or device line")

    def value(cell):
        return None if cell.strip() in ("n/a", "") else float(cell.replace(",", ""))
    rows = {}
    for p, what, *_ in ROWS:
        line = next((l for l in gen.splitlines() if l.startswith(f"| {what} (`{p}`) | ")), None)
        if line is None:
            rows[p] = (None, None)
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[p] = (value(cells[1]), value(cells[5]))
    return {"device": where.group(1), "driver": where.group(2), "day": head.group(1), "commit": head.group(2),
            "rows": rows}


def readme_table(m):
    """README.md's speed table: the matrix beside llama.cpp's figures, no history."""
    o = [README_BEGIN,
         f"{m['device']} ({m['driver']}), commit {m['commit']}, {m['day']}: `forge bench MODEL -p 512 -n 128 -r 3`",
         "on random-weight models of these shapes (`tools/make_bench_model.py`), median of 3, default settings;",
         "llama.cpp's figures: its Vulkan backend (3f545be) on the same kind of machine and shapes.",
         "",
         "| model | prefill tok/s | llama.cpp pp512 | decode tok/s | llama.cpp tg128 |",
         "|---|---:|---:|---:|---:|"]
    for p, what, _tpp, _ttg, lpp, ltg in ROWS:
        pp, tg = m["rows"].get(p, (None, None))
        o.append(f"| {what} | {num(pp)} | {num(lpp)} | {num(tg, 1)} | {num(ltg)} |")
    o.append(README_END)
    return "\n".join(o)


def section(out_dir, commit):
    m = matrix(out_dir, commit)
    runs = {p: {"prefill_tok_s": pp, "decode_tok_s": tg} for p, (pp, tg) in m["rows"].items()}
    device, driver, day = m["device"], m["driver"], m["day"]
    o = [BEGIN, f"## Now: the bench matrix ({day}, commit {commit})", ""]
    o.append(f"Written by `bench/results.py` from one `bash bench/device_run.sh` call on {device} ({driver}):")
    o.append("`tools/make_bench_model.py PRESET` writes each model, `forge bench MODEL -p 512 -n 128 -r 3`")
    o.append("measures it (median of 3 after a warm-up; default settings, so f16 KV cache, tensor cores")
    o.append("and int8 activations where the device has them). The bar of each column is the larger of")
    o.append("issue 10's target and llama.cpp's figure.")
    o.append("")
    o.append("| model (preset) | prefill tok/s | target | llama.cpp pp512 | | decode tok/s | target | llama.cpp tg128 | |")
    o.append("|---|---|---|---|---|---|---|---|---|")
    for p, what, tpp, ttg, lpp, ltg in ROWS:
        r = runs[p] or {}
        pp, tg = r.get("prefill_tok_s"), r.get("decode_tok_s")
        o.append(f"| {what} (`{p}`) | {num(pp)} | {num(tpp)} | {num(lpp)} | {verdict(pp, tpp, lpp)} "
                 f"| {num(tg, 1)} | {num(ttg)} | {num(ltg)} | {verdict(tg, ttg, ltg)} |")
    tests = os.path.join(out_dir, "tests.txt")
    if os.path.exists(tests):
        with open(tests) as f:
            lines = f.readlines()
        # one "[  PASSED  ] N tests." a shard (device_run.sh runs the suite in several processes)
        passed = sum(int(l.split()[3]) for l in lines if l.startswith("[  PASSED  ]"))
        shards = sum(1 for l in lines if l.startswith("[==========] ") and "ran." in l)
        failed = sorted({l.split("]", 1)[1].split(",")[0].split(" (")[0].strip() for l in lines
                         if l.startswith("[  FAILED  ] ") and "listed" not in l and "(" in l})
        if shards:
            o += ["", f"The suite on the same GPU ({shards} processes): {passed} tests passed"
                  + (f"; failed: {', '.join(failed[:8])}{' and more' if len(failed) > 8 else ''}." if failed else ".")]
    o += beside_llama(out_dir)
    o += decode_account(out_dir)
    for p in PROFILED:
        prof = load(os.path.join(out_dir, f"profile_{p}.json"))
        if not prof or "profile" not in prof:
            continue
        pr = prof["profile"]
        o += ["", f"### Where the time goes: `{p}` (`forge bench -p 512 -n 128 -r 1 --profile`: warm-up, one run and"
              " classify, timestamps after every dispatch)", ""]
        o.append("| kernel | calls | ms | us a call |")
        o.append("|---|---|---|---|")
        kernels = sorted(((k, v) for k, v in pr.items() if " " not in k), key=lambda kv: -kv[1]["ms"])
        for k, v in kernels[:12]:
            o.append(f"| {k} | {v['calls']} | {v['ms']:.1f} | {1000 * v['ms'] / max(v['calls'], 1):.1f} |")
        o += ["", "| product (kernel N x K) | calls | rows a call | us a call | GB/s | TFLOP/s |", "|---|---|---|---|---|---|"]
        shapes = sorted(((k, v) for k, v in pr.items() if " " in k), key=lambda kv: -kv[1]["ms"])
        for k, v in shapes[:14]:
            calls = max(v["calls"], 1)
            o.append(f"| {k} | {v['calls']} | {v.get('rows', 0) / calls:.1f} | {1000 * v['ms'] / calls:.1f} "
                     f"| {v.get('gb_s', 0):.0f} | {v.get('tflop_s', 0):.1f} |")
    o.append(END)
    return "\n".join(o)


def readme_main(args):
    if len(args) not in (2, 3):
        sys.exit("usage: results.py --readme (RESULTS.md | OUT_DIR COMMIT) README.md")
    source, readme = args[0], args[1]
    if os.path.isdir(source):
        if len(args) != 3:
            sys.exit("results.py --readme OUT_DIR README.md COMMIT: the commit is needed with raw results")
        m = matrix(source, args[2])
    else:
        with open(source) as f:
            m = matrix_from_results(f.read())
    with open(readme) as f:
        text = f.read()
    if README_BEGIN not in text or README_END not in text:
        sys.exit(f"results.py: {readme} has no speed table markers ({README_BEGIN} ... {README_END})")
    text = text[: text.index(README_BEGIN)] + readme_table(m) + text[text.index(README_END) + len(README_END):]
    sys.stdout.write(text)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--readme":
        return readme_main(sys.argv[2:])
    if len(sys.argv) != 4:
        sys.exit("usage: results.py OUT_DIR RESULTS.md COMMIT\n       results.py --readme (RESULTS.md | OUT_DIR) README.md [COMMIT]")
    out_dir, results, commit = sys.argv[1:]
    with open(results) as f:
        text = f.read()
    new = section(out_dir, commit)
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + new + text[text.index(END) + len(END):]
    else:
        first, _, rest = text.partition("\n")
        text = first + "\n\n" + new + "\n\n" + rest.lstrip("\n")
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
