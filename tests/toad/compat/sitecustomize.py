"""Run Toad 0.6 (batrachian-toad, which declares Python >= 3.14) on Python 3.13, for the test
that drives the real client (tests/toad/test_toad.py). Loaded through PYTHONPATH only by that
test, only when the Python it found is older than 3.14; never part of dsh.

Toad needs three things of 3.14, each supplied here for Toad's own modules and nothing else:
- lazily evaluated annotations (PEP 649): Toad annotates with names defined later in a module.
  Its modules are compiled with ``from __future__ import annotations`` (annotations become strings);
- its JSON-RPC layer reads parameter types from those annotations with ``inspect.signature``:
  there it is given ``eval_str=True`` so the strings are evaluated in the method's module, as 3.14
  would have done;
- ``concurrent.futures.InterpreterPoolExecutor`` (its file search): a thread pool stands in.
"""

from __future__ import annotations
import __future__

import concurrent.futures
import functools
import importlib.abc
import inspect
import sys
from importlib.machinery import PathFinder, SourceFileLoader


class _ToadLoader(SourceFileLoader):
    def source_to_code(self, data, path, *, _optimize=-1):  # type: ignore[override]
        flags = __future__.annotations.compiler_flag
        return compile(data, path, "exec", flags=flags, dont_inherit=True, optimize=_optimize)

    def get_code(self, fullname):  # type: ignore[override]
        # never a cached .pyc compiled without the flag above
        return self.source_to_code(self.get_data(self.get_filename(fullname)), self.get_filename(fullname))

    def exec_module(self, module):  # type: ignore[override]
        super().exec_module(module)
        if module.__name__ == "toad.jsonrpc":
            module.signature = functools.partial(inspect.signature, eval_str=True)


class _ToadFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # type: ignore[override]
        if name != "toad" and not name.startswith("toad."):
            return None
        spec = PathFinder.find_spec(name, path, target)
        if spec is not None and spec.origin is not None and spec.origin.endswith(".py"):
            spec.loader = _ToadLoader(name, spec.origin)
        return spec


if sys.version_info < (3, 14):
    sys.meta_path.insert(0, _ToadFinder())
    if not hasattr(concurrent.futures, "InterpreterPoolExecutor"):
        concurrent.futures.InterpreterPoolExecutor = concurrent.futures.ThreadPoolExecutor  # type: ignore[attr-defined]
