"""`python tcp_forward.py LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT`: every connection to the listening address
is relayed to the target, both ways, until either side closes. On the test bed it stands in for the SSH tunnel of
`ray dashboard CLUSTER.yaml` (ssh -L 8265:localhost:8265 to the head): run in the head's network namespace, it
takes the operator's connections on the head's address to the dashboard on the head's loopback."""

from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def _serve(listen_host: str, listen_port: int, target_host: str, target_port: int) -> None:
    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            target_reader, target_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, target_writer), _pipe(target_reader, writer))

    server = await asyncio.start_server(relay, listen_host, listen_port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    host, port, target, target_port = sys.argv[1:5]
    asyncio.run(_serve(host, int(port), target, int(target_port)))
