"""The load worker's HTTP client (loadshapes/wire.py) against servers that behave and misbehave on purpose.

The client runs on gevent's hub in this process (gevent without monkey-patching: it uses real sockets and libev
watchers of its own); each scripted server is a thread on a plain blocking socket.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import gevent
import gevent.event
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from loadshapes.http_framing import decode_response, request_bytes, request_head
from loadshapes.null_server import NullConfig, NullServer, ServerThread
from loadshapes.sse import StreamResult, body_lines
from loadshapes.wire import Exchange, WireClient

STREAM = b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in [b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"])
OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
OK = OK_HEAD + b"\r\n" + STREAM + b"0\r\n\r\n"


class ScriptedServer:
    """Accepts connections on 127.0.0.1; `handle(connection, number)` plays each one (number counts from 0)."""

    def __init__(self, handle: Callable[[socket.socket, int], None]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.handle = handle
        self.connections = 0
        self.requests: list[bytes] = []
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            number = self.connections
            self.connections += 1
            threading.Thread(target=self.play, args=(connection, number), daemon=True).start()

    def play(self, connection: socket.socket, number: int) -> None:
        with connection, contextlib.suppress(OSError):
            self.handle(connection, number)

    def read_request(self, connection: socket.socket) -> bytes | None:
        """One whole request (head and Content-Length body), or None at the client's EOF."""
        data = b""
        while b"\r\n\r\n" not in data:
            piece = connection.recv(65536)
            if not piece:
                return None
            data += piece
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            body += connection.recv(1 << 20)
        self.requests.append(head + b"\r\n\r\n" + body)
        return body

    def close(self) -> None:
        self.listener.close()


def _exchanges(
    port: int,
    bodies: list[bytes],
    *,
    timeout_s: float = 5.0,
    sequential: bool = True,
    max_connections: int = 8,
    tls: ssl.SSLContext | None = None,
) -> tuple[list[Exchange], WireClient]:
    """Each body POSTed (one after another, or all at once) until every one has ended."""
    ended: list[Exchange] = []
    done = gevent.event.Event()
    client = WireClient("127.0.0.1", port, tls=tls, max_connections=max_connections, timeout_s=timeout_s,
                        on_done=lambda exchange: (ended.append(exchange), done.set()))  # fmt: skip
    head = request_head("POST", "127.0.0.1", port, "/v1/completions", {"Content-Type": "application/json"}, tls=False)

    def run() -> None:
        for index, body in enumerate(bodies):
            client.submit(Exchange(request_bytes(head, body, f"r{index}")))
            while sequential and len(ended) <= index:
                done.clear()
                done.wait(0.05)
                client.expire()
        while len(ended) < len(bodies):
            done.clear()
            done.wait(0.05)
            client.expire()

    gevent.spawn(run).get(timeout=30)
    client.close()
    return ended, client


@pytest.fixture
def null_server() -> Iterator[ServerThread]:
    thread = ServerThread(NullServer(NullConfig(chunks=3, tokens_per_chunk=2)))
    yield thread
    thread.stop()


def test_a_stream_arrives_with_each_read_stamped_on_one_kept_alive_connection(null_server: ServerThread) -> None:
    body = b'{"model":"m","prompt":"p","max_tokens":6,"stream":true,"specdrill":{"prompt_tokens":4}}'
    ended, client = _exchanges(null_server.port, [body] * 5)
    assert client.opened == 1 and null_server.server.received_ids == [f"r{i}" for i in range(5)]
    for exchange in ended:
        assert exchange.failure is None and exchange.broken is None and exchange.done_ns is not None
        assert exchange.sent_ns is not None and exchange.sent_ns <= exchange.times[0]
        assert exchange.times == sorted(exchange.times) and exchange.done_ns == exchange.times[-1]
        response = decode_response(exchange.chunks, exchange.times)
        assert response is not None and response.status == 200 and response.complete
        result = StreamResult()
        for line, t_ns in body_lines(response.body, response.times):
            result.feed(line, t_ns)
        result.check_complete()
        assert result.output_tokens == 6 and result.prompt_tokens == 4 and len(result.token_times_ns) == 6


def test_decoded_body_keeps_the_arrival_time_of_each_read_that_carried_it() -> None:
    raw = OK_HEAD + b"\r\n" + STREAM + b"0\r\n\r\n"
    cut1, cut2 = raw.index(b"data: two") + 3, raw.index(b"0\r\n\r\n") + 1
    response = decode_response([raw[:cut1], raw[cut1:cut2], raw[cut2:]], [10, 20, 30])
    assert response is not None and response.status == 200 and response.complete
    assert b"".join(response.body) == b"data: one\n\ndata: two\n\ndata: [DONE]\n\n"
    assert response.times == [10, 20] and response.body[0].endswith(b"dat")
    assert decode_response([b"HTTP/1.1 200 OK\r\nContent-Le"], [5]) is None  # no complete head yet


def test_a_request_larger_than_the_socket_buffer_goes_out_whole() -> None:
    server = ScriptedServer(lambda c, _: server.read_request(c) and c.sendall(OK))
    try:
        big = b'{"prompt":"' + b"x" * (24 << 20) + b'"}'  # far beyond what one send() takes on loopback
        ended, _ = _exchanges(server.port, [big])
    finally:
        server.close()
    assert ended[0].failure is None and ended[0].done_ns is not None
    assert server.requests[0].endswith(big)


def test_an_answer_before_the_whole_request_went_out_ends_that_connection() -> None:
    too_large = b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\n\r\n"

    def handle(connection: socket.socket, number: int) -> None:
        if number == 0:  # answer after the head, read no body, keep the connection open
            while b"\r\n\r\n" not in connection.recv(65536):
                pass
            connection.sendall(too_large)
            threading.Event().wait(2)  # hold it open, reading nothing more
        else:
            server.read_request(connection)
            connection.sendall(OK)

    server = ScriptedServer(handle)
    try:
        big = b'{"prompt":"' + b"x" * (24 << 20) + b'"}'
        ended, client = _exchanges(server.port, [big, b"{}"])
    finally:
        server.close()
    first = decode_response(ended[0].chunks, ended[0].times)
    assert first is not None and first.status == 413 and ended[0].done_ns is not None
    assert ended[1].failure is None and client.opened == 2  # the half-sent body never reached the next request


def test_a_kept_alive_connection_the_server_dropped_is_retried_once_on_a_new_one() -> None:
    def handle(connection: socket.socket, number: int) -> None:
        server.read_request(connection)
        connection.sendall(OK)
        if number == 0:  # read the next request, then close without an answer: the keep-alive race
            connection.recv(65536)

    server = ScriptedServer(handle)
    try:
        ended, client = _exchanges(server.port, [b"{}", b"{}"])
    finally:
        server.close()
    assert [e.failure for e in ended] == [None, None] and ended[1].retried
    assert client.opened == 2


@pytest.mark.parametrize(
    ("behaviour", "expect"),
    [
        ("refused", ("error", "connection_error")),
        ("close_at_once", ("error", "connection_error")),
        ("garbage", ("error", "connection_error")),
        ("silent", ("timeout", "timeout")),
        ("close_mid_body", "broken"),
    ],
)
def test_failures_are_classified(behaviour: str, expect: tuple[str, str] | str) -> None:
    def handle(connection: socket.socket, _: int) -> None:
        server.read_request(connection)
        if behaviour == "garbage":
            connection.sendall(b"SSH-2.0-not-http\r\n\r\n")
        elif behaviour == "silent":
            connection.recv(1)
        elif behaviour == "close_mid_body":
            connection.sendall(OK[: OK.index(b"data: two")])

    server = ScriptedServer(handle)
    port = server.port
    if behaviour == "refused":
        server.close()
    try:
        ended, _ = _exchanges(port, [b"{}"], timeout_s=0.3)
    finally:
        server.close()
    (exchange,) = ended
    assert exchange.failed_ns is not None and exchange.done_ns is None
    if expect == "broken":
        assert exchange.broken is not None and exchange.failure is None and exchange.chunks
    else:
        assert exchange.failure is not None and exchange.failure[:2] == expect and exchange.failure[2]


def test_requests_beyond_the_connection_cap_wait_for_a_free_connection() -> None:
    server = ScriptedServer(lambda c, _: [server.read_request(c) and c.sendall(OK) for _ in range(10)])
    try:
        ended, client = _exchanges(server.port, [b"{}"] * 10, sequential=False, max_connections=2)
    finally:
        server.close()
    assert all(e.failure is None for e in ended) and len(ended) == 10 and client.opened == 2
    assert client.waited_at_cap == 8  # the first two opened the connections, the rest found both busy
    waits = sorted(e.sent_ns - e.dispatched_ns for e in ended if e.sent_ns and e.dispatched_ns)
    assert len(waits) == 10 and waits[-1] > waits[0]  # the send time is the real one, after the wait


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1, valid for a day, and its key (PEM files)."""
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "specdrill-test")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256())
    )
    cert, key = directory / "cert.pem", directory / "key.pem"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert, key


def test_tls_target(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)

    def handle(connection: socket.socket, _: int) -> None:
        with server_context.wrap_socket(connection, server_side=True) as tls:
            for _ in range(3):
                if server.read_request(tls) is None:
                    return
                tls.sendall(OK)

    server = ScriptedServer(handle)
    client_context = ssl.create_default_context(cafile=str(cert))
    try:
        ended, client = _exchanges(server.port, [b"{}"] * 3, tls=client_context)
    finally:
        server.close()
    assert [e.failure for e in ended] == [None] * 3 and client.opened == 1
    response = decode_response(ended[0].chunks, ended[0].times)
    assert response is not None and b"".join(response.body).endswith(b"data: [DONE]\n\n")
