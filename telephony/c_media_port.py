"""The C media port (``telephony/media_port.c``) from Python: loading, checking, and its two halves.

With pjsua2's ``AudioMediaPort`` every media tick runs Python on PJSIP's clock thread, and on
this machine that costs about a percent of a core per worker however little the callbacks do
(docs/benchmarks.md). The C port's callbacks only copy frames into and out of two rings; asyncio
moves frames in batches once per ``audio.tick_ms``:

* :class:`CMediaPort` is the SIP thread's half: it registers the port with the conference bridge
  and connects it to a call, through pjsua's C API (``pjsua_conf_add_port``, ``_connect``);
* :class:`CRing` is asyncio's half: the :class:`~audio.playout.FrameRing` a call's playout plays
  through, and the caller frames waiting for the inbound pipeline.

The port is declared against PJSIP 2.15.1's structures, so it is only used with that release,
after its layout check, and after :func:`self_test` has seen a frame cross the bridge between two
of them; otherwise voicegate keeps its Python port (``media.port``, README).

With the evidence detector (``audio.vad_detector``, the default) the port also runs it on every
caller frame, on the clock thread (``telephony/evidence_vad.c``, webrtcvad's C functions taken
from the webrtcvad wheel's own library): per frame, the detector there costs a few microseconds
of C where Python spent about 16 (docs/benchmarks.md), and asyncio gets records only for the
frames its turns and barge-in act on, and the caller's audio only for an agent that takes it.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import logging
import time
from pathlib import Path
from typing import Any, Protocol

import pjsua2 as pj

from audio.inbound import PIPELINE_BUCKETS_S
from audio.playout import RingStatus
from audio.vad import VadConfig

log = logging.getLogger("voicegate.sip")

PJSIP_RELEASE = "2.15.1"
# Outbound frames a port holds: more than the longest asyncio tick (60 ms) plus its lateness
# under load. A cut empties it, so its size adds nothing to barge-in latency.
OUT_FRAMES = 16
# Caller frames held for asyncio: one second, as the Python port's deque.
IN_FRAMES = 50
# Detector records held for asyncio (media_port.c's REC_CAP) and the int64 fields of each.
REC_CAP = 512
REC_FIELDS = 4

_u64 = ctypes.c_uint64
_u32 = ctypes.c_uint32
_ptr = ctypes.c_void_p


class _Status(ctypes.Structure):
    # vg_status in media_port.c.
    _fields_ = (
        ("ticks", _u64),
        ("played", _u64),
        ("last_tag", _u64),
        ("underruns", _u64),
        ("last_audio_ns", _u64),
        ("rx_frames", _u64),
        ("rx_overflow", _u64),
        ("out_queued", _u32),
        ("in_queued", _u32),
        ("rec_overflow", _u64),
        ("detecting", _u32),
        ("stirring", _u32),
    )


class _EvConfig(ctypes.Structure):
    # ev_config in evidence_vad.h.
    _fields_ = (
        ("aggressiveness", ctypes.c_int32),
        ("onset_frames", ctypes.c_int32),
        ("hangover_frames", ctypes.c_int32),
        ("window_frames", ctypes.c_int32),
        ("warmup_frames", ctypes.c_int32),
        ("pad", ctypes.c_int32),
        ("margin_db", ctypes.c_double),
        ("floor_rise_db_s", ctypes.c_double),
    )


def detector_config(config: VadConfig) -> _EvConfig | None:
    """``config`` as the C detector takes it, or None when it asks for what only Python runs
    (the ``verdicts`` detector, VAD frames other than 20 ms)."""
    if config.detector != "evidence" or config.frame_ms != 20:
        return None
    onset = -(-config.onset_ms // 20)
    # As EvidenceVad.__init__ rounds them.
    return _EvConfig(
        aggressiveness=config.aggressiveness,
        onset_frames=onset,
        hangover_frames=-(-config.hangover_ms // 20),
        window_frames=max(onset, config.window_ms // 20),
        warmup_frames=-(-config.warmup_ms // 20),
        margin_db=config.margin_db,
        floor_rise_db_s=config.floor_rise_db_s,
    )


_BOUNDS_NS = (ctypes.c_uint64 * len(PIPELINE_BUCKETS_S))(
    *(round(bound * 1e9) for bound in PIPELINE_BUCKETS_S)
)


class RingUser(Protocol):
    def use_ring(self, ring: CRing) -> None: ...


class CPortUnavailable(RuntimeError):
    """The C port cannot be used here; the message says why."""


class BridgeError(RuntimeError):
    """pjsua refused to add or connect a port (its status code is ``status``)."""

    def __init__(self, what: str, status: int) -> None:
        super().__init__(f"{what} failed with PJSIP status {status}")
        self.status = status


def _library_path() -> Path | None:
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = here / f"_media_port{suffix}"
        if candidate.exists():
            return candidate
    return None


class CPortLibrary:
    """The compiled port and the few pjsua functions that wire it in."""

    def __init__(self, port_library: Path, pjsua_library: str) -> None:
        # PyDLL keeps the GIL across each call: they are short copies under the port's own lock,
        # which the clock thread only ever holds for a copy and one frame of the detector (a
        # few microseconds), so nothing here waits on Python.
        vg = ctypes.PyDLL(str(port_library))
        vg.vg_port_new.restype = _ptr
        vg.vg_port_new.argtypes = (ctypes.c_char_p, _ptr, _u32, _u32, _u32, _u32)
        vg.vg_port_layout_ok.restype = ctypes.c_int
        vg.vg_port_layout_ok.argtypes = (_ptr, _u32)
        vg.vg_port_attach.restype = _u64
        vg.vg_port_attach.argtypes = (_ptr,)
        status_p = ctypes.POINTER(_Status)
        vg.vg_port_push.restype = ctypes.c_int
        vg.vg_port_push.argtypes = (_ptr, _u64, ctypes.c_char_p, _u32, _u64, ctypes.c_int, status_p)
        vg.vg_port_cut.restype = ctypes.c_int
        vg.vg_port_cut.argtypes = (_ptr, _u64, status_p)
        vg.vg_port_take.restype = ctypes.c_int
        vg.vg_port_take.argtypes = (_ptr, _u64, ctypes.c_char_p, _u32, status_p)
        vg.vg_port_status.restype = ctypes.c_int
        vg.vg_port_status.argtypes = (_ptr, _u64, status_p)
        vg.vg_port_tick.restype = None
        vg.vg_port_tick.argtypes = (_ptr, ctypes.c_char_p, ctypes.c_char_p)
        vg.vg_vad_bind.restype = ctypes.c_int
        vg.vg_vad_bind.argtypes = (_ptr, _ptr, _ptr, _ptr, _ptr)
        vg.vg_vad_decide.restype = ctypes.c_int
        vg.vg_vad_decide.argtypes = (
            ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
            ctypes.POINTER(ctypes.c_int),
        )  # fmt: skip
        vg.vg_port_detect.restype = ctypes.c_int
        vg.vg_port_detect.argtypes = (
            _ptr, _u64, ctypes.POINTER(_EvConfig), ctypes.POINTER(_u64), _u32
        )
        vg.vg_port_marks.restype = ctypes.c_int
        vg.vg_port_marks.argtypes = (_ptr, _u64, ctypes.POINTER(ctypes.c_int64), _u32)
        vg.vg_port_drain.restype = ctypes.c_int
        vg.vg_port_drain.argtypes = (
            _ptr, _u64, ctypes.c_char_p, _u32, ctypes.c_void_p, _u32, ctypes.POINTER(_u32),
            ctypes.POINTER(_u64), status_p,
        )
        self.vg = vg
        self.detects = self._bind_webrtcvad()
        # CDLL lets the GIL go: pjsua takes its own locks, and a Python port's callback may hold
        # the bridge's while it waits for the GIL.
        pjsua = ctypes.CDLL(pjsua_library)
        pjsua.pj_get_version.restype = ctypes.c_char_p
        pjsua.pj_get_version.argtypes = ()
        pjsua.pjsua_pool_create.restype = _ptr
        pjsua.pjsua_pool_create.argtypes = (ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t)
        pjsua.pjsua_conf_add_port.restype = ctypes.c_int
        pjsua.pjsua_conf_add_port.argtypes = (_ptr, _ptr, ctypes.POINTER(ctypes.c_int))
        for name in ("pjsua_conf_connect", "pjsua_conf_disconnect"):
            fn = getattr(pjsua, name)
            fn.restype = ctypes.c_int
            fn.argtypes = (ctypes.c_int, ctypes.c_int)
        self.pjsua = pjsua
        self._info_init = ctypes.cast(pjsua.pjmedia_port_info_init, _ptr).value

    def _bind_webrtcvad(self) -> bool:
        """Hand the detector webrtcvad's C functions from the wheel's own library, which exports
        them (``nm -D``); False, and caller frames keep Python's detector, if it cannot."""
        try:
            import _webrtcvad  # the webrtcvad wheel's extension

            vad = ctypes.CDLL(_webrtcvad.__file__)
            names = ("Create", "Init", "set_mode", "Process", "Free")
            addresses = [ctypes.cast(getattr(vad, f"WebRtcVad_{n}"), _ptr).value for n in names]
        except (ImportError, OSError, AttributeError):
            return False
        if self.vg.vg_vad_bind(*addresses) != 0:
            return False
        # Bound by name and address, the functions' signatures are taken on trust: a wheel
        # built from another WebRTC release could take other arguments or decide otherwise.
        # The detector runs only if they decide as the Python binding does, frame for frame.
        why = self._vad_disagrees()
        if why:
            log.warning("media.c_detector_unverified", extra={"why": why})
            return False
        return True

    def _vad_disagrees(self) -> str:
        """Empty if the bound functions give webrtcvad.Vad's verdict on every frame of a test
        signal at 8 and 16 kHz in every mode; else what differed."""
        import webrtcvad

        for rate in (8000, 16000):
            pcm = vad_check_signal(rate)
            length = rate // 50
            frames = len(pcm) // 2 // length
            for mode in range(4):
                out = (ctypes.c_int * frames)()
                if self.vg.vg_vad_decide(rate, mode, pcm, length, frames, out) != 0:
                    return f"WebRtcVad refused rate {rate}, mode {mode}"
                vad = webrtcvad.Vad(mode)
                step = length * 2
                want = [int(vad.is_speech(pcm[i * step : (i + 1) * step], rate)) for i in
                        range(frames)]  # fmt: skip
                if list(out) != want:
                    differ = sum(a != b for a, b in zip(out, want, strict=True))
                    return f"{differ} of {frames} frames differ at {rate} Hz, mode {mode}"
        return ""

    @classmethod
    def load(cls) -> CPortLibrary:
        """The library, or :class:`CPortUnavailable` saying what is missing."""
        path = _library_path()
        if path is None:
            raise CPortUnavailable(
                "telephony/_media_port was not built (no C compiler at install time?); "
                "reinstall with gcc present"
            )
        lib = cls(path, pj._pjsua2.__file__)
        version = (lib.pjsua.pj_get_version() or b"").decode()
        if version != PJSIP_RELEASE:
            raise CPortUnavailable(
                f"the C port is declared for PJSIP {PJSIP_RELEASE}; this pjsua2 is {version}"
            )
        return lib

    def new_port(self, name: str, rate: int) -> int:
        """A new port of 20 ms mono frames at ``rate``, not yet on the bridge."""
        frame_bytes = rate // 50 * 2
        ptr = self.vg.vg_port_new(
            name.encode(), self._info_init, rate, frame_bytes, OUT_FRAMES, IN_FRAMES
        )
        if not ptr:
            raise CPortUnavailable(f"vg_port_new({name!r}, {rate}) failed")
        if not self.vg.vg_port_layout_ok(ptr, rate):
            raise CPortUnavailable("pjmedia_port_info is not laid out as media_port.c expects")
        return int(ptr)

    def pool(self, name: str) -> int:
        """A pjsua memory pool for the bridge's bookkeeping of our ports (call after libInit)."""
        pool = self.pjsua.pjsua_pool_create(name.encode(), 4096, 4096)
        if not pool:
            raise CPortUnavailable("pjsua_pool_create failed")
        return int(pool)

    def add_to_bridge(self, pool: int, port: int) -> int:
        slot = ctypes.c_int(-1)
        status = self.pjsua.pjsua_conf_add_port(pool, port, ctypes.byref(slot))
        if status != 0:
            raise BridgeError("pjsua_conf_add_port", status)
        return slot.value

    def connect(self, source: int, sink: int) -> None:
        status = self.pjsua.pjsua_conf_connect(source, sink)
        if status != 0:
            raise BridgeError(f"pjsua_conf_connect({source}, {sink})", status)

    def disconnect(self, source: int, sink: int) -> None:
        # Failing here means the pair was not connected (the call's stream went first).
        self.pjsua.pjsua_conf_disconnect(source, sink)


class CRing:
    """asyncio's half of one call on one C port: its outbound ring and its caller frames.

    Every method answers None (or nothing) once the port serves another call: the port's epoch
    moved on, so a late call from this one cannot touch the next caller's audio.
    """

    __slots__ = (
        "_buf",
        "_config",
        "_epoch",
        "_n_recs",
        "_port",
        "_recs",
        "_st",
        "_timing",
        "_vg",
        "detecting",
        "frame_bytes",
        "rec_overflow",
        "rx_frames",
        "rx_overflow",
        "stirring",
    )

    def __init__(self, lib: CPortLibrary, port: int, epoch: int, frame_bytes: int) -> None:
        self._vg = lib.vg
        self._port = port
        self._epoch = epoch
        self.frame_bytes = frame_bytes
        self._st = _Status()
        self._buf = ctypes.create_string_buffer(IN_FRAMES * frame_bytes)
        self.rx_frames = 0
        self.rx_overflow = 0
        # Set by detect(); then drain() replaces take().
        self.detecting = False
        self.stirring = False
        self.rec_overflow = 0
        self._recs: ctypes.Array[ctypes.c_int64] | None = None
        self._config: _EvConfig | None = None
        self._n_recs = _u32()
        self._timing = (_u64 * (len(PIPELINE_BUCKETS_S) + 2))()

    @property
    def capacity(self) -> int:
        return OUT_FRAMES

    def _status(self, accepted: int = 0) -> RingStatus:
        st = self._st
        self.rx_frames = st.rx_frames
        self.rx_overflow = st.rx_overflow
        return RingStatus(
            st.ticks, st.played, st.last_tag, st.underruns, st.last_audio_ns, st.out_queued,
            accepted,
        )

    def push(self, pcm: bytes, first_tag: int, more_due: bool) -> RingStatus | None:
        n = len(pcm) // self.frame_bytes
        taken = self._vg.vg_port_push(
            self._port, self._epoch, pcm, n, first_tag, more_due, ctypes.byref(self._st)
        )
        return None if taken < 0 else self._status(taken)

    def cut(self) -> RingStatus | None:
        if self._vg.vg_port_cut(self._port, self._epoch, ctypes.byref(self._st)) < 0:
            return None
        return self._status()

    def status(self) -> RingStatus | None:
        if self._vg.vg_port_status(self._port, self._epoch, ctypes.byref(self._st)) < 0:
            return None
        return self._status()

    def detect(self, config: VadConfig) -> bool:
        """Run the caller's frames through the C evidence detector from now on (before the call
        has audio); False if it cannot (the configuration, or no webrtcvad for C)."""
        c_config = detector_config(config)
        if c_config is None:
            return False
        status = self._vg.vg_port_detect(
            self._port, self._epoch, ctypes.byref(c_config), _BOUNDS_NS, len(_BOUNDS_NS)
        )
        if status == 0:
            self.detecting = True
            self._config = c_config
            if self._recs is None:
                self._recs = (ctypes.c_int64 * (REC_CAP * REC_FIELDS))()
        return self.detecting

    def restart(self) -> None:
        """The detector afresh (its noise floor, warm-up and segment), its records dropped."""
        if self._config is not None:
            self._vg.vg_port_detect(
                self._port, self._epoch, ctypes.byref(self._config), _BOUNDS_NS, len(_BOUNDS_NS)
            )

    def mark(self, speech_ms: tuple[int, ...]) -> None:
        """Record a speaking frame only where the segment's ``speech_ms`` reaches one of these
        (at most four) from then on, instead of every speaking frame."""
        marks = (ctypes.c_int64 * len(speech_ms))(*speech_ms)
        if self._vg.vg_port_marks(self._port, self._epoch, marks, len(speech_ms)) == -2:
            raise ValueError(f"at most 4 marks, got {len(speech_ms)}")

    def drain(self, pcm: bool) -> tuple[list[bytes], list[int], list[int]]:
        """With the detector: every caller frame waiting leaves the port. Returns the frames
        (the newest second of them, only when ``pcm``), the records of those worth acting on
        (flat: index, kind, timestamp, speech_ms; media_port.c), and their time in the
        detector (a count per :data:`PIPELINE_BUCKETS_S` bucket and one above, then the sum in
        ns). Nothing once the port serves another call."""
        recs = self._recs
        assert recs is not None, "drain() before detect()"
        timing = self._timing
        n = self._vg.vg_port_drain(
            self._port, self._epoch, self._buf if pcm else None, IN_FRAMES, recs, REC_CAP,
            ctypes.byref(self._n_recs), timing, ctypes.byref(self._st),
        )
        if n < 0:
            return [], [], []
        st = self._st
        self.rx_frames = st.rx_frames
        self.rx_overflow = st.rx_overflow
        self.rec_overflow = st.rec_overflow
        self.stirring = bool(st.stirring)
        count = self._n_recs.value
        records = recs[: count * REC_FIELDS] if count else []
        frames: list[bytes] = []
        if n:
            fb = self.frame_bytes
            raw = ctypes.string_at(self._buf, n * fb)
            frames = [raw[i * fb : (i + 1) * fb] for i in range(n)]
        return frames, records, timing[:]

    def take(self) -> list[bytes]:
        """The caller frames waiting, oldest first (none once the port serves another call)."""
        n = self._vg.vg_port_take(
            self._port, self._epoch, self._buf, IN_FRAMES, ctypes.byref(self._st)
        )
        if n <= 0:
            return []
        self._status()
        fb = self.frame_bytes
        raw = ctypes.string_at(self._buf, n * fb)  # only the frames taken, not the whole buffer
        return [raw[i * fb : (i + 1) * fb] for i in range(n)]


class CMediaPort:
    """A C port on the conference bridge, lent to one call at a time; owned by the SIP thread.

    Like the Python port it is never removed from the bridge: it is reused call after call, and
    :meth:`attach` hands the next call a fresh :class:`CRing`.
    """

    def __init__(
        self, lib: CPortLibrary, pool: int, name: str, rate: int, vad: VadConfig | None = None
    ) -> None:
        self._lib = lib
        # Caller frames go through the C detector with this, where it can run.
        self.vad = vad if lib.detects else None
        self.name = name
        self.rate = rate
        self.frame_bytes = rate // 50 * 2
        self.port = lib.new_port(name, rate)
        self.slot = lib.add_to_bridge(pool, self.port)
        self.channel: Any = None

    def new_ring(self) -> CRing:
        """Serve a new call from the next tick on: empty rings, and the old call's ring dead."""
        epoch = self._lib.vg.vg_port_attach(self.port)
        return CRing(self._lib, self.port, epoch, self.frame_bytes)

    def attach(self, channel: RingUser) -> None:
        """Serve ``channel`` from the next tick on."""
        self.channel = channel
        ring = self.new_ring()
        if self.vad is not None and not ring.detect(self.vad):
            log.warning("media.c_detector_refused", extra={"port": self.name})
        channel.use_ring(ring)

    def connect(self, audio: Any) -> None:
        """Both ways between this port and a call's ``pj.AudioMedia``."""
        other = audio.getPortId()
        self._lib.connect(other, self.slot)
        self._lib.connect(self.slot, other)

    def disconnect(self, audio: Any) -> None:
        other = audio.getPortId()
        self._lib.disconnect(other, self.slot)
        self._lib.disconnect(self.slot, other)


def self_test(lib: CPortLibrary, a: CMediaPort, b: CMediaPort, timeout_s: float = 2.0) -> bool:
    """Whether frames pushed into ``a`` arrive unchanged at ``b`` through the running bridge.

    This is the check the layout test cannot make: that PJSIP calls the port's callbacks where
    media_port.c put them. Leaves both ports attached to nothing in particular and unconnected.
    """
    fb = a.frame_bytes
    pattern = bytes((i * 7 + 3) & 0xFF for i in range(fb))
    sender = a.new_ring()
    receiver = b.new_ring()
    lib.connect(a.slot, b.slot)
    try:
        sender.push(pattern * 3, 1, False)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(frame == pattern for frame in receiver.take()):
                return True
            time.sleep(0.01)
        return False
    finally:
        lib.disconnect(a.slot, b.slot)
        a.new_ring()
        b.new_ring()


_CHECK_SIGNALS: dict[int, bytes] = {}


def vad_check_signal(rate: int) -> bytes:
    """60 frames at ``rate`` that webrtcvad calls speech in some modes and not in others, and
    always both: silence, faint noise, a voiced 120 Hz buzz swelling at 3 Hz, loud noise.

    Made once per process, and by the pool's fork server before it forks (its preload): made in
    each worker, numpy's temporaries and numpy.random's import cost a worker about 2.5 MiB of
    pages of its own (measured with /proc/PID/smaps_rollup, the idle-PSS target of issue 34).
    The noise is a fixed sequence, not numpy.random, for the same reason."""
    signal = _CHECK_SIGNALS.get(rate)
    if signal is None:
        signal = _CHECK_SIGNALS[rate] = _make_check_signal(rate)
    return signal


def _make_check_signal(rate: int) -> bytes:
    import numpy as np

    n = rate // 50
    t = np.arange(n * 60) / rate
    x = np.zeros(n * 60)
    x[n * 10 : n * 20] = _noise(n * 10, 7) * 300.0
    voiced = sum(np.sin(2 * np.pi * 120 * k * t) / k for k in range(1, 25)) * 6000.0
    swell = 1 + 0.5 * np.sin(2 * np.pi * 3 * t)
    x[n * 20 : n * 45] = (voiced * swell)[n * 20 : n * 45]
    x[n * 45 :] = _noise(n * 15, 11) * 6000.0
    return bytes(np.clip(x, -32768, 32767).astype("<i2").tobytes())


def _noise(count: int, seed: int) -> Any:
    """``count`` values spread evenly over about -1.7 to 1.7 (unit variance), in a scrambled
    order."""
    import numpy as np

    state = (np.arange(1, count + 1, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(seed))
    state = state * np.uint64(6364136223846793005) >> np.uint64(33)
    return (state % np.uint64(1 << 20)).astype(np.float64) / (1 << 20) * 3.464 - 1.732
