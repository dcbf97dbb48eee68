"""str_replace_editor through a real host's tool path, beside bash (and sandbox-tools' read and edit)
doing the same work in the same run and sandbox, on a 2,000-line file in the session workspace:

1. one literal replacement: ``str_replace_editor str_replace`` against ``bash`` running
   ``sed -i`` (a fork and an exec through the session's warm confined command server) and ``edit``;
2. showing the file with line numbers: ``str_replace_editor view`` against ``bash`` ``cat -n`` and
   ``read``.

    python bench/str_replace_editor.py [--repeat 50] [--mechanism auto|bwrap|landlock]
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from _common import bench_session, run_main

LINES = 2000


async def main(repeat: int, mechanism: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        target = work / "big.py"
        target.write_text("".join(f"value_{i} = {i}  # line {i}\n" for i in range(LINES)))
        config = {"sandbox-tools": {"mechanism": mechanism}}
        plugins = ("scripted-model", "sandbox-tools", "str-replace-editor")
        async with bench_session(work, plugins, config) as session:

            async def call(name: str, args: dict) -> float:
                return (await session.call(name, args))[0]

            path = str(target)
            await call("bash", {"command": "true", "description": "start the command server"})
            await call("str_replace_editor", {"command": "view", "path": path})
            editor, sed, edit, view, cat, read = [], [], [], [], [], []
            for i in range(repeat):
                a, b = f"value_{LINES // 2} = {i}", f"value_{LINES // 2} = {i + 1}"
                if i == 0:
                    a = f"value_{LINES // 2} = {LINES // 2}"
                editor.append(await call("str_replace_editor", {"command": "str_replace", "path": path,
                                                                "old_str": a, "new_str": b}))
                c = f"value_{LINES // 2} = {i + 1}"
                sed.append(await call("bash", {"command": f"sed -i 's/^{c}  /{c}x  /' big.py",
                                               "description": "replace one line"}))
                await call("read", {"file_path": path})
                edit.append(await call("edit", {"file_path": path, "old_string": f"{c}x  ", "new_string": f"{c}  "}))
                view.append(await call("str_replace_editor", {"command": "view", "path": path}))
                cat.append(await call("bash", {"command": "cat -n big.py", "description": "show the file"}))
                read.append(await call("read", {"file_path": path}))
            assert f"value_{LINES // 2} = {repeat}  # line" in target.read_text()

    med = statistics.median
    print(f"str_replace_editor str_replace ({repeat} runs, {mechanism}, {LINES}-line file): median {med(editor):.2f} ms, "
          f"max {max(editor):.2f} ms; bash `sed -i`: median {med(sed):.2f} ms ({med(editor) / med(sed):.2f}x); "
          f"edit: median {med(edit):.2f} ms")
    print(f"str_replace_editor view: median {med(view):.2f} ms; bash `cat -n`: median {med(cat):.2f} ms "
          f"({med(view) / med(cat):.2f}x); read: median {med(read):.2f} ms")


if __name__ == "__main__":
    run_main(main, __doc__, repeat=50)
