"""The blocking client of the coordinator API, for CLI commands (see ``_client.py``)."""

from __future__ import annotations

from typing import Any

import httpx

from cnode.auth import Identity

from .. import limits
from .._exceptions import CoordinatorRejected
from .._wire._admin import AdminVerb, AllowKind
from .._wire._protocol import CheckpointRecord, JoinResult, Op, RunState
from ._client_core import HTTP_TIMEOUT, Core, map_transport

__all__ = ["SyncCoordinatorClient"]


class SyncCoordinatorClient:
    """Blocking client for CLI commands: state reads, joins and admin actions."""

    def __init__(self, url: str, *, run: str, coordinator: str, identity: Identity) -> None:
        self._core = Core(url, run, coordinator, identity)
        self._http = httpx.Client(timeout=HTTP_TIMEOUT)

    def __enter__(self) -> SyncCoordinatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, method: str, tail: str, **kw: Any) -> dict[str, Any]:
        try:
            response = self._http.request(method, self._core.path(tail), **kw)
        except httpx.HTTPError as exc:
            raise map_transport(exc, self._core.url) from exc
        return self._core.answer(response)

    def run_state(self) -> RunState:
        return self._core.run_state(self._send("GET", "state"))

    def checkpoints(self, *, after: int = -1) -> list[CheckpointRecord]:
        """Every recorded checkpoint of a round > ``after``, oldest first (all pages)."""
        out: list[CheckpointRecord] = []
        while True:
            params = {"after": str(after), "limit": str(limits.MAX_CHECKPOINT_PAGE)}
            page = self._core.checkpoints(self._send("GET", "checkpoints", params=params), after)
            out += page
            if len(page) < limits.MAX_CHECKPOINT_PAGE:
                return out
            after = page[-1].round

    def join(self, *, hf_binding: bytes | None = None, hf_token: str | None = None) -> JoinResult:
        args: dict[str, Any] = {}
        if hf_binding is not None or hf_token is not None:
            args = {"hf_binding": hf_binding, "hf_token": hf_token}
        self._core.joined = JoinResult.from_json(self._signed("join", Op.JOIN, args))
        return self._core.joined

    def admin(self, action: AdminVerb, **args: Any) -> dict[str, Any]:
        return self._signed("admin", Op.ADMIN, {"action": str(action), **args})

    def _signed(self, tail: str, op: Op, args: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(2):
            body = self._core.request_body(op, args, with_token=False)
            try:
                return self._send("POST", tail, json=body)
            except CoordinatorRejected as exc:
                if not self._core.retry_replayed(exc, attempt):
                    raise
        raise AssertionError("unreachable: the second attempt returns or raises")

    def allowlist_add(self, value: str, *, kind: AllowKind = AllowKind.USER) -> bool:
        args = {"kind": str(AllowKind(kind)), "value": value}
        return bool(self.admin(AdminVerb.ALLOWLIST_ADD, **args)["changed"])

    def allowlist_remove(self, value: str, *, kind: AllowKind = AllowKind.USER) -> bool:
        args = {"kind": str(AllowKind(kind)), "value": value}
        return bool(self.admin(AdminVerb.ALLOWLIST_REMOVE, **args)["changed"])

    def allowlist(self) -> list[dict[str, Any]]:
        return list(self.admin(AdminVerb.ALLOWLIST_LS)["allowlist"])

    def ban(self, peer: str, reason: str) -> None:
        self.admin(AdminVerb.BAN, peer=peer, reason=reason)

    def unban(self, peer: str) -> None:
        self.admin(AdminVerb.UNBAN, peer=peer)

    def log(self, *, after: int = 0, limit: int = limits.MAX_LOG_PAGE) -> list[dict[str, Any]]:
        return list(self.admin(AdminVerb.LOG, after=after, limit=limit)["log"])
