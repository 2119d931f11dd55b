"""`ray start` for the second node of the tests' loopback-only cluster.

Ray's command line turns 127.0.0.1 into the machine's own address whenever clusters of several
nodes are enabled, and refuses a second node when they are not. This is its `ray start`, with
that one rewrite left out, so the node joins the head on 127.0.0.1 and binds 127.0.0.1 only.
"""

from __future__ import annotations

import sys

from ray._private import services


def _keep(host: str) -> str:
    return host


if __name__ == "__main__":
    services.resolve_ip_for_localhost = _keep
    from ray.scripts.scripts import main

    sys.argv = ["ray", *sys.argv[1:]]
    sys.exit(main())
