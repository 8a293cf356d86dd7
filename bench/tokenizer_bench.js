#!/usr/bin/env node
// Tokenizer bench helper (HF side), used by tools/bench_tokenizer.sh.
//   node tokenizer_bench.js gen OUT_FILE [BYTES]       writes ~BYTES (default 1 MB) of mixed-language text
//   node tokenizer_bench.js hf TOKENIZER_DIR TEXT_FILE [REPS]
// `hf` loads TOKENIZER_DIR/tokenizer.json with HuggingFace tokenizers (npm "tokenizers", the Rust
// library) and times, like `forge bench-tokenize`: the load (median of REPS), then REPS encodes of
// the whole file as one string after one warm-up, no special tokens added. Run it with
// TOKENIZERS_PARALLELISM=false (the script does) so HF encodes on one thread, as forge does.
// Prints {"impl", "path", "text_bytes", "n_tokens", "reps", "load_s", "encode_s", "mb_per_s"}.
"use strict";
const fs = require("fs");
const path = require("path");

const SENTENCES = [
  "The quick brown fox jumps over the lazy dog, and then it doesn't stop running until 5:30 p.m.",
  "In 2023, researchers reported a 12.5% increase in throughput (see Table 3) compared with the 2019 baseline.",
  "def tokenize(text: str) -> list[int]:\n    return [vocab[t] for t in text.split()]\n",
  "    if (n > 0 && buf[n - 1] == '\\n') { buf[--n] = 0; }\n",
  "人工智能正在改变我们的生活方式，尤其是在自然语言处理领域。",
  "東京は日本の首都であり、世界で最も人口の多い都市圏の一つです。",
  "Москва — столица России, крупнейший по численности населения город страны.",
  "الذكاء الاصطناعي هو فرع من علوم الحاسوب يهتم بإنشاء أنظمة ذكية.",
  "कृत्रिम बुद्धिमत्ता कंप्यूटर विज्ञान की एक शाखा है।",
  "La inteligencia artificial está transformando la manera en que trabajamos y nos comunicamos.",
  "Künstliche Intelligenz verändert die Art und Weise, wie wir arbeiten – schneller als erwartet.",
  "한국어는 한글이라는 고유한 문자 체계를 사용합니다.",
  "Ελληνικά: η τεχνητή νοημοσύνη αλλάζει τον κόσμο.",
  "Emoji test: 👍🏽 🎉 👩‍💻 🇫🇷 ❤️ — and some more text after them!",
  "{\"id\": 42, \"name\": \"forge\", \"tags\": [\"llm\", \"vulkan\", \"c\"], \"score\": 0.987}",
  "Visit https://example.com/docs?page=2&lang=en or email support@example.org for help.",
  "   Indented   text\twith\ttabs and  multiple   spaces.\r\n",
  "Numbers: 3.14159, 2,718,281, 1e-9, 0xDEADBEEF, 1234567890.",
  "Tiếng Việt có nhiều dấu thanh: à, á, ả, ã, ạ.",
  "สวัสดีครับ ยินดีต้อนรับสู่ประเทศไทย",
];

function gen(out, bytes) {
  let seed = 12345, s = "", n = 0;
  const parts = [];
  while (n < bytes) {
    seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0;
    const t = SENTENCES[seed % SENTENCES.length] + ((seed >>> 8) % 4 === 0 ? "\n\n" : " ");
    parts.push(t);
    n += Buffer.byteLength(t);
  }
  s = parts.join("");
  fs.writeFileSync(out, s);
}

function median(v) { v.sort((a, b) => a - b); const n = v.length; return n % 2 ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2; }

async function hf(dir, file, reps) {
  const { Tokenizer } = require("tokenizers");
  const text = fs.readFileSync(file, "utf8");
  const loads = [];
  let tok;
  for (let r = 0; r < reps; r++) {
    const t0 = process.hrtime.bigint();
    tok = Tokenizer.fromFile(path.join(dir, "tokenizer.json"));
    loads.push(Number(process.hrtime.bigint() - t0) / 1e9);
  }
  const encs = [];
  let n = 0;
  for (let r = 0; r <= reps; r++) {
    const t0 = process.hrtime.bigint();
    const e = await tok.encode(text, null, { addSpecialTokens: false });
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    n = e.getIds().length;
    if (r > 0) encs.push(dt);
  }
  const bytes = Buffer.byteLength(text), enc = median(encs);
  console.log(JSON.stringify({ impl: "hf-tokenizers", path: dir, text_bytes: bytes, n_tokens: n, reps, load_s: +median(loads).toFixed(4),
                               encode_s: +enc.toFixed(4), mb_per_s: +(bytes / 1e6 / enc).toFixed(3) }));
}

const [cmd, a, b, c] = process.argv.slice(2);
if (cmd === "gen" && a) gen(a, b ? parseInt(b, 10) : 1000000);
else if (cmd === "hf" && a && b) hf(a, b, c ? parseInt(c, 10) : 3).catch((e) => { console.error(e); process.exit(1); });
else { console.error("usage: tokenizer_bench.js gen OUT [BYTES] | hf DIR TEXT [REPS]"); process.exit(2); }
