"""Who may take part: the ``join`` op (addresses, the optional HF binding checked against the
Hub's whoami, the allowlist) and the access token it issues, which every later request carries
(specs/coordinator.md#join)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from cnode.auth import (
    AuthError,
    EnvelopeError,
    HFLoginError,
    Identity,
    TokenError,
    hf_whoami,
    issue_access_token,
    verify_access_token,
    verify_hf_binding,
)

from .. import limits
from .._codes import ErrorCode as E
from .._config import RunConfig
from .._exceptions import RequestRefused
from .._store._store import Store
from .._wire._protocol import PEER_ONLY_USERNAME, JoinResult
from ._addrs import AddressError, check_peer_addrs
from ._dialback import dial_back
from ._driver import RunDriver

__all__ = ["Admission"]


class Admission:
    """Joins and access tokens of one run (the server's ``join`` op and its token checks)."""

    def __init__(
        self,
        store: Store,
        driver: RunDriver,
        config: RunConfig,
        identity: Identity,
        hf_endpoint: str | None,
    ) -> None:
        self.store = store
        self.driver = driver
        self.config = config
        self.identity = identity
        self.peer_id = identity.peer_id_str
        self.run = config.run
        self.hf_endpoint = hf_endpoint  # None = $HF_ENDPOINT or the public Hub

    async def join(self, peer: str, counter: int, args: dict[str, Any]) -> dict[str, Any]:
        binding, hf_token = args.get("hf_binding"), args.get("hf_token")
        username, orgs = "", []
        self.driver.check_not_banned(peer)  # cheap refusal before asking the Hub
        try:
            addrs = check_peer_addrs(
                args.get("addrs", []),
                peer,
                allow_private=self.config.network.allow_private_addrs,
            )
        except AddressError as exc:
            raise RequestRefused(E.BAD_ADDR, f"addrs: {exc}") from exc
        if binding is not None or hf_token is not None:
            if not isinstance(binding, bytes) or not isinstance(hf_token, str):
                raise RequestRefused(
                    E.BAD_REQUEST, "hf_binding (bytes) and hf_token (string) go together"
                )
            if len(hf_token) > limits.MAX_HF_TOKEN_CHARS:
                raise RequestRefused(E.BAD_REQUEST, "hf_token over MAX_HF_TOKEN_CHARS")
            try:
                bound = verify_hf_binding(binding)
            except AuthError as exc:
                raise RequestRefused(E.BAD_BINDING, f"HF binding: {exc}") from exc
            if bound.peer_id != peer:
                raise RequestRefused(E.BAD_BINDING, "the HF binding is for another peer")
            account = await self._whoami(hf_token)
            if account.username != bound.username:
                raise RequestRefused(
                    E.HF_USER_MISMATCH,
                    f"the HF token belongs to "
                    f"{account.username!r}, the binding names {bound.username!r}",
                )
            username, orgs = account.username, list(account.orgs)
        # Only what the coordinator could dial back is stored and handed out: nobody dials an
        # address that cannot be reached (specs/coordinator.md#reachability).
        reachable = await dial_back(addrs)
        now = time.time()
        expires = now + self.config.access.token_ttl_s
        with self.store.tx():
            self.driver.consume_counter(peer, counter)
            self.driver.check_may_join(peer, username, orgs)
            self.driver.record_join(peer, username, now, expires, reachable)
        token = issue_access_token(
            self.identity,
            peer_id=peer,
            username=username or PEER_ONLY_USERNAME,
            run=self.run,
            expires_at=int(expires),
        )
        return JoinResult(token, peer, username, int(expires) * 1000, reachable).to_json()

    async def _whoami(self, hf_token: str) -> Any:
        loop = asyncio.get_running_loop()
        call = loop.run_in_executor(None, hf_whoami, hf_token, self.hf_endpoint)
        try:
            return await asyncio.wait_for(call, limits.HF_WHOAMI_TIMEOUT_S)
        except HFLoginError as exc:
            raise RequestRefused(E.HF_LOGIN_FAILED, str(exc)) from exc
        except TimeoutError as exc:
            raise RequestRefused(E.HF_TIMEOUT, "the HF Hub did not answer whoami") from exc

    def access(self, peer: str, token: Any, now: float) -> str:
        """Check ``token`` is this run's access token of ``peer``; return its HF username."""
        if not isinstance(token, bytes):
            raise RequestRefused(E.BAD_TOKEN, "this request needs the access token from join")
        try:
            access = verify_access_token(
                token, coordinator_peer_id=self.peer_id, run=self.run, now=now
            )
        except (TokenError, EnvelopeError) as exc:
            raise RequestRefused(E.BAD_TOKEN, f"access token: {exc}") from exc
        if access.peer_id != peer:
            raise RequestRefused(E.BAD_TOKEN, "the access token was issued to another peer")
        return "" if access.username == PEER_ONLY_USERNAME else access.username
