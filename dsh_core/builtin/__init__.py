"""The spine's own plugins, registered like any plugin (all ``trylast``).

``defaults`` (``dsh-defaults``: the agent factory, the in-memory session store, the base system
prompt) is registered by ``host.make_plugin_manager`` in every plugin manager; ``commands``
(``dsh-commands``: run, plugins, examples, doctor) by the CLI's own manager
(``commands.plugin_manager``). This package imports neither, so the host can import
``defaults`` without pulling in the CLI layer.
"""
