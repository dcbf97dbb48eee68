"""dsh-testing is a pytest plugin (installed with the `test` extra): its fixtures — `scripted`,
`acp_agent`, `dsh_home` — and its scenario runner need no line here. This file only pins the
event loop the async tests run on."""

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
