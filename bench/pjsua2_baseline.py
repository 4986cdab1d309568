"""A C-only pjsua2 callee: the baseline that bench/capacity.py compares voicegate's CPU with.

Same wheel, same settings as a voicegate worker (null sound device as the 20 ms clock, the same
bridge rate, no VAD, 20 ms ptime, same codecs), but no Python on the frame path: each answered call
gets a looping WAV player (PJSIP's own port) as its outbound audio, and its inbound audio goes to
the null playback device, so the conference bridge decodes, mixes and encodes it all in C. Python
only answers calls. Run one per 4 calls:

    python bench/pjsua2_baseline.py --port 5200 --rtp 40000-40199 --wav agents/prompts/greeting.wav

The WAV should be at the bridge's rate (``--clock-rate``), or the player adds a resampler that a
worker does not have.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

import pjsua2 as pj


class Call(pj.Call):  # type: ignore[misc]
    def __init__(self, app: Baseline, account: pj.Account, call_id: int) -> None:
        super().__init__(account, call_id)
        self.app = app
        self.player: pj.AudioMediaPlayer | None = None

    def onCallState(self, prm: Any) -> None:
        if self.getInfo().state == pj.PJSIP_INV_STATE_DISCONNECTED:
            self.app.ended.append(self)

    def onCallMediaState(self, prm: Any) -> None:
        info = self.getInfo()
        for index, media in enumerate(info.media):
            if media.type == pj.PJMEDIA_TYPE_AUDIO and media.status == pj.PJSUA_CALL_MEDIA_ACTIVE:
                audio = self.getAudioMedia(index)
                if self.player is None:
                    self.player = pj.AudioMediaPlayer()
                    self.player.createPlayer(self.app.wav, 0)  # 0: loop
                    self.player.startTransmit(audio)
                audio.startTransmit(self.app.ep.audDevManager().getPlaybackDevMedia())


class Account(pj.Account):  # type: ignore[misc]
    def __init__(self, app: Baseline) -> None:
        super().__init__()
        self.app = app

    def onIncomingCall(self, prm: Any) -> None:
        call = Call(self.app, self, prm.callId)
        self.app.calls.append(call)
        answer = pj.CallOpParam()
        answer.statusCode = 200
        call.answer(answer)


class Baseline:
    def __init__(
        self, port: int, rtp: tuple[int, int], wav: str, *, quality: int, clock_rate: int
    ) -> None:
        self.wav = wav
        self.calls: list[Call] = []
        self.ended: list[Call] = []
        self.ep = ep = pj.Endpoint()
        ep.libCreate()
        cfg = pj.EpConfig()
        cfg.uaConfig.threadCnt = 0
        cfg.uaConfig.mainThreadOnly = True
        cfg.uaConfig.maxCalls = 4
        cfg.logConfig.level = 0
        cfg.logConfig.consoleLevel = 0
        cfg.medConfig.clockRate = clock_rate
        cfg.medConfig.sndClockRate = clock_rate
        cfg.medConfig.noVad = True
        cfg.medConfig.quality = quality
        cfg.medConfig.ptime = 20
        cfg.medConfig.audioFramePtime = 20
        ep.libInit(cfg)
        ep.audDevManager().setNullDev()
        transport = pj.TransportConfig()
        transport.port = port
        transport.boundAddress = "127.0.0.1"
        ep.transportCreate(pj.PJSIP_TRANSPORT_UDP, transport)
        ep.libStart()
        account_cfg = pj.AccountConfig()
        account_cfg.idUri = f"sip:baseline@127.0.0.1:{port}"
        media = account_cfg.mediaConfig.transportConfig
        media.boundAddress = "127.0.0.1"
        media.port = rtp[0]
        media.portRange = rtp[1] - rtp[0]
        self.account = Account(self)
        self.account.create(account_cfg, True)

    def run(self) -> None:
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        signal.signal(signal.SIGINT, lambda *_: stop.append(1))
        print("baseline ready", flush=True)
        while not stop:
            self.ep.libHandleEvents(20)
            # Drop wrappers of ended calls here, outside their callbacks (notes/pjsua2.md).
            while self.ended:
                call = self.ended.pop()
                if call in self.calls:
                    self.calls.remove(call)
        self.ep.hangupAllCalls()
        for _ in range(50):
            self.ep.libHandleEvents(20)
        self.calls.clear()
        self.ep.libDestroy()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rtp", required=True, help="LOW-HIGH")
    parser.add_argument("--wav", required=True)
    parser.add_argument("--quality", type=int, default=8, help="media.resample_quality")
    parser.add_argument("--clock-rate", type=int, default=16000, help="media.clock_rate")
    args = parser.parse_args()
    low, high = (int(x) for x in args.rtp.split("-"))
    Baseline(
        args.port, (low, high), args.wav, quality=args.quality, clock_rate=args.clock_rate
    ).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
