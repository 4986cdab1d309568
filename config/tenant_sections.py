"""The sections each tenant may have its own of: ``[agent]``, ``[transfer]``, ``[outbound]``.

They are sections of :class:`config.settings.Settings` (the top-level ones) and fields of
:class:`config.tenants.TenantSettings` (a tenant's own), so they live below both modules: each
imports them from here and neither imports the other back. Declared as every section is (see
config/settings.py): one frozen dataclass, each key a field with ``metadata=key(rule, doc)``.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from config.rules import (
    boolean,
    directory,
    empty_or_one_of,
    existing_file,
    float_range,
    import_path,
    int_range,
    key,
    one_of,
    prompt_name,
    secret_text,
    sip_uri,
    sip_uri_patterns,
    websocket_url,
)
from config.rules import (
    caller_id as from_header,
)


@dataclass(frozen=True, slots=True)
class AgentSettings:
    kind: str = field(
        default="demo",
        metadata=key(
            one_of("demo", "python", "remote"),
            "Which agent answers calls: the built-in demo, your own Python agent (factory), or "
            "a remote agent over a WebSocket (url, secret; docs/agent-protocol.md)",
        ),
    )
    factory: str = field(
        default="",
        metadata=key(
            import_path(empty_ok=True),
            "With kind = python: the agent's factory, called as factory(context, call) for each "
            "call (an agents.base.Agent subclass or a function returning one); imported and "
            "checked at start-up",
        ),
    )
    speech: bool = field(
        default=True,
        metadata=key(
            boolean(),
            "With kind = demo: the demo agent also understands speech (pocketsphinx, one grammar "
            "per step, on a thread of its own) and says dynamic sentences (espeak-ng); false = "
            "keys only, and no caller audio is decoded (docs/speech.md)",
        ),
    )
    prompts_dir: Path | None = field(
        default=None,
        metadata=key(
            directory(empty_ok=True), "Directory of prompt WAVs; empty = the prompts shipped"
        ),
    )
    url: str = field(
        default="",
        metadata=key(
            websocket_url(empty_ok=True),
            "With kind = remote: the agent's WebSocket URL; voicegate opens one socket per call",
        ),
    )
    secret: str = field(
        default="",
        metadata=key(
            secret_text(empty_ok=True),
            "With kind = remote: the per-agent secret that signs the short-lived token voicegate "
            "presents (HMAC-SHA256); never logged",
        ),
    )
    reconnect_deadline_s: float = field(
        default=5.0,
        metadata=key(
            float_range(0.5, 120.0),
            "With kind = remote: how long a dropped link may take to resume before the call ends "
            "failed at stage agent_link (the caller told)",
        ),
    )
    ping_interval_s: float = field(
        default=5.0,
        metadata=key(
            float_range(0.2, 60.0),
            "With kind = remote: ping period; a link silent for 3 periods is lost",
        ),
    )
    max_protocol_errors: int = field(
        default=20,
        metadata=key(
            int_range(1, 1000),
            "With kind = remote: bad messages refused (each with an error) before the link is "
            "closed and the call ends failed at stage agent_link",
        ),
    )
    ca_file: Path | None = field(
        default=None,
        metadata=key(
            existing_file(empty_ok=True),
            "With a wss:// url: a PEM file of the CA certificates to trust for the agent's TLS "
            "certificate (its host name is checked); empty = the system's trust store",
        ),
    )


TRANSFER_MODES = ("blind", "bridge", "attended")
CONSULT_COMPLETIONS = ("after_brief", "api", "person")
# The keys a person on a consult leg may press (RFC 4733 events 0-15).
DTMF_KEYS = (*"0123456789", "*", "#", *"ABCD")


def target_allowed(target: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``target`` matches one of ``patterns`` (shell-style, case-insensitive).

    The one matching rule for ``transfer.allowed_targets``: the control API, the agents' calls and
    inbound REFER policy all ask this (telephony gets the answer, never the patterns' meaning).
    """
    uri = target.strip().lower()
    return any(fnmatch.fnmatchcase(uri, p.lower()) for p in patterns)


@dataclass(frozen=True, slots=True)
class TransferSettings:
    default_target: str = field(
        default="",
        metadata=key(
            sip_uri(empty_ok=True),
            "Where a transfer goes when none is named (the demo agent's key 0); empty = none. "
            "Must match allowed_targets",
        ),
    )
    human_target: str = field(
        default="",
        metadata=key(
            sip_uri(empty_ok=True),
            "A person who takes over a call that needs one (needs_human): the caller is "
            "transferred there instead of hung up on; empty = none. Must match allowed_targets",
        ),
    )
    allowed_targets: tuple[str, ...] = field(
        default=(),
        metadata=key(
            sip_uri_patterns(),
            "The only targets a transfer may go to (toll fraud): patterns with * such as "
            '"sip:*@callcentre.example.com"; anything else is refused (the API answers 403)',
        ),
    )
    default_mode: str = field(
        default="blind",
        metadata=key(
            one_of(*TRANSFER_MODES),
            "How a transfer is made: blind (REFER, RFC 3515: the caller's side calls the "
            "target), bridge (voicegate calls the target and stays in the media path) or "
            "attended (voicegate consults the target first, then REFER with Replaces)",
        ),
    )
    notify_timeout_s: float = field(
        default=60.0,
        metadata=key(
            float_range(1, 600),
            "How long a blind transfer waits for the final NOTIFY before the caller is taken "
            "back by the agent (pjsua's own subscription would wait 600 s)",
        ),
    )
    fallback: str = field(
        default="none",
        metadata=key(
            one_of("none", "bridge"),
            "What a blind transfer whose REFER is refused (4xx/6xx) does: none (the caller goes "
            "back to the agent) or bridge (voicegate calls the target itself and bridges)",
        ),
    )
    accept_inbound_refer: bool = field(
        default=False,
        metadata=key(
            boolean(),
            "Follow a REFER from the caller's side when its Refer-To matches allowed_targets; "
            "off, every inbound REFER is refused with 403",
        ),
    )
    consult_brief: str = field(
        default="consult_brief",
        metadata=key(
            prompt_name(empty_ok=True),
            "Attended transfers: the prompt the person on the consult leg hears once they "
            "answer, before the caller is handed over; empty = none (the REFER with Replaces "
            "then goes at once, or waits for the API with consult_complete = api)",
        ),
    )
    consult_complete: str = field(
        default="after_brief",
        metadata=key(
            one_of(*CONSULT_COMPLETIONS),
            "Attended transfers: when the caller is handed over: after_brief (once the brief "
            "and what the agent said to the person have played), api (when POST "
            "/v1/calls/{id}/transfer/complete or the agent says so) or person (the person's "
            "consult_accept_key hands over, consult_decline_key declines); any way within "
            "notify_timeout_s of the transfer's start",
        ),
    )
    consult_accept_key: str = field(
        default="1",
        metadata=key(
            empty_or_one_of(*DTMF_KEYS),
            "Attended transfers with consult_complete = person: the key the person on the "
            "consult leg presses to take the caller; empty = none (the agent or the API "
            "decides). Every key the person presses is told to the agent either way",
        ),
    )
    consult_decline_key: str = field(
        default="2",
        metadata=key(
            empty_or_one_of(*DTMF_KEYS),
            "Attended transfers with consult_complete = person: the key that declines the "
            "caller (the consult leg is hung up, the caller goes back to the agent); empty = none",
        ),
    )
    caller_id: str = field(
        default="",
        metadata=key(
            from_header(),
            "The From of the INVITE voicegate sends to a transfer's target (a bridge's leg, an "
            "attended transfer's consult leg): what the call centre's screen shows; empty = "
            "voicegate's own URI (sip:voicegate@<sip.address>:<sip.port>)",
        ),
    )

    def allows(self, target: str) -> bool:
        return target_allowed(target, self.allowed_targets)


@dataclass(frozen=True, slots=True)
class OutboundSettings:
    allowed_targets: tuple[str, ...] = field(
        default=(),
        metadata=key(
            sip_uri_patterns(),
            "The only URIs POST /v1/calls may call (toll fraud): patterns with * such as "
            '"sip:*@callcentre.example.com"; empty = no outbound calls (the API answers 403)',
        ),
    )
    ring_timeout_s: float = field(
        default=30.0,
        metadata=key(
            float_range(1, 300),
            "How long an outbound call may ring before voicegate gives it up (CANCEL): outcome "
            "no_answer, the session ends timed_out at stage ringing",
        ),
    )
    caller_id: str = field(
        default="",
        metadata=key(
            from_header(),
            "The From of the INVITE of POST /v1/calls: what the callee's phone shows; empty = "
            "voicegate's own URI (sip:voicegate@<sip.address>:<sip.port>)",
        ),
    )

    def allows(self, target: str) -> bool:
        return target_allowed(target, self.allowed_targets)
