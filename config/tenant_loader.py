"""``[tenants.<name>]`` tables: parsed, checked, and merged over the top-level settings.

A tenant's table::

    [tenants.acme]
    numbers = ["100", "+4930123"]        # called user parts it owns (empty: any)
    trunks = ["203.0.113.0/24"]          # source addresses its carrier sends from (empty: any)
    require_tls = true                   # refuse its calls (403) unless they come over TLS
    api_keys = ["<sha256 hex>"]          # digests of its API keys, never the keys
    [tenants.acme.agent]                 # any [agent] key but prompts_dir; the rest inherited
    kind = "python"
    factory = "acme.agent:Agent"
    [tenants.acme.transfer]              # any [transfer] key; the rest inherited
    default_target = "sip:queue@centre.acme.example"
    [tenants.acme.outbound]              # any [outbound] key; the rest inherited
    allowed_targets = ["sip:*@customers.acme.example"]

Without tables there is one tenant, ``default``: ``sip.numbers``, ``http.api_keys``, ``[agent]``,
``[transfer]`` and ``[outbound]``. With tables, those two top-level lists must be empty (each
number and key belongs to one declared tenant), and ``[agent]``, ``[transfer]`` and ``[outbound]``
are what tenants inherit.
Tenants are declared in the file only; there are no ``VOICEGATE_TENANT_*`` variables.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from typing import Any

from config.rules import Invalid, ip_networks, sha256_hashes, sip_users
from config.schema import BY_DOTTED, from_toml
from config.settings import Settings, agent_problems, transfer_problems
from config.tenants import DEFAULT_TENANT, Tenants, TenantSettings

_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_LISTS = {"numbers": sip_users(), "trunks": ip_networks(), "api_keys": sha256_hashes()}
_SUBTABLES = ("agent", "transfer", "outbound")
# Process-wide: one prompt library serves every call of a process.
_NOT_PER_TENANT = frozenset({"agent.prompts_dir"})


def default_tenant(s: Settings) -> TenantSettings:
    """The one tenant of a config without ``[tenants.*]`` tables."""
    return TenantSettings(
        DEFAULT_TENANT, s.sip.numbers, (), s.http.api_keys, s.agent, s.transfer, s.outbound
    )


def tenants_of(s: Settings) -> Tenants:
    """The tenants a process serves: the declared ones, or the one made of ``s``'s top level
    (computed here, not stored, so a ``dataclasses.replace`` of ``[agent]`` is seen)."""
    return Tenants(s.tenants or (default_tenant(s),))


def open_api_problems(s: Settings) -> list[str]:
    """An API without any key answers anyone who reaches it: allowed on loopback only."""
    if ipaddress.ip_address(s.http.address).is_loopback or tenants_of(s).keys_configured:
        return []
    where = "http.api_keys" if not s.tenants else "tenants.<name>.api_keys"
    return [
        f"http.address = {s.http.address!r}: the control API would answer anyone who reaches "
        f"it, with no key configured: set {where} to SHA-256 digests of API keys (printf %s KEY "
        "| sha256sum), or bind http.address to 127.0.0.1"
    ]


def load_tenants(
    table: object, src: str, s: Settings
) -> tuple[tuple[TenantSettings, ...], list[str]]:
    """The tenants of ``table`` (the file's ``tenants`` value, None if absent) over ``s``, and
    every problem found, each one line naming the key and the fix."""
    if table is None:
        return (), []
    if not isinstance(table, dict) or not table:
        return (), [f"tenants{src}: expected one or more tables [tenants.<name>]"]
    problems: list[str] = []
    tenants: list[TenantSettings] = []
    for name, body in table.items():
        where = f"[tenants.{name}]{src}"
        if not _NAME.fullmatch(name):
            problems.append(
                f"{where}: a tenant name is a lower-case letter, then letters, digits, - or _ "
                "(at most 32)"
            )
            continue
        if not isinstance(body, dict):
            problems.append(f"tenants.{name} = {body!r}{src}: expected a table")
            continue
        tenant, found = _tenant(name, body, src, s)
        problems += found
        if tenant is not None:
            tenants.append(tenant)
    problems += _between(tenants, s, src)
    return tuple(tenants), problems


def _tenant(
    name: str, body: dict[str, Any], src: str, s: Settings
) -> tuple[TenantSettings | None, list[str]]:
    problems: list[str] = []
    lists: dict[str, tuple[str, ...]] = {k: () for k in _LISTS}
    sections: dict[str, dict[str, object]] = {k: {} for k in _SUBTABLES}
    require_tls = False
    for key, raw in body.items():
        dotted = f"tenants.{name}.{key}"
        if key == "require_tls":
            if not isinstance(raw, bool):
                problems.append(f"{dotted}{src}: expected true or false")
            elif raw and not s.sip.tls_port:
                problems.append(
                    f"{dotted}{src}: its calls could never arrive: set sip.tls_port (with "
                    "sip.tls_cert_file and sip.tls_key_file), or remove require_tls"
                )
            else:
                require_tls = raw
        elif key in _LISTS:
            if not isinstance(raw, list) or not all(isinstance(i, str) for i in raw):
                problems.append(f"{dotted}{src}: expected {_LISTS[key].allowed}")
                continue
            try:
                lists[key] = _LISTS[key].check(tuple(raw))
            except Invalid as exc:
                shown = "<redacted>" if key == "api_keys" else repr(raw)
                problems.append(f"{dotted} = {shown}{src}: {exc}")
        elif key in _SUBTABLES and isinstance(raw, dict):
            problems += _section(name, key, raw, src, sections[key])
        else:
            known = ", ".join([*_LISTS, "require_tls", *(f"[{name}.{t}]" for t in _SUBTABLES)])
            problems.append(f"{dotted}{src}: unknown key; known: {known}")
    if problems:
        return None, problems
    agent = dataclasses.replace(s.agent, **sections["agent"])  # type: ignore[arg-type]
    transfer = dataclasses.replace(s.transfer, **sections["transfer"])  # type: ignore[arg-type]
    outbound = dataclasses.replace(s.outbound, **sections["outbound"])  # type: ignore[arg-type]
    for p in [*agent_problems(agent, s.session), *transfer_problems(transfer)]:
        keys = ", ".join(k if k.startswith("session.") else f"tenants.{name}.{k}" for k in p.keys)
        problems.append(f"{keys}{src}: {p.reason}")
    tenant = TenantSettings(
        name,
        lists["numbers"],
        lists["trunks"],
        lists["api_keys"],
        agent,
        transfer,
        outbound,
        require_tls,
    )
    return tenant, problems


def _section(
    name: str, section: str, table: dict[str, Any], src: str, out: dict[str, object]
) -> list[str]:
    """One tenant's [agent], [transfer] or [outbound] keys, each checked by the top-level key's
    own rule."""
    problems = []
    for key, raw in table.items():
        dotted = f"{section}.{key}"
        where = f"tenants.{name}.{dotted}"
        k = BY_DOTTED.get(dotted)
        if k is None or dotted in _NOT_PER_TENANT:
            why = "set it in the top-level section" if k is not None else "unknown key"
            problems.append(f"{where}{src}: {why}")
            continue
        try:
            out[key] = from_toml(k, raw)
        except Invalid as exc:
            shown = "<redacted>" if key == "secret" else repr(raw)
            problems.append(f"{where} = {shown}{src}: {exc}")
    return problems


def _between(tenants: list[TenantSettings], s: Settings, src: str) -> list[str]:
    """Claims two tenants would share: a call or a key must have exactly one owner."""
    problems = []
    if s.sip.numbers:
        problems.append(
            "sip.numbers: with [tenants.*] declared, list each called number in the numbers "
            "of the tenant that owns it, and leave sip.numbers empty"
        )
    if s.http.api_keys:
        problems.append(
            "http.api_keys: with [tenants.*] declared, each key belongs to one tenant: move the "
            "digests into tenants.<name>.api_keys"
        )
    owners: dict[tuple[str, str], str] = {}
    for t in tenants:
        # A number (or the catch-all "") claimed by two tenants is ambiguous unless trunks part
        # them; two trunk-bound claims on one number are left to the trunks.
        for number in t.numbers or ("",):
            if t.trunks:
                continue
            what = f"number {number!r}" if number else "every number (numbers empty)"
            if (other := owners.get(("n", number))) is not None:
                problems.append(
                    f"tenants.{t.name}.numbers{src}: {what} is already claimed by tenant "
                    f"{other!r} from any source: give one of them trunks, or drop the number"
                )
            owners[("n", number)] = t.name
        for digest in t.api_keys:
            if (other := owners.get(("k", digest))) is not None:
                problems.append(
                    f"tenants.{t.name}.api_keys{src}: a digest also listed by tenant {other!r}: "
                    "a key acts for one tenant only"
                )
            owners[("k", digest)] = t.name
    return problems
