"""dsh-hooks: the command-hook core the hook plugins share (a library; it registers no plugin).

``dsh_hooks.protocol`` reads hook files, matches events, runs each hook confined through the
spine's ``Confinement`` seam, decodes what it answers and folds the answers into the spine's
typed interception decisions. A dialect (``Dialect``) says what differs — file names, event
names, placeholders, which outputs count as context — and ``DialectPlugin(dialect)`` is the
pluggy plugin an entry point names (hooks-claude-code, hooks-codex).
"""
