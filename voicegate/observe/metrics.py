"""The Prometheus metrics of one voicegate process, on a registry of their own.

In a pool each worker runs with ``PROMETHEUS_MULTIPROC_DIR`` set by the supervisor, so these
values also land in per-process files that the supervisor's ``/metrics`` sums over all workers
(prometheus-client's multiprocess mode). Each gauge says how workers combine: active calls add up
over live workers, and so do bound transports (the number of workers with SIP up).
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

from agents.base import AGENT_CALLS, RESPONSE_ENDINGS
from agents.remote.protocol import ERROR_CODES
from audio.inbound import PIPELINE_BUCKETS_S
from session.resume import ResumeResult
from session.vocabulary import (
    RECOVERABLE,
    LegOutcome,
    Outcome,
    RecoveryOutcome,
    SpeechDecision,
    Terminal,
    TransferOutcome,
)
from voicegate.observe.batched import BatchedHistogram

# Why the control API refused a request (voicegate/control/auth.py); a closed vocabulary.
API_REFUSAL_REASONS = ("missing_key", "wrong_key", "other_tenant", "metrics_off")
# Why a resume handle was issued (voicegate/call/resume.py, the sessions API).
RESUME_ISSUE_REASONS = ("start", "transfer", "api")
# How a callback offer ends (voicegate/call/callbacks.py).
CALLBACK_OUTCOMES = ("accepted", "declined", "no_answer", "code_refused", "hung_up")
# Transfers (voicegate/call/transfer.py, bridge.py): how each one ended, per mode, and
# the class of each NOTIFY sipfrag status (or REFER refusal) it got; closed vocabularies.
TRANSFER_MODES = ("blind", "bridge", "attended")
TRANSFER_OUTCOMES = (
    "completed",
    "refused",
    "failed",
    "timed_out",
    "caller_left",
    "canceled",
)
NOTIFY_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx", "6xx")


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        r = self.registry
        self.calls_active = Gauge(
            "voicegate_calls_active",
            "Calls offered and not yet ended",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.calls_offered = Counter(
            "voicegate_calls_offered_total", "INVITEs accepted as calls", registry=r
        )
        self.calls = Counter(
            "voicegate_calls_total",
            "Calls ended, by terminal state (completed, canceled, timed_out, failed, needs_human)",
            ["outcome"],
            registry=r,
        )
        self.calls_refused = Counter(
            "voicegate_calls_refused_total",
            "INVITEs refused before becoming a call, by reason and SIP status",
            ["reason", "status"],
            registry=r,
        )
        self.calls_half_open = Counter(
            "voicegate_calls_half_open_total",
            "Answered calls whose ACK never came within sip.ack_timeout_s: ended, slot freed",
            registry=r,
        )
        self.dialogs_ended_locally = Counter(
            "voicegate_dialogs_ended_locally_total",
            "Dialogs we hung up whose BYE went unanswered, ended locally to free their slot",
            registry=r,
        )
        self.dtmf_digits = Counter(
            "voicegate_dtmf_digits_total", "DTMF digits received", ["method"], registry=r
        )
        self.media_frames = Counter(
            "voicegate_media_frames_total",
            "20 ms frames moved through media bridges of ended calls",
            ["direction"],
            registry=r,
        )
        self.playout_underruns = Counter(
            "voicegate_playout_underruns_total",
            "Times a call's playout ran dry while audio was playing",
            registry=r,
        )
        # The session store (docs/storage.md): whether it answers, and what its outages cost.
        self.store_up = Gauge(
            "voicegate_store_up",
            "1 while the session store answers; 0 while it does not (new calls get 503); in a "
            "pool, 0 if any worker's store does not answer",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.store_outages = Counter(
            "voicegate_store_outages_total",
            "Times the session store stopped answering",
            registry=r,
        )
        self.store_unavailable_seconds = Counter(
            "voicegate_store_unavailable_seconds_total",
            "Seconds the session store did not answer (counted every half second)",
            registry=r,
        )
        self.store_outage_calls_ended = Counter(
            "voicegate_store_outage_calls_ended_total",
            "Live calls let go because the store could not record their steps for "
            "storage.unavailable_deadline_s",
            registry=r,
        )
        self.sip_ready = Gauge(
            "voicegate_sip_transports_up",
            "1 while the SIP transports are bound (in a pool: workers with SIP up)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.fast_frame_copy = Gauge(
            "voicegate_fast_frame_copy",
            "1 if the verified pointer copy is used for frames, 0 for the slow SWIG copy",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.c_media_port = Gauge(
            "voicegate_c_media_port",
            "1 if calls get the C media port (no Python on the media clock thread), 0 for "
            "pjsua2's Python port",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.c_detector = Gauge(
            "voicegate_c_detector",
            "1 if the C media port runs the caller's voice activity detector on the media clock "
            "thread, 0 if Python runs it",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.sessions_ended = Counter(
            "voicegate_sessions_ended_total",
            "Sessions that reached their terminal state, including reaped ones",
            ["terminal_state"],
            registry=r,
        )
        self.sessions_reaped = Counter(
            "voicegate_sessions_reaped_total",
            "Sessions finalised because their process died: stale (age) or predecessor (start-up)",
            ["why"],
            registry=r,
        )
        self.gate_frozen_seconds = Counter(
            "voicegate_gate_frozen_seconds_total",
            "Seconds side-effect gates spent frozen or reconciling before reopening or closing",
            registry=r,
        )
        self.recoveries = Counter(
            "voicegate_recoveries_total",
            "Recoveries by interruption kind and outcome (recovered, timed_out, canceled, failed)",
            ["kind", "outcome"],
            registry=r,
        )
        self.recovery_duration = Histogram(
            "voicegate_recovery_duration_seconds",
            "How long recoveries took, by interruption kind",
            ["kind"],
            buckets=(0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120),
            registry=r,
        )
        # A transfer is its own phase, not a recovery (session/transfer.py): an attended one
        # waits for a person for minutes by design, which no recovery target should count.
        self.transfer_duration = Histogram(
            "voicegate_transfer_duration_seconds",
            "How long transfers took from their start to the caller being with the target, back "
            "with the agent or gone, by mode and outcome (completed, refused, failed, declined, "
            "canceled, timed_out, caller_left, ended: the session ended otherwise)",
            ["mode", "outcome"],
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
            registry=r,
        )
        self.stale_events = Counter(
            "voicegate_stale_events_ignored_total",
            "Late events of an older generation or finished response, dropped",
            ["event"],
            registry=r,
        )
        self.session_events_rejected = Counter(
            "voicegate_session_events_rejected_total",
            "Events refused as illegal in their session's state (nothing changed)",
            ["event"],
            registry=r,
        )
        self.rtp_foreign_packets = Counter(
            "voicegate_rtp_foreign_packets_total",
            "RTP and RTCP packets from a source other than the call's caller, dropped in the "
            "kernel before PJMEDIA read them (media.strict_source)",
            registry=r,
        )
        self.media_gaps = Counter(
            "voicegate_media_gaps_total",
            "Times a call's RTP stopped for longer than media.gap_threshold_s (holds excluded)",
            registry=r,
        )
        self.deadline_endings = Counter(
            "voicegate_deadline_endings_total",
            "Sessions ended timed_out, by the deadline that ended them",
            ["deadline"],
            registry=r,
        )
        self.agent_failures = Counter(
            "voicegate_agent_failures_total",
            "In-process agents that raised, by the handler that did (the call ends failed)",
            ["method"],
            registry=r,
        )
        self.dead_response_frames = Counter(
            "voicegate_dead_response_frames_dropped_total",
            "Agent audio (in 20 ms frames) written to a response that was no longer alive, "
            "dropped at admission, by why it had ended (done, interrupted, canceled, "
            "superseded, ended, refused)",
            ["reason"],
            registry=r,
        )
        # Remote agents (agents/remote/, docs/agent-protocol.md).
        self.agent_links = Gauge(
            "voicegate_agent_links",
            "Remote-agent links, by state (connecting, open, lost)",
            ["state"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.agent_link_resumes = Counter(
            "voicegate_agent_link_resumes_total",
            "Redials of a dropped remote-agent link, by result (resumed, refused, restarted: a "
            "new session.start after a refused resume, failed: not back within "
            "agent.reconnect_deadline_s)",
            ["result"],
            registry=r,
        )
        self.agent_replayed_messages = Counter(
            "voicegate_agent_replayed_messages_total",
            "Un-acked protocol messages replayed after a resume, by direction (to_agent: sent "
            "again by voicegate; from_agent: duplicates the agent re-sent, skipped)",
            ["direction"],
            registry=r,
        )
        self.agent_chunks_dropped = Counter(
            "voicegate_agent_chunks_dropped_total",
            "Remote-agent audio chunks dropped, never played, by why (unknown_response, "
            "dead_response)",
            ["reason"],
            registry=r,
        )
        self.agent_protocol_errors = Counter(
            "voicegate_agent_protocol_errors_total",
            "Remote-agent messages refused with an in-band error, by error code "
            "(docs/agent-protocol.md, Errors)",
            ["kind"],
            registry=r,
        )
        self.stale_frames = Counter(
            "voicegate_stale_frames_dropped_total",
            "20 ms frames of audio refused at playout admission: an older generation, or a "
            "response already interrupted or finished",
            registry=r,
        )
        self.barge_ins = Counter(
            "voicegate_barge_ins_total",
            "Responses interrupted by the caller, by speech or DTMF, counted once judged: "
            "confirmed (a caller turn followed; a key press always is one) or false (no turn "
            "within audio.barge_in_false_window_ms: noise, a cough)",
            ["reason", "outcome"],
            registry=r,
        )
        self.caller_said = Counter(
            "voicegate_caller_said_total",
            "Utterances an agent's recogniser heard and logged (caller_said), by the decision "
            "taken: accepted, confirmed, rejected, reprompted, keypad_offered",
            ["decision"],
            registry=r,
        )
        self.barge_in_latency = Histogram(
            "voicegate_barge_in_latency_seconds",
            "From the caller's speech onset to the end of the last agent frame sent",
            buckets=(0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.15, 0.2, 0.3, 0.5, 1.0),
            registry=r,
        )
        self.loop_lag = Histogram(
            "voicegate_event_loop_lag_seconds",
            "How late the media tick ran while calls were live: time the event loop was held",
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
            registry=r,
        )
        self.media_ticks = Counter(
            "voicegate_media_ticks_total",
            "Media ticks by pace: steady (audio.tick_ms) or barge_in (audio.barge_in_tick_ms, "
            "while a caller may be starting to talk over a response)",
            ["pace"],
            registry=r,
        )
        # Observed for every caller frame: counted in process, written once a second
        # (voicegate/observe/batched.py; the runtime's media tick flushes it).
        self.frame_pipeline = BatchedHistogram(
            Histogram(
                "voicegate_frame_pipeline_seconds",
                "Time of the inbound pipeline per 20 ms caller frame: voice activity (in the C "
                "media port's detector, or in Python with resampling for the agent)",
                buckets=PIPELINE_BUCKETS_S,
                registry=r,
            )
        )
        self.tool_calls = Counter(
            "voicegate_tool_calls_total",
            "Tool calls by tool and outcome (committed, failed, not_started, unknown, refused)",
            ["tool", "outcome"],
            registry=r,
        )
        self.tool_bad_answers = Counter(
            "voicegate_tool_bad_answers_total",
            "Provider answers outside the tool contract (each settled as unknown, never as"
            " committed), by tool and reason (voicegate.tools.client.BadAnswer)",
            ["tool", "reason"],
            registry=r,
        )
        self.tool_duplicates_prevented = Counter(
            "voicegate_tool_duplicates_prevented_total",
            "Repeated asks for an intent already made, answered with the original outcome",
            ["tool"],
            registry=r,
        )
        self.tool_receipt_conflicts = Counter(
            "voicegate_tool_receipt_conflicts_total",
            "Receipts that contradict the one on record for their key (seed 000's conflicting "
            "receipt): the session goes to needs_human, nobody picks one answer",
            ["tool"],
            registry=r,
        )
        self.tool_sends_repeated = Counter(
            "voicegate_tool_sends_repeated_total",
            "Writes the provider answered as a replay of a key it had already executed "
            "(Idempotent-Replayed): the write was sent more than once; the provider's "
            "idempotency, not voicegate, kept it from running twice",
            ["tool"],
            registry=r,
        )
        self.stale_frames_played = Counter(
            "voicegate_stale_frames_played_total",
            "20 ms frames the media port played after a cut that were not of the new "
            "generation: stale audio that reached the caller (always 0 unless the port breaks "
            "its cut contract)",
            registry=r,
        )
        self.reconciliations = Counter(
            "voicegate_reconciliations_total",
            "Outcomes learned from providers' status endpoints",
            ["outcome"],
            registry=r,
        )
        self.needs_human = Counter(
            "voicegate_needs_human_total",
            "Sessions sent to needs_human, by reason",
            ["reason"],
            registry=r,
        )
        self.transfers = Counter(
            "voicegate_transfers_total",
            "Transfers by mode and outcome (completed, refused: the REFER was, failed: the final "
            "NOTIFY was not 2xx, timed_out: no final NOTIFY in transfer.notify_timeout_s, "
            "caller_left: the caller's BYE came first, canceled: an attended transfer called off "
            "by the API or the agent before the hand-over, declined: by the person's key)",
            ["mode", "outcome"],
            registry=r,
        )
        self.transfer_notifies = Counter(
            "voicegate_transfer_notifies_total",
            "Transfer progress reports: each NOTIFY's sipfrag status, or the REFER's own "
            "refusal, by status class and whether it was final",
            ["status_class", "final"],
            registry=r,
        )
        self.inbound_refers = Counter(
            "voicegate_inbound_refers_total",
            "REFERs from the caller's side: followed (allowed target) or refused (403)",
            ["result"],
            registry=r,
        )
        # Outbound legs (POST /v1/calls; session.legs): how each turned out.
        self.outbound_calls = Counter(
            "voicegate_outbound_calls_total",
            "Outbound calls placed, by outcome: answered, no_answer (outbound.ring_timeout_s, or "
            "480), busy (486/600), declined (603), failed (any other answer, or no free call "
            "slot), canceled (given up before an answer)",
            ["outcome"],
            registry=r,
        )
        self.bridged_legs = Gauge(
            "voicegate_bridged_legs_active",
            "Call legs in a bridged transfer that is up (two per bridge: the caller's and the "
            "target's); each holds one of the worker's call slots",
            registry=r,
            multiprocess_mode="livesum",
        )
        for leg_outcome in LegOutcome:
            self.outbound_calls.labels(leg_outcome.value)
        self.api_refused = Counter(
            "voicegate_api_requests_refused_total",
            "Control API requests refused before their handler: missing_key, wrong_key (401), "
            "other_tenant, metrics_off (403)",
            ["reason"],
            registry=r,
        )
        for reason in API_REFUSAL_REASONS:
            self.api_refused.labels(reason)
        self.resume_issued = Counter(
            "voicegate_resume_handles_issued_total",
            "Resume handles issued: when a session starts, on a transfer, or to the tenant's API",
            ["reason"],
            registry=r,
        )
        for reason in RESUME_ISSUE_REASONS:
            self.resume_issued.labels(reason)
        self.resume_attempts = Counter(
            "voicegate_resume_attempts_total",
            "Resume handles presented on an INVITE, by result (ok: the call rejoined its "
            "session; expired, invalid, cross_tenant, reused: refused with 403)",
            ["result"],
            registry=r,
        )
        for resume_result in ResumeResult:
            self.resume_attempts.labels(resume_result.value)
        # Callers back after a drop (voicegate/call/callbacks.py, docs/tenants.md).
        self.callbacks_offered = Counter(
            "voicegate_callbacks_offered_total",
            "Calls matched to a dropped session of the same caller and tenant, and offered to "
            "continue it",
            registry=r,
        )
        self.callbacks = Counter(
            "voicegate_callbacks_total",
            "Callback offers by outcome (accepted: the session continued; declined, no_answer, "
            "code_refused: a new session started; hung_up: the caller left during the offer)",
            ["outcome"],
            registry=r,
        )
        for callback_outcome in CALLBACK_OUTCOMES:
            self.callbacks.labels(callback_outcome)
        self.callback_code_attempts = Counter(
            "voicegate_callback_code_attempts_total",
            "Resume codes entered on a callback, by result (ok, wrong)",
            ["result"],
            registry=r,
        )
        for code_result in ("ok", "wrong"):
            self.callback_code_attempts.labels(code_result)
        for mode in TRANSFER_MODES:
            for transfer_outcome in TRANSFER_OUTCOMES:
                self.transfers.labels(mode, transfer_outcome)
        for status_class in NOTIFY_CLASSES:
            for final in ("true", "false"):
                self.transfer_notifies.labels(status_class, final)
        for result in ("followed", "refused"):
            self.inbound_refers.labels(result)
        for outcome in Terminal:
            self.calls.labels(outcome)
            self.sessions_ended.labels(outcome)
        for why in ("stale", "predecessor"):
            self.sessions_reaped.labels(why)
        for deadline in ("recovery", "max_duration", "no_input", "session_timer"):
            self.deadline_endings.labels(deadline)
        # Every series of a closed vocabulary exists at 0 from the start: an alert or a
        # dashboard's increase() sees the first event (a series born at 1 has no increase), and
        # deploy/grafana's queries can be checked against a fresh /metrics.
        for mode in TRANSFER_MODES:
            for phase_outcome in TransferOutcome:
                self.transfer_duration.labels(mode, phase_outcome)
        for kind in RECOVERABLE:
            self.recovery_duration.labels(kind)
            for recovery_outcome in RecoveryOutcome:
                self.recoveries.labels(kind, recovery_outcome)
        for receipt in Outcome:
            self.reconciliations.labels(receipt)
        for reason in ("speech", "dtmf"):
            for judged in ("confirmed", "false"):
                self.barge_ins.labels(reason, judged)
        for decision in SpeechDecision:
            self.caller_said.labels(decision)
        for pace in ("steady", "barge_in"):
            self.media_ticks.labels(pace)
        for call in AGENT_CALLS:
            self.agent_failures.labels(call)
        for ending in RESPONSE_ENDINGS:
            self.dead_response_frames.labels(ending)
        for state in ("connecting", "open", "lost"):
            self.agent_links.labels(state)
        for result in ("resumed", "refused", "restarted", "failed"):
            self.agent_link_resumes.labels(result)
        for direction in ("to_agent", "from_agent"):
            self.agent_replayed_messages.labels(direction)
        for reason in ("unknown_response", "dead_response"):
            self.agent_chunks_dropped.labels(reason)
        for code in ERROR_CODES:
            self.agent_protocol_errors.labels(code)
        # The refusals the capacity alert watches (telephony/admission.py).
        self.calls_refused.labels("capacity", "486")
        self.calls_refused.labels("setup_rate", "503")
