"""Tenants: who owns a call, and whose API key a request carries.

A tenant owns called numbers (SIP user parts) and trunks (the source addresses its carrier sends
from), holds API keys (their SHA-256 digests only), and has its own agent, transfer and
outbound-call settings.
Every call belongs to exactly one tenant, chosen when its INVITE arrives (:meth:`Tenants.route`);
every API request with a key acts for exactly one (:meth:`Tenants.by_key`). With no
``[tenants.<name>]`` tables the process has one tenant, ``default``, made of the top-level
settings, so a config written before tenants existed means what it meant.

The tables are parsed by config/tenant_loader.py; this module is what the running layers use.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from config.tenant_sections import AgentSettings, OutboundSettings, TransferSettings

DEFAULT_TENANT = "default"


@dataclass(frozen=True, slots=True)
class TenantSettings:
    name: str
    numbers: tuple[str, ...]  # called user parts; empty: any number (its trunks permitting)
    trunks: tuple[str, ...]  # source addresses or networks; empty: any source
    api_keys: tuple[str, ...]  # SHA-256 hex digests, lower case
    agent: AgentSettings
    transfer: TransferSettings
    outbound: OutboundSettings  # POST /v1/calls for this tenant: its targets, ring time, From
    # Its calls must arrive over SIP over TLS (sip.tls_port); one over UDP or TCP is refused 403.
    require_tls: bool = False

    def takes(self, called_user: str, source: str) -> int:
        """How specifically this tenant claims a call: 0 not at all; a listed number counts more
        than a listed trunk, which counts more than a catch-all."""
        if self.numbers and called_user not in self.numbers:
            return 0
        if self.trunks and not _in_networks(source, self.trunks):
            return 0
        return 1 + (2 if self.numbers else 0) + (1 if self.trunks else 0)


def _in_networks(source: str, networks: tuple[str, ...]) -> bool:
    try:
        address = ipaddress.ip_address(source)
    except ValueError:
        return False  # no source known (or garbage): a trunk-bound tenant does not take it
    return any(address in ipaddress.ip_network(n, strict=False) for n in networks)


def key_digest(key: str) -> str:
    """The SHA-256 hex digest of an API key, as config stores it."""
    return hashlib.sha256(key.encode()).hexdigest()


class Tenants:
    """The process's tenants, in declaration order (never empty)."""

    def __init__(self, tenants: Sequence[TenantSettings]) -> None:
        if not tenants:
            raise ValueError("at least one tenant")
        self._all = tuple(tenants)
        self._by_name = {t.name: t for t in self._all}

    def __iter__(self) -> Iterator[TenantSettings]:
        return iter(self._all)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self._all)

    def get(self, name: str) -> TenantSettings | None:
        return self._by_name.get(name)

    def __getitem__(self, name: str) -> TenantSettings:
        return self._by_name[name]

    @property
    def keys_configured(self) -> bool:
        """Whether any tenant has an API key: without one the API is open (loopback only)."""
        return any(t.api_keys for t in self._all)

    def route(self, called_user: str, source: str) -> str | None:
        """The name of the tenant that owns a call to ``called_user`` from ``source`` (an IP
        address, "" if unknown), or None: nobody does (the INVITE is answered 404).

        The most specific claim wins (number and trunk, number, trunk, neither); between equal
        claims, the tenant declared first (config/tenant_loader.py refuses the ambiguous ones).
        """
        best, best_score = None, 0
        for tenant in self._all:
            score = tenant.takes(called_user, source)
            if score > best_score:
                best, best_score = tenant.name, score
        return best

    def by_key(self, key: str) -> TenantSettings | None:
        """The tenant whose API key ``key`` is, or None.

        Every stored digest is compared, each with ``hmac.compare_digest``, so how long the
        answer takes says nothing about which digest, or how much of one, matched.
        """
        digest = key_digest(key).encode()
        found = None
        for tenant in self._all:
            for stored in tenant.api_keys:
                if hmac.compare_digest(digest, stored.encode()):
                    found = tenant
        return found
