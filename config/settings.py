"""The settings schema: one frozen dataclass per config section, and ``Settings`` holding them.

Each key is declared once, as a field: its annotation is the type, ``default`` the default, and
``metadata=key(rule, doc)`` what is allowed and a one-line description. The loader, the error
messages, the environment variable names and the reference table are all derived from these
declarations, so adding a key is adding a field, and adding a section is adding a dataclass plus
one field of ``Settings``. The sections a tenant may also have its own of (``[agent]``,
``[transfer]``, ``[outbound]``) are declared in config/tenant_sections.py, below both this module
and config/tenants.py, and re-exported here. Relations between keys of different sections are the
``cross_check`` functions at the bottom.

Lists are tuples so that settings stay immutable and hashable; in TOML they are arrays, in the
environment comma-separated.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from config.rules import (
    boolean,
    choice_list,
    directory,
    empty_or_one_of,
    existing_file,
    float_range,
    header_text,
    http_url,
    int_choice,
    int_range,
    ip_literal,
    key,
    name_token,
    node_name,
    one_of,
    postgres_url,
    sha256_hashes,
    sip_users,
)

# [agent], [transfer], [outbound]: sections here and fields of a tenant, so declared below both
# this module and config.tenants; re-exported, as the sections of Settings.
from config.tenant_sections import CONSULT_COMPLETIONS as CONSULT_COMPLETIONS
from config.tenant_sections import TRANSFER_MODES as TRANSFER_MODES
from config.tenant_sections import AgentSettings as AgentSettings
from config.tenant_sections import OutboundSettings as OutboundSettings
from config.tenant_sections import TransferSettings as TransferSettings
from config.tenant_sections import target_allowed as target_allowed
from config.tenants import TenantSettings
from config.tools import ToolSettings

# The crash windows of seed 000 ("How to validate"), named where voicegate's write path passes them.
CRASH_WINDOWS = (
    "before_turn_commit",
    "after_turn_commit",
    "before_intent_persist",
    "after_intent_persist",
    "before_request_send",
    "after_request_send",
    "after_provider_commit",
    "before_receipt_persist",
    "after_receipt_persist",
    "during_playout",
)
NOT_A_SECTION = "voicegate.not_a_section"

_PORT = int_range(1, 65535)
_ADDRESS = ip_literal()


@dataclass(frozen=True, slots=True)
class SipSettings:
    address: str = field(default="127.0.0.1", metadata=key(_ADDRESS, "Address the SIP stack binds"))
    port: int = field(default=5060, metadata=key(_PORT, "SIP port, shared by UDP and TCP"))
    max_setup_rate: float = field(
        default=20.0,
        metadata=key(
            # The wheel's select ioqueue (64 handles) aborts the process past about 60 set-ups/s.
            float_range(0, 60, lo_open=True),
            "Call set-ups per second admitted by this process; pjsua2 aborts past about 60",
        ),
    )
    numbers: tuple[str, ...] = field(
        default=(),
        metadata=key(sip_users(), "Called user parts answered; empty answers any user"),
    )
    user_agent: str = field(
        default="voicegate", metadata=key(header_text(), "User-Agent and Server header value")
    )
    answer_after_s: float = field(
        default=0.0,
        metadata=key(
            float_range(0, 60),
            "Seconds an incoming call rings (180) before it is answered; 0 answers at once",
        ),
    )
    ack_timeout_s: float = field(
        default=8.0,
        metadata=key(
            float_range(1, 32),
            "Seconds an answered call waits for the caller's ACK before it is ended failed and "
            "its call slot freed (RFC 3261's Timer H is 32 s; a half-open INVITE holds a slot)",
        ),
    )
    session_expires_s: int = field(
        default=1800,
        metadata=key(
            int_range(90, 86400),
            "RFC 4028 session interval offered and accepted; the dialog ends timed_out if "
            "no refresh comes (Min-SE is 90)",
        ),
    )
    drain_deadline_s: float = field(
        default=60.0,
        metadata=key(
            float_range(0, 86400),
            "On SIGTERM new calls are refused (503) and live calls may go on this many seconds "
            "before they are told the server is shutting down; a second signal skips the wait",
        ),
    )
    shutdown_grace_s: float = field(
        default=5.0,
        metadata=key(
            float_range(0, 300),
            "Seconds live calls get after the BYE on SIGTERM before the process exits anyway",
        ),
    )
    tls_port: int = field(
        default=0,
        metadata=key(
            int_range(0, 65535),
            "SIP over TLS port on the same address (TLS 1.2 or newer only; callers dial "
            "sip:...;transport=tls or sips:); 0 = no TLS listener. Needs tls_cert_file and "
            "tls_key_file, checked at start-up (docs/security.md). In a pool the front door's "
            "Kamailio holds it (docs/pool.md)",
        ),
    )
    tls_cert_file: Path | None = field(
        default=None,
        metadata=key(
            existing_file(empty_ok=True),
            "With tls_port: the PEM certificate (chain) the TLS listener presents, leaf first",
        ),
    )
    tls_key_file: Path | None = field(
        default=None,
        metadata=key(
            existing_file(empty_ok=True),
            "With tls_port: the PEM private key of tls_cert_file (unencrypted; keep it readable "
            "by voicegate only)",
        ),
    )


@dataclass(frozen=True, slots=True)
class MediaSettings:
    address: str = field(default="127.0.0.1", metadata=key(_ADDRESS, "Address RTP binds"))
    public_address: str = field(
        default="",
        metadata=key(
            ip_literal(empty_ok=True, wildcard_ok=False),
            "Address advertised in SDP; empty = the same as address",
        ),
    )
    rtp_port_min: int = field(
        default=20000, metadata=key(int_range(1024, 65535), "Lowest RTP/RTCP port")
    )
    rtp_port_max: int = field(
        default=20999,
        metadata=key(int_range(1024, 65535), "Highest RTP/RTCP port; 2 ports per call"),
    )
    codecs: tuple[str, ...] = field(
        default=("PCMU", "PCMA", "G722"),
        metadata=key(choice_list("PCMU", "PCMA", "G722", what="codec"), "Codecs, preferred first"),
    )
    clock_rate: int = field(
        default=16000,
        metadata=key(int_choice(8000, 16000), "Conference bridge sample rate in Hz"),
    )
    resample_quality: int = field(
        default=8,
        metadata=key(
            int_range(1, 10),
            "PJSIP's media quality: 5-10 resample with the large filter, 3-4 with the small one "
            "(at a 16 kHz bridge with G.711 calls, about a quarter less CPU per worker), 1-2 "
            "linearly; also the encoding effort of codecs that have one",
        ),
    )
    port: str = field(
        default="c",
        metadata=key(
            one_of("c", "python"),
            "Each call's media port on the conference bridge: c (telephony/media_port.c, no "
            "Python on PJSIP's media clock thread; used only with PJSIP 2.15.1 after a start-up "
            "check, else python is used and logged) or python (pjsua2's AudioMediaPort)",
        ),
    )
    fast_frame_copy: bool = field(
        default=True,
        metadata=key(
            boolean(),
            "Copy frames through the vector's data pointer (verified at start-up) instead of "
            "SWIG's slice-assignment copy; false only to measure the difference",
        ),
    )

    srtp: str = field(
        default="off",
        metadata=key(
            one_of("off", "optional", "mandatory"),
            "SRTP for call media (SDES keys): off (plain RTP only), optional (SRTP when the "
            "caller offers it, else plain RTP) or mandatory (SDES on RTP/SAVP over SIP over TLS "
            "only; any other offer is refused 488 with a Warning; needs sip.tls_port). DTLS-SRTP "
            "offers are refused 488 (docs/security.md)",
        ),
    )

    gap_threshold_s: float = field(
        default=1.0,
        metadata=key(
            float_range(0.2, 300),
            "Seconds without caller RTP that count as a media gap (side effects freeze)",
        ),
    )
    strict_source: str = field(
        default="auto",
        metadata=key(
            one_of("auto", "on", "off"),
            "Accept each call's RTP only from the source of its first packets after answer "
            "(and after each re-INVITE); the kernel drops the rest, counted in "
            "voicegate_rtp_foreign_packets_total. auto: on unless media.address is loopback. "
            "off lets anyone who guesses a live call's RTP port take the call's audio (RTP "
            "Bleed): only for a network where nobody else can reach the media ports",
        ),
    )

    @property
    def advertised_address(self) -> str:
        """The address to put in SDP: ``public_address``, or ``address`` when that is empty."""
        return self.public_address or self.address

    @property
    def strict_source_on(self) -> bool:
        """Whether calls' RTP is locked to its caller (``auto``: media beyond loopback)."""
        if self.strict_source != "auto":
            return self.strict_source == "on"
        return not ipaddress.ip_address(self.address).is_loopback


@dataclass(frozen=True, slots=True)
class AudioSettings:
    agent_rate: int = field(
        default=16000,
        metadata=key(int_choice(8000, 16000), "Sample rate of the audio agents receive, in Hz"),
    )
    tick_ms: int = field(
        default=60,
        metadata=key(
            int_choice(20, 40, 60),
            "How often each call's caller audio is taken through VAD and barge-in to the agent, "
            "in ms. Each tick takes every 20 ms frame waiting: a longer tick costs less CPU "
            "(a wake-up per tick per process) and adds up to one tick to barge-in latency",
        ),
    )
    barge_in_tick_ms: int = field(
        default=20,
        metadata=key(
            int_choice(20, 40, 60),
            "How often caller audio is taken instead while a barge-in may be starting (speech "
            "evidence over a playing response, on any call of the process), in ms. The ticks "
            "that decide a barge-in come this often; every other tick is tick_ms apart. Equal "
            "to tick_ms, the pace never changes",
        ),
    )
    vad_aggressiveness: int = field(
        default=2,
        metadata=key(
            int_range(0, 3), "webrtcvad aggressiveness: 0 hears most speech, 3 least noise"
        ),
    )
    vad_frame_ms: int = field(
        default=20, metadata=key(int_choice(10, 20, 30), "Frame length webrtcvad classifies, in ms")
    )
    vad_onset_ms: int = field(
        default=60,
        metadata=key(int_range(10, 2000), "Speech needed before speech counts as started, in ms"),
    )
    vad_hangover_ms: int = field(
        # 400, not 300: at 300 a comma's pause ended 4 of 32 lines early at 10 dB SNR (a turn
        # committed mid-sentence, whose tail then cut the answer); none at 400 (docs/barge-in.md).
        default=400,
        metadata=key(int_range(20, 5000), "Silence needed before speech counts as stopped, in ms"),
    )
    vad_detector: str = field(
        default="evidence",
        metadata=key(
            one_of("evidence", "verdicts"),
            "How caller speech is told from line noise: evidence (webrtcvad frames that stand "
            "vad_margin_db out of a tracked noise floor, onset over vad_window_ms) or verdicts "
            "(webrtcvad's verdicts alone, the behaviour before issue 21; noise can cut the agent "
            "off). evidence needs vad_frame_ms 20",
        ),
    )
    vad_margin_db: float = field(
        # 8.5 with onsets of two full frames and weak ones (audio/evidence_vad.py): at 8 with
        # three full frames, where the frame edges fell in a short first syllable moved its
        # detection from 180 to 780 ms (docs/barge-in.md).
        default=8.5,
        metadata=key(
            float_range(0, 40),
            "Evidence detector: how far above the tracked noise floor a frame must be to count "
            "as speech, in dB (3.5 dB less once the caller is speaking, and for an onset's "
            "frames beyond its first two)",
        ),
    )
    vad_window_ms: int = field(
        default=160,
        metadata=key(
            int_range(20, 2000),
            "Evidence detector: speech starts when vad_onset_ms of evidence lies within the last "
            "this many ms (never less than vad_onset_ms)",
        ),
    )
    vad_floor_rise_db_per_s: float = field(
        default=3.0,
        metadata=key(
            float_range(0.1, 60),
            "Evidence detector: how fast the noise floor may rise while webrtcvad hears speech, "
            "in dB per second (four times that on frames it calls noise)",
        ),
    )
    turn_min_speech_ms: int = field(
        default=240,
        metadata=key(
            int_range(0, 10000),
            "Speech a segment must hold before it becomes a caller turn (shorter bursts are "
            "never given to the agent as turns)",
        ),
    )
    barge_in: bool = field(
        default=True,
        metadata=key(boolean(), "Caller speech during a response interrupts it"),
    )
    barge_in_false_window_ms: int = field(
        default=2500,
        metadata=key(
            int_range(200, 30000),
            "A speech barge-in not followed by a committed caller turn within this many ms is a "
            "false interruption: the agent is told, with the position heard, and may resume",
        ),
    )
    barge_in_min_speech_ms: int = field(
        default=60,
        metadata=key(
            int_range(0, 10000),
            "Speech that must last this long before it interrupts (a cough does not)",
        ),
    )
    barge_in_dtmf: bool = field(
        default=True, metadata=key(boolean(), "A key press during a response interrupts it")
    )
    playout_max_s: float = field(
        default=60.0,
        metadata=key(float_range(1, 600), "Most audio one call may have queued for the caller"),
    )


@dataclass(frozen=True, slots=True)
class HttpSettings:
    address: str = field(
        default="127.0.0.1", metadata=key(_ADDRESS, "Address of the control API and /metrics")
    )
    port: int = field(default=8080, metadata=key(_PORT, "Port of the control API and /metrics"))
    api_keys: tuple[str, ...] = field(
        default=(),
        metadata=key(
            sha256_hashes(),
            "SHA-256 digests of the API keys of the default tenant (with no [tenants.*]); every "
            "/v1 route then needs Authorization: Bearer <key>. Empty: the API is open, which is "
            "allowed only on a loopback address (docs/api.md)",
        ),
    )
    metrics_keys: tuple[str, ...] = field(
        default=(),
        metadata=key(
            sha256_hashes(),
            "SHA-256 digests of the keys a scraper presents for /metrics from a non-loopback "
            "peer (Authorization: Bearer <key>); empty: /metrics answers only loopback peers",
        ),
    )


@dataclass(frozen=True, slots=True)
class PoolSettings:
    workers: int = field(
        default=1,
        metadata=key(
            int_range(1, 64),
            "Worker processes, each one pjsua2 endpoint; above 1 a supervisor runs them behind "
            "Kamailio, which then owns sip.address:sip.port",
        ),
    )
    calls_per_worker: int = field(
        default=4,
        metadata=key(
            int_range(1, 4096),
            "Calls at once in one worker; the pjsua2 wheel is built for at most 4 "
            "(PJSUA_MAX_CALLS) and refuses more, higher values need a rebuilt pjproject",
        ),
    )
    worker_address: str = field(
        default="127.0.0.1",
        metadata=key(
            ip_literal(wildcard_ok=False),
            "Address workers bind for SIP, and Kamailio's dispatcher list names (workers > 1)",
        ),
    )
    worker_sip_port: int = field(
        default=5100,
        metadata=key(_PORT, "SIP port of worker 0; worker i uses worker_sip_port + i"),
    )
    worker_http_port: int = field(
        default=8100,
        metadata=key(
            _PORT, "Loopback control port of worker 0 (for the supervisor); worker i adds i"
        ),
    )
    front_door: bool = field(
        default=True,
        metadata=key(
            boolean(),
            "Run Kamailio here on sip.address:sip.port (workers > 1); false when the front door "
            "runs elsewhere and lists this host's workers",
        ),
    )
    kamailio: str = field(
        default="kamailio",
        metadata=key(header_text(), "Kamailio executable, a command name or a path"),
    )
    source_max_rate: float = field(
        default=30.0,
        metadata=key(
            float_range(0, 10000),
            "New requests (INVITE, OPTIONS, ...) per second the front door takes from one source "
            "address; a source above it is answered 503 with Retry-After until it slows down "
            "(Kamailio pike). 0 turns the limit off; raise it for a carrier trunk's address",
        ),
    )
    probe_interval_s: int = field(
        default=2,
        metadata=key(
            int_range(1, 60),
            "Seconds between Kamailio's OPTIONS probes of each worker; a worker failing two "
            "in a row leaves the dispatcher set until it answers again",
        ),
    )
    health_interval_s: float = field(
        default=1.0,
        metadata=key(float_range(0.1, 60), "Seconds between the supervisor's worker health checks"),
    )
    health_timeout_s: float = field(
        default=5.0,
        metadata=key(
            float_range(0.1, 60),
            "How long one health check may take; generous, so that a worker slowed by a busy "
            "machine is not killed with its calls",
        ),
    )
    health_failures: int = field(
        default=3,
        metadata=key(
            int_range(1, 100),
            "Consecutive failed health checks after which a worker is killed and replaced",
        ),
    )
    start_timeout_s: float = field(
        default=30.0,
        metadata=key(
            float_range(1, 600), "Seconds a worker may take to become healthy after it starts"
        ),
    )
    start_concurrency: int = field(
        default=4,
        metadata=key(
            int_range(1, 64),
            "Workers starting at once; the others wait their turn (start_timeout_s counts from "
            "each one's own start), so that a large pool starting on a small machine does not "
            "starve every worker of CPU until all miss their deadline",
        ),
    )
    fork_server: bool = field(
        default=True,
        metadata=key(
            boolean(),
            "Fork workers from one process that imported voicegate once, so that they start at "
            "once and share its memory (about 50 MB each); false starts each worker as a new "
            "Python interpreter",
        ),
    )
    restart_backoff_s: float = field(
        default=0.5,
        metadata=key(
            float_range(0, 60),
            "Delay before restarting a worker that died; doubles per quick death, reset after "
            "a minute up",
        ),
    )
    restart_backoff_max_s: float = field(
        default=30.0,
        metadata=key(float_range(0, 3600), "Longest delay between restarts of a worker"),
    )


@dataclass(frozen=True, slots=True)
class NodeSettings:
    name: str = field(
        default="",
        metadata=key(
            node_name(empty_ok=True),
            "Empty: this pool is the whole installation. A name unique in the cluster: this pool "
            "is one node of several sharing storage.url behind one front door (docs/cluster.md); "
            "its workers are then '<name>.<i>'",
        ),
    )
    heartbeat_s: float = field(
        default=2.0,
        metadata=key(
            float_range(0.2, 60), "Seconds between this node's heartbeats in the node registry"
        ),
    )
    dead_after_s: float = field(
        default=10.0,
        metadata=key(
            float_range(1, 3600),
            "A node silent this long is dead: a surviving node takes over its sessions (at "
            "least 3 x heartbeat_s, and well above the nodes' clock skew)",
        ),
    )
    api_url: str = field(
        default="",
        metadata=key(
            http_url(empty_ok=True),
            "Where people and other nodes reach this node's control API (shown in /v1/cluster "
            "and in a 409 for a call held elsewhere); empty: http://<http.address>:<http.port>",
        ),
    )


@dataclass(frozen=True, slots=True)
class StorageSettings:
    data_dir: Path = field(
        default=Path("voicegate-data"),
        metadata=key(
            directory(),
            "Directory of the embedded session store (and the callback key); made absolute at "
            "load time",
        ),
    )
    url: str = field(
        default="",
        metadata=key(
            postgres_url(empty_ok=True),
            "Empty: the embedded SQLite store in data_dir. postgresql://user@host:port/db: the "
            "shared PostgreSQL store (docs/storage.md); give the password by PGPASSWORD or a "
            "passfile, never here",
        ),
    )
    unavailable_deadline_s: float = field(
        default=30.0,
        metadata=key(
            float_range(1, 3600),
            "How long a live call goes on while the store cannot persist its steps; then it "
            "is told and ended (docs/storage.md, 'When the database is down')",
        ),
    )


@dataclass(frozen=True, slots=True)
class SessionSettings:
    worker_name: str = field(
        default="worker-0",
        metadata=key(
            name_token(),
            "Name of this serving process; sessions are owned by '<worker_name>/<incarnation>', "
            "and at start-up a worker finalises what its own dead predecessor left open",
        ),
    )
    reap_after_s: float = field(
        default=120.0,
        metadata=key(
            float_range(10, 86400),
            "An open session untouched this long lost its process and is finalised as failed",
        ),
    )
    heartbeat_s: float = field(
        default=5.0,
        metadata=key(float_range(0.5, 60), "How often a live session's owner touches it"),
    )
    reconcile_timeout_s: float = field(
        default=30.0,
        metadata=key(
            float_range(1, 600),
            "How long reconciliation may ask providers about unknown outcomes before the "
            "session goes to needs_human",
        ),
    )
    status_attempts: int = field(
        default=8,
        metadata=key(
            int_range(1, 20), "Status queries per outstanding intent (backoff with jitter)"
        ),
    )
    recovery_timeout_s: float = field(
        default=20.0,
        metadata=key(
            float_range(1, 600),
            "How long a session may try to recover from an interruption before it times out",
        ),
    )
    no_input_s: float = field(
        default=60.0,
        metadata=key(
            float_range(0, 3600),
            "Seconds without a key press or caller speech before the caller is asked if they "
            "are still there; 0 means never",
        ),
    )
    no_input_grace_s: float = field(
        default=10.0,
        metadata=key(
            float_range(1, 600), "Seconds after that question before the call ends timed_out"
        ),
    )
    max_duration_s: float = field(
        default=3600.0,
        metadata=key(float_range(0, 86400), "Longest call in seconds; 0 means no limit"),
    )
    resume_ttl_s: float = field(
        default=600.0,
        metadata=key(
            float_range(30, 86400),
            "How long a resume handle stays valid (one is issued when a session starts, on each "
            "transfer, and to the tenant's API); each is used once. A caller transferred out may "
            "be sent back with it for this long, and the session ends completed only then "
            "(docs/tenants.md, Coming back)",
        ),
    )
    callback_window_s: float = field(
        default=120.0,
        metadata=key(
            float_range(0, 3600),
            "How long a caller whose media was lost for good (not a hang-up) may call back "
            "from the same number and continue the session (offered with a key press, and "
            "the resume code the agent read out if a write had started); the session ends "
            "timed_out only then. 0 turns callbacks off (docs/tenants.md, Coming back)",
        ),
    )


@dataclass(frozen=True, slots=True)
class LogSettings:
    level: str = field(
        default="info",
        metadata=key(one_of("debug", "info", "warning", "error"), "Level of voicegate's logs"),
    )
    format: str = field(
        default="auto",
        metadata=key(
            one_of("auto", "json", "text"),
            "How log lines are written to stderr: json (one object per line), text (for "
            "people: time, level, event, then key=value facts) or auto (text when stderr is a "
            "terminal, json otherwise); the same facts either way",
        ),
    )
    pjsip_level: int = field(
        default=1,
        metadata=key(
            int_range(0, 6),
            "PJSIP's own log verbosity (0 = off): its lines are in the log under the logger "
            "pjsip, level 1 as errors, 2 warnings, 3 info, 4 to 6 (SIP messages from 4, "
            "callers' numbers masked, keys pressed starred) debug; 4 and above are for a test "
            "bench: whole SIP messages at every call",
        ),
    )


@dataclass(frozen=True, slots=True)
class FaultSettings:
    crash_at: str = field(
        default="",
        metadata=key(
            empty_or_one_of(*CRASH_WINDOWS, nth=True),
            "For tests only: exit abruptly (as a crash would) the first time this window is "
            "reached; empty = never",
        ),
    )


@dataclass(frozen=True, slots=True)
class Settings:
    """All settings. Build it with ``load_settings()``, which validates; the bare constructor
    does not (it is for tests and for ``dataclasses.replace`` on loaded settings)."""

    sip: SipSettings = field(default_factory=SipSettings)
    media: MediaSettings = field(default_factory=MediaSettings)
    audio: AudioSettings = field(default_factory=AudioSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    session: SessionSettings = field(default_factory=SessionSettings)
    pool: PoolSettings = field(default_factory=PoolSettings)
    node: NodeSettings = field(default_factory=NodeSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)
    transfer: TransferSettings = field(default_factory=TransferSettings)
    outbound: OutboundSettings = field(default_factory=OutboundSettings)
    log: LogSettings = field(default_factory=LogSettings)
    faults: FaultSettings = field(default_factory=FaultSettings)
    # Not a [section] of keys: [tools.<name>] tables, read by config.tools.
    tools: tuple[ToolSettings, ...] = field(default=(), metadata={NOT_A_SECTION: True})
    # Not a section either: [tenants.<name>] tables, read by config.tenant_loader. Empty without
    # tables: the process then has one tenant, "default", made of the top-level settings
    # (config.tenant_loader.tenants_of).
    tenants: tuple[TenantSettings, ...] = field(default=(), metadata={NOT_A_SECTION: True})


# ---- relations between keys --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CrossProblem:
    keys: tuple[
        str, ...
    ]  # dotted keys involved, e.g. ("media.rtp_port_min", "pool.calls_per_worker")
    reason: str


def _overlap(a: str, b: str) -> bool:
    """Whether sockets bound to these two addresses can collide on one port."""
    ia, ib = ipaddress.ip_address(a), ipaddress.ip_address(b)
    return ia == ib or ia.is_unspecified or ib.is_unspecified


def cross_check(s: Settings) -> list[CrossProblem]:
    """Problems that no single key shows. Runs only on settings whose keys are each valid."""
    problems: list[CrossProblem] = []
    m = s.media
    rtp = ("media.rtp_port_min", "media.rtp_port_max")
    if m.rtp_port_min >= m.rtp_port_max:
        problems.append(CrossProblem(rtp, "rtp_port_min must be below rtp_port_max"))
    elif (count := (m.rtp_port_max - m.rtp_port_min + 1) // s.pool.workers) < 2 * (
        calls := s.pool.calls_per_worker
    ):
        # Each call holds an RTP and an RTCP socket (RFC 3550 section 11: RTCP on the next port);
        # the workers split the range evenly.
        pooled = s.pool.workers > 1
        per = f"each of {s.pool.workers} workers {count}" if pooled else count
        problems.append(
            CrossProblem(
                (*rtp, "pool.calls_per_worker", *(("pool.workers",) if pooled else ())),
                f"the RTP range holds {per} ports but {calls} calls need {2 * calls} (2 per call)",
            )
        )
    if ipaddress.ip_address(m.address).is_unspecified and not m.public_address:
        # SDP with c=0.0.0.0 means "hold" (RFC 3264 section 8.4): the caller would send nothing.
        problems.append(
            CrossProblem(
                ("media.address", "media.public_address"),
                "a wildcard media address needs a public_address to advertise in SDP",
            )
        )
    problems.extend(_tls_problems(s))
    # SIP over TCP and HTTP would fight for one TCP port; SIP over UDP and RTP for one UDP port.
    if s.sip.port == s.http.port and _overlap(s.sip.address, s.http.address):
        problems.append(
            CrossProblem(("sip.port", "http.port"), "SIP (TCP) and HTTP need different ports")
        )
    if m.rtp_port_min <= s.sip.port <= m.rtp_port_max and _overlap(s.sip.address, m.address):
        problems.append(
            CrossProblem(
                ("sip.port", *rtp), "the SIP port must lie outside the RTP range (both UDP)"
            )
        )
    if s.session.heartbeat_s * 3 > s.session.reap_after_s:
        # A live session must be touched several times within the reaper's threshold, or the
        # reaper could finalise it between two heartbeats.
        problems.append(
            CrossProblem(
                ("session.heartbeat_s", "session.reap_after_s"),
                "reap_after_s must be at least 3 x heartbeat_s",
            )
        )
    if s.audio.vad_detector == "evidence" and s.audio.vad_frame_ms != 20:
        # The evidence detector judges each 20 ms media frame as one webrtcvad frame.
        problems.append(
            CrossProblem(
                ("audio.vad_detector", "audio.vad_frame_ms"),
                'vad_detector = "evidence" needs vad_frame_ms = 20 (or use "verdicts")',
            )
        )
    if s.audio.barge_in_tick_ms > s.audio.tick_ms:
        problems.append(
            CrossProblem(
                ("audio.barge_in_tick_ms", "audio.tick_ms"),
                "barge_in_tick_ms quickens the tick near a barge-in: it cannot exceed tick_ms",
            )
        )
    problems.extend(agent_problems(s.agent, s.session))
    problems.extend(_pool_problems(s))
    problems.extend(_node_problems(s))
    problems.extend(transfer_problems(s.transfer))
    return problems


def _tls_problems(s: Settings) -> list[CrossProblem]:
    """The TLS listener needs its certificate and key, a port of its own, and mandatory SRTP
    needs it (SDES keys travel in the SDP: over plain UDP or TCP anyone on the path reads them,
    RFC 4568 section 8.3). Whether the files hold a matching pair is checked at start-up
    (voicegate/tls_check.py), not here: the loader does not read files' contents. In a pool the
    front door's Kamailio holds the listener and the pair (docs/pool.md, "TLS and SRTP")."""
    sip, problems = s.sip, []
    files = ("sip.tls_cert_file", "sip.tls_key_file")
    if sip.tls_port:
        if sip.tls_cert_file is None or sip.tls_key_file is None:
            problems.append(
                CrossProblem(
                    ("sip.tls_port", *files),
                    "a TLS listener needs tls_cert_file and tls_key_file (PEM): set both, or "
                    "set tls_port = 0",
                )
            )
        # SIP over TCP already holds sip.port on this address, and TLS is TCP too.
        if sip.tls_port == sip.port:
            problems.append(
                CrossProblem(
                    ("sip.tls_port", "sip.port"),
                    "SIP over TCP holds sip.port: give TLS a port of its own",
                )
            )
        if sip.tls_port == s.http.port and _overlap(sip.address, s.http.address):
            problems.append(
                CrossProblem(
                    ("sip.tls_port", "http.port"), "SIP over TLS and HTTP need different ports"
                )
            )
    elif sip.tls_cert_file is not None or sip.tls_key_file is not None:
        problems.append(
            CrossProblem(
                ("sip.tls_port", *files),
                "a certificate and key are used only by a TLS listener: set tls_port, or "
                "remove them",
            )
        )
    if s.media.srtp == "mandatory" and not sip.tls_port:
        problems.append(
            CrossProblem(
                ("media.srtp", "sip.tls_port"),
                'srtp = "mandatory" needs SIP over TLS for the keys (SDES, RFC 4568 section '
                '8.3): set sip.tls_port (with its certificate and key), or use "optional"',
            )
        )
    return problems


def agent_problems(a: AgentSettings, session: SessionSettings) -> list[CrossProblem]:
    """What is wrong with one [agent] (the top-level one, or a tenant's)."""
    problems = []
    if a.kind == "python" and not a.factory:
        problems.append(
            CrossProblem(
                ("agent.kind", "agent.factory"),
                'kind = "python" needs a factory such as "mypackage.agent:MyAgent"',
            )
        )
    if a.kind == "remote" and not (a.url and a.secret):
        problems.append(
            CrossProblem(
                ("agent.kind", "agent.url", "agent.secret"),
                'kind = "remote" needs both url (ws:// or wss://) and secret',
            )
        )
    if a.kind == "remote" and a.reconnect_deadline_s >= session.recovery_timeout_s:
        problems.append(
            CrossProblem(
                ("agent.reconnect_deadline_s", "session.recovery_timeout_s"),
                "reconnect_deadline_s must be below the session's recovery_timeout_s",
            )
        )
    if a.ca_file is not None and not a.url.startswith("wss://"):
        problems.append(
            CrossProblem(
                ("agent.ca_file", "agent.url"),
                "ca_file is used only with a wss:// url: use wss://, or remove ca_file",
            )
        )
    if a.kind != "python" and a.factory:
        problems.append(
            CrossProblem(
                ("agent.kind", "agent.factory"),
                'a factory is used only with kind = "python": set kind, or remove factory',
            )
        )
    return problems


def transfer_problems(t: TransferSettings) -> list[CrossProblem]:
    """A configured target outside allowed_targets would be refused on every use: say so now."""
    problems = []
    for name in ("default_target", "human_target"):
        target = getattr(t, name)
        if target and not t.allows(target):
            problems.append(
                CrossProblem(
                    (f"transfer.{name}", "transfer.allowed_targets"),
                    f"{target} matches no pattern of allowed_targets: add one that covers it",
                )
            )
    if t.consult_accept_key and t.consult_accept_key == t.consult_decline_key:
        problems.append(
            CrossProblem(
                ("transfer.consult_accept_key", "transfer.consult_decline_key"),
                "the same key cannot both accept and decline: choose two different keys",
            )
        )
    return problems


def _node_problems(s: Settings) -> list[CrossProblem]:
    """A node of a cluster: a pool, without a front door of its own, on the shared store."""
    n = s.node
    if not n.name:
        return []
    problems: list[CrossProblem] = []
    if not s.storage.url:
        problems.append(
            CrossProblem(
                ("node.name", "storage.url"),
                "a node shares its sessions with the others: set storage.url to the cluster's "
                "PostgreSQL",
            )
        )
    if s.pool.workers < 2:
        problems.append(
            CrossProblem(
                ("node.name", "pool.workers"),
                "a node is a pool whose supervisor heartbeats it: pool.workers must be 2 or more",
            )
        )
    if s.pool.front_door:
        problems.append(
            CrossProblem(
                ("node.name", "pool.front_door"),
                "a node's calls come through the cluster's front door: set pool.front_door = "
                "false (voicegate front-door-config writes that Kamailio's lists)",
            )
        )
    if n.heartbeat_s * 3 > n.dead_after_s:
        problems.append(
            CrossProblem(
                ("node.heartbeat_s", "node.dead_after_s"),
                "dead_after_s must be at least 3 x heartbeat_s",
            )
        )
    if ipaddress.ip_address(s.pool.worker_address).is_loopback:
        problems.append(
            CrossProblem(
                ("node.name", "pool.worker_address"),
                "the front door on another machine must reach the workers: set "
                "pool.worker_address to an address it can",
            )
        )
    return problems


def _pool_problems(s: Settings) -> list[CrossProblem]:
    """With several workers, their SIP and control ports must collide with nothing else."""
    p = s.pool
    if p.workers == 1:
        return []
    problems: list[CrossProblem] = []
    sip_ports = range(p.worker_sip_port, p.worker_sip_port + p.workers)
    http_ports = range(p.worker_http_port, p.worker_http_port + p.workers)
    if sip_ports.stop - 1 > 65535 or http_ports.stop - 1 > 65535:
        problems.append(
            CrossProblem(
                ("pool.workers", "pool.worker_sip_port", "pool.worker_http_port"),
                "worker ports would run past 65535",
            )
        )
        return problems
    if s.sip.port in sip_ports and _overlap(s.sip.address, p.worker_address):
        problems.append(
            CrossProblem(
                ("sip.port", "pool.worker_sip_port", "pool.workers"),
                f"worker SIP ports {sip_ports.start}-{sip_ports.stop - 1} include sip.port, "
                "which Kamailio listens on",
            )
        )
    rtp = range(s.media.rtp_port_min, s.media.rtp_port_max + 1)
    if set(sip_ports) & set(rtp) and _overlap(s.media.address, p.worker_address):
        problems.append(
            CrossProblem(
                ("pool.worker_sip_port", "media.rtp_port_min", "media.rtp_port_max"),
                "worker SIP ports must lie outside the RTP range (both UDP)",
            )
        )
    if set(http_ports) & {s.http.port}:
        problems.append(
            CrossProblem(
                ("pool.worker_http_port", "http.port", "pool.workers"),
                f"worker control ports {http_ports.start}-{http_ports.stop - 1} include "
                "http.port, which the supervisor serves",
            )
        )
    if set(http_ports) & set(sip_ports) and _overlap(p.worker_address, "127.0.0.1"):
        problems.append(
            CrossProblem(
                ("pool.worker_http_port", "pool.worker_sip_port"),
                "worker SIP (TCP) and control ports overlap",
            )
        )
    if p.restart_backoff_s > p.restart_backoff_max_s:
        problems.append(
            CrossProblem(
                ("pool.restart_backoff_s", "pool.restart_backoff_max_s"),
                "restart_backoff_s must not exceed restart_backoff_max_s",
            )
        )
    return problems
