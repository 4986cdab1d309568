"""Dialogs we hung up whose BYE nobody answers: ended locally, so that their call slot is freed.

pjsua reports a call DISCONNECTED the moment we hang up (its "immediate hangup"), but keeps the
call's slot until the INVITE session really ends: when the BYE is answered, or at Timer F (64*T1,
32 s) when nobody answers it. A caller that vanished (a dead phone, a tunnel, a half-open INVITE
from a scanner) therefore held one of the process's four slots for half a minute after its call
had ended; a few of them kept a worker full.

So every dialog we end is looked up again :data:`FORCE_AFTER_S` later by its Call-ID and tags
(``pjsip_ua_find_dialog``; a dialog already gone is simply not found), and one still there has its
INVITE session terminated locally (``pjsip_inv_terminate``), which frees the slot. A peer that
answers its BYE within that time never gets here.

pjsua2 exposes neither function; both are exported by the same shared object as its bindings and
take only pointers, ints and ``pj_str_t``, so ctypes reaches them. One field is read, the INVITE
session's state: a session already DISCONNECTED had its BYE answered, and a dialog that is still
there then (a blind transfer's REFER subscription keeps it) is not ended locally or counted.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

# The BYE has been sent 4 times by then (T1 = 0.5 s, doubling): a live peer has answered.
FORCE_AFTER_S = 4.0
_REQUEST_TIMEOUT = 408
# The one field read from a PJSIP struct: pjsip_inv_session's ``state`` follows
# ``char obj_name[PJ_MAX_OBJ_NAME]`` (32) and three pool pointers (pjsip-ua/sip_inv.h, 2.15).
_INV_STATE_OFFSET = 32 + 3 * ctypes.sizeof(ctypes.c_void_p)
_INV_DISCONNECTED = 6  # PJSIP_INV_STATE_DISCONNECTED; NULL..DISCONNECTED are 0..6


def _inv_state(inv: int) -> int:
    """The INVITE session's state, or -1 if what is read there is no state (another layout):
    then the session is ended locally as before."""
    value = ctypes.c_int.from_address(inv + _INV_STATE_OFFSET).value
    return value if 0 <= value <= _INV_DISCONNECTED else -1


@dataclass(frozen=True, slots=True)
class DialogKey:
    """What identifies a dialog (RFC 3261 section 12): its Call-ID and both tags."""

    call_id: str
    local_tag: str
    remote_tag: str


class _PjStr(ctypes.Structure):
    _fields_ = (("ptr", ctypes.c_char_p), ("slen", ctypes.c_long))


def _pj_str(value: str) -> _PjStr:
    raw = value.encode()
    return _PjStr(raw, len(raw))


class DialogTerminator:
    """Ends a dialog's INVITE session without waiting for its peer. SIP thread only."""

    def __init__(self, library_path: str) -> None:
        # PyDLL keeps the GIL: PJSIP may log (through pjsua2's LogWriter, Python) while it works.
        lib = ctypes.PyDLL(library_path)
        pj_str_p = ctypes.POINTER(_PjStr)
        lib.pjsip_ua_find_dialog.restype = ctypes.c_void_p
        lib.pjsip_ua_find_dialog.argtypes = (pj_str_p, pj_str_p, pj_str_p, ctypes.c_int)
        lib.pjsip_dlg_get_inv_session.restype = ctypes.c_void_p
        lib.pjsip_dlg_get_inv_session.argtypes = (ctypes.c_void_p,)
        lib.pjsip_inv_terminate.restype = ctypes.c_int
        lib.pjsip_inv_terminate.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_int)
        lib.pjsip_dlg_dec_lock.restype = None
        lib.pjsip_dlg_dec_lock.argtypes = (ctypes.c_void_p,)
        self._lib = lib

    @classmethod
    def load(cls) -> DialogTerminator:
        import pjsua2 as pj

        return cls(pj._pjsua2.__file__)

    def terminate(self, key: DialogKey) -> str:
        """``ended`` if the dialog was still there, its BYE unanswered, and its INVITE session is
        now ended; ``gone`` if the dialog is no more; ``answered`` if its session had ended (the
        BYE was answered) and something else keeps the dialog."""
        call_id, local, remote = (_pj_str(v) for v in (key.call_id, key.local_tag, key.remote_tag))
        # lock=1: the dialog comes back locked, so it cannot be destroyed under us; ending the
        # session may destroy it when the lock is released.
        dlg = self._lib.pjsip_ua_find_dialog(
            ctypes.byref(call_id), ctypes.byref(local), ctypes.byref(remote), 1
        )
        if not dlg:
            return "gone"
        try:
            inv = self._lib.pjsip_dlg_get_inv_session(dlg)
            if not inv:
                return "gone"
            if _inv_state(inv) == _INV_DISCONNECTED:
                # Its BYE was answered: what keeps the dialog is another usage, such as the
                # subscription of a blind transfer's REFER, not an unanswered BYE.
                return "answered"
            # notify=1: pjsua hears of the end and frees the slot (it told the app long ago).
            ended = self._lib.pjsip_inv_terminate(inv, _REQUEST_TIMEOUT, 1) == 0
            return "ended" if ended else "gone"
        finally:
            self._lib.pjsip_dlg_dec_lock(dlg)


class Lingering:
    """Dialogs we ended, and when each is to be looked at again (sans-IO, time passed in)."""

    def __init__(self, after_s: float = FORCE_AFTER_S) -> None:
        self.after_s = after_s
        self._due: dict[DialogKey, float] = {}

    def __len__(self) -> int:
        return len(self._due)

    def ended(self, key: DialogKey, now: float) -> None:
        self._due.setdefault(key, now + self.after_s)

    def next_due(self) -> float | None:
        return min(self._due.values(), default=None)

    def due(self, now: float) -> list[DialogKey]:
        keys = [key for key, due in self._due.items() if due <= now]
        for key in keys:
            del self._due[key]
        return keys
