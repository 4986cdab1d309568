/*
 * The evidence detector of audio/evidence_vad.py in C, run by the C media port on PJSIP's clock
 * thread (telephony/media_port.c), so that a call's caller frames reach Python only as the few
 * records the call's turns and barge-in act on. It must decide exactly as the Python class does:
 * tests/unit/test_c_evidence_vad.py feeds both the same audio and compares every frame.
 */
#ifndef VG_EVIDENCE_VAD_H
#define VG_EVIDENCE_VAD_H

#include <stddef.h>
#include <stdint.h>

/* webrtcvad's C API as the webrtcvad wheel's _webrtcvad library exports it (the 2016 WebRTC
 * release py-webrtcvad builds: Create fills a handle and returns 0). */
typedef int (*ev_vad_create_fn)(void **handle);
typedef int (*ev_vad_init_fn)(void *handle);
typedef int (*ev_vad_set_mode_fn)(void *handle, int mode);
typedef int (*ev_vad_process_fn)(void *handle, int fs, const int16_t *audio, size_t length);
typedef int (*ev_vad_free_fn)(void *handle);

/* Window entries kept: onset_ms is at most 10 s (audio.vad.VadConfig), 500 frames. */
#define EV_MAX_WINDOW 512

/* VadConfig, in frames where the Python class rounds milliseconds up to frames. */
typedef struct {
    int32_t aggressiveness;
    int32_t onset_frames;    /* ceil(onset_ms / 20) */
    int32_t hangover_frames; /* ceil(hangover_ms / 20) */
    int32_t window_frames;   /* max(onset_frames, window_ms // 20) */
    int32_t warmup_frames;   /* ceil(warmup_ms / 20) */
    int32_t pad;
    double margin_db;
    double floor_rise_db_s;
} ev_config;

enum { EV_NONE = 0, EV_STARTED = 1, EV_STOPPED = 2 };

/* What one frame completed: an event dated at timestamp (samples since the port's call began),
 * and speech_ms after the frame as EvidenceVad.speech_ms says it. */
typedef struct {
    int kind;
    int64_t timestamp;
    int64_t speech_ms;
} ev_result;

typedef struct {
    void *vad; /* webrtcvad's handle, made once and reset for each call */
    ev_config cfg;
    int rate, length; /* Hz, samples per 20 ms frame */
    int full_frames, heard, quiet, warmup, speaking, has_floor;
    int64_t evidence_ms;
    double floor_db, rise, alpha;
    int win_head, win_len;
    int64_t win_ts[EV_MAX_WINDOW];
    uint8_t win_strength[EV_MAX_WINDOW];
} ev_state;

/* Give the detector webrtcvad's functions; 0, or -1 if any is missing. Once per process. */
int ev_bind(ev_vad_create_fn create, ev_vad_init_fn init, ev_vad_set_mode_fn set_mode,
            ev_vad_process_fn process, ev_vad_free_fn free_fn);

/* webrtcvad's verdict on each of n frames of length samples at pcm, at rate under mode, through
 * the bound functions on a handle of their own, into out (1 speech, 0 not, -1 refused): so that
 * Python can check at start that they decide as its own binding does. 0, or -1 if not bound or
 * the settings are refused. */
int ev_vad_decide(int rate, int mode, const int16_t *pcm, int length, int n, int *out);

/* Start detecting afresh at rate with cfg: 0, or -1 (not bound, bad configuration, webrtcvad
 * refused). */
int ev_reset(ev_state *s, int rate, const ev_config *cfg);

/* One 20 ms frame of s->length samples whose first sample is at timestamp. */
void ev_process(ev_state *s, const int16_t *pcm, int64_t timestamp, ev_result *out);

/* EvidenceVad.stirring: speaking, or a full evidence frame in the window. */
int ev_stirring(const ev_state *s);

#endif
