"""Tests of Session.embed, Session.rerank, Model.embed / rerank / embed_info on the committed fixtures
(tests/fixtures/embed: tiny random-weight checkpoints laid out as sentence-transformers
publishes them, with sentence-transformers' own vectors and scores in reference.json; made by
tools/fixtures/make_embed_fixtures.py). Run as test_forge.py is:

    FORGE_LIBRARY=build/libforge.so python3 -m pytest -q bindings/python/tests
"""

from __future__ import annotations

import ctypes
import inspect
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bindings" / "python"))

import forge  # noqa: E402
from forge import _ffi  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "embed"
EMBEDDERS = ("qwen3_embed_f32", "gemma3_embed_f32")
TOL = 1e-4  # absolute, on every value of every vector and score


def reference(name: str) -> dict:
    return json.loads((FIXTURES / name / "reference.json").read_text())


def rows(vectors) -> list[list[float]]:
    """embed()'s result (a numpy array, or lists) as lists of Python floats."""
    return vectors.tolist() if hasattr(vectors, "tolist") else [list(v) for v in vectors]


def worst(got, want) -> float:
    """The largest absolute difference between two equally shaped lists of vectors (inf when the
    shapes differ)."""
    got, want = rows(got), [list(v) for v in want]
    if len(got) != len(want) or any(len(g) != len(w) for g, w in zip(got, want)):
        return math.inf
    return max((abs(a - b) for g, w in zip(got, want) for a, b in zip(g, w)), default=0.0)


def options(case: dict) -> dict:
    """A reference case's sentence-transformers options as embed()'s keywords."""
    kw = {}
    if "prompt_name" in case:
        kw["prompt_name"] = case["prompt_name"]
    if "prompt" in case:
        kw["prompt"] = case["prompt"]
    if "truncate_dim" in case:
        kw["dim"] = case["truncate_dim"]
    return kw


def norm(v) -> float:
    return math.sqrt(sum(x * x for x in v))


@pytest.fixture(scope="module")
def models():
    """Each fixture loaded once, with a session, on first use."""
    opened: dict = {}

    def get(name: str):
        if name not in opened:
            model = forge.Model(FIXTURES / name)
            opened[name] = (model, model.session())
        return opened[name]

    yield get
    for model, session in opened.values():
        session.close()
        model.close()


# --- the mirror of forge.h ------------------------------------------------------------------


def test_params_mirror_forges_defaults():
    lib = _ffi.lib()  # loading checks every mirror's sizeof against the library's
    for name in ("forge_embed_params", "forge_embed_info", "forge_rerank_params"):
        assert lib.forge_struct_size(name.encode()) == ctypes.sizeof(_ffi._MIRRORS[name]), name
    e = lib.forge_embed_default_params()
    assert e.struct_size == lib.forge_struct_size(b"forge_embed_params")
    # each field read where forge wrote it: the layout, not only the size, is forge.h's
    assert (e.pooling, e.normalize, e.dim, e.prompt_name, e.prompt, e.truncate, e.add_special, bool(e.cancel)) == \
        (_ffi.POOLING_DEFAULT, -1, 0, None, None, 1, 1, False)
    r = lib.forge_rerank_default_params()
    assert r.struct_size == lib.forge_struct_size(b"forge_rerank_params")
    assert (r.instruction, r.raw, r.truncate, bool(r.cancel)) == (None, 0, 1, False)
    # the keywords' defaults are forge's
    d = inspect.signature(forge.Session.embed).parameters
    assert (d["pooling"].default, d["normalize"].default, d["dim"].default) == (None, None, e.dim)
    assert (d["truncate"].default, d["add_special"].default) == (bool(e.truncate), bool(e.add_special))
    d = inspect.signature(forge.Session.rerank).parameters
    assert (d["raw"].default, d["truncate"].default) == (bool(r.raw), bool(r.truncate))


def test_embed_info(models):
    qwen, _ = models("qwen3_embed_f32")
    info = qwen.embed_info()
    assert isinstance(info, forge.EmbedInfo)
    assert (info.dim, info.pooling, info.normalize, info.n_dense, info.bidirectional, info.sentence_transformers) == \
        (64, "last", True, 0, False, True)
    assert sorted(info.prompt_names) == ["document", "query"] and info.default_prompt_name is None
    assert info.max_tokens > 0
    gemma, _ = models("gemma3_embed_f32")
    info = gemma.embed_info()
    assert (info.dim, info.pooling, info.normalize, info.n_dense, info.bidirectional, info.sentence_transformers) == \
        (64, "mean", True, 2, True, True)
    assert info.max_tokens == 32  # sentence_bert_config.json's max_seq_length
    assert sorted(info.prompt_names) == ["document", "query"] and info.default_prompt_name is None


# --- vectors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name,index", [(n, i) for n in EMBEDDERS for i in range(5)])
def test_vectors_are_sentence_transformers(models, name, index):
    """Every case of reference.json: no options, prompt_name "query" and "document", a prompt
    of our own, truncate_dim 16 (dim=16, the Normalize module applied before the cut)."""
    ref = reference(name)
    case = ref["cases"][index]
    _, session = models(name)
    got = session.embed(ref["texts"], **options(case))
    assert worst(got, case["vectors"]) <= TOL, (case.keys(), worst(got, case["vectors"]))


@pytest.mark.parametrize("name", EMBEDDERS)
def test_token_ids_embed_as_their_text(models, name):
    """Token-id lists get no prefix: sentence-transformers' ids of a prompted case, given as
    ids, are that case's vectors (gemma3's long texts come already cut to max_seq_length)."""
    ref = reference(name)
    _, session = models(name)
    for case in (ref["cases"][0], ref["cases"][1]):
        assert worst(session.embed(case["ids"]), case["vectors"]) <= TOL, case.keys()
    mixed = [ref["texts"][0], ref["cases"][0]["ids"][1]]  # a text and a token-id list in one call
    assert worst(session.embed(mixed), ref["cases"][0]["vectors"][:2]) <= TOL


@pytest.mark.parametrize("name", EMBEDDERS)
def test_order_and_batching_do_not_change_a_vector(models, name):
    ref = reference(name)
    _, session = models(name)
    texts = ref["texts"]
    forward = rows(session.embed(texts, prompt_name="query"))
    backward = rows(session.embed(texts[::-1], prompt_name="query"))[::-1]
    assert worst(backward, forward) <= 1e-5
    alone = [rows(session.embed([t], prompt_name="query"))[0] for t in texts[:3]]
    assert worst(alone, forward[:3]) <= 1e-5


def test_normalize_dim_and_pooling(models):
    ref = reference("qwen3_embed_f32")
    want = ref["cases"][0]["vectors"]
    _, session = models("qwen3_embed_f32")
    raw = rows(session.embed(ref["texts"], normalize=False))  # the pooled state, Normalize skipped
    assert any(abs(norm(v) - 1) > 1e-3 for v in raw)
    assert worst([[x / norm(v) for x in v] for v in raw], want) <= TOL
    # normalize=True normalizes after the cut: unit vectors along sentence-transformers' first 16
    cut = rows(session.embed(ref["texts"], dim=16, normalize=True))
    assert worst(cut, [[x / norm(v[:16]) for x in v[:16]] for v in want]) <= TOL
    assert all(abs(norm(v) - 1) <= 1e-5 for v in cut)
    # the checkpoint's pooling is the last token's: asking for it changes nothing; mean does
    assert worst(session.embed(ref["texts"], pooling="last"), want) <= TOL
    mean = rows(session.embed(ref["texts"], pooling="mean"))
    assert len(mean) == len(want) and all(len(v) == 64 and abs(norm(v) - 1) <= 1e-5 for v in mean)
    assert worst(mean[1:], want[1:]) > 1e-2  # "hello" is one token before EOS: only longer texts must differ
    # prompt="" is no prefix, whatever the prompt name
    assert worst(session.embed(ref["texts"], prompt_name="query", prompt=""), want) <= TOL


def test_numpy_array_or_lists(models, monkeypatch):
    ref = reference("qwen3_embed_f32")
    _, session = models("qwen3_embed_f32")
    np = forge._numpy()
    got = session.embed(ref["texts"][:3])
    if np is not None:
        assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == (3, 64)
        assert session.embed([]).shape == (0, 64) and session.embed([], dim=8).shape == (0, 8)
    monkeypatch.setattr(forge, "_numpy", lambda: None)  # as where numpy is not installed
    lists = session.embed(ref["texts"][:3], dim=16)
    assert type(lists) is list and all(type(v) is list and len(v) == 16 for v in lists)
    assert all(type(x) is float for x in lists[0])
    assert worst(lists, [v[:16] for v in rows(got)]) <= 1e-6
    assert session.embed([]) == []


def test_errors_carry_forges_message(models):
    ref = reference("gemma3_embed_f32")
    model, session = models("gemma3_embed_f32")
    with pytest.raises(forge.InvalidArgumentError) as e:
        session.embed(["hello"], prompt_name="no_such_prompt")
    assert "no_such_prompt" in e.value.message and "query" in e.value.message  # and the names it has
    assert e.value.status == forge.Status.INVALID_ARGUMENT
    # a text longer than max_seq_length (32 tokens) is cut unless truncate=False
    long_text = ref["texts"][4]
    assert len(ref["cases"][0]["ids"][4]) == 32
    with pytest.raises(forge.LimitError):
        session.embed([long_text], truncate=False)
    session.embed(["hello"], truncate=False)  # a short one still runs
    for dim in (-1, 65):
        with pytest.raises(forge.InvalidArgumentError):
            session.embed(["hello"], dim=dim)
    with pytest.raises(ValueError, match="pooling"):
        session.embed(["hello"], pooling="max")
    with pytest.raises(TypeError):
        session.embed("hello")  # one text is [text]
    with pytest.raises(TypeError):
        session.rerank("q", "a document")
    # after the errors the session still embeds
    assert worst(session.embed(ref["texts"][:2]), ref["cases"][0]["vectors"][:2]) <= TOL
    with model.session() as closed:
        pass
    with pytest.raises(forge.InvalidArgumentError):
        closed.embed(["hello"])


# --- reranking --------------------------------------------------------------------------------


def test_rerank_is_qwen3_rerankers_model_card(models):
    ref = reference("qwen3_rerank_f32")
    _, session = models("qwen3_rerank_f32")
    for case in ref["cases"]:
        scores = session.rerank(ref["query"], ref["documents"], instruction=case["instruction"])
        assert type(scores) is list and len(scores) == len(ref["documents"])
        assert max(abs(a - b) for a, b in zip(scores, case["scores"])) <= TOL, (case["instruction"], scores)
        # raw: log P(yes) - log P(no)
        raw = session.rerank(ref["query"], ref["documents"], instruction=case["instruction"], raw=True)
        logits = [math.log(p) - math.log1p(-p) for p in case["scores"]]
        assert max(abs(a - b) for a, b in zip(raw, logits)) <= 1e-3, (raw, logits)
    # order-independent, and one document alone scores as in the batch
    backward = session.rerank(ref["query"], ref["documents"][::-1])[::-1]
    assert max(abs(a - b) for a, b in zip(backward, ref["cases"][0]["scores"])) <= TOL
    assert abs(session.rerank(ref["query"], ref["documents"][2:3])[0] - ref["cases"][0]["scores"][2]) <= TOL
    assert session.rerank(ref["query"], []) == []


def test_cross_encoder_is_sentence_transformers(models):
    ref = reference("qwen3_cross_f32")
    _, session = models("qwen3_cross_f32")
    scores = session.rerank(ref["query"], ref["documents"])
    assert max(abs(a - b) for a, b in zip(scores, ref["scores"])) <= TOL, scores
    raw = session.rerank(ref["query"], ref["documents"], raw=True)
    assert max(abs(a - b) for a, b in zip(raw, ref["logits"])) <= TOL, raw
    backward = session.rerank(ref["query"], ref["documents"][::-1])[::-1]
    assert max(abs(a - b) for a, b in zip(backward, ref["scores"])) <= TOL


def test_rerank_on_an_embedding_model_is_unsupported(models):
    _, session = models("gemma3_embed_f32")
    with pytest.raises(forge.UnsupportedError) as e:
        session.rerank("query", ["a document"])
    assert e.value.message


# --- the README's example ---------------------------------------------------------------------


def test_the_readme_example_runs():
    """bindings/python/README.md's embedding example (tests/test_docs.cpp holds the README to the
    lines between the markers), on the fixtures."""
    path, reranker = str(FIXTURES / "qwen3_embed_f32"), str(FIXTURES / "qwen3_cross_f32")
    # docs:begin embed
    import forge

    docs = ["Paris is the capital of France.", "The quick brown fox jumps over the lazy dog."]
    # path: a sentence-transformers checkpoint (Qwen3-Embedding, EmbeddingGemma) or any decoder
    with forge.Model(path) as model, model.session() as session:
        info = model.embed_info()  # dim, pooling, normalize, max_tokens, prompt_names, ...
        d = session.embed(docs)    # [2, info.dim]: a numpy float32 array, or lists without numpy
        q = session.embed(["What is the capital of France?"], prompt_name="query")
        small = session.embed(docs, dim=16)  # Matryoshka: the first 16 values
        similarity = [sum(a * b for a, b in zip(q[0], v)) for v in d]  # unit vectors: cosines
        print(info.dim, info.pooling, len(small[0]), similarity)
    # reranker: a cross-encoder (a `score` head) or Qwen3-Reranker
    with forge.Model(reranker) as model, model.session() as session:
        scores = session.rerank("What is the capital of France?", docs)  # one per document, in (0, 1)
        print(scores)  # raw=True: logits; instruction=: Qwen3-Reranker's <Instruct>
    # docs:end embed
    assert info.dim == 64 and len(small[0]) == 16 and len(similarity) == 2
    assert all(-1.0001 <= s <= 1.0001 for s in similarity) and all(0 < s < 1 for s in scores)


def test_model_embed_and_rerank_make_their_own_session():
    """Model.embed / Model.rerank: the same results as on a session, with no session to manage."""
    ref = reference("qwen3_embed_f32")
    want = next(c for c in ref["cases"] if c.get("prompt_name") == "query")["vectors"]
    with forge.Model(str(FIXTURES / "qwen3_embed_f32")) as m:
        assert worst(m.embed(ref["texts"], prompt_name="query"), want) <= TOL
    ref = reference("qwen3_rerank_f32")
    with forge.Model(str(FIXTURES / "qwen3_rerank_f32")) as m:
        got = m.rerank(ref["query"], ref["documents"])
        assert max(abs(a - b) for a, b in zip(got, ref["cases"][0]["scores"])) <= TOL
