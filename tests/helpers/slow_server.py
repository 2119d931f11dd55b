"""`python -m tests.helpers.slow_server PORT DELAY [MODELS]`: the real server process on
all-MiniLM-L6-v2 (served MODELS times, as `m0`, `m1`, ... on one scheduler; once by default)
whose every forward pass takes DELAY seconds longer, to hold requests in flight."""

from __future__ import annotations

import faulthandler
import sys

from tests.helpers.checkpoints import minilm_path
from tests.helpers.faulty import faulty_factory
from vectorpress.cli import configure_logging
from vectorpress.server import exit_after_stop, load, run_event_loop, serve
from vectorpress.settings import ModelSettings, ServerSettings, Settings


def main() -> None:
    faulthandler.enable()  # every thread's stack on a fatal signal, for the test's message
    port, delay = int(sys.argv[1]), float(sys.argv[2])
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    models = tuple(
        ModelSettings(
            str(minilm_path()),
            served_model_name=None if count == 1 else f"m{i}",
            max_batch_requests=10,
        )
        for i in range(count)
    )
    settings = Settings(ServerSettings(hostname="127.0.0.1", port=port), models)
    configure_logging(settings)
    make, made = faulty_factory()
    served = load(settings, make_backend=make)
    for backend in made:
        backend.delay = delay
    run_event_loop(serve(served))
    exit_after_stop(0)  # as `vectorpress serve` ends


if __name__ == "__main__":
    main()
