"""Pages from the session data of ``model``: Jinja2 templates (package data, ``templates/``).

HTML is rendered with autoescaping ON, always: titles, paths, arguments and tool output are
written by the model, by commands and by whoever wrote the files they read. The session itself
travels as a JSON island (Jinja's ``tojson``, which escapes ``<``, ``>``, ``&`` and ``'``), which
the page's own script turns into DOM nodes with ``textContent`` only, a chunk at a time as the
reader scrolls. The page fetches nothing (a Content-Security-Policy says so too): its CSS and
script are inlined from ``templates/page.css`` and ``templates/page.js``.

Markdown is the same content in the same order; tool arguments, results and diffs go in code
fences longer than any backtick run they hold, and the rest has ``<`` and ``&`` escaped, so a
Markdown viewer shows markup as text too.
"""

from __future__ import annotations

import re
import time
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined


def _fence(text: Any, lang: str = "") -> str:
    text = "" if text is None else str(text)
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text}\n{ticks}"


def _mdtext(text: Any) -> str:
    return ("" if text is None else str(text)).replace("&", "&amp;").replace("<", "&lt;")


def _stamp(t: Any) -> str:
    if not t:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(t)))


def _secs(s: Any) -> str:
    s = float(s or 0)
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def _environment(*, html: bool) -> Environment:
    env = Environment(loader=PackageLoader("dsh_session_export", "templates"), autoescape=html,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(fence=_fence, mdtext=_mdtext, stamp=_stamp, secs=_secs)
    env.policies["json.dumps_kwargs"] = {"sort_keys": False, "ensure_ascii": False, "separators": (",", ":")}
    return env


_HTML: Environment | None = None
_MD: Environment | None = None


def html_env() -> Environment:
    global _HTML
    if _HTML is None:
        _HTML = _environment(html=True)
    return _HTML


def md_env() -> Environment:
    global _MD
    if _MD is None:
        _MD = _environment(html=False)
    return _MD


def session_html(doc: dict[str, Any]) -> str:
    return html_env().get_template("session.html").render(doc=doc)


def session_md(doc: dict[str, Any]) -> str:
    return md_env().get_template("session.md").render(doc=doc)


def index_html(rows: list[dict[str, Any]], root: str) -> str:
    return html_env().get_template("index.html").render(rows=rows, root=root)
