"""The spine's own subcommands: run, plugins, examples, doctor, config.

The CLI layer: it sits above the host (it composes and serves hosts), so the host never
imports it; ``plugin_manager`` is the host's manager plus this plugin, for every manager the
CLI builds.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from ..hookspecs import hookimpl

if TYPE_CHECKING:  # pragma: no cover
    import pluggy

    from ..protocols import CommandRegistry

NAMES = frozenset({"run", "plugins", "examples", "doctor", "config"})


def plugin_manager(*, trace: bool | None = None) -> pluggy.PluginManager:
    """``host.make_plugin_manager`` with the spine's subcommands registered (``dsh-commands``)."""
    from ..host import make_plugin_manager, register_plugin

    pm = make_plugin_manager(trace=trace)
    register_plugin(pm, sys.modules[__name__], "dsh-commands")
    return pm


def _setup_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("--example", "-e", default="acp-agent", help="example to serve (default: acp-agent)")
    p.add_argument("--provider", help="model provider of the exact route (env DSH_PROVIDER)")
    p.add_argument("--model", help="model id of the exact route (env DSH_MODEL); for scripted: a script path")
    p.add_argument("--login", action="store_true",
                   help="log in to the route's provider in this terminal, then exit (an editor's terminal login runs this)")


def _run(args: argparse.Namespace) -> int:
    import anyio

    from ..compose import load_composition
    from ..errors import CompositionError
    from ..host import open_host
    from ..stdio import claim_stdio

    if args.login:
        return _login(args)
    claim_stdio()  # before any plugin is imported: nothing may reach the protocol fd but frames
    composition = load_composition(args.example)

    async def serve() -> None:
        async with open_host(composition, provider=args.provider, model=args.model, pm=plugin_manager()) as host:
            host.check_route()
            name = composition.front_door
            door = host.front_doors.get(name or "")
            if door is None:
                known = ", ".join(host.front_doors) or "none"
                raise CompositionError(
                    f"example {composition.name!r} asks for front door {name!r}, which no mounted plugin "
                    f"provides (front doors: {known})"
                )
            await door.serve(host)

    anyio.run(serve)
    return 0


def _login(args: argparse.Namespace) -> int:
    """``dsh run --login``: the route provider's interactive login, on this terminal."""
    import anyio

    from ..compose import load_composition
    from ..host import open_host

    composition = load_composition(args.example)

    async def login() -> int:
        async with open_host(composition, provider=args.provider, model=args.model, pm=plugin_manager()) as host:
            name, _ = host.check_route()
            provider = host.provider(name)
            run = getattr(provider, "login", None)
            if run is None:
                print(f"dsh: the {name} provider has no login (it needs no credential, or takes it from the "
                      "environment)", file=sys.stderr)
                return 2
            code: int = await anyio.to_thread.run_sync(run)
            return code

    return anyio.run(login)


def _setup_plugins(p: argparse.ArgumentParser) -> None:
    p.add_argument("--example", "-e", default="acp-agent", help="example whose composition to print")


def _plugins(args: argparse.Namespace) -> int:
    from ..compose import load_composition
    from ..host import load_plugins

    composition = load_composition(args.example)
    pm = plugin_manager()
    loaded = load_plugins(pm, composition)
    rows = []
    for name, plugin in pm.list_name_plugin():
        ep = loaded.get(name)
        dist = ep.dist if ep is not None else None
        rows.append(
            {
                "name": name,
                "distribution": dist.name if dist else "dsh-core",
                "version": dist.version if dist else _own_version(),
                "hooks": sorted(h.name for h in (pm.get_hookcallers(plugin) or [])),
                "builtin": ep is None,
            }
        )
    print(json.dumps({"example": composition.name, "plugins": rows}, indent=2))
    return 0


def _own_version() -> str:
    from .. import __version__

    return __version__


def _examples(args: argparse.Namespace) -> int:
    from ..compose import available_examples, load_composition

    comps = [load_composition(str(path)) for path in available_examples().values()]
    width = max((len(c.name) for c in comps), default=0)
    for comp in comps:
        print(f"{comp.name:<{width}}  {comp.description}  [{', '.join(comp.plugins)}]")
    return 0


def _setup_doctor(p: argparse.ArgumentParser) -> None:
    p.add_argument("--example", "-e", default="acp-agent", help="example to check (default: acp-agent)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object (for scripts)")


def _doctor(args: argparse.Namespace) -> int:
    import anyio

    from ..doctor import examine
    from ..stdio import stdout_to_stderr

    with stdout_to_stderr():  # a plugin's import-time print must not spoil the report (or its JSON)
        report = anyio.run(examine, args.example)
    print(json.dumps(report.to_json(), indent=2) if args.json else report.render())
    return 0 if report.can_serve else 1


def _setup_config(p: argparse.ArgumentParser) -> None:
    p.add_argument("--example", "-e", default="acp-agent", help="example whose plugins' config to print")
    p.add_argument("--json", action="store_true", help='one JSON object: {plugin: {"schema": …, "values": …}}')


def _config(args: argparse.Namespace) -> int:
    from ..compose import load_composition
    from ..config import schema, values
    from ..host import decode_plugin_configs, load_plugins
    from ..stdio import stdout_to_stderr

    composition = load_composition(args.example)
    pm = plugin_manager()
    with stdout_to_stderr():  # a plugin's import-time print must not spoil the JSON
        load_plugins(pm, composition)
        configs = decode_plugin_configs(pm, composition)  # a bad table: one ConfigError, exit 2
    report = {name: {"schema": schema(type(c)), "values": values(c)} for name, c in sorted(configs.items())}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"config of the example {composition.name!r} ({composition.path}); effective values, then the key's type")
    for name, entry in report.items():
        print(f"\n[config.{name}]")
        if not entry["values"]:
            print("# takes no options (a key here is refused)")
        props = entry["schema"].get("properties", {})
        for key, value in entry["values"].items():
            prop = props.get(key, {})
            kind = prop.get("type", "")
            kind = "/".join(kind) if isinstance(kind, list) else kind
            extra = ", ".join(f"{k} {prop[k]}" for k in ("minimum", "maximum", "enum") if k in prop)
            note = prop.get("description", "")
            tail = "  # " + "; ".join(x for x in (kind + (f" ({extra})" if extra else ""), note) if x)
            print(f"{key} = {json.dumps(value)}{tail}")
    return 0


@hookimpl(trylast=True)
def dsh_register_commands(commands: CommandRegistry) -> None:
    commands.add(
        "run",
        help="serve an example's front door (ACP over stdio for acp-agent)",
        description="Serve an example's front door. stdout carries protocol frames only; diagnostics go to stderr.",
        setup=_setup_run,
        run=_run,
    )
    commands.add("plugins", help="print the plugins an example loads, as JSON", setup=_setup_plugins, run=_plugins)
    commands.add("examples", help="list the available examples", setup=lambda p: None, run=_examples)
    commands.add(
        "doctor",
        help="say whether this machine can serve an example (sandbox, key, data dir, plugins)",
        description=(
            "Check whether this machine can serve an example (default: acp-agent): its plugins (and the pip "
            "command for missing ones), its route, the sandbox mechanism, the DeepSeek key (present or not, "
            "never its value), the data dir and its free space, and every example's plugins. Exit 0 when it "
            "can serve, 1 otherwise."
        ),
        setup=_setup_doctor,
        run=_doctor,
    )
    commands.add(
        "config",
        help="print each mounted plugin's config: its JSON Schema and the example's effective values",
        setup=_setup_config,
        run=_config,
    )
