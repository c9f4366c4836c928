"""The load worker's HTTP/1.1 client: sends on pooled keep-alive sockets and stamps every socket read, on
gevent's event loop without a greenlet per request.

Why not geventhttpclient's `request()` (what FastHttpUser uses): a streamed completion arrives in ~15-20 socket
reads, and there each read is a greenlet switch through the hub plus a Python response parser's callbacks; with
per-request header objects and a timeout timer that came to 1.8x the CPU this client needs per request against
the null server (benchmarks/http_client_cost.py; the figures are in docs/engineering/performance.md). Here a request is
its bytes written with one `send`; each time its socket is readable a libev callback in the hub reads what
arrived, stamps it with the one clock and feeds llhttp (geventhttpclient's C parser) only to find where the
response ends. Status and body are decoded later, off the send path (`http_framing.decode_response`).

Not thread-safe: everything runs on the gevent hub of the worker's one thread.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

import gevent
import gevent.monkey
from geventhttpclient._parser import HTTPParseError

from loadshapes.http_framing import Framing
from timebase.clock import now_ns

# The unpatched socket and select: gevent's versions would switch greenlets inside a libev callback.
_socket: type[socket.socket] = gevent.monkey.get_original("socket", "socket")
_poll = gevent.monkey.get_original("select", "poll")
_POLL_IN = 0x001
_READ, _WRITE = 1, 2
# Reads land in one preallocated buffer and are copied out at their size: recv(n) allocates n bytes first,
# and past glibc's mmap threshold (128 KiB) that costs ~25 us a read, more than the read itself.
_RECV_BUFFER = bytearray(256 * 1024)
_RECV_VIEW = memoryview(_RECV_BUFFER)
_WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


@dataclass(slots=True)
class Exchange:
    """One request and what came back of it: the response's bytes as each socket read delivered them, with
    each read's arrival time, or how it failed."""

    request: bytes
    dispatched_ns: int | None = None  # when it was handed to the client
    sent_ns: int | None = None  # when its bytes went to the socket: later when it waited for a connection
    chunks: list[bytes] = field(default_factory=list)  # the raw response (status line, headers, framing)
    times: list[int] = field(default_factory=list)  # when each chunk arrived
    done_ns: int | None = None  # the response's last byte arrived
    failed_ns: int | None = None
    broken: tuple[str, str] | None = None  # the connection broke after the headers: (exception type, message)
    failure: tuple[str, str, str] | None = None  # no usable response: (status, error_class, error_message)
    deadline_ns: int = 0
    retried: bool = False


class _Connection:
    __slots__ = ("client", "exchange", "framing", "pending", "reader", "sock", "used", "writer")

    def __init__(self, client: WireClient, sock: socket.socket) -> None:
        self.client = client
        self.sock = sock
        loop = gevent.get_hub().loop
        self.reader = loop.io(sock.fileno(), _READ)
        self.writer = loop.io(sock.fileno(), _WRITE)
        self.exchange: Exchange | None = None
        self.framing = Framing()
        self.pending = memoryview(b"")  # what a large request has left to send as the socket drains
        self.used = False  # has carried a request before: the server may have closed it meanwhile

    # --- connecting -----------------------------------------------------------------------------------------
    def on_connect_progress(self) -> None:
        """Writable (or, in a TLS handshake, readable) while connecting: finish the step or fail."""
        self.reader.stop()
        self.writer.stop()
        try:
            if not isinstance(self.sock, ssl.SSLSocket):
                code = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    raise OSError(code, os.strerror(code))
                if self.client.tls is not None:
                    self.sock = self.client.tls.wrap_socket(
                        self.sock, server_hostname=self.client.host, do_handshake_on_connect=False
                    )
            if isinstance(self.sock, ssl.SSLSocket):
                self.sock.do_handshake()
        except ssl.SSLWantReadError:
            self.reader.start(self.on_connect_progress)
            return
        except ssl.SSLWantWriteError:
            self.writer.start(self.on_connect_progress)
            return
        except OSError as exc:
            self.client.connection_failed(self, exc)
            return
        self.client.connected(self)

    # --- one exchange ---------------------------------------------------------------------------------------
    def write(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.framing = Framing()
        self.pending = memoryview(b"")
        self.writer.stop()
        if exchange.sent_ns is None:  # a retry keeps its first send
            exchange.sent_ns = now_ns()
        try:
            sent = self.sock.send(exchange.request)
        except _WOULD_BLOCK:
            sent = 0
        except OSError as exc:
            self.client.exchange_failed(self, exc)
            return
        self.reader.start(self.on_readable)
        if sent < len(exchange.request):
            self.pending = memoryview(exchange.request)[sent:]
            self.writer.start(self.on_writable)

    def on_writable(self) -> None:
        pending: memoryview = self.pending
        try:
            sent = self.sock.send(pending)
        except _WOULD_BLOCK:
            return
        except OSError as exc:
            self.client.exchange_failed(self, exc)
            return
        self.pending = pending[sent:]
        if not self.pending:
            self.writer.stop()

    def on_readable(self) -> None:
        exchange = self.exchange
        if exchange is None:  # idle: the server closed it, or sent something unasked for
            self.client.discard(self)
            return
        while True:
            try:
                data = _RECV_VIEW[: self.sock.recv_into(_RECV_BUFFER)].tobytes()
            except _WOULD_BLOCK:
                return
            except OSError as exc:
                self.client.exchange_failed(self, exc)
                return
            if not data:
                self.client.exchange_ended_early(self)
                return
            arrived = now_ns()
            exchange.chunks.append(data)
            exchange.times.append(arrived)
            try:
                self.framing.feed(data)
            except HTTPParseError as exc:
                self.client.exchange_failed(self, exc)
                return
            if self.framing.complete:
                exchange.done_ns = arrived
                # Answered before the request was all sent (an early 413, say): the rest must not follow.
                keep_alive = self.framing.should_keep_alive() and not self.pending
                self.client.exchange_done(self, keep_alive=keep_alive)
                return
            # TLS decrypts whole records: bytes may wait inside the SSL object with nothing left on the socket.
            if not (isinstance(self.sock, ssl.SSLSocket) and self.sock.pending()):
                return

    def idle_and_alive(self) -> bool:
        """Nothing to read on an idle keep-alive socket: no FIN, no stray bytes. The real poll: gevent's would
        yield to every ready greenlet in the middle of a send, and select() fails past 1024 descriptors."""
        try:
            poll = _poll()
            poll.register(self.sock.fileno(), _POLL_IN)
            return not poll.poll(0)
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        self.reader.stop()
        self.writer.stop()
        self.reader.close()
        self.writer.close()
        self.exchange = None
        with contextlib.suppress(OSError):
            self.sock.close()


class WireClient:
    """Keep-alive connections to one server, at most `max_connections` open; a request that finds none free
    waits in order for the next (its `sent_ns` is then its real send; `waited_at_cap` counts the requests that
    found all `max_connections` busy). Every submitted exchange reaches `on_done` exactly once, answered or
    failed, unless `close` takes it back first."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None,
        max_connections: int,
        timeout_s: float,
        on_done: Callable[[Exchange], None],
    ) -> None:
        self.host = host
        self.tls = tls
        self.address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        self.max_connections = max_connections
        self.timeout_ns = round(timeout_s * 1e9)
        self.on_done = on_done
        self.idle: list[_Connection] = []
        self.busy: set[_Connection] = set()
        self.connecting: set[_Connection] = set()
        self.waiting: collections.deque[Exchange] = collections.deque()
        self.opened = 0
        self.waited_at_cap = 0

    @property
    def open_connections(self) -> int:
        return len(self.idle) + len(self.busy) + len(self.connecting)

    def submit(self, exchange: Exchange) -> None:
        exchange.dispatched_ns = now_ns()
        exchange.deadline_ns = exchange.dispatched_ns + self.timeout_ns
        while self.idle:
            connection = self.idle.pop()
            if connection.idle_and_alive():
                self.busy.add(connection)
                connection.write(exchange)
                return
            self.discard(connection)
        if self.open_connections >= self.max_connections:
            self.waited_at_cap += 1
        self.waiting.append(exchange)
        self.refill()

    def open_connection(self) -> None:
        family, kind, proto, _, address = self.address
        sock = _socket(family, kind, proto)
        sock.setblocking(False)
        if family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = _Connection(self, sock)
        self.connecting.add(connection)
        self.opened += 1
        code = sock.connect_ex(address)
        if code in (0, errno.EINPROGRESS, errno.EAGAIN):
            connection.writer.start(connection.on_connect_progress)
        else:  # refused at once: failed from the event loop, not down this stack (refill would recurse)
            error = OSError(code, os.strerror(code))
            gevent.get_hub().loop.run_callback(self.connection_failed, connection, error)

    def connected(self, connection: _Connection) -> None:
        self.connecting.discard(connection)
        self.release(connection)

    def release(self, connection: _Connection) -> None:
        """A free connection takes the oldest waiting request, or goes idle."""
        connection.exchange = None
        if self.waiting:
            self.busy.add(connection)
            connection.write(self.waiting.popleft())
        else:
            connection.reader.stop()
            self.idle.append(connection)

    def connection_failed(self, connection: _Connection, exc: BaseException) -> None:
        """Connecting failed: the oldest waiting request fails with it (one failure per attempt, so a refused
        connection cannot loop), and the next waiting one, if any, gets a new attempt."""
        self.connecting.discard(connection)
        connection.close()
        if self.waiting:
            self.fail(self.waiting.popleft(), "connection_error", f"{type(exc).__name__}: {exc}")
        self.refill()

    def refill(self) -> None:
        while len(self.waiting) > len(self.connecting) and self.open_connections < self.max_connections:
            try:
                self.open_connection()
            except OSError as exc:  # no socket to be had (out of file descriptors): the oldest request fails
                self.fail(self.waiting.popleft(), "connection_error", f"{type(exc).__name__}: {exc}")

    def exchange_done(self, connection: _Connection, *, keep_alive: bool) -> None:
        exchange = connection.exchange
        assert exchange is not None
        connection.used = True
        self.busy.discard(connection)
        if keep_alive:
            self.release(connection)
        else:
            connection.close()
            self.refill()
        self.on_done(exchange)

    def exchange_ended_early(self, connection: _Connection) -> None:
        """EOF before the response's end. On a reused connection with nothing received, the server closed it as
        we wrote (the keep-alive race): the request goes again once on a fresh connection."""
        exchange = connection.exchange
        assert exchange is not None
        if connection.used and not exchange.chunks and not exchange.retried:
            exchange.retried = True
            self.busy.discard(connection)
            connection.close()
            self.waiting.appendleft(exchange)
            self.refill()
            return
        with contextlib.suppress(HTTPParseError):
            connection.framing.feed(b"")  # a body delimited by the connection's end is complete now
        if connection.framing.complete:
            exchange.done_ns = now_ns()
            self.exchange_done(connection, keep_alive=False)
            return
        self.exchange_failed(connection, ConnectionError("connection closed before the end of the response"))

    def exchange_failed(self, connection: _Connection, exc: BaseException) -> None:
        exchange = connection.exchange
        assert exchange is not None
        self.busy.discard(connection)
        headers_complete = connection.framing.headers_complete
        connection.close()
        self.refill()
        if headers_complete and not isinstance(exc, HTTPParseError):
            exchange.broken = (type(exc).__name__, str(exc))
            exchange.failed_ns = now_ns()
            self.on_done(exchange)
        else:
            self.fail(exchange, "connection_error", f"{type(exc).__name__}: {exc}")

    def fail(self, exchange: Exchange, error_class: str, message: str, status: str = "error") -> None:
        exchange.failure = (status, error_class, message)
        exchange.failed_ns = now_ns()
        self.on_done(exchange)

    def discard(self, connection: _Connection) -> None:
        if connection in self.idle:
            self.idle.remove(connection)
        connection.close()

    def expire(self) -> None:
        """Fail every request past its deadline (waiting for a connection or in flight); their connections close."""
        now = now_ns()
        message = f"no complete response within {self.timeout_ns / 1e9:g} s"
        while self.waiting and self.waiting[0].deadline_ns <= now:
            self.fail(self.waiting.popleft(), "timeout", message, status="timeout")
        for connection in [c for c in self.busy if c.exchange is not None and c.exchange.deadline_ns <= now]:
            exchange = connection.exchange
            assert exchange is not None
            self.busy.discard(connection)
            connection.close()
            self.fail(exchange, "timeout", message, status="timeout")
        self.refill()

    def close(self) -> list[Exchange]:
        """Close every connection; the requests still waiting or in flight come back (they reach no `on_done`)."""
        unfinished = list(self.waiting)
        self.waiting.clear()
        for connection in [*self.idle, *self.busy, *self.connecting]:
            if connection.exchange is not None:
                unfinished.append(connection.exchange)
            connection.close()
        self.idle.clear()
        self.busy.clear()
        self.connecting.clear()
        return unfinished
