"""Speech for the demo agent: grammars, the recogniser on espeak-ng speech (16 kHz and 8 kHz),
the recognition thread, synthesis and its cache, masking of what is logged, and the meaning of
what the demo's grammars accept."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numpy.typing import NDArray

from agents.demo_grammars import AMOUNT, GRAMMARS, amount_cents, intent, say_cents
from audio.speech.grammar import Grammar, GrammarError, vocabulary
from audio.speech.masking import DIGIT_WORDS, mask_digits
from audio.speech.recognizer import Heard, Recognizer
from audio.speech.synth import SynthesisError, Synthesizer, Voice
from audio.speech.worker import RecognitionThread, SpeechStream

SYNTH = Synthesizer()


def _spoken(text: str, rate: int, voice: Voice | None = None) -> NDArray[np.int16]:
    speech = SYNTH.say(text, rate, voice)
    silence = np.zeros(rate, dtype=np.int16)
    return np.concatenate((silence[: rate // 2], speech, silence))


def _recognise(recognizer: Recognizer, audio: NDArray[np.int16], rate: int) -> list[Heard]:
    size = rate // 50
    heard: list[Heard] = []
    for start in range(0, len(audio) - size + 1, size):
        heard += recognizer.feed(audio[start : start + size])
    return heard


# --- grammars -----------------------------------------------------------------------------------


def test_a_grammar_names_its_public_rule_and_only_dictionary_words() -> None:
    with pytest.raises(GrammarError, match="public <menu>"):
        Grammar("menu", "public <other> = yes;")
    with pytest.raises(GrammarError, match="lower-case"):
        Grammar("Menu", "public <Menu> = yes;")
    with pytest.raises(GrammarError, match="not in the pronunciation dictionary: zzyzxq"):
        vocabulary([Grammar("odd", "public <odd> = yes | zzyzxq;")])


def test_the_demo_grammars_words_are_few_and_all_known() -> None:
    words = vocabulary(GRAMMARS)
    assert {"payment", "fifty", "cents", "yes", "goodbye", "person"} <= words
    assert len(words) < 100  # trimmed: the full dictionary has 134,860


# --- recognition ----------------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [16000, 8000])
def test_an_utterance_in_the_grammar_is_accepted_at_both_rates(rate: int) -> None:
    recognizer = Recognizer(GRAMMARS, rate)
    (heard,) = _recognise(recognizer, _spoken("make a payment", rate), rate)
    assert (heard.text, heard.grammar, heard.accepted) == ("make a payment", "menu", True)
    assert 0 < heard.confidence <= 1
    recognizer.use("confirm")
    (heard,) = _recognise(recognizer, _spoken("yes", rate, Voice("en+f3", 185)), rate)
    assert (heard.grammar, heard.accepted) == ("confirm", True)
    assert intent("confirm", heard.text).kind == "yes"  # "yes" or "yeah"


def test_a_spoken_amount_at_16_khz_is_understood() -> None:
    recognizer = Recognizer(GRAMMARS, 16000)
    recognizer.use("amount")
    (heard,) = _recognise(recognizer, _spoken("fifty nine cents", 16000), 16000)
    assert heard.accepted and intent("amount", heard.text).value == "59"


@pytest.mark.parametrize("rate", [16000, 8000])
def test_an_utterance_is_dated_where_it_was_said_in_the_stream(rate: int) -> None:
    # The speaking demo lines utterances up with the session's caller turns by these dates.
    recognizer = Recognizer(GRAMMARS, rate)
    silence = np.zeros(rate * 2, dtype=np.int16)
    speech = SYNTH.say("goodbye", rate)
    (heard,) = _recognise(recognizer, np.concatenate((silence, speech, silence)), rate)
    said_from, said_to = 2000, 2000 + len(speech) * 1000 // rate
    assert abs(heard.ended_ms - said_to) <= 200, (heard.ended_ms, said_to)
    assert abs(heard.ended_ms - heard.speech_ms - said_from) <= 200, (heard, said_from)


def test_out_of_grammar_speech_is_rejected_not_guessed() -> None:
    recognizer = Recognizer(GRAMMARS, 16000)
    (heard,) = _recognise(recognizer, _spoken("what is the weather like today", 16000), 16000)
    assert not heard.accepted and heard.reason in ("no_hypothesis", "not_in_grammar", "low_score")


def test_silence_and_noise_are_no_utterance() -> None:
    recognizer = Recognizer(GRAMMARS, 8000)
    noise = np.random.default_rng(3).normal(0, 30, 8000 * 3).astype(np.int16)
    assert _recognise(recognizer, noise, 8000) == []


def test_an_unknown_grammar_is_refused_by_name() -> None:
    with pytest.raises(GrammarError, match="no grammar named 'nope'"):
        Recognizer(GRAMMARS, 16000).use("nope")


def test_decoder_options_reach_pocketsphinx_and_an_unknown_one_is_refused() -> None:
    # bench/speech_options.py weighs pocketsphinx's speed settings through this keyword.
    recognizer = Recognizer(GRAMMARS, 8000, options={"ds": 2, "bestpath": False})
    assert recognizer._decoder.config["ds"] == 2
    assert recognizer._decoder.config["bestpath"] is False
    assert Recognizer(GRAMMARS, 8000)._decoder.config["bestpath"] is True  # the default
    with pytest.raises(KeyError, match="nosuch"):
        Recognizer(GRAMMARS, 8000, options={"nosuch": 1})


def test_results_come_from_the_recognition_thread_never_the_callers() -> None:
    worker = RecognitionThread()
    got: list[tuple[Heard, str]] = []
    done = threading.Event()

    def deliver(heard: Heard) -> None:
        got.append((heard, threading.current_thread().name))
        done.set()

    stream = worker.open(GRAMMARS, 16000, deliver)
    audio = _spoken("goodbye", 16000)
    for start in range(0, len(audio) - 319, 320):
        assert stream.feed(audio[start : start + 320])
    assert done.wait(10)
    stream.close()
    worker.stop()
    ((heard, thread),) = got
    assert heard.text == "goodbye" and thread == "voicegate-speech"
    assert thread != threading.current_thread().name


def test_a_decoder_is_built_ahead_and_reused_clean_by_the_next_call() -> None:
    worker = RecognitionThread()
    got: list[tuple[str, Heard]] = []
    done = threading.Event()

    def deliver_to(name: str) -> Callable[[Heard], None]:
        def deliver(heard: Heard) -> None:
            got.append((name, heard))
            done.set()

        return deliver

    worker.prepare(GRAMMARS, 1)
    first = worker.open(GRAMMARS, 8000, deliver_to("first"))
    first.use("confirm")
    half = _spoken("make a payment", 8000)[: 8000]  # ends mid-utterance
    for start in range(0, len(half) - 159, 160):
        first.feed(half[start : start + 160])
    first.close()
    second = worker.open(GRAMMARS, 16000, deliver_to("second"))
    audio = _spoken("make a payment", 16000)
    for start in range(0, len(audio) - 319, 320):
        second.feed(audio[start : start + 320])
    assert done.wait(10)
    second.close()
    worker.stop()
    assert worker.decoders_built == 1
    ((name, heard),) = got
    assert (name, heard.grammar, heard.text) == ("second", "menu", "make a payment")


def test_a_reused_decoder_hears_the_next_call_as_a_new_one_would() -> None:
    # The decoder's cepstral mean adapts to a caller; the next call on it must not start from
    # the last caller's voice and line (it flipped "goodbye" to "i would like" in the G.722 test).
    voice = Voice("en+f3", 185)
    call = np.concatenate([_spoken(line, 16000, voice) for line in ("make a payment", "goodbye")])
    reused = Recognizer(GRAMMARS, 16000)
    earlier = np.concatenate([_spoken(line, 8000) for line in ("operator", "repeat that") * 3])
    assert _recognise(reused, earlier, 8000)  # it heard that caller: its mean moved
    reused.restart(16000)
    again = _recognise(reused, call, 16000)
    fresh = _recognise(Recognizer(GRAMMARS, 16000), call, 16000)
    assert [(h.text, h.confidence) for h in again] == [(h.text, h.confidence) for h in fresh]
    assert [h.text for h in fresh] == ["make a payment", "goodbye"]


def test_a_full_queue_drops_frames_and_counts_them_instead_of_waiting() -> None:
    worker = RecognitionThread(max_queued=1)  # never started: nothing drains it
    stream = SpeechStream(worker, 1)
    frame = np.zeros(320, dtype=np.int16)
    assert stream.feed(frame)
    assert not stream.feed(frame)
    assert worker.dropped == 1
    stream.closed = True
    assert not stream.feed(frame)


# --- synthesis ------------------------------------------------------------------------------------


def test_a_sentence_is_synthesised_once_and_shared_read_only() -> None:
    synth = Synthesizer()
    first = synth.say("You said 59 cents. Shall I charge it?", 8000)
    again = synth.say("You  said 59 cents.  Shall I charge it?", 8000)
    assert first is again and synth.synthesised == 1
    assert not first.flags.writeable and first.dtype == np.int16
    assert 1.0 < len(first) / 8000 < 5.0
    synth.say("You said 59 cents. Shall I charge it?", 16000)
    assert synth.synthesised == 2  # another rate is another entry


def test_bad_synthesis_requests_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="empty"):
        SYNTH.say("   ", 8000)
    with pytest.raises(ValueError, match="words a minute"):
        Voice("en-us", 20)
    with pytest.raises(ValueError, match="not an espeak-ng voice name"):
        Voice("en us; rm", 160)
    with pytest.raises(SynthesisError, match="no voice"):
        SYNTH.say("hello", 8000, Voice("xx-nope", 160))


# --- what is logged -------------------------------------------------------------------------------


def test_digit_runs_are_masked_and_amounts_stay_readable() -> None:
    assert mask_digits("fifty nine cents") == "fifty nine cents"
    assert mask_digits("four one one one two two") == "# # # # # #"
    assert mask_digits("one two", sensitive=True) == "# #"
    assert mask_digits("my code is 1234") == "my code is #"


@given(st.lists(st.sampled_from([*sorted(DIGIT_WORDS), "cents", "yes", "7", "4111x"]), max_size=20))
def test_no_masked_text_holds_three_digits_in_a_row_or_a_written_digit(words: list[str]) -> None:
    masked = mask_digits(" ".join(words)).split()
    assert len(masked) == len(words)
    assert not any(c.isdigit() for c in " ".join(masked))
    run = 0
    for word in masked:
        run = run + 1 if word in DIGIT_WORDS else 0
        assert run < 3


# --- the demo's meaning ---------------------------------------------------------------------------


def _words(n: int) -> str:
    ones = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    teens = "ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen"
    tens = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
    hundreds, rest = divmod(n, 100)
    said = [ones[hundreds], "hundred"] if hundreds else []
    if rest >= 20:
        said += [tens[rest // 10 - 2]] + ([ones[rest % 10]] if rest % 10 else [])
    elif rest >= 10:
        said += [teens.split()[rest - 10]]
    elif rest or not hundreds:
        said += [ones[rest]]
    return " ".join(said)


@given(st.integers(1, 999), st.integers(0, 99))
def test_every_amount_the_grammar_takes_means_its_cents(euros: int, cents: int) -> None:
    said = f"{_words(euros)} euros" + (f" and {_words(cents)} cents" if cents else "")
    assert amount_cents(said) == euros * 100 + cents
    assert amount_cents(f"{_words(euros)} cents") == euros
    assert set(said.split()) <= AMOUNT.words()


def test_intents_of_each_state() -> None:
    assert intent("menu", "i want to make a payment").kind == "pay"
    assert intent("menu", "talk to a person").kind == "person"
    assert intent("menu", "goodbye").kind == "goodbye"
    assert intent("menu", "say that again").kind == "repeat"
    assert intent("confirm", "no thanks").kind == "no"
    assert intent("confirm", "cancel").kind == "no"
    assert intent("confirm", "that is right").kind == "yes"
    assert intent("digits", "one two oh four").value == "1204"
    assert say_cents(59) == "59 cents" and say_cents(250) == "2 euros and 50 cents"


def test_a_caller_who_never_stops_is_cut_and_the_next_utterances_still_decode() -> None:
    # A noisy line the endpointer hears as speech without end: cut at MAX_UTTERANCE_S, and
    # what follows is a new utterance. The decoder used to be fed with no utterance started,
    # and every end_utt after it failed (seen on a 10 dB babble call: the worker wedged).
    recognizer = Recognizer(GRAMMARS, 8000)
    rng = np.random.default_rng(3)
    t = np.arange(8000 * 14) / 8000
    tone = 8000 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    endless = (tone + rng.normal(0, 2000, len(t))).astype(np.int16)
    quiet = np.zeros(8000 * 3, dtype=np.int16)
    audio = np.concatenate([endless, quiet, endless[: 8000 * 2], quiet])
    heard = [h for chunk in np.array_split(audio, 700) for h in recognizer.feed(chunk)]
    assert len(heard) >= 3, heard  # the cut, the rest of that noise, the short burst
    assert all(h.reason != "decoder_error" for h in heard), heard
    # And speech afterwards is an utterance of its own. (Whether it is understood at once is
    # the decoder's: its cepstral mean has followed the noise for 16 s.)
    (after,) = _recognise(recognizer, _spoken("make a payment", 8000), 8000)
    assert after.reason != "decoder_error"
