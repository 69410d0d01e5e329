/*
 * cost_calib.c - the cost model's calibration: measured codec speeds and network alpha /
 * beta, their versioned text form, and the lookup a model does for each tensor's spec.
 *
 * Text form (docs/COST_MODEL.md), one record a line, so that a user can read and edit it:
 *
 *     gradcomp-calibration 3
 *     # comments
 *     info KEY VALUE...
 *     codec SPEC encode_fixed_s=X encode_per_elem=X decode_fixed_s=X decode_per_elem=X
 *     net LABEL ranks=N latency=X bandwidth=X ring_bandwidth=X [burst=X]
 *
 * SPEC is canonical without seed= (the seed changes no speed).  Numbers are written with
 * 17 significant digits so a file read back evaluates to the same bits.  Rejected: JSON
 * (the library has no JSON reader, and a line format needs none); a binary blob (users
 * edit calibrations and diff them between machines).
 *
 * Lookup: the exact seedless spec, interpolated in log n between the sizes it was measured
 * at (per-element cost changes as a tensor outgrows the caches); else the same codec
 * measured with other parameters,
 * scaled where a parameter sets the work (decode of a sparse message is proportional to
 * the kept elements: density; PowerSGD's products to the rank); else 1 ns per element,
 * marked uncalibrated.
 *
 * Measuring (gcomp_cost_calibrate_codec): a synthetic heavy-tailed gradient, buffers
 * touched before timing (a fresh page costs ~10 us to fault in on these VMs, more than
 * encoding it), the median of `runs`, at n and n/8 to fit fixed + per_elem * n.
 */
#define _DEFAULT_SOURCE
#include "cost_internal.h"

#include <ctype.h>
#include <stdarg.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define DEFAULT_PER_ELEM 1e-9

struct gcomp_cost_calibration {
    gcomp_cost_codec_rate *codec;
    size_t ncodec, capcodec;
    gcomp_cost_net_rate *net;
    size_t nnet, capnet;
    char *info; /* "info" lines, kept verbatim */
    size_t infolen;
};

gcomp_status gcomp_cost_calibration_create(gcomp_cost_calibration **out) {
    if (!out) return GCOMP_E_ARG;
    *out = gcomp__calloc(sizeof **out);
    return *out ? GCOMP_OK : GCOMP_E_NOMEM;
}

void gcomp_cost_calibration_free(gcomp_cost_calibration *cal) {
    if (!cal) return;
    gcomp__free(cal->codec);
    gcomp__free(cal->net);
    gcomp__free(cal->info);
    gcomp__free(cal);
}

void gcomp__cost_seedless(const char *canon, char *out, size_t cap) {
    const char *sp = strstr(canon, ",seed=");
    if (!sp) {
        snprintf(out, cap, "%s", canon);
        return;
    }
    const char *rest = sp + 6 + strcspn(sp + 6, ",");
    snprintf(out, cap, "%.*s%s", (int)(sp - canon), canon, rest);
}

double gcomp__cost_spec_num(const char *canon, const char *key, double dflt) {
    double v;
    return gcomp_spec_get_number(canon, key, &v, NULL) == GCOMP_OK ? v : dflt;
}

static bool bad_num(double v) {
    return !(v >= 0) || !isfinite(v);
}

gcomp_status gcomp_cost_calibration_add_codec(gcomp_cost_calibration *cal,
                                              const gcomp_cost_codec_rate *rate, gcomp_error *err) {
    if (!cal || !rate) return gcomp__fail(err, GCOMP_E_ARG, "calibration: NULL argument");
    if (bad_num(rate->encode_fixed_s) || bad_num(rate->encode_per_elem) ||
        bad_num(rate->decode_fixed_s) || bad_num(rate->decode_per_elem))
        return gcomp__fail(err, GCOMP_E_ARG, "calibration: %s: times must be finite and >= 0",
                           rate->spec);
    char canon[GCOMP__SPEC_MAX], key[sizeof rate->spec];
    gcomp_status st = gcomp_spec_canonical(rate->spec, canon, sizeof canon, NULL, err);
    if (st != GCOMP_OK) return st;
    gcomp__cost_seedless(canon, key, sizeof key);
    /* A spec has one rate for every size or rates at sizes, never both: a rate for any
     * size replaces the sized ones, a sized one the rate for any size. */
    size_t k = 0;
    for (size_t j = 0; j < cal->ncodec; j++)
        if (strcmp(cal->codec[j].spec, key) || (rate->elements && cal->codec[j].elements))
            cal->codec[k++] = cal->codec[j];
    cal->ncodec = k;
    size_t i = 0;
    while (i < cal->ncodec &&
           (strcmp(cal->codec[i].spec, key) || cal->codec[i].elements != rate->elements))
        i++;
    if (i == cal->capcodec) {
        size_t cap = cal->capcodec ? 2 * cal->capcodec : 16;
        gcomp_cost_codec_rate *p = gcomp__alloc(cap * sizeof *p);
        if (!p) return gcomp__fail(err, GCOMP_E_NOMEM, "calibration: out of memory");
        if (cal->ncodec) memcpy(p, cal->codec, cal->ncodec * sizeof *p);
        gcomp__free(cal->codec);
        cal->codec = p;
        cal->capcodec = cap;
    }
    cal->codec[i] = *rate;
    snprintf(cal->codec[i].spec, sizeof cal->codec[i].spec, "%s", key);
    if (i == cal->ncodec) cal->ncodec++;
    return GCOMP_OK;
}

gcomp_status gcomp_cost_calibration_add_net(gcomp_cost_calibration *cal,
                                            const gcomp_cost_net_rate *rate) {
    if (!cal || !rate || !rate->label[0] || strpbrk(rate->label, " \t\r\n") || rate->ranks < 1 ||
        bad_num(rate->latency) || !(rate->bandwidth > 0) || !isfinite(rate->bandwidth) ||
        bad_num(rate->ring_bandwidth) || bad_num(rate->burst))
        return GCOMP_E_ARG;
    size_t i = 0;
    while (i < cal->nnet && strcmp(cal->net[i].label, rate->label)) i++;
    if (i == cal->capnet) {
        size_t cap = cal->capnet ? 2 * cal->capnet : 4;
        gcomp_cost_net_rate *p = gcomp__alloc(cap * sizeof *p);
        if (!p) return GCOMP_E_NOMEM;
        if (cal->nnet) memcpy(p, cal->net, cal->nnet * sizeof *p);
        gcomp__free(cal->net);
        cal->net = p;
        cal->capnet = cap;
    }
    cal->net[i] = *rate;
    if (i == cal->nnet) cal->nnet++;
    return GCOMP_OK;
}

gcomp_status gcomp_cost_link_measured(const gcomp_cost_net_rate *rate, gcomp_cost_link *out) {
    if (!rate || !out || !(rate->bandwidth > 0)) return GCOMP_E_ARG;
    out->latency = rate->latency;
    out->burst = rate->burst;
    out->bandwidth = rate->ring_bandwidth > 0 && rate->ring_bandwidth < rate->bandwidth
                         ? rate->ring_bandwidth
                         : rate->bandwidth;
    return GCOMP_OK;
}

size_t gcomp_cost_calibration_codecs(const gcomp_cost_calibration *cal) {
    return cal ? cal->ncodec : 0;
}

const gcomp_cost_codec_rate *gcomp_cost_calibration_codec(const gcomp_cost_calibration *cal,
                                                          size_t i) {
    return cal && i < cal->ncodec ? &cal->codec[i] : NULL;
}

const gcomp_cost_net_rate *gcomp_cost_calibration_net(const gcomp_cost_calibration *cal,
                                                      const char *label) {
    for (size_t i = 0; cal && label && i < cal->nnet; i++)
        if (!strcmp(cal->net[i].label, label)) return &cal->net[i];
    return NULL;
}

/* ---- text form ------------------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t cap, len;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *dst = b->p && b->len < b->cap ? b->p + b->len : NULL;
    int w = vsnprintf(dst, dst ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (w > 0) b->len += (size_t)w;
}

gcomp_status gcomp_cost_calibration_format(const gcomp_cost_calibration *cal, char *out, size_t cap,
                                           size_t *len) {
    if (!cal) return GCOMP_E_ARG;
    sbuf b = {out, out ? cap : 0, 0};
    put(&b, "gradcomp-calibration %d\n", GCOMP_COST_CALIBRATION_VERSION);
    put(&b, "# codec SPEC [elements=N]: seconds per encode / decode-add = fixed + per_elem * "
            "elements, measured at N elements (none: any size)\n"
            "# net LABEL: latency (s, half a ping-pong round trip), bandwidth (bytes/s one "
            "way), ring_bandwidth (bytes/s of a ring allreduce: 2(P-1)/P n / its time "
            "less its codec's), burst (bytes a transfer after idle got through at once)\n");
    if (cal->info) put(&b, "%s", cal->info);
    for (size_t i = 0; i < cal->ncodec; i++) {
        const gcomp_cost_codec_rate *r = &cal->codec[i];
        put(&b, "codec %s", r->spec);
        if (r->elements) put(&b, " elements=%zu", r->elements);
        put(&b,
            " encode_fixed_s=%.17g encode_per_elem=%.17g decode_fixed_s=%.17g "
            "decode_per_elem=%.17g\n",
            r->encode_fixed_s, r->encode_per_elem, r->decode_fixed_s, r->decode_per_elem);
    }
    for (size_t i = 0; i < cal->nnet; i++) {
        const gcomp_cost_net_rate *r = &cal->net[i];
        put(&b, "net %s ranks=%d latency=%.17g bandwidth=%.17g ring_bandwidth=%.17g", r->label,
            r->ranks, r->latency, r->bandwidth, r->ring_bandwidth);
        put(&b, r->burst > 0 ? " burst=%.17g\n" : "\n", r->burst);
    }
    if (len) *len = b.len;
    if (!out || b.len >= cap) return GCOMP_E_DST_SIZE;
    return GCOMP_OK;
}

/* Reads `key=number` items of `rest` into the named slots; 0 on success. */
static int read_items(char *rest, const char *const *keys, double *vals, size_t nkeys,
                      const char **bad) {
    for (char *tok = strtok(rest, " \t"); tok; tok = strtok(NULL, " \t")) {
        char *eq = strchr(tok, '=');
        *bad = tok;
        if (!eq) return -1;
        *eq = 0;
        size_t k = 0;
        while (k < nkeys && strcmp(keys[k], tok)) k++;
        if (k == nkeys) return -1;
        char *end;
        errno = 0;
        vals[k] = strtod(eq + 1, &end);
        if (*end || end == eq + 1 || errno || bad_num(vals[k])) return -1;
    }
    return 0;
}

gcomp_status gcomp_cost_calibration_parse(gcomp_cost_calibration **out, const char *text,
                                          size_t len, gcomp_error *err) {
    if (!out || !text) return gcomp__fail(err, GCOMP_E_ARG, "calibration: NULL argument");
    *out = NULL;
    static const char magic[] = "gradcomp-calibration ";
    if (len < sizeof magic - 1 || memcmp(text, magic, sizeof magic - 1))
        return gcomp__fail(err, GCOMP_E_BAD_MAGIC,
                           "calibration: not a gradcomp calibration (first line must be "
                           "'gradcomp-calibration %d')",
                           GCOMP_COST_CALIBRATION_VERSION);
    gcomp_cost_calibration *cal;
    if (gcomp_cost_calibration_create(&cal) != GCOMP_OK)
        return gcomp__fail(err, GCOMP_E_NOMEM, "calibration: out of memory");
    gcomp_status st = GCOMP_OK;
    size_t pos = 0, lineno = 0;
    char line[1024];
    while (pos < len && st == GCOMP_OK) {
        size_t e = pos;
        while (e < len && text[e] != '\n') e++;
        lineno++;
        size_t l = e - pos;
        if (l >= sizeof line) {
            st = gcomp__fail(err, GCOMP_E_CORRUPT, "calibration: line %zu longer than %zu", lineno,
                             sizeof line - 1);
            break;
        }
        memcpy(line, text + pos, l);
        line[l] = 0;
        pos = e + 1;
        if (l && line[l - 1] == '\r') line[--l] = 0;
        char *s = line;
        while (isspace((unsigned char)*s)) s++;
        if (!*s || *s == '#') continue;
        if (lineno == 1) {
            char *end;
            long v = strtol(s + sizeof magic - 1, &end, 10);
            if (*end || v < 1) {
                st = gcomp__fail(err, GCOMP_E_CORRUPT, "calibration: line 1: bad version");
            } else if (v > GCOMP_COST_CALIBRATION_VERSION) {
                st = gcomp__fail(err, GCOMP_E_VERSION,
                                 "calibration: format version %ld is newer than this library's %d",
                                 v, GCOMP_COST_CALIBRATION_VERSION);
            }
            continue;
        }
        char *kind = strtok(s, " \t"), *name = strtok(NULL, " \t"), *rest = strtok(NULL, "");
        const char *bad = name ? name : kind;
        if (!strcmp(kind, "info")) {
            size_t need = cal->infolen + l + 2;
            char *p = gcomp__alloc(need);
            if (!p) {
                st = gcomp__fail(err, GCOMP_E_NOMEM, "calibration: out of memory");
                break;
            }
            if (cal->infolen) memcpy(p, cal->info, cal->infolen);
            memcpy(p + cal->infolen, text + pos - l - 1, l);
            p[cal->infolen + l] = '\n';
            p[cal->infolen + l + 1] = 0;
            gcomp__free(cal->info);
            cal->info = p;
            cal->infolen += l + 1;
            continue;
        }
        if (name && rest && !strcmp(kind, "codec")) {
            static const char *const keys[] = {"encode_fixed_s", "encode_per_elem",
                                               "decode_fixed_s", "decode_per_elem", "elements"};
            double v[5] = {-1, -1, -1, -1, 0};
            gcomp_cost_codec_rate r = {0};
            if (read_items(rest, keys, v, 5, &bad) == 0 && v[0] >= 0 && v[1] >= 0 && v[2] >= 0 &&
                v[3] >= 0 && v[4] == floor(v[4]) && v[4] < 0x1p53 && strlen(name) < sizeof r.spec) {
                snprintf(r.spec, sizeof r.spec, "%s", name);
                r.encode_fixed_s = v[0];
                r.encode_per_elem = v[1];
                r.decode_fixed_s = v[2];
                r.decode_per_elem = v[3];
                r.elements = (size_t)v[4];
                gcomp_error e2;
                st = gcomp_cost_calibration_add_codec(cal, &r, &e2);
                if (st != GCOMP_OK)
                    st = gcomp__fail(err, st == GCOMP_E_NOMEM ? st : GCOMP_E_CORRUPT,
                                     "calibration: line %zu: %s", lineno, e2.message);
                continue;
            }
        } else if (name && rest && !strcmp(kind, "net")) {
            static const char *const keys[] = {"ranks", "latency", "bandwidth", "ring_bandwidth",
                                               "burst"};
            double v[5] = {-1, -1, -1, 0, 0};
            gcomp_cost_net_rate r = {0};
            if (read_items(rest, keys, v, 5, &bad) == 0 && v[0] >= 1 && v[0] < 1e9 && v[1] >= 0 &&
                v[2] > 0 && strlen(name) < sizeof r.label) {
                snprintf(r.label, sizeof r.label, "%s", name);
                r.ranks = (int)v[0];
                r.latency = v[1];
                r.bandwidth = v[2];
                r.ring_bandwidth = v[3];
                r.burst = v[4];
                st = gcomp_cost_calibration_add_net(cal, &r);
                if (st != GCOMP_OK)
                    st = gcomp__fail(err, st, "calibration: line %zu: bad net record", lineno);
                continue;
            }
        }
        st = gcomp__fail(err, GCOMP_E_CORRUPT,
                         "calibration: line %zu: cannot read '%s' (expected `codec SPEC "
                         "[elements=..] encode_fixed_s=.. encode_per_elem=.. decode_fixed_s=.. "
                         "decode_per_elem=..`, `net LABEL ranks=.. latency=.. bandwidth=.. "
                         "[ring_bandwidth=..] [burst=..]` or `info ...`)",
                         lineno, bad ? bad : "");
    }
    if (st != GCOMP_OK) {
        gcomp_cost_calibration_free(cal);
        return st;
    }
    *out = cal;
    return GCOMP_OK;
}

/* ---- lookup ----------------------------------------------------------------------------- */

static size_t name_len(const char *canon) {
    return strcspn(canon, ":");
}

/* The rate of exactly `spec` for a tensor of n elements, from its records: one for any
 * size (elements 0) if there is one; else the sized ones around n, blended in log n (the
 * blend of two linear laws is the linear law of the blended coefficients); else the nearest
 * size's.  0 when the calibration has no record of the spec. */
static int rate_at(const gcomp_cost_calibration *cal, const char *spec, size_t n,
                   gcomp_cost_codec_rate *out) {
    const gcomp_cost_codec_rate *lo = NULL, *hi = NULL, *any = NULL;
    for (size_t i = 0; i < cal->ncodec; i++) {
        const gcomp_cost_codec_rate *r = &cal->codec[i];
        if (strcmp(r->spec, spec)) continue;
        if (r->elements == 0)
            any = r;
        else if (r->elements <= n && (!lo || r->elements > lo->elements))
            lo = r;
        else if (r->elements > n && (!hi || r->elements < hi->elements))
            hi = r;
    }
    if (any || !lo || !hi) {
        const gcomp_cost_codec_rate *r = any ? any : lo ? lo : hi;
        if (!r) return 0;
        *out = *r;
        return 1;
    }
    double w =
        log((double)n / (double)lo->elements) / log((double)hi->elements / (double)lo->elements);
    *out = *lo;
    out->encode_fixed_s = (1 - w) * lo->encode_fixed_s + w * hi->encode_fixed_s;
    out->encode_per_elem = (1 - w) * lo->encode_per_elem + w * hi->encode_per_elem;
    out->decode_fixed_s = (1 - w) * lo->decode_fixed_s + w * hi->decode_fixed_s;
    out->decode_per_elem = (1 - w) * lo->decode_per_elem + w * hi->decode_per_elem;
    out->elements = n;
    return 1;
}

/* The fraction of n elements a density codec keeps: density=, raised by min_k='s floor;
 * -1 for a spec without density=. */
static double kept_fraction(const char *spec, size_t n) {
    double d = gcomp__cost_spec_num(spec, "density", -1),
           k = gcomp__cost_spec_num(spec, "min_k", 0);
    if (d > 0 && n > 0 && k > d * (double)n) d = (k < (double)n ? k : (double)n) / (double)n;
    return d;
}

int gcomp__cost_rate(const gcomp_cost_calibration *cal, const char *canon, size_t n,
                     gcomp_cost_codec_rate *out) {
    char key[GCOMP__SPEC_MAX];
    gcomp__cost_seedless(canon, key, sizeof key);
    memset(out, 0, sizeof *out);
    snprintf(out->spec, sizeof out->spec, "%s", key);
    out->encode_per_elem = DEFAULT_PER_ELEM;
    out->decode_per_elem = DEFAULT_PER_ELEM;
    if (!cal) return 0;
    if (rate_at(cal, key, n, out)) return 2;
    /* Same codec, other parameters: prefer the one with the same value coder. */
    const gcomp_cost_codec_rate *best = NULL;
    int best_score = -1;
    size_t nl = name_len(key);
    const char *vals = strstr(key, "values=");
    size_t vl = vals ? strcspn(vals, ",") : 0;
    for (size_t i = 0; i < cal->ncodec; i++) {
        const char *s = cal->codec[i].spec;
        if (name_len(s) != nl || strncmp(s, key, nl)) continue;
        const char *sv = strstr(s, "values=");
        int score = (vals && sv && !strncmp(sv, vals, vl) && strcspn(sv, ",") == vl) ? 1 : 0;
        if (score > best_score) {
            best = &cal->codec[i];
            best_score = score;
        }
    }
    if (!best) return 0;
    char have[sizeof best->spec];
    snprintf(have, sizeof have, "%s", best->spec);
    rate_at(cal, have, n, out);
    snprintf(out->spec, sizeof out->spec, "%s", key);
    /* Decoding a sparse message touches the kept elements: scale by the kept fraction at
     * this n (a min_k floor raises it on small tensors).  PowerSGD's products are linear
     * in the rank. */
    double d_have = kept_fraction(have, n), d_want = kept_fraction(key, n);
    if (d_have > 0 && d_want > 0) out->decode_per_elem *= d_want / d_have;
    double r_have = gcomp__cost_spec_num(have, "rank", -1),
           r_want = gcomp__cost_spec_num(key, "rank", -1);
    if (r_have > 0 && r_want > 0) out->encode_per_elem *= r_want / r_have;
    return 1;
}

/* ---- measuring ------------------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void *big_alloc(size_t bytes) {
    void *p = gcomp__alloc(bytes);
#ifdef MADV_HUGEPAGE
    if (p && bytes >= ((size_t)2 << 20))
        madvise((void *)((uintptr_t)p & ~(uintptr_t)4095), bytes, MADV_HUGEPAGE);
#endif
    if (p) memset(p, 0, bytes); /* fault every page in before timing */
    return p;
}

/* Median encode and decode time (s) of `runs` calls on a tensor of n elements. */
static gcomp_status time_once(const char *spec, size_t n, size_t rows, size_t cols, unsigned runs,
                              double *enc_s, double *dec_s, gcomp_error *err) {
    gcomp_compressor *c = NULL;
    gcomp_status st = gcomp_compressor_create(&c, spec, n, rows, cols, err);
    if (st != GCOMP_OK) return st;
    size_t cap = gcomp_encode_bound(c);
    float *g = big_alloc(n * sizeof(float)), *acc = big_alloc(n * sizeof(float));
    uint8_t *msg = big_alloc(cap);
    uint64_t *te = gcomp__alloc((runs + 1) * sizeof(uint64_t)),
             *td = gcomp__alloc((runs + 1) * sizeof(uint64_t));
    if (!g || !acc || !msg || !te || !td) {
        st = gcomp__fail(err, GCOMP_E_NOMEM, "calibration: out of memory for %zu elements", n);
        goto out;
    }
    /* Heavy-tailed, as gradients are (every 97th element 20x). */
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        float u = (float)((s >> 40) & 0xffffff) / 16777216.0f - 0.5f;
        g[i] = u * (i % 97 == 0 ? 20.0f : 1.0f);
    }
    /* A multi-phase codec (PowerSGD) is timed through the protocol its transports drive
     * (gcomp_lowrank_*, one rank: the reductions are the identity): begin and the rounds
     * are its encode (the residual update is folded into begin's pass), finish (out =
     * P Q^T over every element) its decode, as the MPI strategy and the DDP hook run it.
     * gcomp_encode + gcomp_decode_add differ from it (finish overwrites, a decode adds;
     * encode packs a message). */
    gcomp_spec_info info;
    bool protocol = gcomp_spec_describe(spec, n, &info, NULL) == GCOMP_OK &&
                    (info.flags & GCOMP_SPEC_MULTIPHASE);
    for (unsigned r = 0; r <= runs && st == GCOMP_OK; r++) {
        size_t len = 0;
        uint64_t t0 = gcomp__now_ns(), t1, t2;
        if (protocol) {
            float *buf;
            unsigned rounds = 0;
            st = gcomp_lowrank_begin(c, g, &buf, &len, &rounds);
            for (unsigned k = 0; k < rounds && st == GCOMP_OK; k++) {
                if (k) st = gcomp_lowrank_after_q(c, &buf, &len);
                if (st == GCOMP_OK) st = gcomp_lowrank_after_p(c, &buf, &len);
            }
            t1 = gcomp__now_ns();
            if (st == GCOMP_OK) st = gcomp_lowrank_finish(c, rounds ? acc : NULL, 1.0f);
        } else {
            st = gcomp_encode(c, g, msg, cap, &len);
            t1 = gcomp__now_ns();
            if (st == GCOMP_OK) st = gcomp_decode_add(msg, len, acc, n, 1.0f);
        }
        t2 = gcomp__now_ns();
        te[r] = t1 - t0;
        td[r] = t2 - t1;
    }
    if (st != GCOMP_OK) {
        st = gcomp__fail(err, st, "calibration: %s: %s", spec, gcomp_status_str(st));
        goto out;
    }
    /* The first call is the warm-up. */
    qsort(te + 1, runs, sizeof *te, cmp_u64);
    qsort(td + 1, runs, sizeof *td, cmp_u64);
    *enc_s = 1e-9 * (double)te[1 + runs / 2];
    *dec_s = 1e-9 * (double)td[1 + runs / 2];
out:
    gcomp_compressor_free(c);
    gcomp__free(g);
    gcomp__free(acc);
    gcomp__free(msg);
    gcomp__free(te);
    gcomp__free(td);
    return st;
}

void gcomp__cost_fit(size_t n, double t, size_t n2, double t2, double *fixed, double *per_elem) {
    double dn = (double)n - (double)n2, pe = dn > 0 ? (t - t2) / dn : -1;
    if (!(pe >= 0) || !(t - pe * (double)n >= 0)) pe = t / (double)n; /* through (n, t) */
    *per_elem = pe;
    *fixed = fmax(0, t - pe * (double)n);
}

gcomp_status gcomp_cost_calibrate_codec(const char *spec, size_t n, size_t rows, size_t cols,
                                        unsigned runs, gcomp_cost_codec_rate *out,
                                        gcomp_error *err) {
    if (!spec || !out || n < 8 || runs < 1 || runs > 1000 || !gcomp__shape_holds(n, rows, cols))
        return gcomp__fail(err, GCOMP_E_ARG,
                           "calibration: needs a spec, n >= 8, runs 1..1000 and a shape that "
                           "holds n");
    memset(out, 0, sizeof *out);
    char canon[GCOMP__SPEC_MAX];
    gcomp_status st = gcomp_spec_canonical(spec, canon, sizeof canon, NULL, err);
    if (st != GCOMP_OK) return st;
    /* The small size keeps the matrix's aspect for shaped codecs: rows/8 x cols. */
    size_t n2 = rows ? (rows / 8 ? rows / 8 : 1) * cols : n / 8;
    size_t r2 = rows ? n2 / cols : 0, c2 = rows ? cols : 0;
    double e1, d1, e2, d2;
    st = time_once(canon, n, rows, cols, runs, &e1, &d1, err);
    if (st == GCOMP_OK) st = time_once(canon, n2, r2, c2, runs, &e2, &d2, err);
    if (st != GCOMP_OK) return st;
    gcomp__cost_fit(n, e1, n2, e2, &out->encode_fixed_s, &out->encode_per_elem);
    gcomp__cost_fit(n, d1, n2, d2, &out->decode_fixed_s, &out->decode_per_elem);
    out->elements = n;
    gcomp__cost_seedless(canon, out->spec, sizeof out->spec);
    return GCOMP_OK;
}
