from __future__ import annotations

import sys
from pathlib import Path

# The fake DeepSeek server lives with the deepseek-model plugin's tests; these tests use it as a peer.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "deepseek-model" / "tests"))
