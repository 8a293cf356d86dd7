"""Tests of the forge Python package on the bundled stories260K model (lavapipe on machines
without a GPU). Run from the repository root after `make`:

    FORGE_LIBRARY=build/libforge.so python3 -m pytest -q bindings/python/tests

(`make test-python` does this). The package is imported from the source tree; the CLI the
story is compared with is $FORGE_CLI, else build/forge.
"""

from __future__ import annotations

import ctypes
import gc
import inspect
import re
import json
import math
import os
import random
import struct
import subprocess
import sys
import tarfile
from array import array
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bindings" / "python"))

import forge  # noqa: E402
from forge import _ffi  # noqa: E402

MODEL = ROOT / "models" / "stories260K" / "stories260K.gguf"
CLI = Path(os.environ.get("FORGE_CLI", ROOT / "build" / "forge"))
SHARED = ROOT.parent / "shared"  # beside the checkout, as the C tests expect it
ONCE = "Once upon a time"


@pytest.fixture(scope="module")
def model():
    with forge.Model(MODEL) as m:
        yield m


@pytest.fixture()
def session(model):
    with model.session(n_ctx=512) as s:
        yield s


def greedy(model, prompt, max_tokens):
    """(text, token ids) of a greedy run on a fresh session."""
    with model.session(n_ctx=512) as s:
        stream = s.generate(prompt, max_tokens=max_tokens)
        text = "".join(stream)
        return text, stream.tokens


# --- the mirror of forge.h ------------------------------------------------------------------


def test_struct_mirror_and_status_names_match_the_library():
    lib = _ffi.lib()  # loading checks every mirror's sizeof against the library's
    # every struct forge.h defines (the names forge_struct_size knows) has a mirror, or is one
    # the package does not use (a header change shows up here either way)
    header = (Path(__file__).resolve().parents[3] / "forge.h").read_text()
    defined = set(re.findall(r"^typedef struct (forge_[a-z_]+) \{", header, re.M))
    unused = {"forge_discover_params", "forge_discovered_model", "forge_keys_info", "forge_detok_stream"}
    assert defined == set(_ffi._MIRRORS) | unused
    assert {"forge_constraint", "forge_tool", "forge_tool_call", "forge_chat_reply"} <= set(_ffi._MIRRORS)
    for name, mirror in _ffi._MIRRORS.items():
        assert lib.forge_struct_size(name.encode()) == ctypes.sizeof(mirror), name
    assert lib.forge_struct_size(b"forge_no_such_struct") == 0
    for name in ("forge_model_default_params", "forge_session_default_params", "forge_generate_default_params",
                 "forge_classify_default_params", "forge_train_default_params"):
        assert getattr(lib, name)().struct_size == lib.forge_struct_size(name[:-len("_default_params")].encode() + b"_params")
    assert lib.forge_version_number() == 1000  # 0.1.0
    for status in forge.Status:
        assert forge.status_name(status) == status.c_name
    assert forge.library_version() == "0.1.0"


def test_python_defaults_are_forges():
    c = _ffi.lib().forge_generate_default_params()
    defaults = inspect.signature(forge.Session.generate).parameters
    for name in ("max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_window", "seed"):
        assert defaults[name].default == pytest.approx(getattr(c, name)), name
    assert defaults["add_special"].default == bool(c.add_special)
    cc = _ffi.lib().forge_classify_default_params()
    defaults = inspect.signature(forge.Session.classify).parameters
    for name in ("temperature", "top_k", "top_p", "min_p", "seed"):
        assert defaults[name].default == pytest.approx(getattr(cc, name)), name


def test_model_info_and_special_tokens(model):
    info = model.info
    assert (info.architecture, info.source_format, info.n_layers, info.hidden, info.n_vocab) == ("llama", "gguf", 5, 64, 512)
    assert info.n_params > 0 and info.device_name
    assert model.n_vocab == 512
    sp = model.special_tokens
    assert (sp.bos, sp.eos, sp.eot, sp.eos_ids) == (1, 2, -1, (2,))
    assert model.token_piece(sp.bos) == "<s>" and model.token_id("<s>") == 1 and model.is_special(1)
    assert model.token_piece(10**6) is None and model.token_id("no such piece") is None


# --- generation -----------------------------------------------------------------------------


def test_greedy_story_equals_the_cli(model):
    """`forge run` prints the greedy story of the empty prompt (256 tokens) and a newline."""
    cli = subprocess.run([str(CLI), "run", str(MODEL)], capture_output=True, text=True, check=True, timeout=300)
    text, ids = greedy(model, "", 256)
    assert len(ids) == 256
    assert text.startswith(ONCE)
    assert cli.stdout == text + "\n"


def test_tokens_and_text_agree_with_the_tokenizer(model):
    text, ids = greedy(model, ONCE, 40)
    assert model.detokenize(ids) == text
    # a token prompt gives what the text prompt tokenizes to
    prompt = model.tokenize(ONCE, add_special=True)
    assert prompt[0] == model.special_tokens.bos
    assert greedy(model, prompt, 40) == (text, ids)


def test_stream_yields_tokens_with_ids_and_metrics(session):
    stream = session.generate(ONCE, max_tokens=12)
    assert stream.metrics is None  # not run yet
    tokens = list(stream)
    assert all(isinstance(t, forge.Token) and isinstance(t, str) for t in tokens)
    assert [t.id for t in tokens] == stream.tokens and len(tokens) == 12
    m = stream.metrics
    assert (m.prompt_tokens, m.generated_tokens, m.stop_reason) == (5, 12, forge.StopReason.MAX_TOKENS)
    assert session.metrics == m
    assert session.n_past == 5 + 12 - 1


def test_lookup_drafts_from_the_prompt_and_draws_what_plain_decoding_draws(model):
    text, _ = greedy(model, ONCE, 60)
    prompt = ONCE + text + " " + ONCE  # the output repeats the prompt: drafts are kept
    with model.session(n_ctx=512) as s:
        plain = s.generate(prompt, max_tokens=48, temperature=0.8, top_k=40, seed=3)
        plain_text = "".join(plain)
        looked = s.generate(prompt, max_tokens=48, temperature=0.8, top_k=40, seed=3, lookup=8)
        assert "".join(looked) == plain_text and looked.tokens == plain.tokens
        assert plain.metrics.draft_tokens == 0
        assert 0 < looked.metrics.draft_accepted <= looked.metrics.draft_tokens
        with pytest.raises(forge.InvalidArgumentError, match="lookup 16"):
            list(s.generate(prompt, max_tokens=4, lookup=16))


def test_a_draft_model_gives_the_same_text(model):
    with model.session(n_ctx=512) as s, model.session(n_ctx=512) as d:
        plain = s.generate(ONCE, max_tokens=40, temperature=0.7, seed=2)
        plain_text = "".join(plain)
        drafted = s.generate(ONCE, max_tokens=40, temperature=0.7, seed=2, draft=d, lookup=5)
        assert "".join(drafted) == plain_text and drafted.tokens == plain.tokens
        assert 0 < drafted.metrics.draft_accepted <= drafted.metrics.draft_tokens
        with pytest.raises(forge.InvalidArgumentError, match="the draft session is this session"):
            list(s.generate(ONCE, max_tokens=4, draft=s))
        with pytest.raises(TypeError, match="draft must be a Session"):
            s.generate(ONCE, draft=model)


def test_breaking_out_stops_generation_and_leaves_the_session_usable(model, session):
    full_text, full_ids = greedy(model, ONCE, 30)
    seen = []
    for token in session.generate(ONCE, max_tokens=30):
        seen.append(token.id)
        if len(seen) == 5:
            break
    assert seen == full_ids[:5]
    m = session.metrics
    assert (m.generated_tokens, m.stop_reason) == (5, forge.StopReason.CALLBACK)
    assert session.n_past == 5 + 5 - 1  # the prompt and the tokens seen, but the last: no token ran ahead
    # the session goes on: the same call again reuses the cache and gives the whole story
    stream = session.generate(ONCE, max_tokens=30)
    assert "".join(stream) == full_text and stream.tokens == full_ids
    assert stream.metrics.cached_tokens > 0
    # a stream still referenced after the break is closed by the next use of the session
    stream = session.generate(ONCE, max_tokens=30)
    for i, token in enumerate(stream):
        if i == 2:
            break
    assert not stream.done
    assert session.metrics.stop_reason == forge.StopReason.CALLBACK and stream.done
    assert stream.tokens == full_ids[:3] and session.n_past == 5 + 3 - 1


def test_a_new_call_closes_the_stream_still_open(model, session):
    first = session.generate(ONCE, max_tokens=50)
    assert [next(first).id for _ in range(3)]
    second = session.generate("Lily", max_tokens=10)  # first is stopped here
    assert first.done and first.metrics.stop_reason == forge.StopReason.CALLBACK
    with pytest.raises(StopIteration):
        next(first)
    assert "".join(second) == greedy(model, "Lily", 10)[0]


def test_an_exception_in_the_loop_stops_the_stream(model, session):
    with pytest.raises(KeyError):
        with session.generate(ONCE, max_tokens=50) as stream:
            for i, _ in enumerate(stream):
                if i == 2:
                    raise KeyError("consumer failed")
    assert stream.done and session.metrics.stop_reason == forge.StopReason.CALLBACK
    assert "".join(session.generate(ONCE, max_tokens=8)) == greedy(model, ONCE, 8)[0]


def test_stop_strings_and_sampling_by_seed(model, session):
    text, _ = greedy(model, ONCE, 40)
    cut = text.index("Lily")
    stream = session.generate(ONCE, max_tokens=40, stop="Lily")
    assert "".join(stream) == text[:cut] and stream.metrics.stop_reason == forge.StopReason.STRING
    a = session.generate(ONCE, max_tokens=20, temperature=1.0, top_k=40, seed=7).read()
    b = session.generate(ONCE, max_tokens=20, temperature=1.0, top_k=40, seed=7).read()
    assert a == b


def test_classify_agrees_with_greedy_generate(model):
    prompts = [ONCE, "Lily", "The little dog", model.tokenize("Tom and", add_special=True)]
    with model.session(n_ctx=512) as s:
        results = s.classify(prompts, logits=True)
        assert s.n_past == 0
    for prompt, r in zip(prompts, results):
        text, ids = greedy(model, prompt, 1)
        assert (r.id, r.text) == (ids[0], text)
        assert len(r.logits) == model.n_vocab
        assert max(range(len(r.logits)), key=r.logits.__getitem__) == r.id
    assert results[3].n_tokens == len(prompts[3])


def test_classification_names_its_token_id_as_the_cli_does(model):
    """Classification.id is the JSON's "id" (forge classify); token is a read-only alias of it."""
    with model.session(n_ctx=64) as s:
        r = s.classify(["Lily"])[0]
    assert r.token == r.id and isinstance(r.id, int)
    with pytest.raises(AttributeError):
        r.token = 3
    assert [f.name for f in forge.Classification.__dataclass_fields__.values()] == ["id", "text", "n_tokens", "logits",
                                                                                   "choice"]
    assert r.choice is None  # no choices= asked for
    if CLI.exists():
        out = subprocess.run([str(CLI), "classify", str(ROOT / "models" / "stories260K" / "stories260K.gguf"), "Lily"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == [{"id": r.id, "text": r.text}]


def test_stop_reason_prints_the_name_the_cli_json_prints(session):
    """str(StopReason) is forge run --json's "stop_reason" (docs/json.md), not the number; it stays
    an IntEnum, equal to the C value."""
    names = ["none", "eos", "stop_token", "stop_string", "max_tokens", "callback", "context", "cancelled", "constraint"]
    assert [str(r) for r in forge.StopReason] == names
    assert f"{forge.StopReason.CALLBACK}" == "callback" and "%s" % forge.StopReason.EOS == "eos"
    assert forge.StopReason.CALLBACK == 5 and int(forge.StopReason.CALLBACK) == 5 and forge.StopReason(5) is forge.StopReason.CALLBACK
    assert forge.StopReason.CALLBACK.name == "CALLBACK" and forge.StopReason.CALLBACK < forge.StopReason.CONTEXT
    json_md = (ROOT / "docs" / "json.md").read_text()
    listed = json_md[json_md.index("`stop_reason` one of"):].split(".\n")[0]
    assert re.findall(r"`(\w+)`", listed)[1:] == names[1:]
    session.generate(ONCE, max_tokens=3).read()
    assert str(session.metrics.stop_reason) == "max_tokens"
    if CLI.exists():
        out = subprocess.run([str(CLI), "run", str(ROOT / "models" / "stories260K" / "stories260K.gguf"), "-p", ONCE, "-n", "3",
                              "--json"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["stop_reason"] == str(session.metrics.stop_reason)


def test_batch_generate_agrees_with_generate(model):
    prompts = [ONCE, "Lily", [], model.tokenize("Tom", add_special=True)]
    with model.session(n_ctx=256, n_seq_max=2) as s:
        done = s.batch_generate(prompts, max_tokens=16)
    for i in (0, 1, 3):
        text, ids = greedy(model, prompts[i], 16)
        assert (done[i].text, done[i].tokens, done[i].error) == (text, ids, None)
        assert done[i].metrics.generated_tokens == 16
    empty = done[2]
    assert isinstance(empty.error, forge.InvalidArgumentError) and empty.error.status == forge.Status.INVALID_ARGUMENT
    assert "empty" in empty.error.message


# --- errors ---------------------------------------------------------------------------------


def test_a_missing_file_raises_file_error(tmp_path):
    missing = tmp_path / "absent.gguf"
    with pytest.raises(forge.FileError) as e:
        forge.Model(missing)
    err = e.value
    assert isinstance(err, forge.Error)
    assert (err.status, err.status_name) == (forge.Status.IO, "FORGE_ERR_IO")
    assert str(missing) in err.message


def test_a_device_memory_budget_too_small_raises_out_of_memory():
    with pytest.raises(forge.OutOfMemoryError) as e:
        forge.Model(MODEL, max_device_memory=4096)
    assert e.value.status == forge.Status.OUT_OF_MEMORY
    assert "budget" in e.value.message


def test_a_malformed_file_raises_format_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 40)
    with pytest.raises(forge.FormatError) as e:
        forge.Model(bad)
    assert e.value.status_name == "FORGE_ERR_FORMAT" and "bad.gguf" in e.value.message


def test_errors_of_calls_carry_the_objects_message(model):
    with pytest.raises(forge.InvalidArgumentError, match="outside the vocabulary"):
        model.detokenize([100000])
    with model.session(n_ctx=16) as s:
        with pytest.raises(forge.LimitError) as e:
            list(s.generate(ONCE + " there was a dog" * 10))
        assert "16" in e.value.message
        assert s.generate(ONCE, max_tokens=4).read()  # still usable
        with pytest.raises(forge.UnsupportedError, match="chat format"):
            list(s.chat([{"role": "user", "content": "hi"}]))
    with pytest.raises(ValueError):  # InvalidArgumentError is a ValueError too
        model.detokenize([-5])


def test_an_exception_in_the_token_callback_does_not_cross_into_c(session, monkeypatch):
    def fail(*args):
        raise RuntimeError("decode failed")
    stream = session.generate(ONCE, max_tokens=20)
    monkeypatch.setattr(ctypes, "string_at", fail)
    with pytest.raises(RuntimeError, match="decode failed"):
        list(stream)
    monkeypatch.undo()
    assert session.metrics.stop_reason == forge.StopReason.CALLBACK
    assert session.generate(ONCE, max_tokens=4).read()


# --- prewarm -------------------------------------------------------------------------------


def test_prewarm_reports_each_kernel_then_the_end_and_leaves_generation_unchanged(model):
    want, _ = greedy(model, ONCE, 32)
    with forge.Model(MODEL) as m:  # a model of its own: nothing prewarmed on it yet
        with m.session(n_ctx=512) as s:
            calls = []
            assert s.prewarm(progress=lambda *args: calls.append(args)) is None
            n = len(calls) - 1
            assert n > 0 and calls[-1] == (n, n, None)
            assert [(done, total) for done, total, _ in calls[:-1]] == [(i, n) for i in range(n)]
            assert all(isinstance(name, str) and name for _, _, name in calls[:-1])
            again = []
            s.prewarm(progress=lambda *args: again.append(args))
            assert again == [(0, 0, None)]
            assert "".join(s.generate(ONCE, max_tokens=32)) == want
        with m.session(n_ctx=512) as s:  # the model's kernels are warm for its other sessions
            other = []
            s.prewarm(16, lambda *args: other.append(args))
            s.prewarm()  # no callback
            assert other == [(0, 0, None)]


def test_prewarm_errors_and_an_exception_in_progress():
    with forge.Model(MODEL) as m, m.session(n_ctx=512) as s:
        with pytest.raises(forge.InvalidArgumentError, match="n_prompt") as e:
            s.prewarm(-1)
        assert e.value.status_name == "FORGE_ERR_INVALID_ARGUMENT"
        with pytest.raises(TypeError, match="progress"):
            s.prewarm(progress="not callable")
        calls = []

        def fail(*args):
            calls.append(args)
            raise RuntimeError("progress failed")
        with pytest.raises(RuntimeError, match="progress failed"):
            s.prewarm(progress=fail)
        assert len(calls) == 1 and calls[0][0] == 0 < calls[0][1]  # not called again after it raised
        again = []
        s.prewarm(progress=lambda *args: again.append(args))  # the kernels were compiled all the same
        assert again == [(0, 0, None)]
        assert s.generate(ONCE, max_tokens=4).read()


# --- lifetime -------------------------------------------------------------------------------


def test_kv_type_f16_halves_the_cache_and_states_cross_types(model, tmp_path):
    with model.session(n_ctx=128, kv_type="f32") as s32, model.session(n_ctx=128, kv_type="f16") as s16:
        assert (s32.kv_type, s16.kv_type) == ("f32", "f16")
        assert 2 * s16.memory.kv_cache_bytes == s32.memory.kv_cache_bytes > 0
        assert len(list(s16.generate("Once upon a time", max_tokens=8))) == 8
        s16.save(str(tmp_path / "f16.state"))
        s32.load(str(tmp_path / "f16.state"))
        assert s32.n_past == s16.n_past > 0
    with pytest.raises(ValueError, match="kv_type"):
        model.session(kv_type="f8")


def test_context_managers_free_models_and_sessions():
    with forge.Model(MODEL) as m:
        with m.session(n_ctx=64) as s:
            assert s.generate(ONCE, max_tokens=4).read()
        assert s.closed and not m.closed
        s2 = m.session(n_ctx=64)
        stream = s2.generate(ONCE, max_tokens=100)
        next(stream)
    # closing the model closed its open session (and the stream running on it) first
    assert m.closed and s2.closed and stream.done
    with pytest.raises(forge.InvalidArgumentError, match="closed"):
        s2.generate(ONCE)
    with pytest.raises(forge.InvalidArgumentError, match="closed"):
        m.tokenize("x")
    m.close()  # twice is fine


def test_dropped_objects_are_freed_in_any_order():
    for _ in range(3):
        m = forge.Model(MODEL)
        s = m.session(n_ctx=64)
        stream = s.generate(ONCE, max_tokens=50)
        next(stream)
        del m, s, stream  # a stream waiting in its callback, its session, its model: one collection
        gc.collect()


# --- tokenizer ------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [ONCE, " leading space", "héllo wörld 🙂\n\nnew lines\ttab", ""])
def test_tokenize_detokenize_round_trip(model, text):
    ids = model.tokenize(text)
    assert all(0 <= i < model.n_vocab for i in ids)
    assert model.detokenize(ids) == text
    with_bos = model.tokenize(text, add_special=True)
    assert with_bos == [model.special_tokens.bos] + ids
    assert model.detokenize(with_bos, skip_special=True) == text


def test_special_token_text_is_parsed_unless_asked_not_to(model):
    assert model.tokenize("<s>Lily")[0] == model.special_tokens.bos
    plain = model.tokenize("<s>Lily", parse_special=False)
    assert model.special_tokens.bos not in plain and model.detokenize(plain) == "<s>Lily"


# --- chat, on a random-weight Llama 3 with the real Llama 3 tokenizer -----------------------


def make_chat_model(dest: Path) -> Path:
    """A one-layer random f16 Llama with hidden 32 beside the Llama 3 tokenizer from ../shared:
    enough for forge to render Llama 3 chats and generate."""
    with tarfile.open(SHARED / "tokenizers" / "llama3.tar.xz") as tar:
        tar.extractall(dest, members=[m for m in tar.getmembers() if m.name.startswith("llama3/")])
    out = dest / "llama3"
    vocab, hidden, head = 128256, 32, 16
    (out / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": hidden, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "intermediate_size": 64, "vocab_size": vocab, "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "float16"}))
    p = "model.layers.0."
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden],
              p + "input_layernorm.weight": [hidden], p + "post_attention_layernorm.weight": [hidden],
              p + "self_attn.q_proj.weight": [2 * head, hidden], p + "self_attn.k_proj.weight": [head, hidden],
              p + "self_attn.v_proj.weight": [head, hidden], p + "self_attn.o_proj.weight": [hidden, 2 * head],
              p + "mlp.gate_proj.weight": [64, hidden], p + "mlp.up_proj.weight": [64, hidden],
              p + "mlp.down_proj.weight": [hidden, 64]}
    rng = random.Random(1)
    # f16 values of magnitude 1/16 .. 1/8 and random sign: random bytes with the high byte's
    # exponent bits set to 01011
    exponent = bytes((b & 0x83) | 0x2C for b in range(256))
    header, body = {}, bytearray()
    for name, shape in shapes.items():
        n = 1
        for d in shape:
            n *= d
        data = bytearray(rng.randbytes(2 * n))
        data[1::2] = data[1::2].translate(exponent)
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [len(body), len(body) + len(data)]}
        body += data
    blob = json.dumps(header).encode()
    (out / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob + body)
    return out


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory):
    return make_chat_model(tmp_path_factory.mktemp("chat"))


def test_chat_streams_and_reuses_the_cache(chat_model_dir):
    with forge.Model(chat_model_dir) as m, m.session(n_ctx=256) as s:
        turn1 = [{"role": "user", "content": "Hello there!"}]
        rendered = m.render_chat(turn1)
        assert "<|start_header_id|>user<|end_header_id|>\n\nHello there!<|eot_id|>" in rendered
        assert rendered.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
        reply = s.chat(turn1, max_tokens=6)
        text = "".join(reply)
        m1 = reply.metrics
        assert m1.prompt_tokens == len(m.tokenize(rendered)) and m1.cached_tokens == 0
        assert 1 <= m1.generated_tokens <= 6
        turn2 = turn1 + [{"role": "assistant", "content": text}, {"role": "user", "content": "Tell me more."}]
        m2 = s.chat(turn2, max_tokens=6)
        m2.read()
        assert m2.metrics.cached_tokens >= m1.prompt_tokens and m2.metrics.prompt_tokens > m2.metrics.cached_tokens
        eot = m.token_id("<|eot_id|>")
        assert m.special_tokens.eot == eot and eot in m.special_tokens.eos_ids
        with pytest.raises(TypeError, match="message 0"):
            s.chat([{"text": "no role"}])


# --- structured output (constraints) -------------------------------------------------------

SCHEMAS = ROOT / "bench" / "schemas"


def schema_errors(value, schema, at="$"):
    """Why `value` (parsed JSON) does not satisfy `schema`, or "": the JSON Schema keywords the
    tests' schemas use (a small validator, so the tests need no jsonschema package)."""
    types = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    kind = schema.get("type")
    if kind in ("integer", "number"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind == "integer" and value != int(value)):
            return f"{at}: {value!r} is not an {kind}"
    elif kind is not None and not isinstance(value, types[kind]):
        return f"{at}: {value!r} is not of type {kind}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{at}: {value!r} not in {schema['enum']}"
    if "minimum" in schema and value < schema["minimum"] or "maximum" in schema and value > schema["maximum"]:
        return f"{at}: {value!r} out of range"
    if isinstance(value, str):
        if len(value) > schema.get("maxLength", len(value)) or len(value) < schema.get("minLength", 0):
            return f"{at}: {value!r} has the wrong length"
        if "pattern" in schema and not re.search(schema["pattern"], value):
            return f"{at}: {value!r} does not match {schema['pattern']}"
        if schema.get("format") == "time" and not re.fullmatch(
                r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])", value):
            return f"{at}: {value!r} is not a time"
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                return f"{at}: {key!r} is missing"
        for key, v in value.items():
            if key in props:
                why = schema_errors(v, props[key], f"{at}.{key}")
                if why:
                    return why
            elif schema.get("additionalProperties", True) is False:
                return f"{at}: {key!r} is not allowed"
    if isinstance(value, list):
        prefix = schema.get("prefixItems", [])
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
            return f"{at}: {len(value)} items"
        for i, v in enumerate(value):
            sub = prefix[i] if i < len(prefix) else schema.get("items", True)
            if sub is False:
                return f"{at}[{i}]: no item allowed here"
            why = schema_errors(v, sub, f"{at}[{i}]") if isinstance(sub, dict) else ""
            if why:
                return why
    return ""


def check_constrained(stream, schema=None):
    """The checks of tests/test_grammar.cpp's check_run on a finished stream: an output that
    matched whole parses and satisfies the schema; any other stopped at max_tokens. Returns
    whether it matched whole."""
    m = stream.metrics
    assert m.generated_tokens == len(stream.tokens)
    what = f"{m.stop_reason}: {stream.text!r}"
    if not m.constraint_complete:
        assert m.stop_reason == forge.StopReason.MAX_TOKENS, what
        return False
    assert m.stop_reason in (forge.StopReason.CONSTRAINT, forge.StopReason.EOS), what
    if schema is not None:
        assert schema_errors(json.loads(stream.text), schema) == "", what
    return True


def test_json_schema_outputs_validate_on_random_weights(chat_model_dir):
    """tests/test_grammar.cpp's Constrained.RandomWeightOutputsValidate through the package: on
    random weights (logits close to uniform: garbage unless constrained), greedy and sampled,
    the schema given as a dict and as its JSON text."""
    complete = total = 0
    with forge.Model(chat_model_dir) as m, m.session(n_ctx=512) as s:
        for name in ("09-sentiment.json", "28-rgb-color.json", "55-time-slot.json"):
            text = (SCHEMAS / name).read_text()
            schema = json.loads(text)
            for temperature, seed, given in ((0.0, 7, schema), (1.2, 8, text)):
                stream = s.generate("Answer in JSON:", json_schema=given, temperature=temperature, seed=seed,
                                    max_tokens=48)
                stream.read()
                complete += check_constrained(stream, schema)
                total += 1
                assert stream.metrics.constraint_ms > 0
        # json_object=True: any JSON object; chat takes the same keywords
        stream = s.chat([{"role": "user", "content": "Reply in JSON."}], json_object=True, temperature=0.8, seed=3,
                        max_tokens=32)
        stream.read()
        if check_constrained(stream, {"type": "object"}):
            complete += 1
        total += 1
    assert complete >= 4, f"{complete} of {total} runs matched whole"


def test_forced_text_grammars_and_triggers(chat_model_dir, model):
    """Forced text is written without draws (metrics.forced_tokens) unless sample_forced; a GBNF
    grammar's match is whole or a prefix cut by max_tokens; a trigger leaves the text free
    until it appears (tests/test_grammar.cpp's Constrained.ForcedTextAndStopReasons)."""
    schema = {"type": "object", "properties": {
        "customer_account_identifier": {"type": "integer", "minimum": 0, "maximum": 9},
        "preferred_notification_channel": {"enum": ["email", "sms"]}},
        "required": ["customer_account_identifier", "preferred_notification_channel"], "additionalProperties": False}
    with forge.Model(chat_model_dir) as m, m.session(n_ctx=1024) as s:
        stream = s.generate("JSON:", json_schema=schema, max_tokens=100)
        stream.read()
        assert check_constrained(stream, schema) and stream.metrics.stop_reason == forge.StopReason.CONSTRAINT
        assert stream.metrics.forced_tokens > 3
        sampled = s.generate("JSON:", json_schema=schema, sample_forced=True, max_tokens=100)
        sampled.read()
        assert sampled.metrics.forced_tokens == 0 and schema_errors(json.loads(sampled.text), schema) == ""
        # a grammar that cannot end within max_tokens: a prefix of a match
        long = s.generate("x", grammar='root ::= "ab"{400} "!"', temperature=0.8, seed=1, max_tokens=12)
        long.read()
        assert (long.metrics.stop_reason, long.metrics.constraint_complete, len(long.tokens)) == \
            (forge.StopReason.MAX_TOKENS, False, 12)
        assert ("ab" * 200).startswith(long.text)
        # the empty string is matched before any token
        empty = s.generate("x", grammar='root ::= ""', max_tokens=12)
        assert empty.read() == "" and empty.metrics.stop_reason == forge.StopReason.CONSTRAINT
        assert empty.metrics.generated_tokens == 0 and empty.metrics.constraint_complete
    grammar = 'root ::= ("yes" | "no") ", " [0-9]{1,3} " " [a-z]+ "."'
    whole = r"(yes|no), [0-9]{1,3} [a-z]+\."
    prefix = r"|y|ye|n|(yes|no)(,( ([0-9]{1,3}( [a-z]*)?)?)?)?"
    with model.session(n_ctx=512) as s:
        for temperature in (0.0, 1.0, 2.0):
            stream = s.generate("1.", grammar=grammar, temperature=temperature, seed=4, max_tokens=40)
            stream.read()
            assert re.fullmatch(whole if check_constrained(stream) else prefix, stream.text), stream.text
        # a trigger: free text until "there", the grammar's text after it, then free again
        free = s.generate(ONCE, max_tokens=30).read()
        assert free.startswith(", there was")
        stream = s.generate(ONCE, grammar='root ::= " lived a cat named Zed."', trigger="there", max_tokens=30)
        assert stream.read().startswith(", there lived a cat named Zed.") and stream.metrics.constraint_complete


def test_constraint_keywords_are_checked_and_errors_carry_forges_message(session):
    for kwargs, named in ((dict(json_object=True, choices=["a"]), "json_object=True and choices="),
                          (dict(grammar='root ::= "a"', json_schema={}), "grammar= and json_schema="),
                          (dict(grammar="", json_schema="{}", choices=[]), "grammar=, json_schema=, choices=")):
        for call in (lambda: session.generate(ONCE, **kwargs), lambda: session.chat([], **kwargs),
                     lambda: session.batch_generate([ONCE], **kwargs), lambda: session.classify([ONCE], **kwargs)):
            with pytest.raises(ValueError, match="one constraint at a time: " + re.escape(named)):
                call()
    with pytest.raises(ValueError, match="trigger= and sample_forced= go with a constraint"):
        session.generate(ONCE, trigger="x")
    with pytest.raises(TypeError, match="choices must be a list of str"):
        session.classify([ONCE], choices="yes")
    with pytest.raises(TypeError, match="json_schema must be a dict"):
        session.generate(ONCE, json_schema=42)
    # what forge cannot compile fails the call, with the library's message naming the problem
    with pytest.raises(forge.UnsupportedError) as e:
        session.generate(ONCE, json_schema={"type": "integer", "multipleOf": 3}).read()
    assert e.value.status == forge.Status.UNSUPPORTED and '"multipleOf"' in e.value.message
    with pytest.raises(forge.InvalidArgumentError, match="not JSON"):
        session.generate(ONCE, json_schema='{"type": ').read()
    with pytest.raises(forge.InvalidArgumentError, match="'nope'"):
        session.generate(ONCE, grammar="root ::= nope").read()
    with pytest.raises(forge.InvalidArgumentError, match="choices"):
        session.classify([ONCE], choices=[])
    bad = session.batch_generate([ONCE], grammar="root ::= nope", max_tokens=4)[0]
    assert isinstance(bad.error, forge.InvalidArgumentError) and "'nope'" in bad.error.message
    assert session.generate(ONCE, max_tokens=4).read()  # still usable


def test_classify_choices_are_what_generate_writes(model):
    """tests/test_grammar.cpp's Constrained.ClassifyChoices: each prompt's choice is the one a
    greedy generate with the same choices writes; `forge classify --choices` prints its text."""
    choices = ["positive", "negative", "neutral", "positively not", "n/a"]
    texts = ["Great movie!", "Awful.", "It was a film.", "Meh", "I loved every minute of it", "No comment"]
    with model.session(n_ctx=512) as s:
        results = s.classify(texts, choices=choices)
        assert s.n_past == 0
        for text, r in zip(texts, results):
            assert r.choice in range(len(choices))
            assert s.generate(text, choices=choices, max_tokens=20).read() == choices[r.choice], text
        assert [r.choice for r in s.classify(texts[:2])] == [None, None]
    if CLI.exists():
        out = subprocess.run([str(CLI), "classify", str(MODEL), "--choices", ",".join(choices), *texts],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert [r["choice"] for r in json.loads(out.stdout)] == [choices[r.choice] for r in results]


def test_batch_items_with_constraints_equal_generate(model):
    """tests/test_grammar.cpp's Constrained.BatchItemsMatchGenerate: each prompt of a constrained
    batch gives what generate gives for it alone."""
    schema = json.loads((SCHEMAS / "09-sentiment.json").read_text())
    prompts = ["Reply:", "Lily", "Tom and"]
    for kwargs in (dict(json_schema=schema, temperature=0.9, seed=11), dict(choices=["yes", "no", "maybe later"])):
        with model.session(n_ctx=512, n_seq_max=2) as bs:
            done = bs.batch_generate(prompts, max_tokens=60, **kwargs)
        for prompt, d in zip(prompts, done):
            with model.session(n_ctx=512) as s:
                alone = s.generate(prompt, max_tokens=60, **kwargs)
                alone.read()
            assert (d.text, d.tokens, d.error) == (alone.text, alone.tokens, None), prompt
            am = alone.metrics
            assert (d.metrics.stop_reason, d.metrics.forced_tokens, d.metrics.constraint_complete) == \
                (am.stop_reason, am.forced_tokens, am.constraint_complete)
            if "choices" in kwargs:
                assert d.text in kwargs["choices"]


# --- tool calls, on the random-weight Llama with Llama 3.2's chat template ------------------


@pytest.fixture(scope="module")
def tools_model_dir(chat_model_dir, tmp_path_factory):
    """chat_model_dir's model with Llama 3.2 Instruct's template (tests/fixtures/chat), which
    renders tools: forge reads chat_template.jinja from the model directory when
    tokenizer_config.json has no "chat_template" (that one comes first), so the copy of
    tokenizer_config.json here leaves it out."""
    out = tmp_path_factory.mktemp("tools") / "llama3.2"
    out.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (out / name).symlink_to(chat_model_dir / name)
    config = json.loads((chat_model_dir / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "chat_template.jinja").write_bytes((ROOT / "tests" / "fixtures" / "chat" / "llama3.2-instruct.jinja").read_bytes())
    return out


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
CLOCK = {"type": "object", "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
         "required": ["zone"], "additionalProperties": False}
# one tool in transformers' form, one bare with its parameters as JSON text
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.", "parameters": WEATHER}},
         {"name": "get_time", "parameters": json.dumps(CLOCK)}]


def test_render_chat_with_tools_is_what_transformers_renders(tools_model_dir):
    """tests/fixtures/chat/chat_tools.json's Llama 3.2 conversations (tools, assistant tool calls,
    tool results), rendered through the package, byte for byte as transformers'
    apply_chat_template rendered them (but for the "Today Date" line: today's date here)."""
    cases = [c for c in json.loads((ROOT / "tests" / "fixtures" / "chat" / "chat_tools.json").read_text())
             if c["family"] == "llama3.2"]
    assert len(cases) >= 8
    with forge.Model(tools_model_dir) as m:
        for c in cases:
            got = m.render_chat(c["messages"], add_generation_prompt=c["add_generation_prompt"],
                                thinking=c["kwargs"].get("enable_thinking"), tools=c.get("tools"))
            assert re.sub(r"Today Date: [^\n]*", "Today Date: " + c["date"], got) == c["rendered"], c["name"]
        # the same tools and calls in the other forms: bare tools, parameters and arguments as
        # JSON text, calls as {"name", "arguments"} or as ToolCall
        c = next(c for c in cases if c["name"] == "tools_call_result")
        bare = [{k: json.dumps(v) if k == "parameters" else v for k, v in t["function"].items()} for t in c["tools"]]
        call = c["messages"][1]["tool_calls"][0]["function"]
        for form in ({"name": call["name"], "arguments": json.dumps(call["arguments"])},
                     forge.ToolCall(call["name"], call["arguments"])):
            messages = [c["messages"][0], {"role": "assistant", "tool_calls": [form]}, c["messages"][2]]
            assert m.render_chat(messages, tools=bare) == m.render_chat(c["messages"], tools=c["tools"])
        # the history's call and result, as the template writes them
        rendered = m.render_chat(c["messages"], tools=c["tools"])
        assert '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius", "days": 3}}<|eot_id|>' in rendered
        assert '<|start_header_id|>ipython<|end_header_id|>\n\n"{\\"temp\\": 21.5}"<|eot_id|>' in rendered
        # forge's errors, in its words
        with pytest.raises(forge.InvalidArgumentError, match="name"):
            m.render_chat([{"role": "user", "content": "hi"}], tools=[{"description": "no name"}])
        with pytest.raises(forge.InvalidArgumentError, match="JSON object"):
            m.render_chat([{"role": "user", "content": "hi"}], tools=[{"name": "f", "parameters": "[1, 2]"}])
        with pytest.raises(TypeError, match="tool 0"):
            m.render_chat([{"role": "user", "content": "hi"}], tools=["get_weather"])


@pytest.mark.parametrize("family,template", [("mistral-v0.3", "mistral-7b-instruct-v0.3.jinja"),
                                             ("mistral-nemo", "mistral-nemo-instruct-2407.jinja")])
def test_mistral_tools_render_with_their_ids(tools_model_dir, tmp_path, family, template):
    """chat_tools.json's Mistral v0.3 / Nemo conversations through the package: calls with their
    "id" (transformers' dicts or ToolCall), results with their "tool_call_id", byte for byte as
    the template renders them, and the template's own error for a missing or short id."""
    out = tmp_path / family
    out.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (out / name).symlink_to(tools_model_dir / name)
    (out / "chat_template.jinja").write_bytes((ROOT / "tests" / "fixtures" / "chat" / template).read_bytes())
    cases = [c for c in json.loads((ROOT / "tests" / "fixtures" / "chat" / "chat_tools.json").read_text())
             if c["family"] == family]
    assert len(cases) >= 16
    with forge.Model(out) as m:
        # the tokenizer here is Llama 3's: its BOS and EOS stand where Mistral's <s> and </s> do
        probe = m.render_chat([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
        bos, eos = probe[:probe.index("[INST]")], probe[probe.rindex("b") + 1:]
        assert bos and eos
        for c in cases:
            if c["rendered"]:
                c["rendered"] = bos + c["rendered"][len("<s>"):].replace("</s>", eos)
            if c["error"]:
                with pytest.raises(forge.InvalidArgumentError, match=re.escape(c["error"])):
                    m.render_chat(c["messages"], add_generation_prompt=c["add_generation_prompt"], tools=c["tools"] or None)
                continue
            got = m.render_chat(c["messages"], add_generation_prompt=c["add_generation_prompt"], tools=c["tools"] or None)
            assert got == c["rendered"], c["name"]
        c = next(c for c in cases if c["name"] == "tools_call_result")
        call = c["messages"][1]["tool_calls"][0]
        as_toolcall = [c["messages"][0], {"role": "assistant", "tool_calls": [forge.ToolCall(
            call["function"]["name"], call["function"]["arguments"], call["id"])]}, c["messages"][2]]
        assert m.render_chat(as_toolcall, tools=c["tools"]) == c["rendered"]


def test_required_tool_calls_validate_on_random_weights(tools_model_dir, chat_model_dir):
    """tests/test_grammar.cpp's ToolCalls.RequiredCallsValidateOnRandomWeights through the package:
    tool_choice="required" makes the reply one call of a given tool whose arguments validate
    against its parameters' schema, parsed back into TokenStream.tool_calls; without it the
    reply is free text (its content)."""
    user = [{"role": "user", "content": "Weather in Paris?"}]
    schemas = {"get_weather": WEATHER, "get_time": CLOCK}
    complete, calls = 0, []
    with forge.Model(tools_model_dir) as m, m.session(n_ctx=1024) as s:
        for temperature in (0.0, 1.2):
            for seed in (1, 2, 3):
                reply = s.chat(user, tools=TOOLS, tool_choice="required", temperature=temperature, seed=seed,
                               max_tokens=96)
                assert reply.tool_calls == [] and reply.content == ""  # not run yet
                text = reply.read()
                what = f"T {temperature} seed {seed}: {text!r}"
                if not reply.metrics.constraint_complete:
                    assert reply.metrics.stop_reason == forge.StopReason.MAX_TOKENS, what
                    continue
                complete += 1
                assert len(reply.tool_calls) == 1, what
                call = reply.tool_calls[0]
                assert isinstance(call, forge.ToolCall) and call.name in schemas, what
                assert len(call.id) == 9 and call.id.isalnum(), what
                assert schema_errors(call.arguments, schemas[call.name]) == "", what
                assert json.loads(text) == {"name": call.name, "parameters": call.arguments}  # Llama's call format
                assert reply.content == "" and reply.metrics.forced_tokens > 0
                calls = reply.tool_calls
        assert complete >= 4, f"{complete} of 6 runs made a whole call"
        # the call and its result go back into the conversation, and the chat goes on
        history = user + [{"role": "assistant", "tool_calls": calls},
                          {"role": "tool", "content": json.dumps({"temperature": 21})}]
        assert "<|start_header_id|>ipython<|end_header_id|>" in m.render_chat(history, tools=TOOLS)
        follow = s.chat(history, tools=TOOLS, max_tokens=4)
        follow.read()
        assert follow.metrics.cached_tokens > 0 and follow.metrics.generated_tokens >= 1
        # without tool_choice the reply is free (random weights: no call), all of it content
        free = s.chat(user, tools=TOOLS, max_tokens=8)
        text = free.read()
        assert free.tool_calls == [] and free.content == text.strip() and not free.metrics.forced_tokens
        # strict=True holds a call the model opens to a tool's schema (the constraint is lazy)
        strict = s.chat(user, tools=TOOLS, strict=True, max_tokens=8)
        strict.read()
        assert strict.tool_calls == [] and strict.metrics.constraint_ms > 0
        # a plain chat's content is its text, and it has no tool calls
        plain = s.chat(user, max_tokens=4)
        assert plain.read() == plain.content and plain.tool_calls == []
        # what the keywords refuse
        with pytest.raises(ValueError, match="tool_choice must be one of"):
            s.chat(user, tools=TOOLS, tool_choice="any")
        with pytest.raises(ValueError, match="go with tools="):
            s.chat(user, tool_choice="required")
        with pytest.raises(ValueError, match="take no json_object=True"):
            s.chat(user, tools=TOOLS, strict=True, json_object=True)
    # a chat format without tools (Llama 3.0's template) says so, in forge's words
    with forge.Model(chat_model_dir) as m, m.session(n_ctx=256) as s:
        with pytest.raises(forge.UnsupportedError, match="tools"):
            s.chat(user, tools=TOOLS, max_tokens=4).read()


def test_the_readme_example_runs(tools_model_dir):
    """bindings/python/README.md's structured output and tool call example (tests/test_docs.cpp
    holds the README to the lines between the markers)."""
    path = str(tools_model_dir)
    # docs:begin structured
    import json
    import forge

    weather = {"type": "object", "properties": {"city": {"type": "string"},
                                                "unit": {"enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"], "additionalProperties": False}
    # path: a model whose chat template renders tools (Llama 3.1+, Qwen 3, Qwen 3.5)
    with forge.Model(path) as model, model.session(n_ctx=1024) as session:
        # structured output: grammar=, json_schema=, json_object=True or choices=
        stream = session.generate("A city's weather as JSON:", json_schema=weather, max_tokens=64)
        text = stream.read()
        if stream.metrics.constraint_complete:  # else it stopped at max_tokens, a prefix of a match
            print(json.loads(text)["unit"])
        print(session.classify(["Paris is sunny:"], choices=["yes", "no"])[0].choice)  # 0 or 1
        # tool calls (Llama 3.1+, Qwen 3, Qwen 3.5): tools as transformers takes them
        tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                                   "parameters": weather}}]
        messages = [{"role": "user", "content": "What's the weather in Paris?"}]
        reply = session.chat(messages, tools=tools, tool_choice="required", max_tokens=64)
        reply.read()                                   # streams like any chat; parsed at its end
        for call in reply.tool_calls:                  # ToolCall(name, arguments: dict)
            print(call.name, call.arguments["unit"])
        messages.append({"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls})
        messages.append({"role": "tool", "content": json.dumps({"temperature": 21})})
        print(session.chat(messages, tools=tools, max_tokens=16).read())
    # docs:end structured


# --- the example ----------------------------------------------------------------------------


def run_example(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "bindings" / "python"))
    return subprocess.run([sys.executable, str(ROOT / "examples" / "stream.py"), *args], capture_output=True,
                          text=True, env=env, timeout=300, cwd=ROOT)


def test_example_streams_the_story(model):
    run = run_example()
    assert run.returncode == 0, run.stderr
    story, _ = greedy(model, ONCE, 64)
    assert run.stdout.startswith(ONCE + story + "\n")
    assert "tokens/s" in run.stdout and "no chat template" in run.stdout


def test_tour_runs(tmp_path, model):
    """examples/tour.py, which bindings/python/README.md shows (tests/test_docs.cpp holds the README
    to the file), run where it finds models/ and writes its adapter."""
    (tmp_path / "models").symlink_to(ROOT / "models")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "bindings" / "python"), FORGE_LIBRARY=str(library_path()))
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "tour.py")], capture_output=True, text=True,
                         env=env, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == f"llama {model.info.n_params} {model.special_tokens.bos}"
    assert lines[2] == "callback"
    assert lines[3] == greedy(model, "Lily", 1)[0]
    assert (tmp_path / "zora-adapter" / "adapter_model.safetensors").is_file()


def test_example_chats(chat_model_dir):
    run = run_example(str(chat_model_dir), "Hi")
    assert run.returncode == 0, run.stderr
    assert "user: What is a story?" in run.stdout and "assistant: " in run.stdout


# --- installing and finding the library -----------------------------------------------------


def library_path() -> Path:
    return Path(_ffi.lib()._name).resolve()


def python_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("FORGE_LIBRARY", "PYTHONPATH", "LD_LIBRARY_PATH")}
    env.update(extra)
    return env


def test_the_library_is_found_on_the_system_path(tmp_path):
    """Without $FORGE_LIBRARY or a copy in the package, libforge.so.0 comes from the linker's
    search path (here LD_LIBRARY_PATH; after `make install`, the system's)."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libforge.so.0").write_bytes(library_path().read_bytes())
    code = "import forge; print(forge.library_version(), forge._ffi.lib()._name)"
    source = ROOT / "bindings" / "python"
    if any((source / "forge" / n).exists() for n in ("libforge.so", "libforge.so.0")):
        pytest.skip("a libforge.so copied into the source package would be found first")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env=python_env(PYTHONPATH=str(source), LD_LIBRARY_PATH=str(tmp_path / "lib")))
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("0.1.0 ")
    # a FORGE_LIBRARY that cannot be loaded is an error naming it, not a silent fallback
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env=python_env(PYTHONPATH=str(source), LD_LIBRARY_PATH=str(tmp_path / "lib"),
                                        FORGE_LIBRARY=str(tmp_path / "nope.so")))
    assert run.returncode != 0 and "FORGE_LIBRARY=" + str(tmp_path / "nope.so") in run.stderr


def readme_install_commands():
    """The indented block of bindings/python/README.md that makes a venv and installs into it."""
    blocks, block = [], []
    for line in (ROOT / "bindings" / "python" / "README.md").read_text().splitlines() + [""]:
        if line.startswith("    "):
            block.append(line[4:])
        elif block:
            blocks.append(block)
            block = []
    return next((b for b in blocks if any(" -m venv " in c for c in b)), [])


def test_pip_installs_offline_into_a_venv_and_finds_the_packaged_copy(tmp_path):
    """The README's commands, read from bindings/python/README.md and run as written in a directory
    laid out as the checkout after `make` (a copy of the package, the build's library as
    build/libforge.so, models/ and examples/), pip kept off the network (PIP_NO_INDEX): a venv
    of Debian's Python seeing its setuptools and wheel, pip without build isolation, then the
    example. setup.py ships build/libforge.so inside the package, where the installed package
    finds it with no environment variable."""
    commands = readme_install_commands()
    assert len(commands) == 3 and commands[0].startswith("/usr/bin/python3 -m venv "), commands
    if not Path("/usr/bin/python3").exists():
        pytest.skip("no /usr/bin/python3 (Debian's Python, which the README's commands name)")
    src = tmp_path / "bindings" / "python"  # a copy, so that pip's build files stay out of the checkout
    (src / "forge").mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        (src / name).write_bytes((ROOT / "bindings" / "python" / name).read_bytes())
    for f in (ROOT / "bindings" / "python" / "forge").iterdir():
        if f.is_file() and not f.name.startswith("libforge"):
            (src / "forge" / f.name).write_bytes(f.read_bytes())
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "libforge.so").symlink_to(library_path())
    (tmp_path / "models").symlink_to(ROOT / "models")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    for command in commands:
        run = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                             env=python_env(PIP_NO_INDEX="1"))
        assert run.returncode == 0, command + "\n" + run.stdout + run.stderr
    with forge.Model(MODEL) as m:
        story, _ = greedy(m, ONCE, 64)
    assert run.stdout.startswith(ONCE + story + "\n")  # the last command: examples/stream.py
    python = str(tmp_path / ".venv" / "bin" / "python")
    where = subprocess.run([python, "-c", "import forge, os; print(os.path.dirname(forge.__file__))"],
                           capture_output=True, text=True, cwd=tmp_path, env=python_env(), check=True).stdout.strip()
    assert where.startswith(str(tmp_path / ".venv"))
    assert (Path(where) / "libforge.so").read_bytes() == library_path().read_bytes()
    code = f"import forge; m = forge.Model({str(MODEL)!r}, vocab_only=True); print(forge._ffi.lib()._name, m.tokenize('Lily'))"
    run = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=python_env())
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[0] == str(Path(where) / "libforge.so")


def test_the_package_version_is_the_library_version():
    """forge.h's FORGE_VERSION_* is the one version: the library's, the package's, pyproject's."""
    assert forge.library_version() == forge.__version__
    assert f'version = "{forge.__version__}"' in (ROOT / "bindings" / "python" / "pyproject.toml").read_text()


# --- training -------------------------------------------------------------------------------

ZORA = ROOT / "tests" / "fixtures" / "train" / "zora_train.jsonl"


def zora_texts(n):
    return [json.loads(line)["text"] for line in ZORA.read_text().splitlines()[:n]]


def test_training_lowers_the_loss_and_saves_an_adapter_that_loads(tmp_path):
    texts = zora_texts(8)
    with forge.Model(MODEL) as m:
        options = dict(rank=8, alpha=16.0, targets="all", lr=1e-2, max_batch=4, max_seq=128, seed=1)
        plan = m.training_plan(**options)
        with m.trainer(**options) as tr:
            assert plan.device_planned_bytes > 0
            assert tr.memory.device_planned_bytes == plan.device_planned_bytes
            before, counted = tr.eval(texts[:4])
            assert counted == sum(len(m.tokenize(t, add_special=True)) - 1 for t in texts[:4])
            first = tr.step(texts[:4])
            # the step reports the loss before its update: with fresh adapters (B = 0), the base's
            assert first.applied and first.step == 1 and first.tokens == counted
            assert first.loss == pytest.approx(before, rel=1e-6)
            for i in range(1, 10):
                stats = tr.step(texts[4 * (i % 2):4 * (i % 2) + 4])
                assert math.isfinite(stats.loss) and stats.step == i + 1
            after, _ = tr.eval(texts[:4])
            assert after < 0.8 * before
            tr.save(tmp_path / "peft")
            tr.save(tmp_path / "mlx", format="mlx")
        assert (tmp_path / "peft" / "adapter_model.safetensors").is_file()
        assert (tmp_path / "mlx" / "adapters.safetensors").is_file()
        # a trainer started from either file evaluates as the one that saved it
        for saved in ("peft", "mlx"):
            with m.trainer(adapter=tmp_path / saved, max_batch=4, max_seq=128) as again:
                assert again.eval(texts[:4])[0] == pytest.approx(after, rel=1e-5)
        base, _ = greedy(m, "Once upon a time, there was a little girl named", 6)
    with forge.Model(MODEL, adapter=tmp_path / "peft") as tuned:
        text, _ = greedy(tuned, "Once upon a time, there was a little girl named", 6)
    assert text != base


def test_labels_and_mask_choose_what_counts(model):
    ids = model.tokenize(ONCE, add_special=True)
    n = len(ids)
    with model.trainer(max_batch=2, max_seq=64) as tr:
        full, counted = tr.eval([ids])
        assert counted == n - 1
        # labels -100 on the first half and a mask zero there count the same targets
        labels = [-100] * (n // 2) + ids[n // 2:]
        mask = [0] * (n // 2) + [1] * (n - n // 2)
        by_labels = tr.eval([ids], labels=[labels])
        by_mask = tr.eval([ids], mask=[mask])
        assert by_labels[1] == by_mask[1] == n - n // 2
        assert by_labels[0] == pytest.approx(by_mask[0], rel=1e-6)
        # rows of different lengths are padded: each row's loss is its own
        short = model.tokenize("Once upon a time", add_special=True)
        both, c2 = tr.eval([ids, short])
        alone, c3 = tr.eval([short])
        assert c2 == counted + c3
        assert both == pytest.approx((full * counted + alone * c3) / c2, rel=1e-5)


def test_training_errors_are_named(model):
    with pytest.raises(ValueError, match="schedule"):
        model.trainer(schedule="sometimes")
    with pytest.raises(forge.InvalidArgumentError, match="total_steps"):
        model.trainer(schedule="cosine")
    with pytest.raises(forge.InvalidArgumentError):
        model.trainer(targets="wq_proj")
    with pytest.raises(forge.FileError):
        model.trainer(adapter="/nonexistent/adapter")
    with model.trainer(max_batch=2, max_seq=16) as tr:
        with pytest.raises(forge.LimitError):
            tr.step([[1, 2, 3]] * 3)
        with pytest.raises(forge.LimitError):
            tr.step([list(range(1, 40))])
        with pytest.raises(forge.InvalidArgumentError, match="100000"):
            tr.step([[1, 2, 100000]])
        with pytest.raises(ValueError, match="labels row 0"):
            tr.eval([[1, 2, 3]], labels=[[1, 2]])
        with pytest.raises(ValueError, match="targets go with"):
            tr.eval([[1, 2, 3]], targets=[0.0])
        assert math.isfinite(tr.step([[1, 2, 3, 4]]).loss)  # still usable
    with forge.Model(MODEL) as m:
        tr = m.trainer(max_batch=1, max_seq=8)
    assert tr.closed  # the model's close freed its trainer first
    with pytest.raises(forge.InvalidArgumentError, match="closed"):
        tr.eval([[1, 2]])


def test_squared_error_targets_are_checked_against_the_batch(model):
    info = model.info
    with model.trainer(loss="mse_hidden", max_batch=1, max_seq=8) as tr:
        with pytest.raises(ValueError, match=f"1 x 3 x {info.hidden}"):
            tr.eval([[1, 2, 3]], targets=[0.0] * 5)
        loss, positions = tr.eval([[1, 2, 3]], targets=array("f", [0.0] * (3 * info.hidden)))
        assert positions == 3 and loss > 0
