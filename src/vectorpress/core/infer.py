"""Infer: one object per served model; every dialect (HTTP, OpenAI, gRPC) calls these methods."""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from vectorpress.core import postprocess
from vectorpress.core.admission import Admission
from vectorpress.core.calibration import Calibration
from vectorpress.core.metrics import Metrics, stage_histograms
from vectorpress.core.queue import BatchingQueue, Lane, LanePolicy, parse_priority
from vectorpress.core.tokenization import PairInput, TextInput, TokenizerPool, Tokens
from vectorpress.core.worker import BackendWorker
from vectorpress.errors import (
    BackendError,
    BatchSizeError,
    EmptyError,
    ModelTypeError,
    UnhealthyError,
    ValidationError,
    VectorpressError,
)
from vectorpress.model_spec import ColbertSpec, LlmRerankSpec, ModelSpec
from vectorpress.observability import tracing
from vectorpress.types import Encoding, Entry, MultiOutput, OutputKind, Timings, Truncation

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

T = TypeVar("T")


@dataclass
class Result(Generic[T]):
    """A request's values plus what TEI reports about it in headers and usage."""

    values: T
    chars: int = 0
    tokens: int = 0
    timings: Timings | None = None
    """Mean per input, as TEI's x-*-time headers."""
    total_time: float = 0.0
    lengths: list[int] = field(default_factory=list)
    """Tokens of each input as it went to the model (batch jobs write them per row)."""


@dataclass
class _Run:
    values: list[Any]
    """Arrays, or for MULTI entries dicts of named arrays."""
    encodings: list[Encoding]
    timings: Timings


def window_means(
    vectors: list[np.ndarray], lengths: list[int], spans: list[int]
) -> list[np.ndarray]:
    """One vector per input from its windows' (`spans[i]` consecutive vectors): their mean
    weighted by each window's token count."""
    out = []
    start = 0
    for span in spans:
        rows = np.stack(vectors[start : start + span]).astype(np.float64)
        weights = np.asarray(lengths[start : start + span], dtype=np.float64)
        out.append((weights @ rows / weights.sum()).astype(np.float32))
        start += span
    return out


_PLACEHOLDER = re.compile(r"\{(query|document|instruction)\}")


def llm_prompt(llm: LlmRerankSpec, query: str, document: str) -> str:
    """The pair's text in the template; in one pass, so that braces in the texts stay as
    they are."""
    values = {"query": query, "document": document, "instruction": llm.instruction}
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], llm.template)


def colbert_encoding(enc: Encoding, colbert: ColbertSpec, is_query: bool) -> Encoding:
    """PyLate's ColBERT input: the side's prefix token after the first token, and a query
    padded with mask tokens to the query length, which the other tokens do not attend to
    unless the model says so."""
    prefix = colbert.query_prefix_id if is_query else colbert.document_prefix_id
    ids = list(enc.ids)
    if prefix is not None:
        ids = [*ids[:1], prefix, *ids[1:]]
    attended = None
    if is_query and colbert.expansion and len(ids) < colbert.query_length:
        real = len(ids)
        ids += [colbert.mask_token_id] * (colbert.query_length - real)
        attended = None if colbert.attend_to_expansion else real
    return Encoding(
        ids, [0] * len(ids), enc.position_offset, enc.chars, enc.truncated, attended=attended
    )


def m3_weights(weights: Sequence[float] | None) -> tuple[float, float, float]:
    """A request's bge-m3 weights (dense, sparse, ColBERT), checked: three, none negative, not
    all zero, with a finite sum (the score is divided by it)."""
    if weights is None:
        return postprocess.M3_DEFAULT_WEIGHTS
    values = tuple(float(w) for w in weights)
    total = sum(values)
    if (
        len(values) != 3
        or any(not np.isfinite(w) or w < 0 for w in values)
        or not np.isfinite(total)
        or total <= 0
    ):
        raise ValidationError(
            "Input validation error: `weights` must be three non-negative numbers (dense, "
            f"sparse, colbert) that do not sum to zero, got {list(weights)}"
        )
    return values


class Infer:
    """The pipeline for one model: admission, tokenization, queue, worker, post-processing."""

    def __init__(
        self,
        spec: ModelSpec,
        tokenizers: TokenizerPool,
        queue: BatchingQueue,
        worker: BackendWorker,
        *,
        max_concurrent_requests: int,
        max_client_batch_size: int,
        auto_truncate: bool,
        windowed: bool = False,
        window_overlap: int = 0,
        metrics: Metrics | None = None,
        lanes: LanePolicy | None = None,
        server_admission: Admission | None = None,
    ) -> None:
        self.spec = spec
        self.tokenizers = tokenizers
        self.queue = queue
        self.worker = worker
        self.admission = Admission(max_concurrent_requests)
        self.server_admission = server_admission
        """The permits every model shares (a server-wide cap), taken with this model's own."""
        self.lanes = lanes or LanePolicy()
        self.max_client_batch_size = max_client_batch_size
        self.auto_truncate = auto_truncate
        self.windowed = windowed
        self.window_overlap = window_overlap
        self.metrics = metrics or Metrics(spec.max_input_length)
        self.metrics.gauge_callback("te_queue_size", lambda: len(queue))
        self.tracer: Tracer | None = None
        """Set when --otlp-endpoint is given; None means no span is ever created."""
        self._probe: asyncio.Future[np.ndarray] | None = None
        self.calibration: Calibration | None = None
        """Ranges for int8/uint8 embeddings, set at start-up for dense embedding models."""

    @property
    def name(self) -> str:
        """The model's served name, which its metrics carry as their `model` label."""
        return self.metrics.model

    # -- checks shared by every route ----------------------------------------------------------

    def check_batch(self, n: int, what: str = "inputs") -> None:
        if n == 0:
            raise EmptyError(f"`{what}` cannot be empty")
        if n > self.max_client_batch_size:
            raise BatchSizeError(
                f"batch size {n} > maximum allowed batch size {self.max_client_batch_size}"
            )

    def _require_embedding(self) -> None:
        if self.spec.kind != "embedding":
            raise ModelTypeError("Backend error: Model is not an embedding model")

    def _check_dimensions(self, dimensions: int | None) -> None:
        if dimensions is None:
            return
        if dimensions <= 0:
            raise ValidationError("Input validation error: `dimensions` should be positive")
        if dimensions > self.spec.embedding_size:
            raise ValidationError(
                "Input validation error: `dimensions` should be smaller than the maximum "
                "embedding dimension."
            )

    # -- the one way through -------------------------------------------------------------------

    async def _run(
        self,
        n: int,
        encode: Callable[[], Awaitable[list[Encoding]]],
        kind: OutputKind,
        family: str,
        wait_for_permits: bool = False,
        priority: Lane | str | None = None,
    ) -> _Run:
        if not self.worker.alive:
            raise UnhealthyError()
        lane = priority if isinstance(priority, Lane) else parse_priority(priority)
        await self._admit(n, wait_for_permits)
        try:
            self.metrics.inc(f"te_{family}_count", n)
            started = time.perf_counter()
            try:
                if self.tracer is None:
                    encodings = await encode()
                else:
                    with tracing.stage(self.tracer, "tokenization", inputs=n):
                        encodings = await encode()
            except VectorpressError as exc:
                exc.counted_as = "tokenization"
                raise
            tokenization = time.perf_counter() - started
            self.metrics.observe_many(("te_request_input_length", len(e)) for e in encodings)
            truncated = sum(1 for e in encodings if e.truncated)
            if truncated:
                self.metrics.inc("vectorpress_truncated_inputs", truncated)
            loop = asyncio.get_running_loop()
            entries = [
                Entry(enc, kind, loop.create_future(), loop, tokenization=tokenization)
                for enc in encodings
            ]
            tokens = sum(len(e) for e in encodings)
            self.queue.put(entries, self.lanes.lane(lane, n, tokens))
            try:
                if len(entries) == 1:  # most requests: one loop iteration less than gather
                    values = [await entries[0].future]
                else:
                    values = await asyncio.gather(*(e.future for e in entries))
            finally:
                for entry in entries:
                    if not entry.future.done():
                        entry.future.cancel()
            if self.tracer is not None:
                tracing.record_batches(self.tracer, entries)
            timings = Timings(
                tokenization=tokenization,
                queue=sum(e.queue_time for e in entries) / n,
                inference=sum(e.inference_time for e in entries) / n,
            )
            total = time.perf_counter() - started
            # Recorded once the response is on its way (see _counted).
            loop.call_soon(self._record_run, family, entries, tokenization, total)
            return _Run(list(values), encodings, timings)
        finally:
            self.admission.release(n)
            if self.server_admission is not None:
                self.server_admission.release(n)

    async def _admit(self, n: int, wait: bool) -> None:
        """This model's permits, then the server's (both or neither)."""
        if wait:
            await self.admission.acquire(n)
        else:
            self.admission.try_acquire(n)
        if self.server_admission is None:
            return
        try:
            if wait:
                await self.server_admission.acquire(n)
            else:
                self.server_admission.try_acquire(n)
        except BaseException:
            self.admission.release(n)
            raise

    def _record_run(
        self, family: str, entries: list[Entry], tokenization: float, total: float
    ) -> None:
        self.metrics.inc(f"te_{family}_success", len(entries))
        duration, tokenizing, queue, inference = stage_histograms(f"te_{family}")
        values: list[tuple[str, float]] = []
        for entry in entries:
            values += (
                (duration, total),
                (tokenizing, tokenization),
                (queue, entry.queue_time),
                (inference, entry.inference_time),
            )
        self.metrics.observe_many(values)

    async def _request(
        self,
        n: int,
        call: Callable[[], Awaitable[Result[T]]],
        operation: str,
        batch: bool | None = None,
    ) -> Result[T]:
        # TEI labels a request by the shape its caller sent (a list of one is a batch); a
        # dialect that knows the shape says so, otherwise the count decides.
        method = "batch" if (n != 1 if batch is None else batch) else "single"
        if self.tracer is None:
            return await self._counted(method, call)
        with tracing.request_span(self.tracer, operation, n):
            return await self._counted(method, call)

    async def stream_request(
        self, call: Callable[[], Awaitable[Result[T]]], operation: str
    ) -> Result[T]:
        """One request made of a stream's messages (gRPC RerankStream): counted once, as TEI
        counts a stream; the messages are `predict(..., counted=False)` calls inside `call`."""
        return await self._request(0, call, operation, batch=True)

    async def _counted(self, method: str, call: Callable[[], Awaitable[Result[T]]]) -> Result[T]:
        """Count a request and time it; failures are counted by their error kind."""
        self.metrics.inc("te_request_count", method=method)
        started = time.perf_counter()
        try:
            result = await call()
        except VectorpressError as exc:
            self.metrics.inc("te_request_failure", err=exc.metric)
            self.metrics.fold_due()
            raise
        except asyncio.CancelledError:
            self.metrics.inc("te_request_failure", err="dropped")
            self.metrics.fold_due()
            raise
        result.total_time = time.perf_counter() - started
        # After a forward pass the caches are cold and each metric update costs microseconds:
        # they wait for the loop's next turn, by when the handler has written its response.
        asyncio.get_running_loop().call_soon(self._record_request, method, result)
        return result

    def _record_request(self, method: str, result: Result[Any]) -> None:
        self.metrics.inc("te_request_success", method=method)
        timings = result.timings
        if timings is None:
            self.metrics.observe(stage_histograms("te_request")[0], result.total_time)
        else:
            values = (result.total_time, timings.tokenization, timings.queue, timings.inference)
            self.metrics.observe_many(zip(stage_histograms("te_request"), values, strict=True))
        self.metrics.fold_due()

    @staticmethod
    def _chars(inputs: Sequence[TextInput]) -> int:
        return sum(len(i) for i in inputs)

    # -- embeddings ----------------------------------------------------------------------------

    async def embed(
        self,
        inputs: Sequence[TextInput],
        *,
        truncate: bool | None = None,
        direction: Truncation = Truncation.RIGHT,
        prompt_name: str | None = None,
        normalize: bool = True,
        dimensions: int | None = None,
        wait_for_permits: bool = False,
        batch: bool | None = None,
        windowed: bool | None = None,
        window_overlap: int | None = None,
        priority: Lane | str | None = None,
    ) -> Result[list[np.ndarray]]:
        """Pooled vectors (Dense applied), then Matryoshka truncation, then normalization.

        `windowed` (the server's default when None): a text longer than the model's window is
        cut into windows sharing `window_overlap` tokens, each embedded as an input of its own
        in the same batches, and its vector is the token-weighted mean of theirs (vLLM's
        chunked processing); usage counts every window's tokens.
        """

        async def call() -> Result[list[np.ndarray]]:
            self._require_embedding()
            if self.spec.colbert is not None:
                raise ModelTypeError(
                    "Backend error: a ColBERT model gives per-token vectors only; use /embed_multi"
                )
            self.check_batch(len(inputs))
            if self.spec.is_splade and normalize:
                raise BackendError("Backend error: `normalize` is not available for SPLADE models")
            self._check_dimensions(dimensions)
            spans: list[int] = []
            use_windows = self.windowed if windowed is None else windowed

            async def encode() -> list[Encoding]:
                if not use_windows:
                    return await self._encode_texts(inputs, truncate, direction, prompt_name)
                if any(not isinstance(i, str) for i in inputs):
                    raise ValidationError(
                        "Input validation error: `windowed` inputs must be texts, not token ids"
                    )
                overlap = self.window_overlap if window_overlap is None else window_overlap
                windows = await self.tokenizers.encode_windows(
                    [str(i) for i in inputs], overlap=overlap, prompt_name=prompt_name
                )
                spans.extend(len(w) for w in windows)
                return [e for w in windows for e in w]

            run = await self._run(
                len(inputs), encode, OutputKind.POOLED, "embed", wait_for_permits, priority
            )
            values = run.values
            if spans:
                values = window_means(values, [len(e) for e in run.encodings], spans)
            vectors = []
            for v in values:
                v = postprocess.matryoshka(v, dimensions)
                vectors.append(postprocess.l2_normalize(v) if normalize else v)
            return self._result(vectors, run, self._chars(inputs))

        return await self._request(len(inputs), call, "embed", batch)

    async def embed_sparse(
        self,
        inputs: Sequence[TextInput],
        *,
        truncate: bool | None = None,
        direction: Truncation = Truncation.RIGHT,
        prompt_name: str | None = None,
        wait_for_permits: bool = False,
        batch: bool | None = None,
        priority: Lane | str | None = None,
    ) -> Result[list[tuple[np.ndarray, np.ndarray]]]:
        """SPLADE vectors as (indices, values) of their non-zero entries."""

        async def call() -> Result[list[tuple[np.ndarray, np.ndarray]]]:
            if self.spec.kind != "embedding" or not self.spec.has_sparse:
                raise ModelTypeError(
                    "Backend error: Model is not an embedding model with SPLADE pooling"
                )
            self.check_batch(len(inputs))
            m3 = self.spec.m3 is not None
            run = await self._run(
                len(inputs),
                lambda: self._encode_texts(inputs, truncate, direction, prompt_name),
                OutputKind.MULTI if m3 else OutputKind.POOLED,
                "embed",
                wait_for_permits,
                priority,
            )
            if m3:
                values = [(v["sparse_ids"], v["sparse_weights"]) for v in run.values]
            else:
                values = [postprocess.sparsify(v) for v in run.values]
            return self._result(values, run, self._chars(inputs))

        return await self._request(len(inputs), call, "embed_sparse", batch)

    async def embed_all(
        self,
        inputs: Sequence[TextInput],
        *,
        truncate: bool | None = None,
        direction: Truncation = Truncation.RIGHT,
        prompt_name: str | None = None,
        wait_for_permits: bool = False,
        batch: bool | None = None,
        priority: Lane | str | None = None,
    ) -> Result[list[np.ndarray]]:
        """The last hidden state of every token, special and prompt tokens included."""

        async def call() -> Result[list[np.ndarray]]:
            self._require_embedding()
            if self.spec.is_splade:
                raise BackendError("Backend error: `embed_all` is not available for SPLADE models")
            self.check_batch(len(inputs))
            run = await self._run(
                len(inputs),
                lambda: self._encode_texts(inputs, truncate, direction, prompt_name),
                OutputKind.RAW,
                "embed",
                wait_for_permits,
                priority,
            )
            return self._result(run.values, run, self._chars(inputs))

        return await self._request(len(inputs), call, "embed_all", batch)

    async def embed_multi(
        self,
        inputs: Sequence[TextInput],
        *,
        dense: bool = False,
        sparse: bool = False,
        colbert: bool = True,
        normalize: bool = True,
        truncate: bool | None = None,
        direction: Truncation = Truncation.RIGHT,
        prompt_name: str | None = None,
        is_query: bool = True,
        wait_for_permits: bool = False,
        batch: bool | None = None,
        windowed: bool | None = None,
        priority: Lane | str | None = None,
    ) -> Result[list[MultiOutput]]:
        """Any of a multi-output model's dense vector, sparse weights and per-token (ColBERT)
        vectors, all from one forward pass per input. A ColBERT model encodes the inputs as
        queries (prefix, expansion) or documents (prefix, skip-list) by `is_query`.

        Never windowed (`windowed=True` is refused; the server default does not apply): the
        token vectors of overlapping windows would repeat the shared tokens in two contexts and
        a query's expansion has no windows. A long document is split into passages, each
        indexed on its own, as ColBERT indexes are built."""

        async def call() -> Result[list[MultiOutput]]:
            self._require_multi_vector()
            self._refuse_windows(windowed)
            if not (dense or sparse or colbert):
                raise ValidationError(
                    "Input validation error: ask for at least one of `dense`, `sparse` and "
                    "`colbert`"
                )
            offered = self.spec.outputs
            for name, wanted in (("dense", dense), ("sparse", sparse), ("colbert", colbert)):
                if wanted and name not in offered:
                    raise ModelTypeError(f"Backend error: Model has no {name} output")
            self.check_batch(len(inputs))
            sides = [is_query] * len(inputs)
            run = await self._run(
                len(inputs),
                lambda: self._encode_multi(inputs, sides, truncate, direction, prompt_name),
                OutputKind.MULTI,
                "embed",
                wait_for_permits,
                priority,
            )
            out = []
            for v in self._kept_tokens(run, sides):
                vector = v.get("dense") if dense else None
                if vector is not None and normalize:
                    vector = postprocess.l2_normalize(vector)
                out.append(
                    MultiOutput(
                        dense=vector,
                        sparse=(v["sparse_ids"], v["sparse_weights"]) if sparse else None,
                        colbert=v["colbert"] if colbert else None,
                    )
                )
            return self._result(out, run, self._chars(inputs))

        return await self._request(len(inputs), call, "embed_multi", batch)

    async def _encode_multi(
        self,
        inputs: Sequence[TextInput],
        queries: list[bool],
        truncate: bool | None,
        direction: Truncation,
        prompt_name: str | None = None,
    ) -> list[Encoding]:
        """Encodings for MULTI entries; a ColBERT model's with its prefix and query expansion."""
        colbert = self.spec.colbert
        if colbert is None:
            return await self._encode_texts(inputs, truncate, direction, prompt_name)
        out: list[Encoding] = []
        for side in (True, False):
            which = [i for i, q in enumerate(queries) if q is side]
            if not which:
                continue
            length = colbert.query_length if side else colbert.document_length
            prefix = colbert.query_prefix_id if side else colbert.document_prefix_id
            encodings = await self._encode_texts(
                [inputs[i] for i in which],
                truncate,
                direction,
                prompt_name,
                max_length=length - (prefix is not None),
            )
            out.extend(colbert_encoding(e, colbert, side) for e in encodings)
        # Back in input order: queries were encoded first.
        order = [i for q in (True, False) for i, side in enumerate(queries) if side is q]
        ranked = sorted(range(len(order)), key=order.__getitem__)
        return [out[r] for r in ranked]

    def _kept_tokens(self, run: _Run, queries: list[bool]) -> list[dict[str, np.ndarray]]:
        """MULTI values with a ColBERT document's skip-list tokens dropped (PyLate keeps every
        token of a query)."""
        colbert = self.spec.colbert
        if colbert is None:
            return list(run.values)
        out = []
        for value, enc, is_query in zip(run.values, run.encodings, queries, strict=True):
            if not is_query:
                keep = ~np.isin(np.asarray(enc.ids), colbert.skiplist_ids)
                value = {**value, "colbert": value["colbert"][keep]}
            out.append(value)
        return out

    def _refuse_windows(self, windowed: bool | None) -> None:
        """Per-token outputs and LLM rerankers are not windowed: asking for it is a 422."""
        if windowed:
            what = "an LLM reranker's prompts" if self.spec.llm_rerank else "per-token vectors"
            raise ValidationError(
                f"Input validation error: `windowed` is not available for {what}; split long "
                "documents into passages, or let them be truncated"
            )

    def _require_multi_vector(self) -> None:
        if not self.spec.has_multi_vector:
            raise ModelTypeError(
                "Backend error: Model has no multi-vector (ColBERT) output; serve a bge-m3 or "
                "ColBERT model"
            )

    async def similarity(
        self,
        source: str,
        sentences: Sequence[str],
        *,
        truncate: bool | None = None,
        direction: Truncation = Truncation.RIGHT,
        prompt_name: str | None = None,
        priority: Lane | str | None = None,
    ) -> Result[list[float]]:
        """Cosine similarity of each sentence with the source sentence."""
        if not sentences:
            raise EmptyError("`sentences` cannot be empty")
        self.check_batch(len(sentences) + 1)
        result = await self.embed(
            [source, *sentences],
            truncate=truncate,
            direction=direction,
            prompt_name=prompt_name,
            normalize=False,
            priority=priority,
        )
        src, *rest = result.values
        return Result(
            [postprocess.cosine(src, v) for v in rest],
            result.chars,
            result.tokens,
            result.timings,
            result.total_time,
        )

    # -- classification and reranking ----------------------------------------------------------

    async def predict(
        self,
        inputs: Sequence[PairInput],
        *,
        truncate: bool | None = None,
        direction: Truncation = Truncation.RIGHT,
        raw_scores: bool = False,
        wait_for_permits: bool = False,
        batch: bool | None = None,
        priority: Lane | str | None = None,
        counted: bool = True,
    ) -> Result[list[list[tuple[str, float]]]]:
        """Per input, every (label, score) sorted by score descending.

        `counted=False` leaves the request metrics to a caller that counts a larger request
        this is part of (`stream_request`).
        """

        async def call() -> Result[list[list[tuple[str, float]]]]:
            if self.spec.kind == "embedding":
                raise ModelTypeError("Backend error: Model is not a classifier model")
            self.check_batch(len(inputs))
            run = await self._run(
                len(inputs),
                lambda: self._encode_pairs(inputs, truncate, direction),
                OutputKind.POOLED,
                "predict",
                wait_for_permits,
                priority,
            )
            out = []
            for logits in run.values:
                scores = postprocess.class_scores(logits, raw_scores)
                labelled = [(self.spec.id2label[i], float(s)) for i, s in enumerate(scores)]
                labelled.sort(key=lambda p: p[1], reverse=True)
                out.append(labelled)
            chars = sum(len(i) if isinstance(i, str) else len(i[0]) + len(i[1]) for i in inputs)
            return self._result(out, run, chars)

        if not counted:
            return await call()
        return await self._request(len(inputs), call, "predict", batch)

    async def rerank(
        self,
        query: str,
        texts: Sequence[str],
        *,
        truncate: bool | None = None,
        direction: Truncation = Truncation.RIGHT,
        raw_scores: bool = False,
        wait_for_permits: bool = False,
        weights: Sequence[float] | None = None,
        windowed: bool | None = None,
        window_overlap: int | None = None,
        max_windows: int | None = None,
        priority: Lane | str | None = None,
    ) -> Result[list[tuple[int, float]]]:
        """(index, score) of each text, best first; ties put the higher index first.

        A cross-encoder scores each pair; a bge-m3 model encodes the query and the texts once
        each and scores them by FlagEmbedding's weighted mean of its dense, sparse and ColBERT
        scores (`weights`, in that order; its defaults otherwise).

        `windowed` (a cross-encoder; the server's default when None): a text too long for the
        model's window with the query is scored window by window, and its score is the best
        window's (Cohere's max over chunks); `max_windows` keeps each text's first windows only
        (Cohere's `max_chunks_per_doc`) and asks for windows by itself.
        """
        if max_windows is not None:
            windowed = True

        async def call() -> Result[list[tuple[int, float]]]:
            if max_windows is not None and max_windows <= 0:
                raise ValidationError(
                    "Input validation error: `max_chunks_per_doc` must be a positive integer"
                )
            if self.spec.has_multi_vector:
                self._refuse_windows(windowed)
                if not texts:
                    raise EmptyError("`texts` cannot be empty")
                self.check_batch(len(texts), "texts")
                scored = await self._score_multi(
                    [query] * len(texts), texts, truncate, direction, weights, priority
                )
                ranked = [(i, scored.values[i]) for i in postprocess.rerank_order(scored.values)]
                return Result(
                    ranked, scored.chars, scored.tokens, scored.timings, lengths=scored.lengths
                )
            if self.spec.llm_rerank is not None:
                self._refuse_windows(windowed)
            if weights is not None:
                raise ValidationError("Input validation error: `weights` is for bge-m3 models only")
            if self.spec.kind != "reranker":
                raise ModelTypeError("Backend error: model is not a re-ranker model")
            if not texts:
                raise EmptyError("`texts` cannot be empty")
            self.check_batch(len(texts), "texts")
            pairs: list[PairInput] = [(query, t) for t in texts]
            spans: list[int] = []
            use_windows = self.windowed if windowed is None else windowed

            async def encode() -> list[Encoding]:
                if not use_windows or self.spec.llm_rerank is not None:
                    # The server's default windows cross-encoders only (see _refuse_windows).
                    return await self._encode_pairs(pairs, truncate, direction)
                overlap = self.window_overlap if window_overlap is None else window_overlap
                windows = await self.tokenizers.encode_pair_windows(query, texts, overlap=overlap)
                if max_windows is not None:
                    windows = [w[:max_windows] for w in windows]
                spans.extend(len(w) for w in windows)
                return [e for w in windows for e in w]

            run = await self._run(
                len(texts),
                encode,
                OutputKind.POOLED,
                "predict",
                wait_for_permits,
                priority,
            )
            scores = [float(postprocess.class_scores(v, raw_scores)[0]) for v in run.values]
            if spans:
                bounds = [0, *itertools.accumulate(spans)]
                scores = [max(scores[a:b]) for a, b in itertools.pairwise(bounds)]
            ranked = [(i, scores[i]) for i in postprocess.rerank_order(scores)]
            chars = len(query) * len(texts) + sum(len(t) for t in texts)
            return self._result(ranked, run, chars)

        # TEI counts every rerank as a batch request, whatever the number of texts.
        return await self._request(len(texts), call, "rerank", batch=True)

    async def _encode_pairs(
        self, inputs: Sequence[PairInput], truncate: bool | None, direction: Truncation
    ) -> list[Encoding]:
        """A cross-encoder's pair encodings, or an LLM reranker's prompts."""
        llm = self.spec.llm_rerank
        if llm is None:
            return await self.tokenizers.encode_pairs(
                inputs, truncate=self._truncate(truncate), direction=direction
            )
        texts = []
        for item in inputs:
            if isinstance(item, str):
                raise ValidationError(
                    "Input validation error: an LLM reranker scores (query, document) pairs; "
                    "give two texts per input"
                )
            texts.append(llm_prompt(llm, item[0], item[1]))
        return await self.tokenizers.encode_wrapped(
            texts, prefix=llm.prefix, suffix=llm.suffix, truncate=self._truncate(truncate)
        )

    async def score_multi(
        self,
        queries: Sequence[str],
        documents: Sequence[str],
        *,
        truncate: bool | None = None,
        direction: Truncation = Truncation.RIGHT,
        weights: Sequence[float] | None = None,
        priority: Lane | str | None = None,
    ) -> Result[list[float]]:
        """The late-interaction score of each (query, document) pair: a bge-m3 model's
        weighted mean of its three scores (FlagEmbedding's compute_score), a ColBERT model's
        MaxSim. Each distinct text is encoded once, queries as queries, documents as
        documents."""

        async def call() -> Result[list[float]]:
            if not self.spec.has_multi_vector:
                raise ModelTypeError(
                    "Backend error: late-interaction scores need a bge-m3 or ColBERT model"
                )
            if not documents:
                raise EmptyError("Input validation error: nothing to score")
            self.check_batch(len(documents), "texts")
            return await self._score_multi(
                queries, documents, truncate, direction, weights, priority
            )

        return await self._request(len(documents), call, "predict", batch=True)

    async def _score_multi(
        self,
        queries: Sequence[str],
        documents: Sequence[str],
        truncate: bool | None,
        direction: Truncation,
        weights: Sequence[float] | None,
        priority: Lane | str | None,
    ) -> Result[list[float]]:
        if self.spec.m3 is None and weights is not None:
            raise ValidationError("Input validation error: `weights` is for bge-m3 models only")
        mode = m3_weights(weights)
        distinct_q = list(dict.fromkeys(queries))
        distinct_d = list(dict.fromkeys(documents))
        everything = [*distinct_q, *distinct_d]
        sides = [True] * len(distinct_q) + [False] * len(distinct_d)
        run = await self._run(
            len(everything),
            lambda: self._encode_multi(everything, sides, truncate, direction),
            OutputKind.MULTI,
            "predict",
            False,
            priority,
        )
        values = self._kept_tokens(run, sides)
        q_out = dict(zip(distinct_q, values[: len(distinct_q)], strict=True))
        d_out = dict(zip(distinct_d, values[len(distinct_q) :], strict=True))
        scores = []
        for query, document in zip(queries, documents, strict=True):
            q, p = q_out[query], d_out[document]
            if self.spec.m3 is not None:
                scores.append(postprocess.m3_scores(q, p, mode)["colbert+sparse+dense"])
            else:
                scores.append(postprocess.maxsim(q["colbert"], p["colbert"]))
        return self._result(scores, run, self._chars(everything))

    # -- tokenizer routes ----------------------------------------------------------------------

    async def tokenize(
        self,
        inputs: Sequence[str],
        *,
        add_special_tokens: bool = True,
        prompt_name: str | None = None,
    ) -> list[Tokens]:
        self.check_batch(len(inputs))
        try:
            return await self.tokenizers.tokenize(
                inputs, add_special_tokens=add_special_tokens, prompt_name=prompt_name
            )
        except VectorpressError:
            # TEI counts tokenizer-route failures, though not the requests themselves.
            self.metrics.inc("te_request_failure", err="tokenization")
            raise

    async def decode(
        self, ids: Sequence[Sequence[int]], *, skip_special_tokens: bool = True
    ) -> list[str]:
        self.check_batch(len(ids), "ids")
        try:
            return await self.tokenizers.decode(ids, skip_special_tokens=skip_special_tokens)
        except VectorpressError:
            self.metrics.inc("te_request_failure", err="tokenization")
            raise

    # -- health --------------------------------------------------------------------------------

    async def health(self, timeout: float = 30.0) -> bool:
        """True when the backend answers: cheap after a good batch, a 1-token forward otherwise."""
        if not self.worker.alive:
            return False
        if self.worker.last_batch_ok:
            return True
        # Concurrent checks share one probe, so a flood of health checks against a failing
        # backend queues one forward pass, not one each.
        if self._probe is None or self._probe.done():
            loop = asyncio.get_running_loop()
            probe = Encoding(
                ids=[0], type_ids=[0], position_offset=self.spec.position_offset, probe=True
            )
            entry = Entry(probe, self.spec.probe_kind, loop.create_future(), loop)
            try:
                self.queue.put([entry], Lane.INTERACTIVE)
            except VectorpressError:
                return False
            self._probe = entry.future
        try:
            await asyncio.wait_for(asyncio.shield(self._probe), timeout)
        except (VectorpressError, asyncio.TimeoutError):
            return False
        return True

    # -- helpers -------------------------------------------------------------------------------

    async def _encode_texts(
        self,
        inputs: Sequence[TextInput],
        truncate: bool | None,
        direction: Truncation,
        prompt_name: str | None,
        max_length: int | None = None,
    ) -> list[Encoding]:
        """Single inputs encoded as a request asks them (`truncate` None: --auto-truncate's)."""
        return await self.tokenizers.encode(
            inputs,
            truncate=self._truncate(truncate),
            direction=direction,
            prompt_name=prompt_name,
            max_length=max_length,
        )

    def _truncate(self, truncate: bool | None) -> bool:
        return self.auto_truncate if truncate is None else truncate

    @staticmethod
    def _result(values: T, run: _Run, chars: int) -> Result[T]:
        lengths = [len(e) for e in run.encodings]
        return Result(values, chars, sum(lengths), run.timings, lengths=lengths)
