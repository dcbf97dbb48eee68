import pytest

pytest_plugins = ["dsh_core.testing"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
