"""An example remote agent: an aiohttp WebSocket server speaking docs/agent-protocol.md.

Written from the document alone (it imports nothing of voicegate): it checks the bearer token,
answers session.start, speaks prompts (agents/prompts/*.wav) and a synthesized tone, reacts to
DTMF, calls the ``charge`` tool, and resumes after a dropped socket (replaying what voicegate has
not acked, asking again for a tool result it never got: voicegate answers with the original
outcome, never a second charge). After a false interruption (the caller's noise cut a response
and no turn followed) it says the cut response again from a little before where it was cut.

Keys: 1 pays 5.00 through the charge tool, 5 plays an 8 s tone, 9 says goodbye and hangs up, 0
asks voicegate to transfer the caller (to transfer.default_target), any other key is read back.
An attended transfer's person hears why (``consult.say``) once ``consult.event{answered}`` comes.
``POST /admin/drop`` closes every live socket (try a resume by hand); ``?keep_streaming=1`` also
keeps streaming the cut response after the resume, to show that voicegate drops it;
``?after_tool_call=1`` drops the link right after the next ``tool.call`` is sent; ``?down_s=4``
refuses new sockets for 4 s (hear voicegate's "reconnecting" line and hold audio).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import secrets
import ssl
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile
from aiohttp import WSMsgType, web

log = logging.getLogger("example_agent")
PROMPTS = Path(__file__).resolve().parents[2] / "agents" / "prompts"
CHUNK_MS = 20
LEAD_MS = 200  # stream at most this far ahead of real time (voicegate refuses past its maximum)
# What the call is doing: logged whole (they hold no digit); other messages by type only.
SHOWN = (
    "gate",
    "playback.cleared",
    "playback.interrupted",
    "playback.false_interruption",
    "transfer.progress",
    "consult.event",
    "tool.result",
)
BACK_MS = 500  # after a false interruption, pick up this far before the cut


def verify(secret: str, token: str, audience: str) -> str | None:
    """The session id of a valid bearer token for ``audience``, else None."""
    try:
        prefix, body, mac = token.split(".")
        good = hmac.new(secret.encode(), f"{prefix}.{body}".encode(), hashlib.sha256).digest()
        if prefix != "v1" or not hmac.compare_digest(
            base64.urlsafe_b64decode(mac + "=" * (-len(mac) % 4)), good
        ):
            return None
        claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except ValueError:
        return None
    if claims.get("exp", 0) < time.time() or claims.get("aud") != audience:
        return None
    return str(claims["sid"])


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()  # the token itself is never stored


@dataclass
class Session:
    sid: str
    rate: int = 8000
    seq: int = 0  # last sequenced seq we sent
    received: int = 0  # last voicegate seq we took
    unacked: list[dict[str, Any]] = field(default_factory=list)
    resume_digest: str = ""
    ws: web.WebSocketResponse | None = None
    responses: int = 0
    stream: asyncio.Task[None] | None = None
    tools: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # call_id -> result
    keep_streaming: bool = False
    said: dict[str, np.ndarray] = field(default_factory=dict)  # response id -> its audio
    linked: asyncio.Event = field(default_factory=asyncio.Event)  # a live socket is attached

    async def send(self, body: dict[str, Any], link: bool = False) -> None:
        if not link:
            self.seq += 1
        message = {**body, "seq": self.seq, "ack": self.received}
        if not link:
            self.unacked.append(message)
        if self.ws is not None and not self.ws.closed:
            await self.ws.send_str(json.dumps(message))

    async def chunk(self, rid: str, pcm: np.ndarray) -> None:
        if self.ws is not None and not self.ws.closed:
            head = struct.pack("!BBH", 2, 1, len(rid)) + rid.encode()
            await self.ws.send_bytes(head + pcm.astype("<i2").tobytes())

    def prompt(self, name: str) -> np.ndarray:
        audio, rate = soundfile.read(PROMPTS / f"{name}.wav", dtype="int16")
        n = int(len(audio) * self.rate / rate)
        at = np.linspace(0, len(audio) - 1, n)
        return np.asarray(np.interp(at, np.arange(len(audio)), audio), dtype=np.int16)

    def tone(self, seconds: float, hz: float = 1000.0) -> np.ndarray:
        t = np.arange(int(seconds * self.rate)) / self.rate
        return (8000 * np.sin(2 * np.pi * hz * t)).astype(np.int16)

    def stop(self) -> None:
        if self.stream is not None and not self.keep_streaming:
            self.stream.cancel()

    def say(self, *audio: np.ndarray, mark: str | None = None, then_hangup: str = "") -> None:
        """Start a response streamed in real time; the one before it stops streaming."""
        self.stop()
        self.responses += 1
        rid, pcm = f"a{self.responses}", np.concatenate(audio)
        self.said = {rid: pcm}  # only the latest can be picked up again
        self.stream = asyncio.create_task(self._stream(rid, pcm, mark, then_hangup))

    async def _stream(self, rid: str, pcm: np.ndarray, mark: str | None, then: str) -> None:
        await self.send({"type": "response.start", "response_id": rid})
        step, start = self.rate * CHUNK_MS // 1000, time.monotonic()
        for i, at in enumerate(range(0, len(pcm), step)):
            await self.linked.wait()  # while the link is down, wait for the resume
            ahead = i * CHUNK_MS - (time.monotonic() - start) * 1000
            if ahead > LEAD_MS:
                await asyncio.sleep((ahead - LEAD_MS) / 1000)
            await self.chunk(rid, pcm[at : at + step])
            if i and i % 50 == 0:
                log.info("%s: %d ms sent", rid, i * CHUNK_MS)
        if mark:
            await self.send({"type": "mark", "response_id": rid, "mark_id": mark})
        await self.send({"type": "response.done", "response_id": rid})
        if then:
            await self.send({"type": "hangup", "reason": then, "after_playout": True})


class Agent:
    def __init__(self, secret: str, audience: str) -> None:
        self.secret, self.audience = secret, audience
        self.sessions: dict[str, Session] = {}
        self.down_until = 0.0  # /admin/drop?down_s=N: refuse sockets (503) until then
        # /admin/drop?after_tool_call=1: the next tool.call is sent, then the socket drops at
        # once (and stays down for down_s): a link lost right after a tool call.
        self.drop_after_tool_call: float | None = None

    async def socket(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        sid = verify(self.secret, auth.removeprefix("Bearer "), self.audience)
        if sid is None:
            return web.Response(status=401, text="bad token\n")
        if time.monotonic() < self.down_until:
            return web.Response(status=503, text="down for a while (/admin/drop?down_s)\n")
        ws = web.WebSocketResponse(protocols=("voicegate.agent.v1",), max_msg_size=1 << 17)
        await ws.prepare(request)
        session: Session | None = None
        async for frame in ws:
            if frame.type is not WSMsgType.TEXT:
                continue  # caller audio: this example does no speech recognition
            message = json.loads(frame.data)
            if session is None:
                session = await self.hello(ws, sid, message)
                if session is None:
                    break
                continue
            await self.handle(session, message)
        if session is not None and session.ws is ws:
            session.ws = None
            session.linked.clear()
        return ws

    async def hello(self, ws: web.WebSocketResponse, sid: str, m: dict[str, Any]) -> Session | None:
        token = secrets.token_urlsafe(32)
        if m["type"] == "session.start" and m["session_id"] == sid and sid not in self.sessions:
            s = self.sessions[sid] = Session(sid, rate=m["audio"]["rates"][0], ws=ws)
            s.received, s.resume_digest = m["seq"], digest(token)
            s.linked.set()
            fb = s.rate // 50 * 2
            audio = {"encoding": "pcm16", "rate": s.rate, "frame_ms": 20, "frame_bytes": fb}
            await s.send(
                {
                    "type": "session.accept",
                    "version": 1,
                    "audio": audio,
                    "features": ["marks", "tools", "resume", "consult", "false_interruptions"],
                    "resume_token": token,
                }
            )
            if m["resumed"]:  # we restarted and lost the call: pick it up, don't greet again
                said = {"last_heard": m["last_heard"]}
                if "rejoined" in m:  # a caller sent back to this session (a new call)
                    said["rejoined"] = m["rejoined"]
                log.info("session.start %s", json.dumps(said))
            s.say(s.prompt("sorry_lost_you" if m["resumed"] else "greeting"), mark="greeting")
            return s
        known = self.sessions.get(sid)
        if (
            m["type"] == "session.resume"
            and known is not None
            and hmac.compare_digest(digest(m.get("resume_token", "")), known.resume_digest)
        ):
            s = known
            if s.ws is not None and not s.ws.closed:
                await s.ws.close()  # one live socket per session: the resumed one
            s.ws, s.resume_digest = ws, digest(token)  # rotated: the old token is dead
            s.linked.set()
            await s.send({"type": "session.resumed", "resume_token": token}, link=True)
            s.unacked = [u for u in s.unacked if u["seq"] > m["ack"]]
            for u in s.unacked:  # replay what voicegate has not acked, same seq
                await ws.send_str(json.dumps({**u, "ack": s.received}))
            for call_id, result in s.tools.items():
                if result is None:  # reclaim, don't resend: voicegate answers the original
                    await self.pay(s, call_id)
            return s
        code = "resume_refused" if m["type"] == "session.resume" else "handshake"
        error = {"type": "error", "seq": 0, "ack": 0, "fatal": True, "code": code, "ref_seq": None}
        await ws.send_str(json.dumps({**error, "detail": "unknown session or token"}))
        return None

    async def pay(self, s: Session, call_id: str) -> None:
        args = {"amount_cents": 500, "currency": "EUR", "account": f"example-{s.sid[:8]}"}
        await s.send({"type": "tool.call", "call_id": call_id, "tool": "charge", "arguments": args})
        if self.drop_after_tool_call is not None and s.ws is not None:
            self.down_until = time.monotonic() + self.drop_after_tool_call
            self.drop_after_tool_call = None
            log.info("admin.drop_after_tool_call %s", call_id)
            await s.ws.close()

    async def handle(self, s: Session, m: dict[str, Any]) -> None:
        s.unacked = [u for u in s.unacked if u["seq"] > m["ack"]]
        kind, sent = m["type"], s.seq
        log.info("%s %s", kind, json.dumps(m) if kind in SHOWN else f"seq={m['seq']}")
        if kind in ("ping", "pong", "ack", "session.resume"):
            if kind == "ping":
                await s.send({"type": "pong", "id": m["id"]}, link=True)
            return
        if m["seq"] <= s.received:
            return  # a replay of something we already took
        s.received = m["seq"]
        if kind == "dtmf":
            await self.key(s, m["digit"])
        elif kind == "tool.result" and s.tools.get(m["call_id"]) is None:
            if m["outcome"] != "pending":
                s.tools[m["call_id"]] = m
                outcome = m["outcome"] if m["outcome"] != "refused" else "unavailable"
                s.say(s.prompt(f"payment_{outcome}"))
        elif kind == "playback.interrupted" and m["response_id"] == f"a{s.responses}":
            s.stop()  # (a key press may already have started the next response)
        elif kind == "playback.false_interruption" and m["response_id"] in s.said:
            # Nobody spoke to us: say the rest, from a little before the cut.
            at = max(0, m["heard_ms"] - BACK_MS) * s.rate // 1000
            s.say(s.said[m["response_id"]][at:])
        elif kind == "media.lost":
            s.stop()
        elif kind == "media.restored" and "agent_link" not in m["interruptions"]:
            s.say(s.prompt("sorry_lost_you"))
        elif kind == "consult.event" and m["kind"] == "answered":  # said on the consult leg only
            await s.send({"type": "consult.say", "text": "The caller pressed 0 for a person."})
        elif kind == "session.end":
            self.sessions.pop(s.sid, None)
        if s.seq == sent:
            await s.send({"type": "ack"}, link=True)

    async def key(self, s: Session, digit: str) -> None:
        if digit == "1":
            call_id = f"pay-{len(s.tools) + 1}"
            s.tools[call_id] = None
            await self.pay(s, call_id)
            s.say(s.prompt("payment_processing"))
        elif digit == "5":
            s.say(s.tone(8.0), mark="tone")
        elif digit == "9":
            s.say(s.prompt("goodbye"), then_hangup="caller pressed 9")
        elif digit == "0":
            await s.send({"type": "transfer"})
        else:
            name = {"*": "star", "#": "hash"}.get(digit, digit)
            s.say(s.prompt(f"digit_{name}"))

    async def drop(self, request: web.Request) -> web.Response:
        keep = request.query.get("keep_streaming") == "1"
        down_s = float(request.query.get("down_s", "0"))
        if request.query.get("after_tool_call") == "1":
            self.drop_after_tool_call = down_s
            return web.json_response({"dropped": 0, "armed": True})
        self.down_until = time.monotonic() + down_s
        dropped = 0
        for s in self.sessions.values():
            s.keep_streaming = keep
            if s.ws is not None and not s.ws.closed:
                await s.ws.close()
                dropped += 1
        return web.json_response({"dropped": dropped})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--cert", help="PEM certificate chain (with --key): serve wss://")
    parser.add_argument("--key", help="PEM private key of --cert")
    args = parser.parse_args()
    tls = None
    if args.cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.cert, args.key)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    secret = os.environ["REMOTE_AGENT_SECRET"]  # the same value as voicegate's agent.secret
    scheme = "wss" if tls else "ws"
    audience = os.environ.get("REMOTE_AGENT_URL", f"{scheme}://{args.host}:{args.port}/agent")
    agent = Agent(secret, audience)
    app = web.Application()
    app.add_routes([web.get("/agent", agent.socket), web.post("/admin/drop", agent.drop)])
    print(f"listening on {args.host}:{args.port}", flush=True)
    web.run_app(app, host=args.host, port=args.port, print=None, ssl_context=tls)


if __name__ == "__main__":
    main()
