"""Where dsh keeps its data."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def data_home() -> Path:
    """``$DSH_HOME`` when set (tests, overrides), else platformdirs' per-user data dir.

    Works with the minimal environment ACP clients pass (HOME, LOGNAME, PATH, SHELL,
    TERM, USER). Session logs, attachments and spill files live below it.
    """
    env = os.environ.get("DSH_HOME")
    base = Path(env) if env else Path(platformdirs.user_data_dir("dsh"))
    return base.expanduser().absolute()
