"""Root conftest: every test directory (tests/, plugins/*/tests/) gets dsh's pytest helpers."""

import pytest

pytest_plugins = ["dsh_testing"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
