"""What crosses between the SIP thread and asyncio: events one way, commands the other.

Plain frozen dataclasses, so nothing of pjsua2 leaks into asyncio code. ``call_id`` is voicegate's
own id for the call (also its session id), never PJSIP's index, which is reused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from telephony.inbound_context import PresentedHandle
    from telephony.media_bridge import MediaChannel


# --- events: SIP thread -> asyncio ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TransportsUp:
    """The UDP and TCP transports are bound; ``/readyz`` may say ready."""

    addresses: tuple[str, ...]
    fast_copy: bool
    media_port: str = "python"
    """The media port calls get: "c" or "python" (telephony.c_media_port)."""
    c_detector: bool = False
    """Whether those C ports run the caller's frames through the C evidence detector."""


@dataclass(frozen=True, slots=True)
class TransportsDown:
    reason: str


@dataclass(frozen=True, slots=True)
class CallOffered:
    call_id: str
    sip_call_id: str
    remote_uri: str
    local_uri: str
    called_user: str
    transport: str
    context: Mapping[str, object] = field(default_factory=dict)
    """What the session's metadata records of the INVITE's context headers
    (telephony.inbound_context): ``context`` and ``context_dropped``, or nothing."""
    tenant: str = "default"
    resume: PresentedHandle | None = None
    """The resume handle the INVITE presented (X-Voicegate-Resume or in hex User-to-User): the
    call rejoins that session if it verifies (voicegate/call/rejoin.py), else it is refused."""


@dataclass(frozen=True, slots=True)
class CallRefused:
    """An INVITE refused before it became a call. ``reason`` is a fixed label for metrics."""

    status: int
    reason: str
    remote_uri: str


@dataclass(frozen=True, slots=True)
class CallAnswered:
    call_id: str


@dataclass(frozen=True, slots=True)
class MediaReady:
    """Audio flows through ``channel``; sent again after every media change.

    ``codec_rate`` is the codec's clock rate on the wire; the channel runs at the conference
    bridge's rate (``media.clock_rate``), so PJSIP converts between the two once, in C.
    """

    call_id: str
    codec: str
    codec_rate: int
    channel: MediaChannel


@dataclass(frozen=True, slots=True)
class MediaHealthChanged:
    """RTP from the caller stopped (``interrupted``), came back (``flowing``) or is on ``held``."""

    call_id: str
    health: str
    since: float


@dataclass(frozen=True, slots=True)
class MediaSourceLocked:
    """The call's RTP is accepted from ``source`` only from now on (telephony.strict_source)."""

    call_id: str
    source: str


@dataclass(frozen=True, slots=True)
class ForeignRtp:
    """``packets`` from strangers reached the call's media ports and were dropped unread."""

    call_id: str
    packets: int


@dataclass(frozen=True, slots=True)
class ReinviteStarted:
    """The caller sent a re-INVITE (new address after a handover, codec change, hold)."""

    call_id: str


@dataclass(frozen=True, slots=True)
class ReinviteFinished:
    """The re-INVITE's media is in place (``ok``), or it failed and the old media stays
    (RFC 6141)."""

    call_id: str
    ok: bool


@dataclass(frozen=True, slots=True)
class TransferStatus:
    """Progress of a REFER we sent (pjsua2's ``onCallTransferStatus``): 100 when the REFER was
    accepted, then each NOTIFY's sipfrag status line (RFC 3515 section 2.4.5); ``final`` when the
    subscription ended. A refused REFER reports its own status (4xx/6xx), final."""

    call_id: str
    status: int
    reason: str
    final: bool


@dataclass(frozen=True, slots=True)
class InboundRefer:
    """The caller's side sent us a REFER: ``status`` is what we answered (202 followed, 403
    refused by policy). ``target`` is masked (telephony.sip_message.mask_uri)."""

    call_id: str
    status: int
    target: str


@dataclass(frozen=True, slots=True)
class CallReferred:
    """A followed inbound REFER's new call (RFC 3515 section 2.4.2), placed by pjsua to
    ``target`` (its bare URI, unmasked: the session records it masked) for ``tenant``, the
    referring call's. From here it is reported like a :class:`Dial`'s call: answered,
    :class:`CallAnswered` and :class:`MediaReady`; its end, :class:`CallEnded`."""

    call_id: str  # the new call's
    referred_by: str  # the call whose REFER it follows
    target: str
    tenant: str


@dataclass(frozen=True, slots=True)
class Bridged:
    """A bridge leg (``Dial.bridge_to``) answered and its audio and the caller's are connected
    in the conference bridge both ways; the caller's media port no longer sends or hears."""

    call_id: str  # the leg's
    caller_id: str


@dataclass(frozen=True, slots=True)
class DtmfReceived:
    call_id: str
    digit: str
    method: str


@dataclass(frozen=True, slots=True)
class AckTimedOut:
    """Our 2xx got no ACK within ``after_s`` (telephony.half_open): the call is being ended and
    its slot freed; a :class:`CallEnded` follows."""

    call_id: str
    after_s: float


@dataclass(frozen=True, slots=True)
class DialogEndedLocally:
    """A dialog we hung up whose BYE nobody answered was ended without it (dialog_end)."""


@dataclass(frozen=True, slots=True)
class DialogLingers:
    """A dialog we hung up whose BYE was answered is still there (a blind transfer's REFER
    subscription keeps it until its last NOTIFY): nothing to end, nothing counted."""

    sip_call_id: str


@dataclass(frozen=True, slots=True)
class CallEnded:
    """The dialog is gone. ``by`` is ``caller`` or ``server``; ``answered`` whether it ever was."""

    call_id: str
    by: str
    status: int
    reason: str
    answered: bool


@dataclass(frozen=True, slots=True)
class DialogProbed:
    """The final answer to a :class:`ProbeDialog` OPTIONS (RFC 3261 section 11), sent in the
    call's dialog.

    ``status`` is the final status code: the peer's, or PJSIP's own for a failure without one
    (408 "Request Timeout" when the transaction timed out, 503 with a reason such as "Transport
    Error" when the request could not be sent). A 481 or 408 means the peer no longer has the
    dialog (RFC 3261 section 12.2.1.2). Never sent for 1xx.
    """

    call_id: str
    generation: int
    attempt: int
    status: int
    reason: str


SipEvent = (
    TransportsUp
    | TransportsDown
    | CallOffered
    | CallRefused
    | CallAnswered
    | MediaReady
    | MediaHealthChanged
    | MediaSourceLocked
    | ForeignRtp
    | ReinviteStarted
    | ReinviteFinished
    | DtmfReceived
    | TransferStatus
    | Bridged
    | InboundRefer
    | CallReferred
    | DialogProbed
    | AckTimedOut
    | DialogEndedLocally
    | DialogLingers
    | CallEnded
)


# --- commands: asyncio -> SIP thread ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    call_id: str
    status: int = 200


@dataclass(frozen=True, slots=True)
class Hangup:
    call_id: str
    status: int = 603
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Rekey:
    """Know call ``call_id`` as ``new_call_id`` from now on: a call that rejoins a session takes
    the session's id (voicegate/call/rejoin.py), so its events reach that session's task."""

    call_id: str
    new_call_id: str


@dataclass(frozen=True, slots=True)
class Drain:
    """Refuse every new INVITE with 503 from now on (shutdown has begun)."""


@dataclass(frozen=True, slots=True)
class StoreAvailability:
    """Refuse new INVITEs with 503 while the session store does not answer (``available``
    False), and take them again once it does."""

    available: bool


@dataclass(frozen=True, slots=True)
class ProbeDialog:
    """Ask the caller whether the dialog still exists: an OPTIONS within it (RFC 3261 section 11),
    answered by :class:`DialogProbed` carrying the same ``generation`` and ``attempt``.

    Dropped without an answer if the call is not answered yet, is being hung up or has ended.
    """

    call_id: str
    generation: int
    attempt: int


@dataclass(frozen=True, slots=True)
class Transfer:
    """Send a blind-transfer REFER in the call's dialog to ``target`` (a bare SIP URI) with
    ``headers`` escaped into the Refer-To (telephony.transfer). Progress comes back as
    :class:`TransferStatus`; a REFER that cannot be sent is reported as a final 503."""

    call_id: str
    target: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Dial:
    """Place an outbound call: an INVITE to ``target`` (a bare SIP URI) with ``headers`` on it,
    as call ``call_id`` (voicegate's id: its session is durable before this is sent).

    Answered, it reports :class:`CallAnswered` and :class:`MediaReady` like an inbound call; not
    answered, :class:`CallEnded` with ``answered`` False and the callee's final status. An INVITE
    that cannot be sent (no free call slot, draining, PJSIP refused it) is reported at once as a
    :class:`CallEnded` with status 503 and why. :class:`Hangup` before the answer CANCELs it."""

    call_id: str
    target: str
    headers: tuple[tuple[str, str], ...] = ()
    bridge_to: str = ""
    """A bridged transfer's leg: once answered, its audio is connected both ways with this
    call's instead of a media port of ours (:class:`Bridged` says when)."""
    consult: bool = False
    """An attended transfer's consult leg: no media port of ours; it only has to be answered,
    then :class:`TransferReplaces` hands it over."""
    caller_id: str = ""
    """The INVITE's From (a SIP URI, or a display name and one in <>, checked by
    config.rules.caller_id); empty: the account's own URI."""
    tenant: str = ""
    """Whose call it is (config/tenants.py): the inbound-REFER policy asks with it, as for an
    inbound call's (telephony.refer)."""


@dataclass(frozen=True, slots=True)
class TransferReplaces:
    """Send an attended transfer's REFER in ``call_id``'s dialog: the caller's side is asked to
    call the consult leg's party with ``Replaces`` (RFC 3891, RFC 5589 section 7). Progress
    comes back as :class:`TransferStatus` of ``call_id``."""

    call_id: str
    consult_id: str


SipCommand = (
    Answer | Hangup | Drain | StoreAvailability | ProbeDialog | Transfer | Dial | TransferReplaces
    | Rekey
)
