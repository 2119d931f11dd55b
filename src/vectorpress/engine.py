"""Engine / AsyncEngine: the serving pipeline in-process, for scripts, batch jobs and Ray actors.

Both are built by `server.load` and `server.build_pipeline`, exactly as `vectorpress serve`
builds its model: the same tokenizer pool, token-budget queue and device thread, so a vector
from an engine equals the server's to the bit. The pipeline runs on an event loop of its own
(one thread), so the synchronous `Engine` works from any thread and `AsyncEngine` from any
event loop.

Calls take any number of inputs: they are cut into requests of `max_client_batch_size`, which
wait for admission permits instead of being refused, so a list of a million texts streams
through the queue in token-budget batches.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from dataclasses import fields, replace
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import numpy as np

from vectorpress.api.state import AppState, ModelState
from vectorpress.core import postprocess
from vectorpress.core.infer import Infer, Result
from vectorpress.core.tokenization import PairInput, Tokens
from vectorpress.errors import UnhealthyError
from vectorpress.model_spec import ModelSpec
from vectorpress.settings import ModelSettings, ServerSettings, Settings
from vectorpress.types import Truncation

T = TypeVar("T")
P = ParamSpec("P")

__all__ = ["AsyncEngine", "Engine", "engine_settings"]


def engine_settings(
    model_id: str | None = None, settings: ModelSettings | None = None, **options: Any
) -> ModelSettings:
    """A model's settings (as `serve` gets them per model) from a model id or folder and
    options named as ModelSettings fields, or from given settings with options replaced."""
    known = {f.name for f in fields(ModelSettings)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"unknown Engine option(s): {', '.join(unknown)}")
    if settings is None:
        if model_id is None:
            from vectorpress.hub import bundled_model_path

            bundled = bundled_model_path()
            if bundled is None:
                raise TypeError("Engine needs a model id or folder (no bundled model installed)")
            model_id = str(bundled)
        return ModelSettings(model_id, **options)
    if model_id is not None:
        options["model_id"] = model_id
    return replace(settings, **options) if options else settings


class _Runtime:
    """One loaded model and the event-loop thread its pipeline runs on."""

    def __init__(self, settings: Settings, threads: int | None) -> None:
        from vectorpress.server import load

        self.served = load(settings, threads=threads)
        self.infer: Infer = self.served.infer
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="vp-engine", daemon=True)
        self._thread.start()
        self.closed = False
        self._lock = threading.Lock()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        if self.closed:
            coro.close()
            raise UnhealthyError("the engine is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self.served.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()


def _chunks(items: Sequence[T], size: int) -> list[Sequence[T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _merge(parts: list[Result[list[T]]]) -> Result[list[T]]:
    values: list[T] = []
    lengths: list[int] = []
    for part in parts:
        values.extend(part.values)
        lengths.extend(part.lengths)
    return Result(
        values,
        sum(p.chars for p in parts),
        sum(p.tokens for p in parts),
        parts[0].timings if parts else None,
        sum(p.total_time for p in parts),
        lengths,
    )


class _Calls:
    """The coroutines both engines run on the pipeline's loop, each call cut into requests."""

    def __init__(self, infer: Infer) -> None:
        self.infer = infer
        self.size = infer.max_client_batch_size

    def _cut(self, inputs: Sequence[T]) -> list[Sequence[T]]:
        return _chunks(inputs, self.size) or [inputs]

    async def _each(
        self,
        call: Callable[..., Coroutine[Any, Any, Result[list[T]]]],
        inputs: Sequence[Any],
        **kw: Any,
    ) -> Result[list[T]]:
        """`call` on each request's slice of `inputs`, waiting for admission, merged."""
        calls = (call(c, wait_for_permits=True, **kw) for c in self._cut(inputs))
        return _merge(list(await asyncio.gather(*calls)))

    async def embed(self, texts: Sequence[str], **kw: Any) -> Result[list[np.ndarray]]:
        return await self._each(self.infer.embed, texts, **kw)

    async def embed_sparse(
        self, texts: Sequence[str], **kw: Any
    ) -> Result[list[tuple[np.ndarray, np.ndarray]]]:
        return await self._each(self.infer.embed_sparse, texts, **kw)

    async def embed_all(self, texts: Sequence[str], **kw: Any) -> Result[list[np.ndarray]]:
        return await self._each(self.infer.embed_all, texts, **kw)

    async def predict(
        self, inputs: Sequence[PairInput], **kw: Any
    ) -> Result[list[list[tuple[str, float]]]]:
        return await self._each(self.infer.predict, inputs, **kw)

    async def rerank(
        self, query: str, texts: Sequence[str], **kw: Any
    ) -> Result[list[tuple[int, float]]]:
        parts = await asyncio.gather(
            *(self.infer.rerank(query, c, wait_for_permits=True, **kw) for c in self._cut(texts))
        )
        # Each part ranks its own slice; the whole list is ranked again by TEI's rule.
        scores = [0.0] * len(texts)
        for n, part in enumerate(parts):
            for i, score in part.values:
                scores[n * self.size + i] = score
        merged: Result[list[tuple[int, float]]] = _merge(
            [Result([], p.chars, p.tokens, p.timings, p.total_time) for p in parts]
        )
        merged.values = [(i, scores[i]) for i in postprocess.rerank_order(scores)]
        merged.lengths = [n for p in parts for n in p.lengths]
        return merged

    async def tokenize(self, texts: Sequence[str], **kw: Any) -> list[Tokens]:
        out: list[Tokens] = []
        for part in await asyncio.gather(*(self.infer.tokenize(c, **kw) for c in self._cut(texts))):
            out.extend(part)
        return out


def _texts(inputs: str | Sequence[str]) -> tuple[Sequence[str], bool]:
    if isinstance(inputs, str):
        return [inputs], True
    return inputs, False


class _Base:
    def __init__(
        self,
        model_id: str | None = None,
        *,
        settings: ModelSettings | None = None,
        threads: int | None = None,
        max_concurrent_requests: int = 4096,
        **options: Any,
    ) -> None:
        """`model_id`: a Hub id or a local folder; `options`: any ModelSettings field (dtype,
        pooling, backend, max_batch_tokens, tokenization_workers, ...), or whole `settings`,
        the same a served model gets. `threads`: torch's intra-op threads (default: every
        core); `max_concurrent_requests`: inputs admitted at once (calls wait for room).
        Every argument pickles, so an engine can be built inside a Ray actor or a
        multiprocessing worker."""
        if threads is not None and threads <= 0:
            raise ValueError(f"threads must be a positive integer, got {threads}")
        self.settings = engine_settings(model_id, settings, **options)
        self.threads = threads
        config = Settings(
            ServerSettings(max_concurrent_requests=max_concurrent_requests), (self.settings,)
        )
        self._rt = _Runtime(config, threads)
        self._calls = _Calls(self._rt.infer)

    @property
    def spec(self) -> ModelSpec:
        """What the model is: kind, embedding size, max input length, labels."""
        return self._rt.infer.spec

    @property
    def infer(self) -> Infer:
        return self._rt.infer

    @property
    def state(self) -> AppState:
        """What the API's app is built on (`api.app.create_app`)."""
        return self._rt.served.state

    @property
    def model_state(self) -> ModelState:
        """What a dialect's handler takes for the model: it runs in-process on it (see
        `run_coroutine`)."""
        return self._rt.served.default.state

    @property
    def dimension(self) -> int:
        return self.spec.embedding_size

    def close(self) -> None:
        """Finish queued work, stop the device thread and the loop; idempotent."""
        self._rt.close()

    async def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        """`coro` run on the pipeline's loop: the one way a call reaches it."""
        raise NotImplementedError


class _Methods(_Base):
    """The calls both engines offer, written once as coroutines. Each reaches the pipeline
    only through `_wait`: AsyncEngine's suspends until the loop is done, Engine's blocks (see
    `_blocking`), and either way the results are shaped in the caller's own thread."""

    async def embed_result(self, texts: Sequence[str], **options: Any) -> Result[list[np.ndarray]]:
        """The full Result of `embed` (vectors plus each input's token count)."""
        return await self._wait(self._calls.embed(texts, **options))

    async def embed(
        self,
        texts: str | Sequence[str],
        *,
        normalize: bool = True,
        truncate: bool | None = None,
        direction: Truncation = Truncation.RIGHT,
        prompt_name: str | None = None,
        dimensions: int | None = None,
    ) -> np.ndarray:
        """(n, dim) float32 vectors; a single string gives one (dim,) vector."""
        items, single = _texts(texts)
        result = await self._wait(
            self._calls.embed(
                items,
                normalize=normalize,
                truncate=truncate,
                direction=direction,
                prompt_name=prompt_name,
                dimensions=dimensions,
            )
        )
        out = np.stack(result.values).astype(np.float32, copy=False)
        return out[0] if single else out

    async def embed_sparse(
        self,
        texts: Sequence[str],
        *,
        truncate: bool | None = None,
        direction: Truncation = Truncation.RIGHT,
        prompt_name: str | None = None,
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per text, (indices, values) of the SPLADE vector's non-zero entries."""
        result = await self._wait(
            self._calls.embed_sparse(
                texts, truncate=truncate, direction=direction, prompt_name=prompt_name
            )
        )
        return result.values

    async def embed_all(
        self,
        texts: Sequence[str],
        *,
        truncate: bool | None = None,
        direction: Truncation = Truncation.RIGHT,
        prompt_name: str | None = None,
    ) -> list[np.ndarray]:
        """Per text, the (tokens, hidden) last hidden state."""
        result = await self._wait(
            self._calls.embed_all(
                texts, truncate=truncate, direction=direction, prompt_name=prompt_name
            )
        )
        return result.values

    async def predict(
        self,
        inputs: Sequence[PairInput],
        *,
        truncate: bool | None = None,
        direction: Truncation = Truncation.RIGHT,
        raw_scores: bool = False,
    ) -> list[list[tuple[str, float]]]:
        """Per input (a text or a pair), every (label, score), best first."""
        result = await self._wait(
            self._calls.predict(
                inputs, truncate=truncate, direction=direction, raw_scores=raw_scores
            )
        )
        return result.values

    async def rerank(
        self,
        query: str,
        texts: Sequence[str],
        *,
        truncate: bool | None = None,
        direction: Truncation = Truncation.RIGHT,
        raw_scores: bool = False,
    ) -> list[tuple[int, float]]:
        """(index, score) of each text, best first, as POST /rerank orders them."""
        result = await self._wait(
            self._calls.rerank(
                query, texts, truncate=truncate, direction=direction, raw_scores=raw_scores
            )
        )
        return result.values

    async def tokenize(
        self,
        texts: Sequence[str],
        *,
        add_special_tokens: bool = True,
        prompt_name: str | None = None,
    ) -> list[Tokens]:
        return await self._wait(
            self._calls.tokenize(
                texts, add_special_tokens=add_special_tokens, prompt_name=prompt_name
            )
        )


def _blocking(
    call: Callable[Concatenate[Any, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[Engine, P], T]:
    """An Engine method from one of `_Methods`' coroutines, run to its end at once: its only
    await is Engine's `_wait`, which blocks on the pipeline's loop instead of suspending."""

    @functools.wraps(call)
    def method(self: Engine, /, *args: P.args, **kwargs: P.kwargs) -> T:
        coro = call(self, *args, **kwargs)
        try:
            coro.send(None)
        except StopIteration as done:
            return cast(T, done.value)
        coro.close()
        raise RuntimeError(f"Engine.{call.__name__} suspended instead of blocking")

    return method


class Engine(_Base):
    """The pipeline in-process, called synchronously from any thread.

    >>> with Engine("sentence-transformers/all-MiniLM-L6-v2") as engine:
    ...     vectors = engine.embed(["A man is eating food.", "A man is eating bread."])
    """

    async def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._block(coro)

    def _block(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._rt.submit(coro).result()

    embed_result = _blocking(_Methods.embed_result)
    embed = _blocking(_Methods.embed)
    embed_sparse = _blocking(_Methods.embed_sparse)
    embed_all = _blocking(_Methods.embed_all)
    predict = _blocking(_Methods.predict)
    rerank = _blocking(_Methods.rerank)
    tokenize = _blocking(_Methods.tokenize)

    def run_coroutine(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the pipeline's event loop, where `engine.infer` can be awaited
        directly (what an API dialect's handler does), and wait for it."""
        return self._block(coro)

    def result(self, call: str, inputs: Sequence[Any], **options: Any) -> Result[Any]:
        """The full Result of `embed`, `embed_sparse`, `embed_all` or `predict`: the values as
        the pipeline gives them, usage, and each input's token count (what batch jobs write)."""
        if call not in ("embed", "embed_sparse", "embed_all", "predict"):
            raise ValueError(f"unknown call {call!r}")
        return self._block(getattr(self._calls, call)(inputs, **options))

    def __enter__(self) -> Engine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncEngine(_Methods):
    """The same pipeline, awaited from any event loop.

    >>> async with AsyncEngine("BAAI/bge-small-en-v1.5") as engine:
    ...     vectors = await engine.embed(["query: what is vectorpress?"])
    """

    async def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(self._rt.submit(coro))

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    async def __aenter__(self) -> AsyncEngine:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
