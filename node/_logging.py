"""Structured logging for every cnode process.

Human console lines on a terminal, JSON lines with ``--log-json``. Context (``peer``, ``run``,
``round``) is bound with :func:`bind_context` and carried by every line after it. A redaction
processor removes anything that looks like a secret, whatever the caller passed; it rewrites
values, never event names (``hf_imported`` is an event, not a token).

py-libp2p logs through the standard library; :func:`configure_logging` routes its records into
structlog (one ``library_log`` event per record, naming the logger), so they are structured,
redacted and filtered like ours. Its per-connection noise (a peer that cannot be dialled, a
pending gossip queue trimmed) is logged at debug, where ``--debug`` shows it.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

REDACTED = "[redacted]"
# Keys whose values are never logged, wherever they appear in an event.
_SECRET_KEYS = re.compile(r"(token|secret|password|private|key_bytes|authorization)", re.I)
# Hugging Face tokens have this shape; mask them even inside free text.
_HF_TOKEN = re.compile(r"hf_[A-Za-z0-9]{8,}")
# An event name is ours (``hf_imported``): only a whole real token (hf_ + 34 characters) in
# one is masked, so a caller that formats a token into the event still does not leak it.
_HF_TOKEN_IN_EVENT = re.compile(r"hf_[A-Za-z0-9]{30,}")


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return _HF_TOKEN.sub(REDACTED, value)
    return value


def redact_secrets(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: drop secret-looking keys and mask token-shaped strings."""
    for key in list(event):
        if key == "event":
            if isinstance(event[key], str):
                event[key] = _HF_TOKEN_IN_EVENT.sub(REDACTED, event[key])
        elif _SECRET_KEYS.search(key):
            event[key] = REDACTED
        else:
            event[key] = _redact_value(event[key])
    return event


# Libraries whose standard-library logging is routed into structlog.
LIBRARY_LOGGERS = ("libp2p",)
# Lines py-libp2p logs as warnings or errors for every peer it cannot reach or whose gossip
# queue it trims (7,283 lines on one holder after 1,000 connections): debug for us.
_LIBRARY_NOISE = (
    "Failed to open stream",
    "Failed to open TCP stream",
    "pending message queue",
)


class _ToStructlog(logging.Handler):
    """A standard-library handler that re-emits each record as a structlog event."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a library's bad format string
            message = str(record.msg)
        level = record.levelno
        if level > logging.DEBUG and any(noise in message for noise in _LIBRARY_NOISE):
            level = logging.DEBUG
        structlog.get_logger(record.name).log(
            level,
            "library_log",
            library=record.name,
            message=message,
            exc_info=record.exc_info or False,
        )


def _route_library_logging(level: int) -> None:
    """Libraries speak at warning and above (their info lines are theirs), all of it on debug."""
    level = level if level <= logging.DEBUG else max(level, logging.WARNING)
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        for handler in [h for h in logger.handlers if isinstance(h, _ToStructlog)]:
            logger.removeHandler(handler)
        handler = _ToStructlog()
        # The handler's own level too: a library logger that sets its own level (py-libp2p's
        # auto-connector forces INFO on itself) would otherwise pass its info lines to us.
        handler.setLevel(level)
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False  # not to the root logger's plain stderr lines


class _CurrentStderr:
    """A file that writes to whatever ``sys.stderr`` is at the time of writing.

    structlog keeps the file it was configured with; binding ``sys.stderr`` itself would keep a
    stream that a test harness (or a daemonizing caller) has since closed or replaced.
    """

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(*, json: bool = False, level: str = "info") -> None:
    """Set up structlog once per process; stderr is the sink, stdout stays for results."""
    numeric_level = logging.getLevelNamesMapping()[level.upper()]
    renderer: Any
    if json:
        renderer = structlog.processors.JSONRenderer(sort_keys=True)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact_secrets,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    _route_library_logging(numeric_level)


def short_peer(peer_id: str) -> str:
    """The last 8 characters of a peer id: enough to tell peers apart in a log."""
    return peer_id[-8:]


def bind_context(**context: Any) -> None:
    """Bind ``peer``/``run``/``round`` (or more) to every later log line of this context."""
    if "peer" in context and isinstance(context["peer"], str):
        context["peer"] = short_peer(context["peer"])
    structlog.contextvars.bind_contextvars(**context)
