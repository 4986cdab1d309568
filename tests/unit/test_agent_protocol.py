"""The remote-agent protocol without a socket: schemas in step with the code, the codec, seq/ack
and replay, the token, and the adapter's mapping (docs/agent-protocol.md).

Bad input of any shape is refused with an in-band error, counted, and changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from agents.base import (
    CallContext,
    ConsultEvent,
    GateChange,
    MarkOutcome,
    PlaybackCut,
    ToolResult,
    TransferUpdate,
)
from agents.remote import auth
from agents.remote.adapter import RemoteAgent, remote_settings
from agents.remote.dial import LinkConfig
from agents.remote.link import Link
from agents.remote.protocol import (
    ACCEPTS,
    SENDS,
    Codec,
    Inbox,
    Outbox,
    ProtocolError,
    ReplayOverflow,
    encode_agent_audio,
)
from agents.remote.schemas import SCHEMA_DIR, SchemaError, validate, validators
from voicegate.observe.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    ROOT / "agents" / "remote" / n
    for n in ("adapter.py", "link.py", "protocol.py", "tool_calls.py")
]


# --- the schemas and the code stay in step -------------------------------------------------------


def _literal_types(path: Path) -> set[str]:
    return set(re.findall(r'"type":\s*"([a-z._]+)"', path.read_text()))


def test_every_message_type_has_a_schema_and_every_schema_is_used() -> None:
    assert set(validators("to_agent")) == SENDS, "to_agent schemas vs protocol.SENDS"
    assert set(validators("from_agent")) == ACCEPTS, "from_agent schemas vs protocol.ACCEPTS"
    for path in SCHEMA_DIR.rglob("*.json"):
        Draft202012Validator.check_schema(json.loads(path.read_text()))
    sent = set().union(*(_literal_types(p) for p in SOURCES))
    assert sent <= SENDS, f"sent without a schema: {sent - SENDS}"
    # What voicegate sends with a literal, plus what protocol.py builds (error).
    assert SENDS - sent <= {"error"}
    handled = set(re.findall(r'case "([a-z.]+)"', (ROOT / "agents/remote/adapter.py").read_text()))
    link_level = {"session.accept", "session.resumed", "error", "ping", "pong", "ack"}
    assert handled | link_level == ACCEPTS
    example = _literal_types(ROOT / "examples" / "remote_agent" / "agent.py")
    assert example <= ACCEPTS, f"the example sends what voicegate refuses: {example - ACCEPTS}"


def test_every_message_the_adapter_builds_matches_its_schema() -> None:
    agent, call = _agent()
    sent = _drive(agent, call)
    types = {m["type"] for m in sent}
    assert types >= SENDS - {"session.resume", "error", "ping", "pong", "ack", "audio.gap"}
    for message in sent:
        validate("to_agent", message)


# --- the codec -----------------------------------------------------------------------------------

VALID = {"type": "response.start", "seq": 1, "ack": 0, "response_id": "a1"}

junk_values = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 2**70), st.text(max_size=80), st.lists(st.integers())
)
junk_messages = st.one_of(
    st.text(max_size=200),
    st.dictionaries(
        st.sampled_from(["type", "seq", "ack", "response_id", "call_id", "tool", "arguments", "x"]),
        st.one_of(junk_values, st.sampled_from(sorted(ACCEPTS | SENDS))),
        max_size=6,
    ).map(json.dumps),
    st.builds(lambda k, v: json.dumps({**VALID, k: v}), st.sampled_from(list(VALID)), junk_values),
)


def _is_valid(text: str) -> bool:
    try:
        Codec("from_agent").decode_text(text)
    except ProtocolError:
        return False
    return True


@given(junk_messages)
@settings(max_examples=300, deadline=None)
def test_the_codec_refuses_junk_with_a_named_code(text: str) -> None:
    try:
        message = Codec("from_agent").decode_text(text)
    except ProtocolError as exc:
        assert exc.code in {"bad_json", "schema", "unknown_type", "too_large"}
        # The error itself is a valid message, and names no value of the refused one.
        validate("to_agent", {**exc.message(), "seq": 1, "ack": 0})
        return
    validate("from_agent", message)


def test_an_oversized_frame_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(ProtocolError) as caught:
        Codec("from_agent").decode_text(json.dumps({**VALID, "x": "a" * 70_000}))
    assert caught.value.code == "too_large"


def test_a_schema_error_names_the_field_never_the_value() -> None:
    with pytest.raises(SchemaError) as caught:
        validate(
            "to_agent",
            {
                "type": "session.resume",
                "seq": 0,
                "ack": 0,
                "session_id": "s1",
                "resume_token": "short-secret",
            },
        )
    assert "resume_token" in caught.value.detail and "short-secret" not in caught.value.detail


@given(st.binary(max_size=300))
def test_binary_frames_decode_or_are_refused(data: bytes) -> None:
    try:
        chunk = Codec("from_agent").decode_agent_audio(data)
    except ProtocolError as exc:
        assert exc.code in {"bad_frame", "too_large"}
        return
    assert encode_agent_audio(chunk.response_id, chunk.samples) == data


@given(st.text("ab1.-", min_size=1, max_size=64), st.lists(st.integers(-32768, 32767)))
def test_agent_audio_round_trips(response_id: str, samples: list[int]) -> None:
    pcm = np.array(samples, dtype=np.int16)
    chunk = Codec("from_agent").decode_agent_audio(encode_agent_audio(response_id, pcm))
    assert chunk.response_id == response_id and np.array_equal(chunk.samples, pcm)


# --- seq, ack and replay -------------------------------------------------------------------------


@given(st.lists(st.one_of(st.just("send"), st.just("link"), st.integers(0, 40)), max_size=60))
def test_replay_is_exactly_what_the_peer_has_not_acked_in_order(steps: list[Any]) -> None:
    outbox, acked = Outbox(bound=100), 0
    for item in steps:
        if item == "send":
            outbox.stamp({"type": "dtmf", "digit": "1"}, 0)
        elif item == "link":
            message = outbox.stamp({"type": "ping", "id": 1}, 0)
            assert message["seq"] == outbox.seq  # link messages do not advance seq
        elif item <= outbox.seq:
            acked = max(acked, item)
            outbox.acked(item)
    replay = outbox.replay(acked, current_ack=7)
    assert [m["seq"] for m in replay] == list(range(acked + 1, outbox.seq + 1))
    assert all(m["ack"] == 7 for m in replay)


def test_the_replay_buffer_is_bounded_and_overflow_is_never_silent() -> None:
    outbox = Outbox(bound=3)
    for _ in range(3):
        outbox.stamp({"type": "output.stop"}, 0)
    with pytest.raises(ReplayOverflow):
        outbox.stamp({"type": "output.stop"}, 0)
    outbox.acked(2)
    outbox.stamp({"type": "output.stop"}, 0)  # room again once acked


def test_the_inbox_takes_in_order_skips_duplicates_and_refuses_gaps() -> None:
    inbox = Inbox()
    assert inbox.take({"type": "mark", "seq": 1})
    assert not inbox.take({"type": "mark", "seq": 1})  # a replayed duplicate
    assert not inbox.take({"type": "ping", "seq": 9})  # link messages order nothing
    with pytest.raises(ProtocolError) as caught:
        inbox.take({"type": "mark", "seq": 3})
    assert (caught.value.code, caught.value.fatal, inbox.seq) == ("seq_gap", True, 1)


# --- bad input changes nothing and is counted ----------------------------------------------------


class Owner:
    def __init__(self) -> None:
        self.messages: list[Mapping[str, Any]] = []
        self.events: list[str] = []

    def on_message(self, message: Mapping[str, Any]) -> None:
        self.messages.append(message)

    def on_chunk(self, data: bytes) -> None:
        raise ProtocolError("unknown_response", "no such response")

    def check_accept(self, message: Mapping[str, Any]) -> None:
        pass

    def link_up(self, resumed: bool) -> None:
        self.events.append(f"up {resumed}")

    def buffered_ms(self) -> int:
        return 120

    def link_down(self) -> None:
        self.events.append("down")

    def link_gone(self, reason: str) -> None:
        self.events.append(f"gone {reason}")

    def restart_message(self) -> dict[str, Any]:
        self.events.append("restart")
        return {"type": "session.start", "resumed": True}

    def resume_fields(self) -> dict[str, Any]:
        return {"last_heard": None}


def _open_link(limit: int = 1000) -> tuple[Link, Owner, Metrics]:
    owner, metrics = Owner(), Metrics()
    link = Link(
        LinkConfig("ws://agent.test/a", "s" * 16, max_protocol_errors=limit),
        "sid1",
        owner,
        metrics,
        now=lambda: 0.0,
    )
    link._handshaken = True
    return link, owner, metrics


def _errors(metrics: Metrics) -> float:
    return sum(
        s.value
        for f in metrics.registry.collect()
        if f.name == "voicegate_agent_protocol_errors"
        for s in f.samples
        if s.name.endswith("_total")
    )


@given(st.lists(junk_messages, min_size=1, max_size=8))
@settings(max_examples=150, deadline=None)
def test_bad_messages_change_nothing_and_are_counted(texts: list[str]) -> None:
    for text in texts:
        assume(not _is_valid(text))
    link, owner, metrics = _open_link()
    link.flood.limit = 10**9  # these tests are not about floods
    for text in texts:
        link._on_text(text)
    assert owner.messages == [] and owner.events == []
    assert link.inbox.seq == 0
    assert _errors(metrics) == len(texts)
    errors = link.outbox.replay(0, 0)
    assert [m["type"] for m in errors] == ["error"] * len(texts)
    for message in errors:
        validate("to_agent", message)


def test_a_ping_is_answered_with_the_buffered_milliseconds() -> None:
    link, owner, _ = _open_link()
    wire: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    link._queue = wire
    link._on_text(json.dumps({"type": "ping", "seq": 0, "ack": 0, "id": 7}))
    kind, text = wire.get_nowait()
    assert kind == "text"
    pong = json.loads(text)
    assert pong == {"type": "pong", "id": 7, "buffered_ms": 120, "seq": 0, "ack": 0}
    validate("to_agent", pong)
    assert link.outbox.unacked == 0 and owner.messages == []  # a link message is not kept


def test_past_the_error_budget_the_link_is_closed_and_given_up() -> None:
    link, _, _ = _open_link(limit=3)
    for _ in range(3):
        link._on_text("not json")
    assert link._give_up_reason == "3 protocol errors"
    last = link.outbox.replay(0, 0)[-1]
    assert (last["code"], last["fatal"]) == ("bad_json", True)


def test_a_flood_is_refused_past_its_rate() -> None:
    link, owner, _ = _open_link()
    for seq in range(1, 206):
        link._on_text(
            json.dumps({"type": "mark", "seq": seq, "ack": 0, "response_id": "a", "mark_id": "m"})
        )
    assert len(owner.messages) == 200
    # Five refused and counted; answered once (an answer each would draw an ack each: more flood).
    assert [m["code"] for m in link.outbox.replay(0, 0) if m["type"] == "error"] == ["flood"]
    assert link.metrics.agent_protocol_errors.labels("flood")._value.get() == 5
    assert link.budget.count == 5


# --- the token -----------------------------------------------------------------------------------


def test_a_token_verifies_only_for_its_secret_audience_and_lifetime() -> None:
    token = auth.make_token("k" * 20, "sid1", "ws://a/agent", now=1000.0)
    assert auth.verify_token("k" * 20, token, "ws://a/agent", now=1030.0)["sid"] == "sid1"
    refusals = [
        ("x" * 20, token, "ws://a/agent", 1030.0, "bad signature"),
        ("k" * 20, token, "ws://b/agent", 1030.0, "issued for another agent"),
        ("k" * 20, token, "ws://a/agent", 1061.0, "expired"),
        ("k" * 20, token[:-2] + "AA", "ws://a/agent", 1030.0, "bad signature"),
        ("k" * 20, "garbage", "ws://a/agent", 1030.0, "not a v1 token"),
    ]
    for secret, tok, audience, now, why in refusals:
        with pytest.raises(auth.TokenError, match=why):
            auth.verify_token(secret, tok, audience, now)


# --- the adapter ---------------------------------------------------------------------------------


class Handle:
    def __init__(self, rid: str) -> None:
        self.id, self.ended, self.played = rid, None, 0

    @property
    def alive(self) -> bool:
        return self.ended is None

    def play(self, samples: Any) -> bool:
        if self.alive:
            self.played += 1
        return self.alive

    def play_prompt(self, name: str) -> bool:
        return self.alive

    def mark(self, mark_id: str) -> bool:
        return self.alive

    def done(self) -> None:
        self.ended = self.ended or "done"

    def cancel(self) -> None:
        self.ended = self.ended or "canceled"


class Call:
    rate = 8000
    queued_ms = 0

    def __init__(self) -> None:
        self.handles: list[Handle] = []
        self.tools: list[tuple[str, str | None]] = []
        self.hangups: list[str] = []
        self.transfers: list[str | None] = []
        self.consult: list[tuple[str, str, str]] = []
        self.consulting = True

    def respond(self) -> Handle:
        self.handles.append(Handle(f"r{len(self.handles) + 1}"))
        return self.handles[-1]

    def hangup(self, reason: str, *, after_playout: bool = True) -> None:
        self.hangups.append(reason)

    def request_tool(
        self, tool: str, arguments: Mapping[str, Any], *, key: str | None = None
    ) -> str:
        self.tools.append((tool, key))
        return key or ""

    def call_soon(self, work: Any) -> None:
        work()

    def link_lost(self) -> None: ...

    def link_restored(self) -> None: ...

    def link_failed(self, reason: str) -> None: ...

    def transfer(
        self, target: str | None = None, *, mode: str | None = None, complete: str | None = None
    ) -> str | None:
        self.transfers.append(target)
        return None if target and target.endswith("@example.com") else "target is not allowed"

    def consult_say(
        self, text: str | None = None, *, prompt: str | None = None, say_id: str = ""
    ) -> str | None:
        self.consult.append(("say", text or prompt or "", say_id))
        return None if self.consulting else "no attended transfer is consulting"

    def consult_complete(self) -> str | None:
        self.consult.append(("complete", "", ""))
        return None if self.consulting else "no attended transfer is consulting"

    def consult_cancel(self) -> str | None:
        self.consult.append(("cancel", "", ""))
        return None if self.consulting else "no attended transfer is consulting"


def _agent() -> tuple[RemoteAgent, Call]:
    call = Call()
    settings = remote_settings("ws://agent.test/a", "s" * 16, 3.0, 5.0, 1000, 8000, 10.0)
    context = CallContext("sid1", "service", "***123", "PCMA", 8000)
    return RemoteAgent(context, call, settings, Metrics()), call


def _msg(agent: RemoteAgent, body: dict[str, Any]) -> None:
    agent.link.inbox.seq += 1
    agent.handle_message({**body, "seq": agent.link.inbox.seq, "ack": 0})


_ACCEPT = {
    "type": "session.accept",
    "seq": 1,
    "ack": 1,
    "version": 1,
    "audio": {"encoding": "pcm16", "rate": 8000, "frame_ms": 20, "frame_bytes": 320},
    "features": ["marks", "false_interruptions"],
    "resume_token": "t" * 32,
}


def _drive(agent: RemoteAgent, call: Call) -> list[dict[str, Any]]:
    async def run() -> None:
        async def no_dial() -> None: ...

        agent.link.run = no_dial  # type: ignore[method-assign]
        await agent.on_start()
        agent.check_accept(_ACCEPT)
        await agent.on_dtmf("5")
        await agent.on_speech_started()
        await agent.on_speech_turn(800)
        _msg(agent, {"type": "response.start", "response_id": "a1"})
        _msg(agent, {"type": "mark", "response_id": "a1", "mark_id": "m1"})
        call.handles[0].ended = "interrupted"
        await agent.on_playback_cut(PlaybackCut("r1", 1, 420, ("m1",), "barge_in"))
        await agent.on_mark(MarkOutcome("r1", "m1", "cleared"))
        await agent.on_false_interruption(420)
        _msg(agent, {"type": "response.start", "response_id": "a2"})
        await agent.on_playback_cut(PlaybackCut("r2", 2, 60, (), "agent_link"))
        await agent.on_gate(GateChange("frozen", "open", "agent_link"))
        _msg(agent, {"type": "transfer", "target": "sip:desk@example.com"})
        await agent.on_transfer(TransferUpdate("trying", 100))
        agent.consult_events = True  # session.accept listed the feature consult
        await agent.on_consultation(ConsultEvent("dtmf", digit="1"))
        await agent.on_stop()
        await agent.on_interrupted("agent_link")
        await agent.on_resumed("agent_link")
        _msg(agent, {"type": "tool.call", "call_id": "pay-1", "tool": "charge", "arguments": {}})
        await agent.on_tool_result(
            ToolResult("charge", call.tools[0][1] or "", "committed", {"id": "ch_1"})
        )
        await agent.on_end("caller hung up")

    asyncio.run(run())
    return agent.link.outbox.replay(0, 0)


def test_the_same_agent_call_id_never_executes_twice() -> None:
    agent, call = _agent()
    body = {"type": "tool.call", "call_id": "pay-1", "tool": "charge", "arguments": {"a": 1}}
    _msg(agent, body)
    _msg(agent, body)  # asked again (after a resume, say) while it runs
    assert len(call.tools) == 1
    pending = agent.link.outbox.replay(0, 0)[-1]
    assert (pending["outcome"], pending["duplicate"]) == ("pending", True)
    asyncio.run(agent.on_tool_result(ToolResult("charge", call.tools[0][1] or "", "committed")))
    _msg(agent, body)
    again = agent.link.outbox.replay(0, 0)[-1]
    assert (again["outcome"], again["duplicate"], len(call.tools)) == ("committed", True, 1)
    with pytest.raises(ProtocolError, match="another request"):
        _msg(agent, {**body, "arguments": {"a": 2}})


def test_chunks_for_unknown_or_dead_responses_are_dropped_and_counted() -> None:
    agent, call = _agent()
    pcm = np.zeros(160, dtype=np.int16)
    agent.on_chunk(encode_agent_audio("nope", pcm))
    (error,) = agent.link.outbox.replay(0, 0)
    assert (error["type"], error["code"], error["ref_seq"]) == ("error", "unknown_response", None)
    _msg(agent, {"type": "response.start", "response_id": "a1"})
    agent.on_chunk(encode_agent_audio("a1", pcm))
    call.handles[0].ended = "interrupted"  # the caller barged in
    agent.on_chunk(encode_agent_audio("a1", pcm))
    assert call.handles[0].played == 1
    dropped = agent.metrics.agent_chunks_dropped
    assert dropped.labels("dead_response")._value.get() == 1
    assert dropped.labels("unknown_response")._value.get() == 1


def test_every_cut_tells_what_was_heard_and_who_cut_it() -> None:
    agent, _call = _agent()
    _msg(agent, {"type": "response.start", "response_id": "a1"})
    _msg(agent, {"type": "response.start", "response_id": "a2"})

    async def cuts() -> None:
        await agent.on_playback_cut(PlaybackCut("r1", 3, 1160, ("m1", "m2"), "canceled"))
        await agent.on_playback_cut(PlaybackCut("r2", 4, 40, (), "media"))
        await agent.on_playback_cut(PlaybackCut("say1", 4, 40, (), "media"))  # not the agent's

    asyncio.run(cuts())
    sent = agent.link.outbox.replay(0, 0)
    assert [(m["type"], m["response_id"], m["generation"], m["heard_ms"]) for m in sent] == [
        ("playback.interrupted", "a1", 3, 1160),
        ("playback.cleared", "a2", 4, 40),
    ]
    assert sent[0]["marks_cleared"] == ["m1", "m2"] and sent[1]["reason"] == "media"
    for message in sent:
        validate("to_agent", message)
    # A resume tells the agent the last cut: where the caller is.
    assert agent.resume_fields() == {"last_heard": {"response_id": "a2", "heard_ms": 40}}


def test_a_transfer_asked_by_the_agent_goes_to_the_call_and_a_refusal_is_told() -> None:
    agent, call = _agent()
    _msg(agent, {"type": "transfer", "target": "sip:desk@example.com"})
    assert agent.link.outbox.replay(0, 0) == []  # under way: progress comes from the call
    _msg(agent, {"type": "transfer", "target": "sip:other@elsewhere.test", "mode": "blind"})
    (refused,) = agent.link.outbox.replay(0, 0)
    assert (refused["type"], refused["state"], refused["detail"]) == (
        "transfer.progress",
        "refused",
        "target is not allowed",
    )
    assert call.transfers == ["sip:desk@example.com", "sip:other@elsewhere.test"]
    for bad in ({"target": "desk"}, {"mode": "consult"}, {"target": "sip:a b@x"}):
        with pytest.raises(ProtocolError) as caught:
            Codec("from_agent").decode_text(
                json.dumps({**bad, "type": "transfer", "seq": 1, "ack": 0})
            )
        assert caught.value.code == "schema"


def test_the_consultation_messages_reach_the_call_and_a_refusal_is_told_not_counted() -> None:
    agent, call = _agent()
    _msg(agent, {"type": "consult.say", "text": "Refund for order 12.", "say_id": "why"})
    _msg(agent, {"type": "consult.say", "prompt": "consult_brief"})
    _msg(agent, {"type": "consult.complete"})
    assert agent.link.outbox.replay(0, 0) == []  # under way: the outcome comes as events
    call.consulting = False
    _msg(agent, {"type": "consult.cancel"})
    _msg(agent, {"type": "consult.say", "text": "Hello", "say_id": "late"})
    # Told in band, not raised as a protocol error (which would spend the error budget).
    refusals = agent.link.outbox.replay(0, 0)
    assert [(m["type"], m["kind"], m.get("say_id")) for m in refusals] == [
        ("consult.event", "refused", None),
        ("consult.event", "refused", "late"),
    ]
    assert refusals[0]["detail"] == "no attended transfer is consulting"
    assert call.consult == [
        ("say", "Refund for order 12.", "why"),
        ("say", "consult_brief", ""),
        ("complete", "", ""),
        ("cancel", "", ""),
        ("say", "Hello", "late"),
    ]
    # Both or neither of text and prompt, an empty text, a bad prompt name: schema errors.
    for bad in ({}, {"text": "a", "prompt": "b"}, {"text": ""}, {"prompt": "../x"}):
        with pytest.raises(ProtocolError) as caught:
            Codec("from_agent").decode_text(
                json.dumps({**bad, "type": "consult.say", "seq": 1, "ack": 0})
            )
        assert caught.value.code == "schema"


def test_consult_events_go_only_to_an_agent_that_accepted_the_feature() -> None:
    agent, _call = _agent()

    async def tell() -> None:
        await agent.on_consultation(ConsultEvent("answered"))
        agent.consult_events = True
        await agent.on_consultation(ConsultEvent("said", say_id="why", outcome="played"))

    asyncio.run(tell())
    (said,) = agent.link.outbox.replay(0, 0)
    assert {k: said[k] for k in ("type", "kind", "say_id", "outcome")} == {
        "type": "consult.event",
        "kind": "said",
        "say_id": "why",
        "outcome": "played",
    }
    validate("to_agent", said)


def test_a_refused_resume_starts_the_session_again_once_then_gives_up() -> None:
    link, owner, metrics = _open_link()
    link.outbox.stamp({"type": "dtmf", "digit": "5"}, 0)  # un-acked from the old session
    link.inbox.seq = 7
    link._handshaken, link._pending, link._resume_token = False, asyncio.Queue(), "t" * 20
    refused = {"type": "error", "seq": 0, "ack": 0, "code": "resume_refused", "fatal": True}
    refused |= {"ref_seq": None, "detail": "unknown session"}
    link._on_text(json.dumps(refused))  # seq 0: a restarted agent numbers afresh; still read
    assert owner.events == ["restart"] and link._give_up_reason is None
    # The next socket opens a new session: session.start as seq 1, nothing of the old one.
    assert [(m["type"], m["seq"]) for m in link.outbox.replay(0, 0)] == [("session.start", 1)]
    assert link.inbox.seq == 0 and link._resume_token is None
    resumes = metrics.agent_link_resumes
    assert (resumes.labels("refused")._value.get(), resumes.labels("restarted")._value.get()) == (
        1,
        1,
    )
    link._pending = asyncio.Queue()  # and if the agent refuses again, the call ends
    link._on_text(json.dumps(refused))
    assert link._give_up_reason == "the agent refused the resume"


def test_a_restarted_session_forgets_the_old_ids_and_tells_what_was_heard() -> None:
    agent, call = _agent()
    _msg(agent, {"type": "response.start", "response_id": "a1"})
    asyncio.run(agent.on_playback_cut(PlaybackCut("r1", 2, 640, (), "agent_link")))
    body = {"type": "tool.call", "call_id": "pay-1", "tool": "charge", "arguments": {}}
    _msg(agent, body)
    start = agent.restart_message()
    validate("to_agent", {**start, "seq": 1, "ack": 0})
    assert (start["resumed"], start["last_heard"]) == (True, {"response_id": "a1", "heard_ms": 640})
    agent.link.inbox.seq = 0
    _msg(agent, {"type": "response.start", "response_id": "a1"})  # the new session's a1
    _msg(agent, body)  # the new session's pay-1: a new request, with a new key
    assert len(call.handles) == 2 and len(call.tools) == 2
    assert call.tools[0][1] != call.tools[1][1]


def test_a_rejoined_agent_sessions_tool_calls_never_take_the_keys_of_the_calls_before() -> None:
    # The rejoined call keeps the session's id and a new agent session numbers its calls from
    # pay-1 again: the same key would answer a new payment with the old one's receipt (or be
    # refused as a conflicting intent). Nor may it meet a restart's key (epoch 1) of before.
    from agents.remote.tool_calls import ToolCalls

    call = {"call_id": "pay-1", "tool": "pay", "arguments": {"amount_cents": 5}, "seq": 3}
    before, restarted, rejoined, again = (ToolCalls("s-1") for _ in range(4))
    restarted.restart()
    rejoined.rejoined()
    again.rejoined()
    keys = {t.new_key(call) for t in (before, restarted, rejoined, again)}
    assert len(keys) == 4
    rejoined.restart()
    assert rejoined.new_key(call) not in keys


def test_a_false_interruption_reaches_only_an_agent_that_asked_for_it() -> None:
    def told(features: list[str]) -> list[dict[str, Any]]:
        agent, call = _agent()

        async def run() -> None:
            agent.check_accept({**_ACCEPT, "features": features})
            _msg(agent, {"type": "response.start", "response_id": "a1"})
            await agent.on_playback_cut(PlaybackCut(call.handles[0].id, 1, 420, (), "barge_in"))
            await agent.on_false_interruption(420)
            # Judged once: a second report without a new barge-in has no response to name.
            await agent.on_false_interruption(420)

        asyncio.run(run())
        return [
            m
            for m in agent.link.outbox.replay(0, 0)
            if m["type"] == "playback.false_interruption"
        ]

    (message,) = told(["marks", "false_interruptions"])
    assert (message["response_id"], message["heard_ms"]) == ("a1", 420)
    validate("to_agent", message)
    assert told(["marks"]) == []
