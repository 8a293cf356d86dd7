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
    unused = {"forge_discover_params", "forge_discovered_model", "forge_keys_info", "forge_detok_stream",
              "forge_constraint", "forge_tool_call", "forge_tool", "forge_chat_reply"}  # constraints and tools: not in the package yet
    assert defined == set(_ffi._MIRRORS) | unused
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
    assert [f.name for f in forge.Classification.__dataclass_fields__.values()] == ["id", "text", "n_tokens", "logits"]
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
