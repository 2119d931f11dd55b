"""`python -m tests.helpers.slow_server PORT DELAY`: the real server process on all-MiniLM-L6-v2
whose every forward pass takes DELAY seconds longer, to hold requests in flight."""

from __future__ import annotations

import sys

from tests.helpers.checkpoints import minilm_path
from tests.helpers.faulty import faulty_factory
from vectorpress.cli import configure_logging
from vectorpress.server import load, run_event_loop, serve
from vectorpress.settings import Settings


def main() -> None:
    port, delay = int(sys.argv[1]), float(sys.argv[2])
    settings = Settings.single(
        model_id=str(minilm_path()), hostname="127.0.0.1", port=port, max_batch_requests=10
    )
    configure_logging(settings)
    make, made = faulty_factory()
    served = load(settings, make_backend=make)
    made[0].delay = delay
    run_event_loop(serve(served))


if __name__ == "__main__":
    main()
