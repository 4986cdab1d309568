"""A call's RTP accepted only from the caller: a kernel socket filter on PJMEDIA's sockets.

PJMEDIA sends a call's audio wherever RTP last came from, once a new source has sent a few
packets in a row (symmetric RTP, for callers behind NAT; ``PJMEDIA_RTP_NAT_PROBATION_CNT``), and
pjsua2 2.15.1 has no run-time switch for it: anyone who guesses a live call's RTP port can take
its audio ("RTP Bleed", docs/security.md). So the packets never reach PJMEDIA: once the call's
first RTP has come (after answer, and again after each re-INVITE), a classic BPF program on its
RTP socket accepts only that source's address and port, and one on its RTCP socket only that
address with the caller's RTCP port (the one its RTCP came from by then, else the RTP port + 1,
RFC 3550's convention; behind a NAT that maps it elsewhere the caller's RTCP is dropped too,
which costs nothing the call uses). The kernel drops the rest before any user space sees it,
and counts the drops per socket (``SO_MEMINFO``), which is how they are counted here. A call
whose first packets come from a stranger is the window left open, as with Asterisk's
``strictrtp`` learning: short, and before the caller's own media has flowed.

IPv4 only (the filter reads the IPv4 header); on IPv6 media the call runs unfiltered, logged.
Everything here runs on the SIP thread, which owns the pjsua2 calls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import socket
import struct
from dataclasses import dataclass

log = logging.getLogger("voicegate.media")

_SOL_SOCKET = 1
_SO_ATTACH_FILTER = 26
_SO_DETACH_FILTER = 27
_SO_MEMINFO = 55  # u32[SK_MEMINFO_VARS]: the socket's memory figures and its drops
_SK_MEMINFO_DROPS = 8
_SKF_NET_OFF = -0x100000  # (the network header, from a socket filter's data: the UDP header)
# Classic BPF opcodes (linux/filter.h).
_LD_W_ABS, _LD_H_ABS = 0x20, 0x28
_JEQ_K = 0x15
_RET_K = 0x06

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF)


def program(address: str, port: int | None) -> bytes:
    """A filter accepting UDP from ``address`` (and ``port``, if given) only, IPv4."""
    ip = struct.unpack("!I", socket.inet_aton(address))[0]
    if port is None:
        return b"".join(
            [
                _insn(_LD_W_ABS, 0, 0, _SKF_NET_OFF + 12),  # the IPv4 source address
                _insn(_JEQ_K, 0, 1, ip),
                _insn(_RET_K, 0, 0, 0xFFFFFFFF),  # accept, whole
                _insn(_RET_K, 0, 0, 0),  # drop
            ]
        )
    return b"".join(
        [
            _insn(_LD_W_ABS, 0, 0, _SKF_NET_OFF + 12),
            _insn(_JEQ_K, 0, 3, ip),
            _insn(_LD_H_ABS, 0, 0, 0),  # the UDP source port
            _insn(_JEQ_K, 0, 1, port),
            _insn(_RET_K, 0, 0, 0xFFFFFFFF),
            _insn(_RET_K, 0, 0, 0),
        ]
    )


def attach(fd: int, code: bytes) -> None:
    """Attach the filter ``code`` to the socket ``fd`` (replacing any before it)."""
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HL", len(code) // 8, ctypes.addressof(buffer))
    if _libc.setsockopt(fd, _SOL_SOCKET, _SO_ATTACH_FILTER, fprog, len(fprog)) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def detach(fd: int) -> None:
    dummy = ctypes.c_int(0)
    _libc.setsockopt(fd, _SOL_SOCKET, _SO_DETACH_FILTER, ctypes.byref(dummy), 4)


def udp_sockets() -> dict[int, int]:
    """This network namespace's IPv4 UDP sockets' inodes by local port (``/proc/net/udp``):
    read when a call locks, to find which of this process's descriptors its sockets are."""
    found: dict[int, int] = {}
    with open("/proc/net/udp") as table:
        next(table)
        for line in table:
            fields = line.split()
            found[int(fields[1].rsplit(":", 1)[1], 16)] = int(fields[9])
    return found


def socket_drops(fd: int) -> int | None:
    """The packets the kernel dropped for socket ``fd`` (a filter's refusals among them)."""
    meminfo = (ctypes.c_uint32 * 9)()
    size = ctypes.c_uint32(ctypes.sizeof(meminfo))
    if _libc.getsockopt(fd, _SOL_SOCKET, _SO_MEMINFO, meminfo, ctypes.byref(size)) != 0:
        return None
    return int(meminfo[_SK_MEMINFO_DROPS])


def socket_fds() -> dict[int, int]:
    """This process's socket file descriptors by inode."""
    found: dict[int, int] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            found[int(target[8:-1])] = int(name)
    return found


def split_address(name: str) -> tuple[str, int] | None:
    """``"1.2.3.4:5"`` as (address, port); None for IPv6 or nothing."""
    host, sep, port = name.rpartition(":")
    if not sep or not port.isdigit() or ":" in host or not host:
        return None
    try:
        socket.inet_aton(host)
    except OSError:
        return None
    return host, int(port)


@dataclass(slots=True)
class _Bound:
    fd: int
    inode: int
    baseline: int  # the socket's drops when its filter went on


class StrictSource:
    """One call's media sockets: learning their caller's source, then locked to it."""

    def __init__(self, call_id: str, local_rtp: str, local_rtcp: str) -> None:
        self.call_id = call_id
        self._local = (split_address(local_rtp), split_address(local_rtcp))
        self.source: tuple[str, int] | None = None  # locked to this (address, port)
        self._bound: list[_Bound] = []
        self._counted = 0

    @property
    def supported(self) -> bool:
        return all(local is not None for local in self._local)

    @property
    def learning(self) -> bool:
        return self.source is None

    def lock(self, source: str, rtcp_source: str = "") -> bool:
        """Lock to ``source`` (``"address:port"``, the first RTP's) and, for RTCP, to
        ``rtcp_source`` if it came from the same address; False if it cannot be."""
        src = split_address(source)
        if src is None or not self.supported:
            return False
        rtcp = split_address(rtcp_source)
        rtcp_port = rtcp[1] if rtcp is not None and rtcp[0] == src[0] else src[1] + 1
        ports = udp_sockets()
        fds = socket_fds()
        bound: list[_Bound] = []
        for local, code in zip(
            self._local, (program(src[0], src[1]), program(src[0], rtcp_port)), strict=True
        ):
            assert local is not None
            inode = ports.get(local[1])
            fd = fds.get(inode) if inode is not None else None
            if inode is None or fd is None:
                log.warning(
                    "media.source_unfiltered", extra={"call_id": self.call_id, "port": local[1]}
                )
                self.release()
                return False
            attach(fd, code)
            bound.append(_Bound(fd, inode, socket_drops(fd) or 0))
        self._bound, self.source = bound, src
        return True

    def relearn(self) -> None:
        """A re-INVITE may move the caller's media: learn its source again."""
        self.release()
        self.source = None

    def release(self) -> None:
        """Take the filters off (the call ends, or its media is renegotiated)."""
        fds = socket_fds()
        for bound in self._bound:
            if fds.get(bound.inode) == bound.fd:  # still our socket, not a reused number
                detach(bound.fd)
        self._bound, self._counted = [], 0

    def foreign_packets(self) -> int:
        """Packets dropped since the last call of this (the sockets' own counters)."""
        total = 0
        for bound in self._bound:
            drops = socket_drops(bound.fd)
            if drops is not None:
                total += max(0, drops - bound.baseline)
        new, self._counted = total - self._counted, total
        return max(0, new)
