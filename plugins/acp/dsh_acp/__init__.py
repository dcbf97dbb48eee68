"""dsh-acp: the Agent Client Protocol library that dsh's door, its client and ``dsh ask`` share.

Not a dsh plugin (no entry point): a library the plugins import.

- ``wire``: ACP v1 messages as msgspec Structs, one set for both directions;
- ``rpc``: newline-delimited JSON-RPC 2.0 (``Peer``, ``Dispatcher``, errors, ``decode_params``);
- ``fdstream``: file descriptors as anyio byte streams (``FdReader``, ``FdWriter``);
- ``client``: drive another ACP agent (``open_client``, ``AcpClient``, ``AcpSession``);
- ``proctree``: the client's child process tree (spawn, tiered shutdown, proof it is gone).
"""
