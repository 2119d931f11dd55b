"""Classifiers and rerankers over a live socket, against sentence-transformers and transformers."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.api.conftest import assert_error, post
from tests.helpers.server import LiveServer
from vectorpress.settings import Settings

QUERY = "how do cats sleep"
TEXTS = [
    "Cats sleep for most of the day, often curled up in warm places.",
    "The stock market closed higher on Friday.",
    "A kitten naps on the windowsill in the afternoon sun.",
    "Recipes for a quick weeknight pasta.",
]
PAIRS = [(QUERY, t) for t in TEXTS]
SINGLES = ["I loved this film", "The service was slow and the food was cold", "It was fine"]


def cross_encoder_scores(folder: Path, pairs: list[tuple[str, str]], act: torch.nn.Module):
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(folder), device="cpu")
    return np.asarray(model.predict(pairs, activation_fn=act, batch_size=16), dtype=np.float64)


def single_logits(folder: Path, texts: list[str]) -> np.ndarray:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        return np.stack(
            [model(**tok(t, return_tensors="pt")).logits[0].numpy() for t in texts]
        ).astype(np.float64)


@pytest.mark.parametrize("arch", ["bert", "xlm-roberta"])
def test_rerank_matches_cross_encoder(
    arch: str, cross_encoder_folder: Callable[[str, str], Path]
) -> None:
    folder = cross_encoder_folder(arch, "reranker")
    sigmoid = cross_encoder_scores(folder, PAIRS, torch.nn.Sigmoid())
    raw = cross_encoder_scores(folder, PAIRS, torch.nn.Identity())
    with LiveServer(Settings.single(str(folder))) as srv:
        info = httpx.get(f"{srv.url}/info").json()
        assert info["model_type"] == {
            "reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}
        }
        for raw_scores, want in ((False, sigmoid), (True, raw)):
            response = post(
                srv,
                "/rerank",
                {"query": QUERY, "texts": TEXTS, "raw_scores": raw_scores, "return_text": True},
            )
            assert response.status_code == 200, response.text
            ranks = response.json()
            assert [list(r) for r in ranks] == [["index", "text", "score"]] * len(TEXTS)
            assert [r["index"] for r in ranks] == list(np.argsort(-want, kind="stable"))
            for r in ranks:
                assert r["text"] == TEXTS[r["index"]]
                assert abs(r["score"] - want[r["index"]]) < 1e-5, (arch, raw_scores, r)
        # A reranker also answers /predict with its one label, through a sigmoid.
        pair = post(srv, "/predict", {"inputs": list(PAIRS[0])}).json()
        assert pair[0]["label"] == "LABEL_0" and abs(pair[0]["score"] - sigmoid[0]) < 1e-5
        default = post(srv, "/", {"query": QUERY, "texts": TEXTS}).json()
        assert [r["index"] for r in default] == [r["index"] for r in ranks]
        assert list(default[0]) == ["index", "score"]
        # Vertex: an instance with query and texts reranks; any other one predicts.
        vertex = post(
            srv,
            "/vertex",
            {"instances": [{"query": QUERY, "texts": TEXTS}, {"inputs": list(PAIRS[0])}]},
        )
        assert vertex.status_code == 200
        assert vertex.json()["predictions"] == [default, pair]


@pytest.mark.parametrize("arch", ["bert", "xlm-roberta"])
def test_predict_matches_transformers(
    arch: str, cross_encoder_folder: Callable[[str, str], Path]
) -> None:
    folder = cross_encoder_folder(arch, "classifier")
    labels = ["negative", "neutral", "positive"]
    pair_logits = cross_encoder_scores(folder, PAIRS[:2], torch.nn.Identity())
    logits = single_logits(folder, SINGLES)
    softmax = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    with LiveServer(Settings.single(str(folder))) as srv:
        info = httpx.get(f"{srv.url}/info").json()
        assert info["model_type"] == {
            "classifier": {
                "id2label": {"0": "negative", "1": "neutral", "2": "positive"},
                "label2id": {"negative": 0, "neutral": 1, "positive": 2},
            }
        }

        def check(got: list[dict[str, object]], want: np.ndarray) -> None:
            assert [list(p) for p in got] == [["score", "label"]] * 3
            scores = [p["score"] for p in got]
            assert scores == sorted(scores, reverse=True)
            for p in got:
                assert abs(p["score"] - want[labels.index(p["label"])]) < 1e-5, (arch, got)

        single = post(srv, "/predict", {"inputs": SINGLES[0]})
        assert single.status_code == 200
        check(single.json(), softmax[0])
        check(post(srv, "/predict", {"inputs": [SINGLES[1]]}).json(), softmax[1])
        check(post(srv, "/", {"inputs": SINGLES[2]}).json(), softmax[2])
        raw_pair = post(srv, "/predict", {"inputs": list(PAIRS[0]), "raw_scores": True}).json()
        check(raw_pair, pair_logits[0])
        batch = post(
            srv,
            "/predict",
            {"inputs": [[SINGLES[0]], list(PAIRS[1]), [SINGLES[2]]], "raw_scores": True},
        )
        assert batch.status_code == 200
        got = batch.json()
        assert len(got) == 3
        check(got[0], logits[0])
        check(got[1], pair_logits[1])
        check(got[2], logits[2])
        assert batch.headers["x-compute-characters"] == str(
            len(SINGLES[0]) + len(QUERY) + len(TEXTS[1]) + len(SINGLES[2])
        )
        vertex = post(srv, "/vertex", {"instances": [{"inputs": SINGLES[0]}]}).json()
        check(vertex["predictions"][0], softmax[0])
        # A classifier with several labels is not a reranker.
        assert_error(
            post(srv, "/rerank", {"query": "q", "texts": ["a"]}),
            424,
            "Backend",
            "Backend error: model is not a re-ranker model",
        )


def test_rerank_ties_put_the_higher_index_first(reranker_server: LiveServer) -> None:
    texts = ["same text", "other words", "same text", "same text"]
    response = post(reranker_server, "/rerank", {"query": "q", "texts": texts})
    # TEI counts the query once per text.
    assert response.headers["x-compute-characters"] == str(len(texts) + sum(map(len, texts)))
    assert response.headers["x-inference-time"].isdigit()
    ranks = response.json()
    same = [r["index"] for r in ranks if r["index"] in (0, 2, 3)]
    assert same == [3, 2, 0]
    scores = [r["score"] for r in ranks]
    assert scores == sorted(scores, reverse=True)


def test_cross_encoder_error_table(
    reranker_server: LiveServer, classifier_server: LiveServer
) -> None:
    cases: list[tuple[LiveServer, str, object, int, str, str]] = [
        (
            reranker_server,
            "/rerank",
            {"query": "q", "texts": []},
            400,
            "Empty",
            "`texts` cannot be empty",
        ),
        (
            reranker_server,
            "/rerank",
            {"query": "q", "texts": ["a"] * 9},
            422,
            "Validation",
            "batch size 9 > maximum allowed batch size 8",
        ),
        (
            reranker_server,
            "/rerank",
            {"query": "", "texts": [""]},
            400,
            "Empty",
            "Input validation error: `inputs` cannot be empty",
        ),
        (reranker_server, "/rerank", {"query": "q"}, 422, "Validation", ""),
        (
            reranker_server,
            "/embed",
            {"inputs": "a"},
            424,
            "Backend",
            "Backend error: Model is not an embedding model",
        ),
        (
            reranker_server,
            "/embed_all",
            {"inputs": "a"},
            424,
            "Backend",
            "Backend error: Model is not an embedding model",
        ),
        (classifier_server, "/predict", {"inputs": []}, 400, "Empty", "`inputs` cannot be empty"),
        (
            classifier_server,
            "/predict",
            {"inputs": ""},
            400,
            "Empty",
            "Input validation error: `inputs` cannot be empty",
        ),
        (classifier_server, "/predict", {"inputs": ["a", "b", "c"]}, 422, "Validation", ""),
        (classifier_server, "/predict", {"inputs": [["a", "b", "c"]]}, 422, "Validation", ""),
        (classifier_server, "/predict", {"inputs": [[]]}, 422, "Validation", ""),
        (classifier_server, "/predict", {"inputs": [1]}, 422, "Validation", ""),
        (
            classifier_server,
            "/predict",
            {"inputs": "word " * 600, "truncate": False},
            422,
            "Validation",
            "Input validation error: `inputs` must have less than 512 tokens. Given: 602",
        ),
        (
            classifier_server,
            "/similarity",
            {"inputs": {"source_sentence": "a", "sentences": ["b"]}},
            424,
            "Backend",
            "Backend error: Model is not an embedding model",
        ),
    ]
    for server, path, payload, status, error_type, message in cases:
        assert_error(post(server, path, payload), status, error_type, message)
    # --auto-truncate is on here, so an omitted `truncate` truncates.
    ok = post(classifier_server, "/predict", {"inputs": "word " * 600})
    assert ok.status_code == 200 and ok.headers["x-compute-tokens"] == "512"
    # The OpenAI route answers in OpenAI's shape.
    body = post(reranker_server, "/v1/embeddings", {"input": "a"}).json()
    assert body == {
        "message": "Backend error: Model is not an embedding model",
        "code": 424,
        "type": "Backend",
    }


@pytest.fixture(scope="module")
def prompted_reranker(
    cross_encoder_folder: Callable[[str, str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The BERT reranker with a default prompt, and a tokenizer that fails on unknown text.

    Its WordPiece model names an unknown-token that is not in the vocabulary, so text the
    vocabulary cannot spell makes the tokenizer itself fail.
    """
    dest = tmp_path_factory.mktemp("prompted") / "model"
    shutil.copytree(cross_encoder_folder("bert", "reranker"), dest)
    data = json.loads((dest / "tokenizer.json").read_text())
    data["model"]["unk_token"] = "[NOT-IN-VOCAB]"
    (dest / "tokenizer.json").write_text(json.dumps(data))
    return dest


def test_default_prompt_applies_to_single_texts_not_pairs(
    prompted_reranker: Path, reranker_server: LiveServer
) -> None:
    settings = Settings.single(str(prompted_reranker), default_prompt="query: ")
    with LiveServer(settings) as srv:
        body = {"query": QUERY, "texts": TEXTS}
        assert post(srv, "/rerank", body).json() == post(reranker_server, "/rerank", body).json()
        pair = {"inputs": [QUERY, TEXTS[0]]}
        assert post(srv, "/predict", pair).json() == post(reranker_server, "/predict", pair).json()
        prompted = post(srv, "/predict", {"inputs": "cats"})
        by_hand = post(reranker_server, "/predict", {"inputs": "query: cats"})
        assert prompted.json() == by_hand.json()
        assert prompted.headers["x-compute-tokens"] == by_hand.headers["x-compute-tokens"]
        # The tokenizer failing is a 422 Tokenizer error, and the server keeps serving.
        snowman = "cats \u2603\u2604"
        assert_error(post(srv, "/rerank", {"query": snowman, "texts": ["a"]}), 422, "Tokenizer")
        assert_error(post(srv, "/tokenize", {"inputs": snowman}), 422, "Tokenizer")
        assert post(srv, "/rerank", body).status_code == 200


def test_nan_scores_and_an_unhealthy_backend(
    cross_encoder_folder: Callable[[str, str], Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    dest = tmp_path_factory.mktemp("nan") / "model"
    shutil.copytree(cross_encoder_folder("bert", "reranker"), dest)
    state = load_file(dest / "model.safetensors")
    state["classifier.bias"] = torch.full_like(state["classifier.bias"], float("nan"))
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
    with LiveServer(Settings.single(str(dest))) as srv:
        body = {"query": "q", "texts": ["a", "b"]}
        assert_error(post(srv, "/rerank", body), 424, "Backend", "score is NaN")
        assert_error(post(srv, "/predict", {"inputs": "a"}), 424, "Backend", "score is NaN")
        assert httpx.get(f"{srv.url}/health").status_code == 200
        srv.infer.worker.stop()
        assert_error(post(srv, "/rerank", body), 503, "Unhealthy", "unhealthy")
        for path in ("/health", "/", "/ping"):
            assert_error(httpx.get(f"{srv.url}{path}"), 503, "Unhealthy", "unhealthy")


def test_tei_client_and_inference_client(
    classifier_server: LiveServer,
    reranker_server: LiveServer,
    inference_client: Callable[..., Any],
) -> None:
    from tei_client import HttpClient

    client = HttpClient(classifier_server.url, timeout=60)
    assert client.health() and client.info().server_model_type.value == "classifier"
    for given, sent in (
        (SINGLES[:2], [[SINGLES[0]], [SINGLES[1]]]),
        ([(QUERY, TEXTS[0]), (QUERY, TEXTS[1])], [[QUERY, TEXTS[0]], [QUERY, TEXTS[1]]]),
    ):
        results = client.classify(given)
        want = post(classifier_server, "/predict", {"inputs": sent}).json()
        assert [[(s.label, s.score) for s in r.scores] for r in results] == [
            [(p["label"], p["score"]) for p in one] for one in want
        ]
    reranker = HttpClient(reranker_server.url, timeout=60)
    ranked = reranker.rerank(QUERY, TEXTS, return_text=True)
    want = post(reranker_server, "/rerank", {"query": QUERY, "texts": TEXTS}).json()
    assert [(r.index, r.score) for r in ranked.ranks] == [(r["index"], r["score"]) for r in want]
    assert all(r.text == TEXTS[r.index] for r in ranked.ranks)
    # huggingface_hub posts {"inputs": text} to the endpoint's root, which is /predict here.
    top = inference_client(classifier_server.url).text_classification(SINGLES[0])
    best = post(classifier_server, "/predict", {"inputs": SINGLES[0]}).json()[0]
    assert (top.label, top.score) == (best["label"], pytest.approx(best["score"]))


def test_concurrent_texts_and_pairs_score_as_alone(classifier_server: LiveServer) -> None:
    bodies = [{"inputs": s} for s in SINGLES] + [{"inputs": list(p)} for p in PAIRS]
    bodies.append({"inputs": [[SINGLES[0]], list(PAIRS[1])], "raw_scores": True})
    alone = [post(classifier_server, "/predict", body).json() for body in bodies]

    async def together() -> list[object]:
        async with httpx.AsyncClient(base_url=classifier_server.url, timeout=60) as client:
            responses = await asyncio.gather(
                *(client.post("/predict", json=body) for body in bodies * 4)
            )
        return [r.json() for r in responses]

    def flat(answer: list) -> list[tuple[str, float]]:  # type: ignore[type-arg]
        one_input = isinstance(answer[0], dict)
        return [
            (p["label"], p["score"]) for one in ([answer] if one_input else answer) for p in one
        ]

    for i, got in enumerate(asyncio.run(together())):
        want = flat(alone[i % len(bodies)])
        assert [label for label, _ in flat(got)] == [label for label, _ in want]
        np.testing.assert_allclose([s for _, s in flat(got)], [s for _, s in want], atol=1e-6)
