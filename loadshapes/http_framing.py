"""HTTP/1.1 framing for the wire client: a request's bytes, where a response ends, and its status and body."""

from __future__ import annotations

from dataclasses import dataclass

from geventhttpclient._parser import HTTPResponseParser
from geventhttpclient.response import HTTPResponse


class Framing(HTTPResponseParser):
    """llhttp with no-op callbacks: says where a response ends, keeps nothing (the raw bytes are kept)."""

    complete = False
    headers_complete = False

    def _on_message_begin(self) -> None:
        pass

    def _on_status(self, status: str) -> None:
        pass

    def _on_header_field(self, name: str) -> None:
        pass

    def _on_header_value(self, value: str) -> None:
        pass

    def _on_headers_complete(self) -> bool:
        self.headers_complete = True
        return False

    def _on_body(self, data: bytearray) -> None:
        pass

    def _on_message_complete(self) -> None:
        self.complete = True


@dataclass(slots=True)
class DecodedResponse:
    status: int
    body: list[bytes]  # the body (de-chunked), one piece per socket read that carried some of it
    times: list[int]  # each piece's arrival time
    complete: bool


def decode_response(chunks: list[bytes], times: list[int]) -> DecodedResponse | None:
    """Status and body of a raw response as it arrived (None before a status line came). Raises HTTPParseError
    on bytes that are not HTTP."""
    parser = HTTPResponse("POST")
    body: list[bytes] = []
    body_times: list[int] = []
    buffer = parser._body_buffer
    for chunk, t_ns in zip(chunks, times, strict=True):
        parser.feed(chunk)
        if buffer:
            body.append(bytes(buffer))
            body_times.append(t_ns)
            del buffer[:]
    if not parser.headers_complete:
        return None
    return DecodedResponse(parser.status_code, body, body_times, parser.message_complete)


def request_head(method: str, host: str, port: int, path: str, headers: dict[str, str], *, tls: bool) -> bytes:
    """The request line and the headers every request shares; each request adds its own and the body."""
    default_port = 443 if tls else 80
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}" if port == default_port else f"Host: {host}:{port}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n").encode("latin-1")


def request_bytes(head: bytes, body: bytes, request_id: str) -> bytes:
    """A whole request: the shared head (request_head), this request's id and length, its body."""
    return b"%bContent-Length: %d\r\nx-request-id: %b\r\n\r\n%b" % (head, len(body), request_id.encode(), body)
