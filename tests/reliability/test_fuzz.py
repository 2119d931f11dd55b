"""Property-based fuzzing of every route from the served OpenAPI document.

Cases are generated from the schema the server publishes, sent over a real socket to a real
server, and every answer is checked: no 5xx, only documented statuses and content types, and
bodies that match the documented schemas. Both generation modes run: valid bodies, and bodies
that break the schema on purpose.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.helpers.server import LiveServer
from vectorpress.settings import Settings

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
EXAMPLES_PER_OPERATION = 25


@pytest.fixture(scope="module", params=["embedding", "reranker"])
def server(
    request: pytest.FixtureRequest, tiny_bert_family: Callable[..., Path]
) -> Iterator[LiveServer]:
    folder = tiny_bert_family("bert", request.param)
    with LiveServer(Settings.single(str(folder), max_client_batch_size=8)) as srv:
        yield srv


def test_fuzz_every_route(server: LiveServer) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/api-doc/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    # TEI's routes, and those of the Cohere, Jina, vLLM and Infinity dialects.
    assert len(operations) >= 25, [op.label for op in operations]
    cases = 0
    for operation in operations:
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):

            @settings(
                max_examples=EXAMPLES_PER_OPERATION,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case: schemathesis.Case) -> None:
                nonlocal cases
                cases += 1
                response = case.call(base_url=server.url)
                case.validate_response(response, checks=CHECKS)

            try:
                run()
            except Unsatisfiable:
                # Nothing to break on purpose: the operation takes no input.
                assert mode is schemathesis.GenerationMode.NEGATIVE, operation.label
    assert cases >= 500, cases
    # The server is still whole after the storm.
    assert httpx.get(f"{server.url}/health").status_code == 200
