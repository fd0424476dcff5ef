"""`overnight serve`'s listening socket lets asyncio turn Nagle off on each connection.

asyncio sets TCP_NODELAY on an accepted connection only when its socket's proto is
IPPROTO_TCP, and an accepted socket inherits the listener's proto. With proto 0 every request
after the first on a keep-alive connection waited ~40 ms for a delayed ACK (benchmarks/
api_latency.py: p50 55 ms for a page the app served in 9 ms).
"""

from __future__ import annotations

import asyncio
import socket

from overnight.cli_service import _bind


def test_accepted_connections_get_tcp_nodelay() -> None:
    listener = _bind("127.0.0.1", 0)
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    conn, _ = listener.accept()
    try:
        assert conn.proto == socket.IPPROTO_TCP

        async def transport_nodelay() -> int:  # what uvicorn's event loop does with it
            loop = asyncio.get_running_loop()
            transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, conn)
            sock = transport.get_extra_info("socket")
            value = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            transport.close()
            return int(value)

        assert asyncio.run(transport_nodelay()) == 1
    finally:
        client.close()
        listener.close()
