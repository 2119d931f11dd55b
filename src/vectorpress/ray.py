"""A Ray Serve application that serves vectorpress's whole HTTP API from replicas Ray places and
autoscales: each replica loads the model with `server.load` and answers with the server's own
FastAPI app (every route, dialect, error and header), behind Serve's HTTP proxy.

    from ray import serve
    import vectorpress.ray

    serve.run(vectorpress.ray.app("BAAI/bge-small-en-v1.5", num_replicas=2), route_prefix="/")

or from the command line, with Serve's own builder convention:

    serve run vectorpress.ray:build_app model_id=BAAI/bge-small-en-v1.5 num_replicas=2
"""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve import Application

from vectorpress.settings import ModelSettings, ServerSettings, Settings

__all__ = ["VectorpressDeployment", "app", "build_app"]


@serve.deployment(name="vectorpress")
@serve.ingress()
class VectorpressDeployment:
    """One replica: the model loaded as `vectorpress serve` loads it."""

    def __init__(self, config: Settings, threads: int | None = None) -> None:
        from vectorpress.server import load

        self.served = load(config, threads=threads)

    def __serve_build_asgi_app__(self) -> Any:
        from vectorpress.api.app import create_app

        return create_app(self.served.state)

    async def check_health(self) -> None:
        """Serve restarts a replica whose backend no longer answers."""
        if not await self.served.infer.health(timeout=30):
            raise RuntimeError("the model's backend is not answering")

    def __del__(self) -> None:
        served = getattr(self, "served", None)
        if served is not None:
            served.close()


def app(
    model_id: str | None = None,
    *,
    settings: ModelSettings | None = None,
    server: ServerSettings | None = None,
    threads: int | None = None,
    num_replicas: int | str | None = None,
    autoscaling_config: dict[str, Any] | None = None,
    ray_actor_options: dict[str, Any] | None = None,
    **options: Any,
) -> Application:
    """The application for one model: `model_id` and ModelSettings fields as `options` (or
    whole `settings`), and `server` for the API's own settings (API key, payload limit,
    admission). `num_replicas` or `autoscaling_config` and `ray_actor_options` (num_cpus,
    num_gpus per replica) go to Serve."""
    from vectorpress.engine import engine_settings

    model = engine_settings(model_id, settings, **options)
    config = Settings(server or ServerSettings(), (model,))
    deployment_options: dict[str, Any] = {}
    if autoscaling_config is not None:
        deployment_options["autoscaling_config"] = autoscaling_config
    elif num_replicas is not None:
        deployment_options["num_replicas"] = num_replicas
    if ray_actor_options is not None:
        deployment_options["ray_actor_options"] = ray_actor_options
    deployment: Any = VectorpressDeployment
    return deployment.options(**deployment_options).bind(config, threads)


def build_app(args: dict[str, str]) -> Application:
    """`serve run vectorpress.ray:build_app model_id=... [num_replicas=N] [num_cpus=C]
    [num_gpus=G] [threads=T] [any ModelSettings field=value]`."""
    values: dict[str, Any] = dict(args)
    actor: dict[str, Any] = {}
    for key in ("num_cpus", "num_gpus"):
        if key in values:
            actor[key] = float(values.pop(key))
    replicas = values.pop("num_replicas", None)
    threads = values.pop("threads", None)
    ints = {"max_batch_tokens", "max_batch_requests", "max_client_batch_size",
            "tokenization_workers"}  # fmt: skip
    typed: dict[str, Any] = {k: int(v) if k in ints else v for k, v in values.items()}
    if "auto_truncate" in typed:
        typed["auto_truncate"] = str(typed["auto_truncate"]).lower() in ("1", "true", "yes")
    model = ModelSettings(**typed)
    return app(
        settings=model,
        threads=int(threads) if threads else None,
        num_replicas=int(replicas) if replicas and replicas != "auto" else replicas,
        ray_actor_options=actor or None,
    )
