"""The five tei.v1 services. Each RPC turns its message into one call on core.Infer.

Unary Embed*, Predict and PredictPair take their permit at once and fail with
RESOURCE_EXHAUSTED when none is free; unary Rerank and every stream wait for permits instead.
`truncate` is a plain proto bool, so it is always passed on explicitly: on gRPC an absent value
means false, never `--auto-truncate`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import numpy as np

from vectorpress.api import answers
from vectorpress.api.grpc.streams import ordered
from vectorpress.api.grpc.stubs import pb, pb_grpc
from vectorpress.api.headers import timing_headers
from vectorpress.api.state import AppState, ModelState
from vectorpress.core import postprocess
from vectorpress.core.infer import Result
from vectorpress.core.tokenization import PairInput, Tokens
from vectorpress.errors import EmptyError, ModelTypeError, ValidationError, VectorpressError
from vectorpress.types import Timings, Truncation

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Res = TypeVar("Res")

#: A response message and, for inference RPCs, the Result its timing metadata comes from.
Answer = tuple[Any, Result[Any] | None]

_MODEL_TYPES = {
    "embedding": pb.MODEL_TYPE_EMBEDDING,
    "classifier": pb.MODEL_TYPE_CLASSIFIER,
    "reranker": pb.MODEL_TYPE_RERANKER,
}


def status_code(exc: VectorpressError) -> grpc.StatusCode:
    """errors.py's table, read for the gRPC column."""
    return getattr(grpc.StatusCode, exc.grpc_code)


def metadata(result: Result[Any]) -> Any:
    """TEI's Metadata message: what the answer cost, times in nanoseconds."""
    t = result.timings or Timings()
    return pb.Metadata(
        compute_chars=result.chars,
        compute_tokens=result.tokens,
        total_time_ns=int(result.total_time * 1e9),
        tokenization_time_ns=int(t.tokenization * 1e9),
        queue_time_ns=int(t.queue * 1e9),
        inference_time_ns=int(t.inference * 1e9),
    )


def direction(value: int) -> Truncation:
    if value == pb.TRUNCATION_DIRECTION_RIGHT:
        return Truncation.RIGHT
    if value == pb.TRUNCATION_DIRECTION_LEFT:
        return Truncation.LEFT
    # proto3 enums are open: a client can send any number (TEI's server panics on one).
    raise ValidationError(
        f"Input validation error: `truncation_direction` {value} is not RIGHT (0) or LEFT (1)"
    )


def optional(message: Any, field: str) -> Any:
    """The value of a proto3 `optional` field, or None when the client did not set it."""
    return getattr(message, field) if message.HasField(field) else None


async def _fail(context: grpc.aio.ServicerContext, exc: Exception) -> None:
    if isinstance(exc, VectorpressError):
        await context.abort(status_code(exc), exc.message)
    log.exception("gRPC call failed", exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the server log")


#: The call metadata that names the model (absent: the default model).
MODEL_KEY = "x-model"


def _priority(context: grpc.aio.ServicerContext) -> str | None:
    """The call's `x-priority` metadata, as HTTP's header: which lane its inputs wait in."""
    for key, value in context.invocation_metadata() or ():
        if key == "x-priority":
            return value if isinstance(value, str) else value.decode("latin-1")
    return None


def model_of(state: AppState, context: grpc.aio.ServicerContext) -> ModelState:
    """The served model a call is for, by its `x-model` metadata."""
    name = None
    for key, value in context.invocation_metadata() or ():
        if key == MODEL_KEY:
            name = value.decode() if isinstance(value, bytes) else value
            break
    return state.models.get(name)


class _Service:
    def __init__(self, state: AppState, max_parallel_stream_requests: int) -> None:
        self.state = state
        self.max_parallel = max_parallel_stream_requests

    async def _unary(
        self, context: grpc.aio.ServicerContext, call: Callable[[ModelState], Awaitable[Answer]]
    ) -> Any:
        try:
            response, result = await call(model_of(self.state, context))
        except Exception as exc:
            await _fail(context, exc)
            raise  # not reached: abort raises
        if result is not None:
            await context.send_initial_metadata(tuple(timing_headers(result).items()))
        return response

    async def _stream(
        self,
        context: grpc.aio.ServicerContext,
        requests: AsyncIterable[Req],
        handle: Callable[[ModelState, Req], Awaitable[Answer]],
    ) -> AsyncIterator[Any]:
        try:
            model = model_of(self.state, context)
            async for response, _ in ordered(
                requests, lambda r: handle(model, r), self.max_parallel
            ):
                yield response
        except Exception as exc:
            await _fail(context, exc)

    @staticmethod
    def _require_reranker(model: ModelState) -> None:
        # TEI's gRPC words these two without the "Backend error: " of the other routes.
        kind = model.infer.spec.kind
        if kind == "embedding":
            raise ModelTypeError("model is not a classifier model")
        if kind != "reranker":
            raise ModelTypeError("model is not a re-ranker model")


#: How an RPC's message is answered: (service, model, message, wait for permits, lane).
Handler = Callable[[Any, ModelState, Any, bool, str | None], Awaitable[Answer]]


def _unary_rpc(handle: Handler) -> Callable[..., Awaitable[Any]]:
    """A unary RPC answered by `handle`, its permit taken at once."""

    async def rpc(self: _Service, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._unary(
            context, lambda m: handle(self, m, request, False, _priority(context))
        )

    return rpc


def _stream_rpc(handle: Handler) -> Callable[..., AsyncIterator[Any]]:
    """The streaming RPC of the same messages, each answered by `handle`, waiting for permits."""

    async def rpc(
        self: _Service, request_iterator: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        async for response in self._stream(
            context, request_iterator, lambda m, r: handle(self, m, r, True, _priority(context))
        ):
            yield response

    return rpc


class InfoService(_Service, pb_grpc.InfoServicer):
    async def Info(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._unary(context, self._info)

    async def _info(self, model: ModelState) -> Answer:
        info = model.info()
        optional_fields = {
            k: info[k]
            for k in ("sha", "docker_label", "model_sha", "max_batch_requests")
            if info[k] is not None
        }
        return pb.InfoResponse(
            version=info["version"],
            model_id=info["model_id"],
            model_dtype=info["model_dtype"],
            model_type=_MODEL_TYPES[model.infer.spec.kind],
            max_concurrent_requests=info["max_concurrent_requests"],
            max_input_length=info["max_input_length"],
            max_batch_tokens=info["max_batch_tokens"],
            max_client_batch_size=info["max_client_batch_size"],
            tokenization_workers=info["tokenization_workers"],
            **optional_fields,
        ), None


class EmbedService(_Service, pb_grpc.EmbedServicer):
    async def _embed(
        self, model: ModelState, req: Any, wait: bool, priority: str | None = None
    ) -> Answer:
        normalize = optional(req, "normalize")
        result = await model.infer.embed(
            [req.inputs],
            truncate=req.truncate,
            direction=direction(req.truncation_direction),
            prompt_name=optional(req, "prompt_name"),
            normalize=True if normalize is None else normalize,
            dimensions=optional(req, "dimensions"),
            wait_for_permits=wait,
            priority=priority,
        )
        vector = result.values[0]
        return pb.EmbedResponse(embeddings=vector.tolist(), metadata=metadata(result)), result

    async def _sparse(
        self, model: ModelState, req: Any, wait: bool, priority: str | None = None
    ) -> Answer:
        result = await model.infer.embed_sparse(
            [req.inputs],
            truncate=req.truncate,
            direction=direction(req.truncation_direction),
            prompt_name=optional(req, "prompt_name"),
            wait_for_permits=wait,
            priority=priority,
        )
        indices, values = result.values[0]
        sparse = [
            pb.SparseValue(index=int(i), value=float(v))
            for i, v in zip(indices.tolist(), values.tolist(), strict=True)
        ]
        return pb.EmbedSparseResponse(sparse_embeddings=sparse, metadata=metadata(result)), result

    async def _all(
        self, model: ModelState, req: Any, wait: bool, priority: str | None = None
    ) -> Answer:
        result = await model.infer.embed_all(
            [req.inputs],
            truncate=req.truncate,
            direction=direction(req.truncation_direction),
            prompt_name=optional(req, "prompt_name"),
            wait_for_permits=wait,
            priority=priority,
        )
        hidden = result.values[0]
        tokens = await answers.off_loop(hidden.size, _token_embeddings, hidden)
        return pb.EmbedAllResponse(token_embeddings=tokens, metadata=metadata(result)), result

    Embed = _unary_rpc(_embed)
    EmbedStream = _stream_rpc(_embed)
    EmbedSparse = _unary_rpc(_sparse)
    EmbedSparseStream = _stream_rpc(_sparse)
    EmbedAll = _unary_rpc(_all)
    EmbedAllStream = _stream_rpc(_all)


def _pair(texts: Any) -> PairInput:
    if len(texts) == 1:
        return str(texts[0])
    if len(texts) == 2:
        return (str(texts[0]), str(texts[1]))
    raise ValidationError(f"`inputs` must have a single or two elements. Given: {len(texts)}")


class PredictService(_Service, pb_grpc.PredictServicer):
    async def _classify(
        self,
        model: ModelState,
        inputs: PairInput,
        req: Any,
        wait: bool,
        priority: str | None = None,
    ) -> Answer:
        result = await model.infer.predict(
            [inputs],
            truncate=req.truncate,
            direction=direction(req.truncation_direction),
            raw_scores=req.raw_scores,
            wait_for_permits=wait,
            priority=priority,
        )
        predictions = [pb.Prediction(score=s, label=label) for label, s in result.values[0]]
        return pb.PredictResponse(predictions=predictions, metadata=metadata(result)), result

    async def _predict(
        self, model: ModelState, req: Any, wait: bool, priority: str | None = None
    ) -> Answer:
        return await self._classify(model, req.inputs, req, wait, priority)

    async def _predict_pair(
        self, model: ModelState, req: Any, wait: bool, priority: str | None = None
    ) -> Answer:
        return await self._classify(model, _pair(req.inputs), req, wait, priority)

    Predict = _unary_rpc(_predict)
    PredictPair = _unary_rpc(_predict_pair)
    PredictStream = _stream_rpc(_predict)
    PredictPairStream = _stream_rpc(_predict_pair)


class RerankService(_Service, pb_grpc.RerankServicer):
    def _ranks(self, order: list[tuple[int, float]], texts: list[str] | None) -> list[Any]:
        if texts is None:
            return [pb.Rank(index=i, score=s) for i, s in order]
        return [pb.Rank(index=i, score=s, text=texts[i]) for i, s in order]

    async def _rerank(self, model: ModelState, req: Any, priority: str | None = None) -> Answer:
        texts = list(req.texts)
        if not texts:
            # INVALID_ARGUMENT either way; TEI's gRPC reports this one as Validation.
            raise ValidationError("`texts` cannot be empty")
        self._require_reranker(model)
        result = await model.infer.rerank(
            req.query,
            texts,
            truncate=req.truncate,
            direction=direction(req.truncation_direction),
            raw_scores=req.raw_scores,
            wait_for_permits=True,
            priority=priority,
        )
        ranks = self._ranks(result.values, texts if req.return_text else None)
        return pb.RerankResponse(ranks=ranks, metadata=metadata(result)), result

    async def _rerank_stream(
        self, model: ModelState, requests: AsyncIterable[Any], priority: str | None = None
    ) -> Answer:
        self._require_reranker(model)
        first: list[Any] = []
        texts: list[str] = []

        def score(m: Any) -> Awaitable[Result[Any]]:
            if not first:
                first.append(m)  # raw_scores and return_text come from the first message
            texts.append(m.text)
            return model.infer.predict(
                [(m.query, m.text)],
                truncate=m.truncate,
                direction=direction(m.truncation_direction),
                raw_scores=first[0].raw_scores,
                wait_for_permits=True,
                priority=priority,
                counted=False,
            )

        async def ranked() -> Result[list[tuple[int, float]]]:
            results = [r async for r in ordered(requests, score, self.max_parallel)]
            if not results:
                raise EmptyError("`texts` cannot be empty")
            scores = [r.values[0][0][1] for r in results]
            n = len(results)
            return Result(
                [(i, scores[i]) for i in postprocess.rerank_order(scores)],
                chars=sum(r.chars for r in results),
                tokens=sum(r.tokens for r in results),
                timings=Timings(
                    tokenization=sum(r.timings.tokenization for r in results if r.timings) / n,
                    queue=sum(r.timings.queue for r in results if r.timings) / n,
                    inference=sum(r.timings.inference for r in results if r.timings) / n,
                ),
            )

        # TEI counts a stream as one batch request, however many messages it has.
        total = await model.infer.stream_request(ranked, "rerank")
        ranks = self._ranks(total.values, texts if first[0].return_text else None)
        return pb.RerankResponse(ranks=ranks, metadata=metadata(total)), total

    async def Rerank(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._unary(context, lambda m: self._rerank(m, request, _priority(context)))

    async def RerankStream(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._unary(
            context, lambda m: self._rerank_stream(m, request_iterator, _priority(context))
        )


def _token_embeddings(hidden: np.ndarray) -> list[Any]:
    return [pb.TokenEmbedding(embeddings=row) for row in hidden.tolist()]


def _encode_response(t: Tokens) -> Any:
    tokens = [
        pb.SimpleToken(id=i, text=x, special=True)
        if a is None
        else pb.SimpleToken(id=i, text=x, special=s, start=a, stop=b)
        for i, x, s, a, b in zip(t.ids, t.texts, t.special, t.starts, t.stops, strict=True)
    ]
    return pb.EncodeResponse(tokens=tokens)


class TokenizeService(_Service, pb_grpc.TokenizeServicer):
    async def _tokenize(self, model: ModelState, req: Any) -> Answer:
        tokens = await model.infer.tokenize(
            [req.inputs],
            add_special_tokens=req.add_special_tokens,
            prompt_name=optional(req, "prompt_name"),
        )
        return await answers.off_loop(len(tokens[0]), _encode_response, tokens[0]), None

    async def _decode(self, model: ModelState, req: Any) -> Answer:
        texts = await model.infer.decode(
            [list(req.ids)], skip_special_tokens=req.skip_special_tokens
        )
        return pb.DecodeResponse(text=texts[0]), None

    async def Tokenize(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._unary(context, lambda m: self._tokenize(m, request))

    async def TokenizeStream(
        self, request_iterator: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        async for response in self._stream(context, request_iterator, self._tokenize):
            yield response

    async def Decode(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._unary(context, lambda m: self._decode(m, request))

    async def DecodeStream(
        self, request_iterator: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        async for response in self._stream(context, request_iterator, self._decode):
            yield response


def add_services(server: grpc.aio.Server, state: AppState, max_parallel: int) -> None:
    pb_grpc.add_InfoServicer_to_server(InfoService(state, max_parallel), server)
    pb_grpc.add_EmbedServicer_to_server(EmbedService(state, max_parallel), server)
    pb_grpc.add_PredictServicer_to_server(PredictService(state, max_parallel), server)
    pb_grpc.add_RerankServicer_to_server(RerankService(state, max_parallel), server)
    pb_grpc.add_TokenizeServicer_to_server(TokenizeService(state, max_parallel), server)
