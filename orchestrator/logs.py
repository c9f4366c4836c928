"""structlog, configured once per process: coloured console lines on a TTY, JSON lines otherwise."""

from __future__ import annotations

import logging
import sys

import structlog

_configured = False


class _CurrentStderr:
    """Whatever sys.stderr is when a line is written: the stream bound at configure time can be replaced and
    closed later (pytest's capture of an in-process CLI call, a redirect), and writing to it then raises."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(level: str = "INFO", *, json: bool | None = None) -> None:
    global _configured
    if _configured:
        return
    use_json = not sys.stderr.isatty() if json is None else json
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    _configured = True


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    # Lazy: the logger binds to whatever configure_logging() set up by the time it first logs.
    return structlog.get_logger(name)  # type: ignore[no-any-return]
