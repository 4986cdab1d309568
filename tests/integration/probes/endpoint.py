"""The quiet, single-threaded pjsua2 endpoint each probe starts (the way voicegate's SIP thread
runs it: no PJSIP worker threads, the null sound device as the media clock)."""

from __future__ import annotations

import pjsua2 as pj


def start_endpoint(
    *, rate: int = 16000, snd_auto_close_s: int = 1, udp_port: int | None = None
) -> pj.Endpoint:
    ep = pj.Endpoint()
    ep.libCreate()
    cfg = pj.EpConfig()
    cfg.uaConfig.threadCnt = 0
    cfg.uaConfig.mainThreadOnly = True
    cfg.logConfig.level = 0
    cfg.logConfig.consoleLevel = 0
    cfg.medConfig.clockRate = rate
    cfg.medConfig.sndClockRate = rate
    cfg.medConfig.sndAutoCloseTime = snd_auto_close_s  # -1: never close the idle device
    ep.libInit(cfg)
    ep.audDevManager().setNullDev()
    if udp_port is not None:
        transport = pj.TransportConfig()
        transport.port = udp_port
        transport.boundAddress = "127.0.0.1"
        ep.transportCreate(pj.PJSIP_TRANSPORT_UDP, transport)
    ep.libStart()
    return ep
