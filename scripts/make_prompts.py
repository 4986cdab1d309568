"""Generate the demo agent's prompts with espeak-ng into agents/prompts/<name>.wav.

Run from the repository root, with voicegate installed (``pip install -e .``) and espeak-ng on PATH:

    /work/venv/bin/python scripts/make_prompts.py            # (re)write agents/prompts/
    /work/venv/bin/python scripts/make_prompts.py --check    # exit 1 if any file would change

Each prompt is spoken by ``espeak-ng -v en-us -s 160``, trimmed of leading and trailing silence,
resampled to 16 kHz with audio.resample, brought to a -3 dBFS peak and written as mono 16-bit WAV.
The same espeak-ng version gives byte-identical files, and a file whose bytes would not change is
not rewritten, so running this twice is a no-op. Files for names not in PROMPTS are left alone
and listed. The names are what the demo agent plays (agents/demo.py); add a name there and here.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile
from numpy.typing import NDArray

from audio.resample import resample

DIGIT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

PROMPTS: dict[str, str] = {
    "greeting": "Hello, this is voicegate.",
    "menu": (
        "Press 1 and then your digits, ending with the hash key, to hear them read back. "
        "Press 2 for payments. Press 0 to speak to a person. Press 9 to end the call. "
        "Press star to hear this menu again."
    ),
    "you_entered": "You entered",
    "no_digits": "You have not entered any digits.",
    "enter_digits": "Enter your digits, then press hash.",
    "not_available": "That option is not available yet.",
    "goodbye": "Thank you for calling. Goodbye.",
    "shutting_down": "This service is restarting. Please call again in a minute. Goodbye.",
    **{f"digit_{d}": word for d, word in enumerate(DIGIT_WORDS)},
    "digit_star": "star",
    "digit_hash": "hash",
    **{f"digit_{c}": c for c in "ABCD"},
    "still_there": "Are you still there?",
    "reconnecting": "One moment, I am reconnecting.",
    "sorry_lost_you": "Sorry, I lost you for a moment.",
    # The demo agent's payment flow (menu key 2).
    "enter_amount": "Enter the amount in cents, then press hash.",
    "confirm_payment": "cents. Press 1 to pay, or star to cancel.",
    "payment_processing": "One moment, please.",
    "payment_committed": "The payment went through. Thank you.",
    "payment_failed": "The payment was declined. Nothing was charged.",
    "payment_not_started": "The payment was not made. Nothing was charged.",
    "payment_canceled": "Payment canceled. Nothing was charged.",
    "payment_unavailable": "Payments are not available right now. Nothing was charged.",
    "payment_pending": "That payment is still being processed.",
    # The demo agent's speech (agent.speech): what to say, and what happens when it was not heard.
    "speech_hint": "Or just say what you want: make a payment, talk to a person, or goodbye.",
    "confirm_goodbye": "Shall I end the call? Say yes or no, or press 9 to end it.",
    "say_amount": "Say the amount, for example fifty nine cents, or key it in and press hash.",
    "say_digits": "Say your digits, or key them in and press hash.",
    "not_understood": "Sorry, I did not catch that.",
    "keypad_amount": "Please key in the amount in cents on your keypad, then press hash.",
    "say_yes_or_no": "Please say yes or no, or press 1 to pay, or star to cancel.",
    # What the session machine says when a call ends on a deadline (session/machine.py, Say).
    "timed_out": "I am sorry, I could not restore the connection in time. "
    "Nothing else will be done on this call. Goodbye.",
    "outcome_unknown": "I cannot confirm yet whether your request went through. "
    "A colleague will check it and get back to you. Goodbye.",
    "technical_problem": "I am sorry, something went wrong on our side. "
    "Please call again later. Goodbye.",
    # A blind transfer that failed, was refused or got no answer in time (session/machine.py).
    "transfer_failed": "I could not reach a colleague right now. I am still here to help you.",
    # An attended transfer's consultation (session/machine.py): the caller waits, and is told so.
    "transfer_consulting": "Please hold. I am asking a colleague to take your call.",
    # What the person on an attended transfer's consult leg hears first (transfer.consult_brief).
    "consult_brief": "A caller is waiting for you. Their details are in the handoff.",
    # needs_human with transfer.human_target set: the caller goes to a person, and is told why.
    "handoff": "I cannot confirm yet whether your request went through. "
    "I am connecting you to a colleague who can check.",
    # A caller whose call dropped calls back (voicegate/call/callbacks.py): the offer to go on.
    "welcome_back": "Welcome back. Press 1 to continue where we left off.",
    "enter_resume_code": "Please enter the code I read out to you earlier.",
    "resume_code_wrong": "That code is not right.",
    "new_session": "Let us start again.",
    # The demo agent reads out the resume code when a payment starts (agents/demo.py).
    "resume_code_intro": "If we get cut off, call back and enter",
}

RATE = 16000  # G.722's rate; 8 kHz calls get these resampled at load, never upsampled audio
VOICE = ["-v", "en-us", "-s", "160"]
# Below -46 dBFS counts as silence: espeak-ng's pauses are digital zero or near it, while the
# quietest speech it makes (the tail of an "s") stays well above.
SILENCE = 32768 * 10 ** (-46 / 20)
# Kept around the speech so onsets and decays are not clipped.
LEAD_S, TAIL_S = 0.03, 0.06
PEAK = 32768 * 10 ** (-3 / 20)  # headroom for codecs and the resampler's overshoot


def speak(text: str) -> tuple[NDArray[np.int16], int]:
    """espeak-ng's rendering of ``text`` as int16 samples and their rate (22050 Hz)."""
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "out.wav"
        subprocess.run(["espeak-ng", *VOICE, "-w", str(wav), text], check=True)
        samples, rate = soundfile.read(wav, dtype="int16")
    return samples, int(rate)


def trim(samples: NDArray[np.int16], rate: int) -> NDArray[np.int16]:
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > SILENCE)
    if len(loud) == 0:
        raise ValueError("espeak-ng produced only silence")
    start = max(0, loud[0] - round(LEAD_S * rate))
    end = min(len(samples), loud[-1] + 1 + round(TAIL_S * rate))
    return samples[start:end]


def render(text: str) -> bytes:
    """The WAV file for ``text``, as bytes."""
    samples, rate = speak(text)
    audio = resample(trim(samples, rate), rate, RATE).astype(np.float64)
    audio *= PEAK / np.abs(audio).max()
    out = io.BytesIO()
    soundfile.write(out, np.rint(audio).astype(np.int16), RATE, subtype="PCM_16", format="WAV")
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("agents/prompts"))
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    stale = []
    for name, text in PROMPTS.items():
        path = out / f"{name}.wav"
        data = render(text)
        if path.exists() and path.read_bytes() == data:
            continue
        stale.append(name)
        if not args.check:
            path.write_bytes(data)
            print(f"wrote {path} ({len(data)} bytes)")
    for extra in sorted(set(p.stem for p in out.glob("*.wav")) - PROMPTS.keys()):
        print(f"not generated here, left alone: {out / extra}.wav")
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
