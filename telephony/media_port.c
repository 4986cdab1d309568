/*
 * A pjmedia port whose frame callbacks run no Python: voicegate's per-call media port in C.
 *
 * PJSIP's conference clock calls get_frame and put_frame of every port of the process, serially,
 * on one thread every 20 ms. A pjsua2 AudioMediaPort makes each of those a SWIG director call into
 * Python, and on this machine the cost of taking the GIL on that thread is paid per tick in which
 * any Python runs there (README, "Benchmarks"). This port instead keeps two rings of whole 20 ms
 * frames; the clock thread only copies into and out of them, and the asyncio side moves frames in
 * batches through the small API below (called from Python with ctypes).
 *
 * Outbound frames carry a tag chosen by the asyncio side; the port records the tag of the last
 * frame it played, so the asyncio side learns exactly which frames the caller has heard. cut()
 * empties the outbound ring under the lock and returns that tag: nothing queued before it plays
 * after it, which is the playback-generation guarantee for barge-in, disconnect and transfer.
 *
 * The caller's frames can also go through the evidence detector (evidence_vad.c) on the clock
 * thread. It runs under a lock of its own, taken before the port's: the asyncio side calls in
 * through ctypes.PyDLL and so holds the GIL while it waits for the port's lock, and that lock only
 * ever guards copies. A clock thread preempted in the middle of a frame of detection then stalls
 * no Python thread. Lock order: det_lock, then lock.
 *
 * The port is reused call after call and never freed: attach() starts a new epoch, and every call
 * made with an older epoch (a call that ended, seen late by asyncio) is refused with -1.
 *
 * The pjmedia structures are declared here by hand for the one PJSIP release voicegate is pinned
 * to (pjsua2-python 2.15.1, x86-64 / aarch64 LP64). vg_port_layout_ok() and the Python side check
 * them at start-up, and voicegate falls back to its Python port if anything disagrees.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "evidence_vad.h"

/* --- pjmedia 2.15.1 declarations (pjmedia/port.h, format.h, frame.h) ------------------------ */

typedef struct {
    char *ptr;
    long slen;
} pj_str;

typedef struct {
    uint32_t clock_rate, channel_count, frame_time_usec, bits_per_sample, avg_bps, max_bps;
} pjm_audio_detail;

typedef struct {
    uint32_t id;
    int type;
    int detail_type;
    union {
        pjm_audio_detail aud;
        uint32_t vid[6];
        char user[1];
    } det;
} pjm_format;

typedef struct {
    pj_str name;
    uint32_t signature;
    int dir;
    pjm_format fmt;
} pjm_port_info;

enum { PJM_FRAME_NONE = 0, PJM_FRAME_AUDIO = 1 };

typedef struct {
    int type;
    void *buf;
    size_t size;
    uint64_t timestamp;
    uint32_t bit_info;
} pjm_frame;

typedef struct pjm_port pjm_port;
struct pjm_port {
    pjm_port_info info;
    struct {
        void *pdata;
        long ldata;
    } port_data;
    void *grp_lock;
    void *(*get_clock_src)(pjm_port *, int);
    int (*put_frame)(pjm_port *, pjm_frame *);
    int (*get_frame)(pjm_port *, pjm_frame *);
    int (*on_destroy)(pjm_port *);
};

typedef int (*port_info_init_fn)(pjm_port_info *, const pj_str *, unsigned, unsigned, unsigned,
                                 unsigned, unsigned);

/* --- the port ------------------------------------------------------------------------------- */

/* What the asyncio side reads back; field order is mirrored in telephony/c_media_port.py. */
typedef struct {
    uint64_t ticks;        /* get_frame calls this epoch: the media ticks seen */
    uint64_t played;       /* outbound frames played this epoch */
    uint64_t last_tag;     /* tag of the last outbound frame played (0: none yet) */
    uint64_t underruns;    /* dry spells: the ring ran out right after audio while more was due */
    uint64_t last_audio_ns; /* CLOCK_MONOTONIC at the last outbound frame played */
    uint64_t rx_frames;    /* caller frames received this epoch */
    uint64_t rx_overflow;  /* caller frames dropped because the asyncio side fell behind */
    uint32_t out_queued;   /* outbound frames waiting in the ring */
    uint32_t in_queued;    /* caller frames waiting in the ring */
    uint64_t rec_overflow; /* detector records dropped because the asyncio side fell behind */
    uint32_t detecting;    /* the caller's frames go through the evidence detector */
    uint32_t stirring;     /* its EvidenceVad.stirring after the last frame */
} vg_status;

/* A caller frame the detector made worth Python's attention: its index in this epoch, ev_result's
 * kind, timestamp and speech_ms. That is a frame with an event, and while the caller speaks,
 * every frame, or once marks are set only the frames on which speech_ms reaches one of them
 * (what barge-in and caller turns wait for: nothing else changes on the frames in between). */
enum { REC_FIELDS = 4, REC_CAP = 512, MAX_BOUNDS = 15, MAX_MARKS = 4 };

typedef struct {
    pjm_port base; /* first: PJSIP's pointer to the port is a pointer to this */
    pthread_mutex_t lock;
    /* Guards det, n_marks, marks, last_speech_ms and st.detecting's changes; rx_frames changes
     * under both locks. */
    pthread_mutex_t det_lock;
    char name[48];
    uint32_t frame_bytes;
    uint64_t epoch;
    uint8_t *out_buf;
    uint64_t *out_tags;
    uint32_t out_cap, out_head, out_len;
    uint8_t *in_buf;
    uint32_t in_cap, in_head, in_len;
    int sounding;
    int more_due;
    vg_status st;
    /* The detector, made at the first vg_port_detect; on only while st.detecting. */
    ev_state *det;
    int64_t *recs;
    uint32_t rec_head, rec_len;
    uint32_t n_marks;
    int64_t marks[MAX_MARKS];
    int64_t last_speech_ms;
    /* Its time per frame, as voicegate_frame_pipeline_seconds buckets it (bounds in ns). */
    uint32_t n_bounds;
    uint64_t bounds_ns[MAX_BOUNDS];
    uint64_t timing[MAX_BOUNDS + 1];
    uint64_t timing_ns;
} vg_port;

static uint64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Clock thread: the next outbound frame, or silence. Always audio, as the Python port did, so the
 * call's stream sends a packet every tick whatever the agent does. */
static int vg_get_frame(pjm_port *base, pjm_frame *frame) {
    vg_port *p = (vg_port *)base;
    size_t n = p->frame_bytes;
    if (frame->size < n)
        n = frame->size;
    pthread_mutex_lock(&p->lock);
    p->st.ticks++;
    if (p->out_len) {
        memcpy(frame->buf, p->out_buf + (size_t)p->out_head * p->frame_bytes, n);
        p->st.last_tag = p->out_tags[p->out_head];
        p->out_head = (p->out_head + 1) % p->out_cap;
        p->out_len--;
        p->st.played++;
        p->st.last_audio_ns = monotonic_ns();
        p->sounding = 1;
    } else {
        memset(frame->buf, 0, n);
        if (p->sounding && p->more_due)
            p->st.underruns++;
        p->sounding = 0;
    }
    pthread_mutex_unlock(&p->lock);
    frame->type = PJM_FRAME_AUDIO;
    frame->size = n;
    return 0;
}

/* Clock thread, det_lock held (not the port's lock): the caller's frame pcm through the detector
 * into *r; how long it took into *spent. 1 when Python has something to do with the frame (it
 * becomes a record), else 0. */
static int detect(vg_port *p, const int16_t *pcm, ev_result *r, uint64_t *spent) {
    uint64_t started = monotonic_ns();
    ev_process(p->det, pcm, (int64_t)p->st.rx_frames * p->det->length, r);
    *spent = monotonic_ns() - started;
    int keep = r->kind != EV_NONE || (r->speech_ms && !p->n_marks);
    for (uint32_t i = 0; i < p->n_marks && !keep; i++)
        keep = p->last_speech_ms < p->marks[i] && r->speech_ms >= p->marks[i];
    p->last_speech_ms = r->speech_ms;
    return keep;
}

/* Clock thread, both locks held: what detect() made of the frame, into the timing buckets, the
 * status and (keep) the records. */
static void note_detection(vg_port *p, const ev_result *r, uint64_t spent, int keep) {
    uint32_t bucket = 0;
    while (bucket < p->n_bounds && spent > p->bounds_ns[bucket])
        bucket++;
    p->timing[bucket]++;
    p->timing_ns += spent;
    p->st.stirring = (uint32_t)ev_stirring(p->det);
    if (!keep)
        return;
    uint32_t slot;
    if (p->rec_len == REC_CAP) {
        slot = p->rec_head;
        p->rec_head = (p->rec_head + 1) % REC_CAP;
        p->st.rec_overflow++;
    } else {
        slot = (p->rec_head + p->rec_len) % REC_CAP;
        p->rec_len++;
    }
    int64_t *rec = p->recs + (size_t)slot * REC_FIELDS;
    rec[0] = (int64_t)p->st.rx_frames;
    rec[1] = r->kind;
    rec[2] = r->timestamp;
    rec[3] = r->speech_ms;
}

/* Clock thread: one frame of the caller. The bridge also sends an empty frame every tick to a
 * port nothing transmits to; that is not caller audio. */
static int vg_put_frame(pjm_port *base, pjm_frame *frame) {
    vg_port *p = (vg_port *)base;
    if (frame->type != PJM_FRAME_AUDIO || frame->size != p->frame_bytes)
        return 0;
    pthread_mutex_lock(&p->det_lock);
    ev_result r;
    uint64_t spent = 0;
    int detecting = p->st.detecting, keep = 0;
    if (detecting)
        keep = detect(p, (const int16_t *)frame->buf, &r, &spent);
    pthread_mutex_lock(&p->lock);
    uint32_t slot;
    if (p->in_len == p->in_cap) {
        /* Keep the newest second of audio: drop the oldest frame. */
        slot = p->in_head;
        p->in_head = (p->in_head + 1) % p->in_cap;
        p->st.rx_overflow++;
    } else {
        slot = (p->in_head + p->in_len) % p->in_cap;
        p->in_len++;
    }
    uint8_t *pcm = p->in_buf + (size_t)slot * p->frame_bytes;
    memcpy(pcm, frame->buf, p->frame_bytes);
    if (detecting)
        note_detection(p, &r, spent, keep);
    p->st.rx_frames++;
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_unlock(&p->det_lock);
    return 0;
}

/* --- the asyncio side's API ------------------------------------------------------------------ */

static int lock_epoch(vg_port *p, uint64_t epoch);
static int lock_det_epoch(vg_port *p, uint64_t epoch);
static void unlock_det(vg_port *p);

/* A new port of frame_bytes-byte frames holding out_cap outbound and in_cap caller frames, with
 * its pjmedia info filled by PJSIP's own pjmedia_port_info_init. NULL on bad arguments or when
 * out of memory. */
void *vg_port_new(const char *name, void *info_init, uint32_t clock_rate, uint32_t frame_bytes,
                  uint32_t out_cap, uint32_t in_cap) {
    if (!info_init || !clock_rate || frame_bytes < 2 || frame_bytes % 2 || !out_cap || !in_cap)
        return NULL;
    vg_port *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->out_buf = calloc(out_cap, frame_bytes);
    p->out_tags = calloc(out_cap, sizeof(uint64_t));
    p->in_buf = calloc(in_cap, frame_bytes);
    if (!p->out_buf || !p->out_tags || !p->in_buf || pthread_mutex_init(&p->lock, NULL) ||
        pthread_mutex_init(&p->det_lock, NULL)) {
        free(p->out_buf);
        free(p->out_tags);
        free(p->in_buf);
        free(p);
        return NULL;
    }
    strncpy(p->name, name, sizeof(p->name) - 1);
    p->frame_bytes = frame_bytes;
    p->out_cap = out_cap;
    p->in_cap = in_cap;
    pj_str pname = {p->name, (long)strlen(p->name)};
    /* 'V','G','P','T': PJMEDIA_SIGNATURE-style four characters of our own. */
    uint32_t signature = ((uint32_t)'V' << 24) | ((uint32_t)'G' << 16) | ('P' << 8) | 'T';
    ((port_info_init_fn)info_init)(&p->base.info, &pname, signature, clock_rate, 1, 16,
                                   frame_bytes / 2);
    p->base.put_frame = vg_put_frame;
    p->base.get_frame = vg_get_frame;
    return p;
}

/* Whether PJSIP filled the info where this file expects it: the audio format of a 20 ms mono
 * 16-bit port at clock_rate. */
int vg_port_layout_ok(void *port, uint32_t clock_rate) {
    vg_port *p = port;
    const pjm_audio_detail *aud = &p->base.info.fmt.det.aud;
    return p->base.info.name.ptr == p->name && aud->clock_rate == clock_rate &&
           aud->channel_count == 1 && aud->bits_per_sample == 16 &&
           aud->frame_time_usec == p->frame_bytes / 2 * 1000000u / clock_rate &&
           offsetof(pjm_port, port_data) == 64 && offsetof(pjm_port, put_frame) == 96 &&
           offsetof(pjm_port, get_frame) == 104 && sizeof(pjm_frame) == 40;
}

/* Serve a new call from the next tick on: empty both rings, zero the counters, and return the
 * new epoch every later call must give. */
uint64_t vg_port_attach(void *port) {
    vg_port *p = port;
    pthread_mutex_lock(&p->det_lock);
    pthread_mutex_lock(&p->lock);
    uint64_t epoch = ++p->epoch;
    p->out_head = p->out_len = p->in_head = p->in_len = 0;
    p->sounding = p->more_due = 0;
    memset(&p->st, 0, sizeof(p->st));
    p->rec_head = p->rec_len = 0;
    p->n_marks = 0;
    p->last_speech_ms = 0;
    memset(p->timing, 0, sizeof(p->timing));
    p->timing_ns = 0;
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_unlock(&p->det_lock);
    return epoch;
}

/* Record speaking frames only where speech_ms reaches one of marks (at most MAX_MARKS; none:
 * every speaking frame again). 0, -1 for a stale epoch, -2 for too many. */
int vg_port_marks(void *port, uint64_t epoch, const int64_t *marks, uint32_t n) {
    vg_port *p = port;
    if (n > MAX_MARKS)
        return -2;
    if (!lock_det_epoch(p, epoch))
        return -1;
    memcpy(p->marks, marks, n * sizeof(int64_t));
    p->n_marks = n;
    unlock_det(p);
    return 0;
}

/* Give the detector webrtcvad's C functions (from the webrtcvad wheel's library): 0, or -1. */
int vg_vad_bind(void *create, void *init, void *set_mode, void *process, void *free_fn) {
    return ev_bind((ev_vad_create_fn)create, (ev_vad_init_fn)init, (ev_vad_set_mode_fn)set_mode,
                   (ev_vad_process_fn)process, (ev_vad_free_fn)free_fn);
}

/* ev_vad_decide, for the check at start (telephony/c_media_port.py). */
int vg_vad_decide(int rate, int mode, const int16_t *pcm, int length, int n, int *out) {
    return ev_vad_decide(rate, mode, pcm, length, n, out);
}

/* Run this epoch's caller frames through the evidence detector from the next one on, fresh, with
 * cfg; time each frame into the buckets bounds_ns (ascending, at most MAX_BOUNDS; the last
 * bucket is everything above). 0; -1 for a stale epoch; -2 if the detector cannot run (webrtcvad
 * not bound, a configuration it refuses, out of memory). */
int vg_port_detect(void *port, uint64_t epoch, const ev_config *cfg, const uint64_t *bounds_ns,
                   uint32_t n_bounds) {
    vg_port *p = port;
    if (n_bounds > MAX_BOUNDS)
        return -2;
    if (!lock_det_epoch(p, epoch))
        return -1;
    int status = 0;
    if (!p->det)
        p->det = calloc(1, sizeof(*p->det));
    if (!p->recs)
        p->recs = calloc((size_t)REC_CAP * REC_FIELDS, sizeof(int64_t));
    uint32_t rate = p->base.info.fmt.det.aud.clock_rate;
    p->st.stirring = 0; /* fresh, or not detecting at all */
    if (!p->det || !p->recs || ev_reset(p->det, (int)rate, cfg) != 0) {
        p->st.detecting = 0;
        status = -2;
    } else {
        p->st.detecting = 1;
        p->rec_head = p->rec_len = 0;
        p->last_speech_ms = 0;
        p->n_bounds = n_bounds;
        memcpy(p->bounds_ns, bounds_ns, n_bounds * sizeof(uint64_t));
        memset(p->timing, 0, sizeof(p->timing));
        p->timing_ns = 0;
    }
    unlock_det(p);
    return status;
}

static void fill_status(vg_port *p, vg_status *out) {
    if (out) {
        *out = p->st;
        out->out_queued = p->out_len;
        out->in_queued = p->in_len;
    }
}

/* Take the port's lock for a call of this epoch: 1 with the lock held, or 0 (lock released) when
 * the port already serves another call. */
static int lock_epoch(vg_port *p, uint64_t epoch) {
    pthread_mutex_lock(&p->lock);
    if (epoch == p->epoch)
        return 1;
    pthread_mutex_unlock(&p->lock);
    return 0;
}

/* lock_epoch, with the detector's lock taken first: for the calls that change the detector. */
static int lock_det_epoch(vg_port *p, uint64_t epoch) {
    pthread_mutex_lock(&p->det_lock);
    if (lock_epoch(p, epoch))
        return 1;
    pthread_mutex_unlock(&p->det_lock);
    return 0;
}

static void unlock_det(vg_port *p) {
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_unlock(&p->det_lock);
}

/* Queue up to n frames (n * frame_bytes bytes at pcm) tagged first_tag, first_tag + 1, ...; say
 * whether more audio is due after them (so a ring that runs dry counts as an underrun). Returns
 * the frames queued (fewer when the ring is full), or -1 for a stale epoch. */
int vg_port_push(void *port, uint64_t epoch, const uint8_t *pcm, uint32_t n, uint64_t first_tag,
                 int more_due, vg_status *out) {
    vg_port *p = port;
    if (!lock_epoch(p, epoch))
        return -1;
    uint32_t room = p->out_cap - p->out_len;
    uint32_t take = n < room ? n : room;
    for (uint32_t i = 0; i < take; i++) {
        uint32_t slot = (p->out_head + p->out_len) % p->out_cap;
        memcpy(p->out_buf + (size_t)slot * p->frame_bytes, pcm + (size_t)i * p->frame_bytes,
               p->frame_bytes);
        p->out_tags[slot] = first_tag + i;
        p->out_len++;
    }
    p->more_due = more_due;
    fill_status(p, out);
    pthread_mutex_unlock(&p->lock);
    return (int)take;
}

/* Drop every outbound frame not yet played; the status says which one played last. 0, or -1 for
 * a stale epoch. */
int vg_port_cut(void *port, uint64_t epoch, vg_status *out) {
    vg_port *p = port;
    if (!lock_epoch(p, epoch))
        return -1;
    p->out_head = p->out_len = 0;
    p->more_due = 0;
    p->sounding = 0;
    fill_status(p, out);
    pthread_mutex_unlock(&p->lock);
    return 0;
}

/* Move up to max caller frames, oldest first, to dst (max * frame_bytes bytes). Returns the
 * frames moved, or -1 for a stale epoch. */
int vg_port_take(void *port, uint64_t epoch, uint8_t *dst, uint32_t max, vg_status *out) {
    vg_port *p = port;
    if (!lock_epoch(p, epoch))
        return -1;
    uint32_t n = p->in_len < max ? p->in_len : max;
    for (uint32_t i = 0; i < n; i++) {
        memcpy(dst + (size_t)i * p->frame_bytes, p->in_buf + (size_t)p->in_head * p->frame_bytes,
               p->frame_bytes);
        p->in_head = (p->in_head + 1) % p->in_cap;
    }
    p->in_len -= n;
    fill_status(p, out);
    pthread_mutex_unlock(&p->lock);
    return (int)n;
}

/* The detector's side of vg_port_take: every caller frame waiting leaves the ring, copied to
 * pcm (up to max frames, the newest; NULL: none wanted) and its records to recs (up to max_recs,
 * REC_FIELDS each, oldest first; *n_recs says how many). timing gets the frame times since the
 * last drain: n_bounds + 1 bucket counts, then their sum in ns; they start again from zero.
 * Returns the frames copied, or -1 for a stale epoch. */
int vg_port_drain(void *port, uint64_t epoch, uint8_t *pcm, uint32_t max, int64_t *recs,
                  uint32_t max_recs, uint32_t *n_recs, uint64_t *timing, vg_status *out) {
    vg_port *p = port;
    if (!lock_epoch(p, epoch))
        return -1;
    uint32_t skip = p->in_len > max ? p->in_len - max : 0;
    uint32_t n = pcm ? p->in_len - skip : 0;
    uint32_t head = (p->in_head + skip) % p->in_cap;
    for (uint32_t i = 0; i < n; i++) {
        memcpy(pcm + (size_t)i * p->frame_bytes, p->in_buf + (size_t)head * p->frame_bytes,
               p->frame_bytes);
        head = (head + 1) % p->in_cap;
    }
    p->in_head = p->in_len = 0;
    uint32_t r = p->rec_len < max_recs ? p->rec_len : max_recs;
    for (uint32_t i = 0; i < r; i++) {
        memcpy(recs + (size_t)i * REC_FIELDS, p->recs + (size_t)p->rec_head * REC_FIELDS,
               REC_FIELDS * sizeof(int64_t));
        p->rec_head = (p->rec_head + 1) % REC_CAP;
    }
    p->rec_len -= r;
    *n_recs = r;
    memcpy(timing, p->timing, (p->n_bounds + 1) * sizeof(uint64_t));
    timing[p->n_bounds + 1] = p->timing_ns;
    memset(p->timing, 0, sizeof(p->timing));
    p->timing_ns = 0;
    fill_status(p, out);
    pthread_mutex_unlock(&p->lock);
    return (int)n;
}

/* The counters alone. 0, or -1 for a stale epoch. */
int vg_port_status(void *port, uint64_t epoch, vg_status *out) {
    vg_port *p = port;
    if (!lock_epoch(p, epoch))
        return -1;
    fill_status(p, out);
    pthread_mutex_unlock(&p->lock);
    return 0;
}

/* For tests without a conference bridge: run the clock's two callbacks once each, as the bridge
 * does every tick, with an outbound buffer of frame_bytes bytes at out (NULL: a heartbeat only) and
 * caller audio at in (NULL: the empty frame of a port nothing transmits to). */
void vg_port_tick(void *port, uint8_t *out, const uint8_t *in) {
    vg_port *p = port;
    pjm_frame f = {PJM_FRAME_NONE, NULL, 0, 0, 0};
    if (out) {
        f.buf = out;
        f.size = p->frame_bytes;
        p->base.get_frame(&p->base, &f);
    }
    pjm_frame g = {in ? PJM_FRAME_AUDIO : PJM_FRAME_NONE, (void *)in, in ? p->frame_bytes : 0, 0,
                   0};
    p->base.put_frame(&p->base, &g);
}
