"""--grpc-port and GRPC_MAX_PARALLEL_STREAM_REQUESTS reach Settings from flags and environment."""

from __future__ import annotations

import pytest

from vectorpress.cli import settings_from_args
from vectorpress.errors import StartupError


def test_grpc_is_off_unless_a_port_is_given() -> None:
    settings = settings_from_args(["serve", "--model-id", "m"], env={})
    assert settings.server.grpc_port is None
    assert settings.server.grpc_max_parallel_stream_requests == 1024


def test_flag_and_environment() -> None:
    flag = settings_from_args(["serve", "--model-id", "m", "--grpc-port", "50051"], env={})
    assert flag.server.grpc_port == 50051
    env = {"GRPC_PORT": "50052", "GRPC_MAX_PARALLEL_STREAM_REQUESTS": "8"}
    from_env = settings_from_args(["serve", "--model-id", "m"], env=env)
    assert (from_env.server.grpc_port, from_env.server.grpc_max_parallel_stream_requests) == (
        50052,
        8,
    )
    both = settings_from_args(["serve", "--model-id", "m", "--grpc-port", "1"], env=env)
    assert both.server.grpc_port == 1, "the flag wins over the environment"


def test_bad_values_stop_start_up() -> None:
    with pytest.raises(StartupError, match="GRPC_PORT"):
        settings_from_args(["serve", "--model-id", "m"], env={"GRPC_PORT": "grpc"})
    with pytest.raises(StartupError, match="grpc-max-parallel-stream-requests"):
        settings_from_args(
            ["serve", "--model-id", "m"], env={"GRPC_MAX_PARALLEL_STREAM_REQUESTS": "0"}
        )
