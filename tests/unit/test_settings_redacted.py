"""Settings.redacted(): what the start-up log line carries, with every secret replaced.

The log handler also masks secret values in any line it writes (observability/logging.py), so
the log tests alone would not notice a secret that `redacted()` lets through: this pins it on
its own.
"""

from __future__ import annotations

from dataclasses import fields
from typing import cast

from vectorpress.settings import SECRETS, ModelSettings, ServerSettings, Settings

Scope = dict[str, object]


def _scopes(out: dict[str, object]) -> tuple[Scope, list[Scope]]:
    return cast(Scope, out["server"]), cast(list[Scope], out["models"])


def test_every_secret_is_replaced_in_both_scopes_and_nothing_else_is() -> None:
    settings = Settings(
        ServerSettings(api_key="server-key-123", port=8123),
        (
            ModelSettings("org/a", hf_token="hf_secret_a", served_model_name="a"),
            ModelSettings("org/b", hf_token="hf_secret_b", served_model_name="b"),
        ),
    )
    out = settings.redacted()
    server, models = _scopes(out)
    assert server["api_key"] == "<redacted>"
    assert server["port"] == 8123
    assert [m["hf_token"] for m in models] == ["<redacted>", "<redacted>"]
    assert [m["model_id"] for m in models] == ["org/a", "org/b"]
    for secret in settings.secrets:
        assert secret not in repr(out)
    # Every field is there, so the log line shows the whole configuration.
    assert set(server) == {f.name for f in fields(ServerSettings)}
    assert set(models[0]) == {f.name for f in fields(ModelSettings)}


def test_an_unset_secret_stays_none() -> None:
    server, models = _scopes(Settings.single("org/a").redacted())
    assert server["api_key"] is None
    assert models[0]["hf_token"] is None


def test_the_secret_fields_are_the_ones_the_settings_have() -> None:
    names = {f.name for f in fields(ServerSettings)} | {f.name for f in fields(ModelSettings)}
    assert set(SECRETS) <= names
