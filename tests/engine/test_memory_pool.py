"""The Arrow memory pool the service process selects (:func:`select_memory_pool`), in fresh processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pytest

from mooncake_assets.engine.service.process import ARROW_POOL_ENV, SERVICE_MEMORY_POOL, select_memory_pool

PROBE = (
    "import sys, pyarrow as pa\n"
    "from mooncake_assets.engine.service.process import select_memory_pool\n"
    "got = select_memory_pool(*sys.argv[1:])\n"
    "print(got, pa.default_memory_pool().backend_name)\n"
)


def _probe(*args: str, env_pool: str | None = None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != ARROW_POOL_ENV}
    if env_pool:
        env[ARROW_POOL_ENV] = env_pool
    out = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_service_pool_is_the_default_and_arrow_uses_it():
    assert SERVICE_MEMORY_POOL in pa.supported_memory_backends()
    assert _probe() == [SERVICE_MEMORY_POOL, SERVICE_MEMORY_POOL]


def test_arrow_variable_and_argument_override():
    assert _probe(env_pool="system") == ["system", "system"]
    assert _probe("system", env_pool="jemalloc") == ["system", "system"]


def test_unknown_pool_is_refused():
    with pytest.raises(ValueError, match="unknown Arrow memory pool"):
        select_memory_pool("tcmalloc")
