"""Which INVITEs a worker takes, and how fast: sans-IO, time passed in.

Why a rate limit at all: every INVITE that reaches ``onIncomingCall`` has already made PJSIP open
an RTP and an RTCP socket, and a closed socket's ioqueue key stays reserved for 500 ms
(``PJ_IOQUEUE_KEY_FREE_DELAY``). The wheel's select ioqueue has 64 keys and *asserts* (aborting the
process) when none is free (pjlib ``ioqueue_select.c``, shared/notes/pjsua2.md). So the socket churn
per second must stay bounded whatever callers do.

Two mechanisms bound it:
- a token bucket admits at most ``rate`` set-ups per second (burst ``burst``);
- an INVITE over the rate is answered 503 only once its call slot is older than
  :data:`SLOT_HOLD_S`. While held, the slot counts against PJSIP's own ceiling, so further INVITEs
  are refused by PJSIP statelessly, before any socket is opened. Held slots can therefore churn at
  most ``max_calls / SLOT_HOLD_S`` sockets pairs per second.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from telephony.offer_check import BadOffer

# Longer than PJ_IOQUEUE_KEY_FREE_DELAY (500 ms), so a held slot outlives its sockets' quarantine.
SLOT_HOLD_S = 0.6


# Which tenant owns a call to a user part from a source address ("" if unknown); None: nobody.
Route = Callable[[str, str], str | None]
DEFAULT_TENANT = "default"


@dataclass(frozen=True, slots=True)
class Decision:
    """``status`` None means accept (for ``tenant``); otherwise answer ``status`` not before
    ``not_before``."""

    status: int | None
    reason: str
    not_before: float = 0.0
    tenant: str = DEFAULT_TENANT
    # Why, for the caller: sent as a Warning header with the refusal (RFC 3261 section 20.43).
    warning: str = ""


ACCEPT = Decision(None, "accepted")


class Admission:
    """Decides each INVITE. Not thread-safe: the SIP thread is its only user."""

    def __init__(
        self,
        *,
        max_calls: int,
        rate: float,
        numbers: frozenset[str] = frozenset(),
        route: Route | None = None,
        burst: float | None = None,
        tls_tenants: frozenset[str] = frozenset(),
    ) -> None:
        if max_calls < 1 or rate <= 0:
            raise ValueError("max_calls must be >= 1 and rate > 0")
        self.max_calls = max_calls
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, float(max_calls))
        self.numbers = numbers
        self.route = route
        # Tenants whose calls must come over TLS (tenants.<name>.require_tls).
        self.tls_tenants = tls_tenants
        self.draining = False
        # The session store does not answer (docs/storage.md): a new call could not even record
        # that it began, so it is refused and the front door tries another worker.
        self.store_unavailable = False
        self._tokens = self.burst
        self._last: float | None = None

    def _take_token(self, now: float) -> bool:
        if self._last is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def decide(
        self,
        *,
        live_calls: int,
        called_user: str,
        now: float,
        source: str = "",
        bad_offer: BadOffer | None = None,
        srtp_refusal: str | None = None,
        over_tls: bool = False,
    ) -> Decision:
        """Decide an INVITE that PJSIP has turned into a call slot at ``now``.

        ``live_calls`` counts this worker's calls not counting the new one; ``source`` is the
        INVITE's source address (the trunk), which ``route`` may use with the called user;
        ``bad_offer`` is telephony.offer_check's verdict on it. A refused INVITE costs the same
        sockets as an accepted one, so the rate comes first: a flood of malformed offers refused
        at once would exhaust the ioqueue as surely as a flood of calls (PROTOS c07-sip,
        sdp-connection-ip replayed back to back aborted a worker this way). ``srtp_refusal``
        is telephony.srtp_offer's reason an offer cannot have SRTP (media.srtp = mandatory);
        ``over_tls`` whether the INVITE came over TLS, for a tenant that requires it.
        """
        if self.draining:
            # RFC 3261 21.5.4: 503 tells the front door to try another worker.
            return Decision(503, "draining", now)
        if self.store_unavailable:
            return Decision(503, "store_unavailable", now)
        if not self._take_token(now):
            return Decision(503, "setup_rate", now + SLOT_HOLD_S)
        if bad_offer is not None:
            return Decision(bad_offer.status, bad_offer.reason, now)
        if srtp_refusal is not None:
            # RFC 3261 section 21.4.26: the session description is not acceptable.
            return Decision(488, "srtp_required", now, warning=srtp_refusal)
        if self.numbers and called_user not in self.numbers:
            return Decision(404, "unknown_number", now)
        tenant = DEFAULT_TENANT
        if self.route is not None:
            owner = self.route(called_user, source)
            if owner is None:
                return Decision(404, "unknown_number", now)
            tenant = owner
        if tenant in self.tls_tenants and not over_tls:
            # RFC 3261 section 21.4.4: understood, and refused; retrying as it is will not help.
            return Decision(
                403,
                "tls_required",
                now,
                tenant=tenant,
                warning="this number takes calls over SIP over TLS only",
            )
        if live_calls >= self.max_calls:
            return Decision(486, "capacity", now)
        return ACCEPT if tenant == DEFAULT_TENANT else Decision(None, "accepted", tenant=tenant)
