"""pjsua2's library from start to destroy: its configuration, transports, codecs and account.

Everything here runs on the SIP thread (telephony.endpoint), which owns the library: pjsua2 is not
safe to call from any other thread (shared/notes/pjsua2.md, "Threading").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pjsua2 as pj

from audio.vad import VadConfig
from telephony.pjsip_log import DECOR, route_early_lines

# telephony.endpoint imports it from here, where it was before telephony.pjsip_log.
from telephony.pjsip_log import LogWriter as LogWriter

log = logging.getLogger("voicegate.sip")

CODEC_IDS = {"PCMU": "PCMU/8000/1", "PCMA": "PCMA/8000/1", "G722": "G722/16000/1"}


class TelephonyStartError(RuntimeError):
    """The SIP stack could not start (address in use, bad address, ...)."""


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    """What the SIP thread needs, flattened from the settings so this layer does not import them."""

    sip_address: str
    sip_port: int
    media_address: str
    media_advertised_address: str  # the address SDP names (media.advertised_address)
    rtp_port_min: int
    rtp_port_max: int
    codecs: tuple[str, ...]
    clock_rate: int
    max_calls: int
    max_setup_rate: float
    numbers: frozenset[str]
    user_agent: str
    pjsip_log_level: int = 1
    fast_copy: bool = True
    gap_threshold_s: float = 1.0
    session_expires_s: int = 1800
    playout_max_ms: int = 60_000
    health_poll_s: float = 0.2
    resample_quality: int = 8
    media_port: str = "c"
    # The C port runs caller frames through this detector where it can (telephony.c_media_port).
    inbound_vad: VadConfig | None = None
    ack_timeout_s: float = 8.0
    # Each call's RTP only from its caller's source (telephony.strict_source).
    strict_source: bool = False
    # Inbound REFER policy: None refuses every REFER from the caller's side with 403; else it is
    # asked whether the call's tenant may call the Refer-To's bare URI (tenant, uri).
    follow_refer: Callable[[str, str], bool] | None = None
    # Which tenant owns a call (called user, source address); None answers 404. None: every
    # call is the default tenant's (sip.numbers still applies).
    route: Callable[[str, str], str | None] | None = None
    # Behind the pool's front door every INVITE comes from Kamailio, which puts the caller's
    # own source address in X-Voicegate-Source (after removing any the caller sent).
    trusted_source_header: bool = False
    # SIP over TLS (docs/security.md): 0 = no TLS listener; else its port and PEM files, which
    # voicegate.tls_files has already checked.
    tls_port: int = 0
    tls_cert_file: str = ""
    tls_key_file: str = ""
    # media.srtp: "off", "optional" or "mandatory".
    srtp: str = "off"
    # Tenants whose calls must arrive over TLS (tenants.<name>.require_tls).
    tls_tenants: frozenset[str] = frozenset()


def start_library(ep: Any, cfg: EndpointConfig, writer: LogWriter) -> None:
    """Create, configure and start ``ep`` (a ``pj.Endpoint``): UDP and TCP transports bound,
    and TLS when ``cfg.tls_port`` is set.

    Raises ``pj.Error`` if the library cannot start; the caller destroys it then. ``writer`` must
    outlive the library (PJSIP calls it back).
    """
    if not route_early_lines(cfg.pjsip_log_level):
        log.debug("pjlib's log functions not found: its first lines go to stdout")
    ep.libCreate()
    ep_cfg = pj.EpConfig()
    ep_cfg.uaConfig.threadCnt = 0
    ep_cfg.uaConfig.mainThreadOnly = True
    ep_cfg.uaConfig.maxCalls = cfg.max_calls
    ep_cfg.uaConfig.userAgent = cfg.user_agent
    # pjsua hands the writer only lines within consoleLevel (telephony.pjsip_log): the same
    # level, or the writer hears nothing; with a writer set, nothing goes to the console.
    ep_cfg.logConfig.writer = writer
    ep_cfg.logConfig.level = cfg.pjsip_log_level
    ep_cfg.logConfig.consoleLevel = cfg.pjsip_log_level
    ep_cfg.logConfig.decor = DECOR
    ep_cfg.logConfig.msgLogging = cfg.pjsip_log_level >= 4
    ep_cfg.medConfig.clockRate = cfg.clock_rate
    ep_cfg.medConfig.sndClockRate = cfg.clock_rate
    ep_cfg.medConfig.noVad = True
    ep_cfg.medConfig.quality = cfg.resample_quality
    ep_cfg.medConfig.ptime = 20
    ep_cfg.medConfig.audioFramePtime = 20
    ep.libInit(ep_cfg)
    # No sound card: the null device drives the conference bridge's 20 ms clock.
    ep.audDevManager().setNullDev()
    ipv6 = ":" in cfg.sip_address
    for kind in (
        pj.PJSIP_TRANSPORT_UDP6 if ipv6 else pj.PJSIP_TRANSPORT_UDP,
        pj.PJSIP_TRANSPORT_TCP6 if ipv6 else pj.PJSIP_TRANSPORT_TCP,
    ):
        tcfg = pj.TransportConfig()
        tcfg.port = cfg.sip_port
        tcfg.boundAddress = cfg.sip_address
        ep.transportCreate(kind, tcfg)
    if cfg.tls_port:
        tcfg = pj.TransportConfig()
        tcfg.port = cfg.tls_port
        tcfg.boundAddress = cfg.sip_address
        tcfg.tlsConfig = tls_config(cfg)
        ep.transportCreate(pj.PJSIP_TRANSPORT_TLS6 if ipv6 else pj.PJSIP_TRANSPORT_TLS, tcfg)
    ep.libStart()
    set_codec_priorities(ep, cfg.codecs)


def tls_config(cfg: EndpointConfig) -> Any:
    """The TLS listener's settings: our certificate, TLS 1.2 and 1.3 only.

    ``proto`` wins over ``method`` in PJSIP (sip_transport_tls.c: the method is used only when
    proto is 0); TLS 1.0 and 1.1 are deprecated (RFC 8996) and refused in the handshake. Callers
    are not asked for a certificate: carriers and phones authenticate by trunk address or
    digest, not by client certificates.
    """
    tls = pj.TlsConfig()
    tls.certFile = cfg.tls_cert_file
    tls.privKeyFile = cfg.tls_key_file
    tls.method = pj.PJSIP_TLSV1_2_METHOD
    tls.proto = pj.PJ_SSL_SOCK_PROTO_TLS1_2 | pj.PJ_SSL_SOCK_PROTO_TLS1_3
    tls.verifyClient = False
    tls.requireClientCert = False
    return tls


# "mandatory" runs PJSIP in its optional mode: its own mandatory mode refuses a plain offer with
# a bare 488 before pjsua2 hears of the call; telephony.srtp_offer keeps the rule instead, with a
# Warning saying why, and checks every stream that starts.
_SRTP_USE = {
    "off": pj.PJMEDIA_SRTP_DISABLED,
    "optional": pj.PJMEDIA_SRTP_OPTIONAL,
    "mandatory": pj.PJMEDIA_SRTP_OPTIONAL,
}


def set_srtp(media_cfg: Any, srtp: str) -> None:
    """``media.srtp`` on an ``AccountMediaConfig``.

    SDES (RFC 4568) carries the keys in the SDP itself, so with "mandatory" it is taken only
    on a call whose INVITE came over TLS (telephony.srtp_offer). PJSIP's own switch for
    that, ``srtpSecureSignaling``, is left at 0: set, it refuses *every* call not over TLS with
    406, a plain-RTP caller's too (pjsua_media.c, PJSIP_ESESSIONINSECURE, measured), which
    would make "optional" refuse what "off" takes.
    """
    media_cfg.srtpUse = _SRTP_USE[srtp]
    media_cfg.srtpSecureSignaling = 0
    # SDES only: DTLS-SRTP did not work with baresip 1.0.0's dtls_srtp (PJSIP cannot take its
    # UDP/TLS/RTP/SAVPF offer: PJMEDIA_SRTP_ESDPINTRANSPORT). Worse, with SRTP on (optional or
    # mandatory, either keying list) that offer makes pjsua answer 480 and then crash the
    # process, also in a ten-line pjsua2 program; with srtpUse disabled it is a clean 488. So
    # such offers never reach this account (telephony.srtp_offer.offers_dtls).
    keyings = pj.IntVector()
    keyings.append(pj.PJMEDIA_SRTP_KEYING_SDES)
    media_cfg.srtpOpt.keyings = keyings


def set_codec_priorities(ep: Any, codecs: tuple[str, ...]) -> None:
    """Offer ``codecs`` in that order and nothing else."""
    wanted = {CODEC_IDS[name]: 255 - i for i, name in enumerate(codecs)}
    # telephone-event (RFC 2833) is not a codec entry; it is always offered.
    for info in ep.codecEnum2():
        ep.codecSetPriority(info.codecId, wanted.get(info.codecId, 0))


def account_config(cfg: EndpointConfig, *, srtp: str | None = None) -> Any:
    """The account's configuration: its URI, RTP addresses and ports, session timers;
    ``srtp`` overrides ``cfg.srtp`` (the account DTLS offers go to: telephony.srtp_offer)."""
    ipv6 = ":" in cfg.sip_address
    host = f"[{cfg.sip_address}]" if ipv6 else cfg.sip_address
    acc_cfg = pj.AccountConfig()
    acc_cfg.idUri = f"sip:voicegate@{host}:{cfg.sip_port}"
    media_tp = acc_cfg.mediaConfig.transportConfig
    media_tp.boundAddress = cfg.media_address
    media_tp.publicAddress = cfg.media_advertised_address
    media_tp.port = cfg.rtp_port_min
    media_tp.portRange = cfg.rtp_port_max - cfg.rtp_port_min
    set_srtp(acc_cfg.mediaConfig, cfg.srtp if srtp is None else srtp)
    # RFC 4028: offered and accepted when the caller supports it; PJSIP refreshes when it is
    # the refresher and ends the dialog (408, BYE) when no refresh comes.
    acc_cfg.callConfig.timerUse = pj.PJSUA_SIP_TIMER_OPTIONAL
    acc_cfg.callConfig.timerSessExpiresSec = cfg.session_expires_s
    acc_cfg.callConfig.timerMinSESec = 90
    return acc_cfg
