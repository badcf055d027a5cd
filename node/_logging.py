"""Structured logging for every cnode process.

Human console lines on a terminal, JSON lines with ``--log-json``. Context (``peer``, ``run``,
``round``) is bound with :func:`bind_context` and carried by every line after it. A redaction
processor removes anything that looks like a secret, whatever the caller passed.
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


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return _HF_TOKEN.sub(REDACTED, value)
    return value


def redact_secrets(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: drop secret-looking keys and mask token-shaped strings."""
    for key in list(event):
        if _SECRET_KEYS.search(key) and key != "event":
            event[key] = REDACTED
        else:
            event[key] = _redact_value(event[key])
    return event


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
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )


def short_peer(peer_id: str) -> str:
    """The last 8 characters of a peer id: enough to tell peers apart in a log."""
    return peer_id[-8:]


def bind_context(**context: Any) -> None:
    """Bind ``peer``/``run``/``round`` (or more) to every later log line of this context."""
    if "peer" in context and isinstance(context["peer"], str):
        context["peer"] = short_peer(context["peer"])
    structlog.contextvars.bind_contextvars(**context)
