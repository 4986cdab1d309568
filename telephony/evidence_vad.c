/*
 * audio/evidence_vad.py's EvidenceVad, statement for statement (its docstrings say why each rule
 * is there; this file only says where C has to take care to decide exactly as Python does).
 *
 * Levels: the sum of squares of a frame's samples is an integer below 2^41, exact in a double
 * whichever order it is added in, so the level is the same double numpy and math.log10 compute.
 * Every later expression keeps Python's order of operations, and the extension is compiled with
 * -ffp-contract=off so that no multiply-add is fused where Python rounds twice.
 */
#include "evidence_vad.h"

#include <math.h>
#include <string.h>

#define FRAME_MS 20
#define SPEAKING_RELIEF_DB 3.5
#define NOISE_TAU_MS 400
#define FLOOR_FALL_MAX_DB 0.5
#define LEARN_FRAMES 20
#define ONSET_FULL_FRAMES 2
#define FLOOR_FALL 0.1

enum { NONE = 0, WEAK = 1, FULL = 2 };

static ev_vad_create_fn vad_create;
static ev_vad_init_fn vad_init;
static ev_vad_set_mode_fn vad_set_mode;
static ev_vad_process_fn vad_process;
static ev_vad_free_fn vad_free;

int ev_bind(ev_vad_create_fn create, ev_vad_init_fn init, ev_vad_set_mode_fn set_mode,
            ev_vad_process_fn process, ev_vad_free_fn free_fn) {
    if (!create || !init || !set_mode || !process || !free_fn)
        return -1;
    vad_create = create;
    vad_init = init;
    vad_set_mode = set_mode;
    vad_process = process;
    vad_free = free_fn;
    return 0;
}

int ev_vad_decide(int rate, int mode, const int16_t *pcm, int length, int n, int *out) {
    void *vad = NULL;
    if (!vad_create || length <= 0 || n < 0 || vad_create(&vad) != 0 || !vad)
        return -1;
    int status = -1;
    if (vad_init(vad) == 0 && vad_set_mode(vad, mode) == 0) {
        for (int i = 0; i < n; i++)
            out[i] = vad_process(vad, rate, pcm + (size_t)i * (size_t)length, (size_t)length);
        status = 0;
    }
    vad_free(vad);
    return status;
}

int ev_reset(ev_state *s, int rate, const ev_config *cfg) {
    if (!vad_create || (rate != 8000 && rate != 16000 && rate != 32000 && rate != 48000))
        return -1;
    if (cfg->onset_frames < 1 || cfg->hangover_frames < 1 || cfg->window_frames < 1 ||
        cfg->window_frames > EV_MAX_WINDOW || cfg->warmup_frames < 0 ||
        cfg->aggressiveness < 0 || cfg->aggressiveness > 3)
        return -1;
    if (!s->vad && vad_create(&s->vad) != 0)
        return -1;
    /* Init puts the handle back in the state a new webrtcvad.Vad starts from. */
    if (vad_init(s->vad) != 0 || vad_set_mode(s->vad, cfg->aggressiveness) != 0)
        return -1;
    void *vad = s->vad;
    memset(s, 0, offsetof(ev_state, win_ts));
    s->vad = vad;
    s->cfg = *cfg;
    s->rate = rate;
    s->length = rate / 50;
    s->full_frames = cfg->onset_frames < ONSET_FULL_FRAMES ? cfg->onset_frames : ONSET_FULL_FRAMES;
    s->warmup = cfg->warmup_frames;
    s->rise = cfg->floor_rise_db_s * FRAME_MS / 1000;
    s->alpha = (double)FRAME_MS / NOISE_TAU_MS;
    return 0;
}

static void window_append(ev_state *s, int64_t timestamp, int strength) {
    int cap = s->cfg.window_frames;
    int slot;
    if (s->win_len == cap) {
        slot = s->win_head;
        s->win_head = (s->win_head + 1) % cap;
    } else {
        slot = (s->win_head + s->win_len) % cap;
        s->win_len++;
    }
    s->win_ts[slot] = timestamp;
    s->win_strength[slot] = (uint8_t)strength;
}

static int grade(ev_state *s, const int16_t *pcm) {
    int is_speech = vad_process(s->vad, s->rate, pcm, (size_t)s->length) == 1;
    int64_t energy = 0;
    for (int i = 0; i < s->length; i++)
        energy += (int64_t)pcm[i] * pcm[i];
    if (energy == 0) /* digital silence: every sample zero */
        return NONE;
    if (s->warmup) {
        s->warmup--;
        is_speech = 0;
    }
    double level = 10 * log10((double)energy / s->length + 1.0);
    if (!s->has_floor) {
        s->has_floor = 1;
        s->floor_db = level;
        s->heard = 1;
        return NONE;
    }
    double floor = s->floor_db;
    double margin = s->cfg.margin_db;
    int strength;
    if (!is_speech || level < floor + margin - SPEAKING_RELIEF_DB)
        strength = NONE;
    else if (level >= floor + margin)
        strength = FULL;
    else
        strength = WEAK;
    int evidence = strength == FULL || (strength == WEAK && s->speaking);
    if (s->heard < LEARN_FRAMES) {
        s->heard++;
        s->floor_db = floor + (level - floor) / s->heard;
    } else if (evidence) {
        double risen = floor + s->rise;
        s->floor_db = level <= risen ? level : risen;
    } else if (level < floor) {
        double fall = FLOOR_FALL * (floor - level);
        s->floor_db = floor - (fall <= FLOOR_FALL_MAX_DB ? fall : FLOOR_FALL_MAX_DB);
    } else {
        s->floor_db = floor + s->alpha * (level - floor);
    }
    return strength;
}

void ev_process(ev_state *s, const int16_t *pcm, int64_t timestamp, ev_result *out) {
    int strength = grade(s, pcm);
    window_append(s, timestamp, strength);
    out->kind = EV_NONE;
    out->timestamp = 0;
    if (!s->speaking) {
        if (strength != NONE) {
            int count = 0, full = 0;
            int64_t first = 0;
            for (int i = 0; i < s->win_len; i++) {
                int at = (s->win_head + i) % s->cfg.window_frames;
                if (s->win_strength[at]) {
                    if (!count)
                        first = s->win_ts[at];
                    count++;
                    full += s->win_strength[at] == FULL;
                }
            }
            if (count >= s->cfg.onset_frames && full >= s->full_frames) {
                s->speaking = 1;
                s->quiet = 0;
                s->evidence_ms = (int64_t)count * FRAME_MS;
                out->kind = EV_STARTED;
                out->timestamp = first;
            }
        }
    } else if (strength != NONE) {
        s->quiet = 0;
        s->evidence_ms += FRAME_MS;
    } else if (++s->quiet >= s->cfg.hangover_frames) {
        s->speaking = 0;
        s->evidence_ms = 0;
        s->win_head = s->win_len = 0;
        out->kind = EV_STOPPED;
        out->timestamp = timestamp - (int64_t)(s->cfg.hangover_frames - 1) * s->length;
    }
    out->speech_ms = s->speaking ? s->evidence_ms : 0;
}

int ev_stirring(const ev_state *s) {
    if (s->speaking)
        return 1;
    for (int i = 0; i < s->win_len; i++)
        if (s->win_strength[(s->win_head + i) % s->cfg.window_frames] == FULL)
            return 1;
    return 0;
}
