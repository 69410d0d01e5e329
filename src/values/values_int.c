/*
 * values_int.c - int8 and int4: linear (asymmetric min/scale) quantization per bucket.
 *
 * For each bucket of B values (bucket=, default 512; 0: one bucket):
 *     scale = (max - min) / (2^bits - 1),   q = round((x - min) / scale),   x^ = min + q*scale
 * the scheme of bucketed low-precision gradients (QSGD's buckets, Alistarh et al. 2017;
 * the asymmetric uint8 of inference quantizers).  rounding=nearest gives |x - x^| <=
 * scale/2 (plus float rounding of the arithmetic); rounding=stochastic rounds up with
 * probability frac((x - min)/scale), drawn from the seeded per-bucket stream, which makes
 * E[x^] = x.  Layout: docs/FORMAT.md, "int8 / int4".
 *
 * Speed: two passes per bucket, the first (min/max, finiteness) streams from memory, the
 * second (quantize, pack, residual) finds the bucket in L1; the AVX-512 kernel does 16
 * values per step and is checked byte for byte against the portable one.
 *
 * Rejected: f16 min/scale on the wire (f16 cannot hold gradients below 6e-8, which are
 * common; the 4 extra bytes per 512 values cost 0.8% of the ratio); symmetric absmax
 * scaling (wastes half the codes on one-sided buckets); a per-tensor scale (outliers
 * every ~100 values in real gradients would flatten everything else to zero).
 */
#include "values/values_quant.h"

static const gcomp_param_info int_params[] = {
    {"bucket", GCOMP_PARAM_INT, 0, 4294967295.0, 0, "512", NULL,
     "values sharing one min and scale (0: all values in one bucket)"},
    {"rounding", GCOMP_PARAM_ENUM, 0, 0, 0, "nearest", "nearest|stochastic",
     "nearest: |x - x^| <= scale/2; stochastic: unbiased, drawn from seed= and the step"},
};

static size_t code_bytes(unsigned bits, size_t nv) {
    return bits == 8 ? nv : nv / 2 + (nv & 1);
}

static size_t section_bytes(unsigned bits, size_t nv, size_t B) {
    return 4 + 8 * gcomp__q_nbuckets(nv, B) + code_bytes(bits, nv);
}

/* Largest decoded magnitude must stay finite: min + qmax*scale is the far end. */
static bool range_ok(float mn, float sc, float qmax) {
    return fabs((double)mn + (double)qmax * (double)sc) <= (double)FLT_MAX;
}

/* min and max of a bucket; false on Inf/NaN. */
static bool min_max(const float *v, size_t n, float *mn_out, float *mx_out) {
    float mn = v[0], mx = v[0];
    size_t i = 0;
    uint32_t bad = 0;
#if GCOMP__Q_AVX512
    if (gcomp__quant_simd()) {
        __m512 vmn = _mm512_set1_ps(v[0]), vmx = vmn;
        __m512i vab = _mm512_setzero_si512();
        const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
        for (; i + 16 <= n; i += 16) {
            __m512 x = _mm512_loadu_ps(v + i);
            vmn = _mm512_min_ps(vmn, x);
            vmx = _mm512_max_ps(vmx, x);
            vab = _mm512_max_epu32(vab, _mm512_and_si512(_mm512_castps_si512(x), absmask));
        }
        if (i < n) {
            __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
            __m512 x = _mm512_maskz_loadu_ps(m, v + i);
            vmn = _mm512_mask_min_ps(vmn, m, vmn, x);
            vmx = _mm512_mask_max_ps(vmx, m, vmx, x);
            vab = _mm512_mask_max_epu32(vab, m, vab,
                                        _mm512_and_si512(_mm512_castps_si512(x), absmask));
            i = n;
        }
        mn = _mm512_reduce_min_ps(vmn);
        mx = _mm512_reduce_max_ps(vmx);
        bad = (uint32_t)_mm512_reduce_max_epu32(vab);
    }
#endif
    for (; i < n; i++) {
        float x = v[i];
        uint32_t u;
        memcpy(&u, &x, 4);
        u &= 0x7fffffffu;
        bad = u > bad ? u : bad;
        mn = x < mn ? x : mn;
        mx = x > mx ? x : mx;
    }
    if (bad >= 0x7f800000u) return false;
    /* min/max of +0 and -0 depend on the order of comparison: normalise to +0 so that the
     * bytes do not depend on the code path. */
    *mn_out = mn + 0.0f;
    *mx_out = mx + 0.0f;
    return true;
}

typedef struct bucket_q {
    float mn, sc, f, inv, qmax;
    bool stoch;
    uint64_t bkey;
} bucket_q;

/* One value, portable: the reference for the SIMD kernel below, operation for operation. */
static inline float quant1(const bucket_q *b, float x, size_t k) {
    float t = ((x - b->mn) * b->f) * b->inv;
    t = t > 0.0f ? t : 0.0f;
    t = t < b->qmax ? t : b->qmax;
    if (!b->stoch) return nearbyintf(t);
    float fl = floorf(t);
    float fr = (t - fl) * 16777216.0f;
    return gcomp__q_u24(b->bkey, k) < fr ? fl + 1.0f : fl;
}

/* Values [s, e) of the vector, bucket b: codes and residual. */
static void quant_range(unsigned bits, const bucket_q *b, const float *v, float *res,
                        uint8_t *codes, size_t s, size_t e, size_t ahead, size_t nv) {
    size_t i = s;
    (void)ahead, (void)nv; /* the SIMD loop's prefetch */
#if GCOMP__Q_AVX512
    if (gcomp__quant_simd() && (bits == 8 || (s & 1) == 0)) {
        const __m512 vmn = _mm512_set1_ps(b->mn), vsc = _mm512_set1_ps(b->sc),
                     vf = _mm512_set1_ps(b->f), vinv = _mm512_set1_ps(b->inv),
                     vqmax = _mm512_set1_ps(b->qmax), zero = _mm512_setzero_ps(),
                     one = _mm512_set1_ps(1.0f), two24 = _mm512_set1_ps(16777216.0f);
        for (; i + 16 <= e; i += 16) {
            gcomp__q_prefetch(v, i, ahead, nv);
            __m512 x = _mm512_loadu_ps(v + i);
            __m512 t = _mm512_mul_ps(_mm512_mul_ps(_mm512_sub_ps(x, vmn), vf), vinv);
            t = _mm512_min_ps(_mm512_max_ps(t, zero), vqmax);
            __m512 q;
            if (!b->stoch) {
                q = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            } else {
                __m512 fl = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
                __m512 fr = _mm512_mul_ps(_mm512_sub_ps(t, fl), two24);
                __mmask16 up = _mm512_cmp_ps_mask(gcomp__q_u24x16(b->bkey, i - s), fr, _CMP_LT_OQ);
                q = _mm512_mask_add_ps(fl, up, fl, one);
            }
            __m512i qi = _mm512_cvttps_epi32(q);
            if (bits == 8) {
                _mm_storeu_si128((__m128i *)(void *)(codes + i), _mm512_cvtepi32_epi8(qi));
            } else {
                /* Each 64-bit lane holds codes 2j (low) and 2j+1 (high dword): low | high << 4. */
                __m512i pr = _mm512_or_si512(qi, _mm512_srli_epi64(qi, 28));
                _mm_storel_epi64((__m128i *)(void *)(codes + i / 2), _mm512_cvtepi64_epi8(pr));
            }
            if (res) _mm512_storeu_ps(res + i, _mm512_sub_ps(x, _mm512_fmadd_ps(q, vsc, vmn)));
        }
    }
#endif
    for (; i < e; i++) {
        float x = v[i];
        float q = quant1(b, x, i - s);
        uint8_t c = (uint8_t)q;
        if (bits == 8)
            codes[i] = c;
        else if ((i & 1) == 0)
            codes[i / 2] = c; /* also clears the high nibble (padding) */
        else
            codes[i / 2] = (uint8_t)(codes[i / 2] | (c << 4));
        if (res) res[i] = x - fmaf(q, b->sc, b->mn);
    }
}

static size_t int8_bound(const gcomp__vparams *p, size_t nv) {
    return section_bytes(8, nv, gcomp__q_bucket(p, nv));
}
static size_t int4_bound(const gcomp__vparams *p, size_t nv) {
    return section_bytes(4, nv, gcomp__q_bucket(p, nv));
}

static gcomp_status int_encode(unsigned bits, const gcomp__vparams *p, const float *v, size_t nv,
                               float *res, uint64_t key, uint8_t *dst, size_t cap, size_t *len) {
    size_t B = gcomp__q_bucket(p, nv);
    if (B > UINT32_MAX) return GCOMP_E_LIMIT;
    size_t nb = gcomp__q_nbuckets(nv, B), need = section_bytes(bits, nv, B);
    if (cap < need) return GCOMP_E_DST_SIZE;
    bucket_q q;
    q.qmax = bits == 8 ? 255.0f : 15.0f;
    q.stoch = gcomp__spec_num(p->spec, "rounding", 0) == 1;
    gcomp__put32(dst, (uint32_t)B);
    uint8_t *hdr = dst + 4, *codes = dst + 4 + 8 * nb;
    for (size_t b = 0; b < nb; b++) {
        size_t s = b * B, e = s + B < nv ? s + B : nv;
        float mx;
        if (!min_max(v + s, e - s, &q.mn, &mx)) return GCOMP_E_NONFINITE;
        q.sc = (float)(((double)mx - (double)q.mn) / (double)q.qmax);
        /* Keep min + qmax*scale finite (only buckets spanning more than FLT_MAX need it). */
        while (q.sc > 0.0f && !range_ok(q.mn, q.sc, q.qmax)) q.sc = nextafterf(q.sc, 0.0f);
        q.f = gcomp__q_prescale(q.sc);
        q.inv = q.sc > 0.0f ? 1.0f / (q.sc * q.f) : 0.0f;
        q.bkey = gcomp__q_bkey(key, b);
        gcomp__putf(hdr + 8 * b, q.mn);
        gcomp__putf(hdr + 8 * b + 4, q.sc);
        quant_range(bits, &q, v, res, codes, s, e, gcomp__q_ahead(B), nv);
    }
    *len = need;
    return GCOMP_OK;
}

static gcomp_status int_decode(unsigned bits, const uint8_t *src, size_t len, size_t nv, float *acc,
                               float scale) {
    if (len < 4) return GCOMP_E_CORRUPT;
    size_t B = gcomp__get32(src);
    if (B == 0 || len != section_bytes(bits, nv, B)) return GCOMP_E_CORRUPT;
    size_t nb = gcomp__q_nbuckets(nv, B);
    const uint8_t *hdr = src + 4, *codes = src + 4 + 8 * nb;
    const float qmax = bits == 8 ? 255.0f : 15.0f;
    for (size_t b = 0; b < nb; b++) {
        uint32_t sb = gcomp__get32(hdr + 8 * b + 4);
        float mn = gcomp__getf(hdr + 8 * b), sc = gcomp__getf(hdr + 8 * b + 4);
        if (!isfinite(mn) || !isfinite(sc) || (sb >> 31) || !range_ok(mn, sc, qmax))
            return GCOMP_E_CORRUPT;
    }
    if (bits == 4 && (nv & 1) && (codes[nv / 2] >> 4)) return GCOMP_E_CORRUPT; /* padding */
    if (!acc) return GCOMP_OK;
    for (size_t b = 0; b < nb; b++) {
        size_t s = b * B, e = s + B < nv ? s + B : nv, i = s;
        float mn = gcomp__getf(hdr + 8 * b), sc = gcomp__getf(hdr + 8 * b + 4);
#if GCOMP__Q_AVX512
        if (gcomp__quant_simd() && (bits == 8 || (s & 1) == 0)) {
            const __m512 vmn = _mm512_set1_ps(mn), vsc = _mm512_set1_ps(sc),
                         vs = _mm512_set1_ps(scale);
            const __m512i lo4 = _mm512_set1_epi32(15);
            for (; i + 16 <= e; i += 16) {
                __m512i qi;
                if (bits == 8) {
                    qi = _mm512_cvtepu8_epi32(
                        _mm_loadu_si128((const __m128i *)(const void *)(codes + i)));
                } else {
                    /* 8 bytes -> 16 nibbles: byte j to dwords 2j (low) and 2j+1 (high). */
                    __m512i w = _mm512_cvtepu8_epi64(
                        _mm_loadl_epi64((const __m128i *)(const void *)(codes + i / 2)));
                    qi = _mm512_and_si512(_mm512_or_si512(w, _mm512_slli_epi64(w, 28)), lo4);
                }
                __m512 val = _mm512_fmadd_ps(_mm512_cvtepi32_ps(qi), vsc, vmn);
                __m512 a = _mm512_loadu_ps(acc + i);
                _mm512_storeu_ps(acc + i, _mm512_add_ps(a, _mm512_mul_ps(vs, val)));
            }
        }
#endif
        for (; i < e; i++) {
            unsigned c = bits == 8 ? codes[i] : (codes[i / 2] >> (4 * (i & 1))) & 15u;
            acc[i] += scale * fmaf((float)c, sc, mn);
        }
    }
    return GCOMP_OK;
}

static gcomp_status int8_encode(const gcomp__vparams *p, const float *v, size_t nv, float *res,
                                uint64_t key, uint8_t *dst, size_t cap, size_t *len) {
    return int_encode(8, p, v, nv, res, key, dst, cap, len);
}
static gcomp_status int4_encode(const gcomp__vparams *p, const float *v, size_t nv, float *res,
                                uint64_t key, uint8_t *dst, size_t cap, size_t *len) {
    return int_encode(4, p, v, nv, res, key, dst, cap, len);
}
static gcomp_status int8_decode(const uint8_t *src, size_t len, size_t nv, float *acc,
                                float scale) {
    return int_decode(8, src, len, nv, acc, scale);
}
static gcomp_status int4_decode(const uint8_t *src, size_t len, size_t nv, float *acc,
                                float scale) {
    return int_decode(4, src, len, nv, acc, scale);
}

/* rounding=stochastic draws from the seed and is unbiased; nearest is neither. */
static void int_describe(const gcomp__vparams *p, gcomp__desc *d) {
    if (gcomp__spec_num(p->spec, "rounding", 0) == 1)
        d->traits |= GCOMP_SPEC_UNBIASED | GCOMP_SPEC_PRIVATE_DRAWS;
}

/* As `values=` of a selector and as the dense codec alike: one coder per width. */
#define INT_CODER(bits_)                                                                           \
    {                                                                                              \
        GCOMP__VCODER_NAME_ID(int##bits_),                                                         \
            .params = int_params, .nparams = GCOMP__COUNTOF(int_params),                           \
            .bound = int##bits_##_bound, .encode = int##bits_##_encode,                            \
            .decode = int##bits_##_decode, .type = GCOMP_VALUES_OTHER, .bits = bits_,              \
            .describe = int_describe                                                               \
    }
/* No ef_ratio: either rounding errs by less than one step, scale = (max - min)/(2^b - 1)
 * <= 2 max|v| / (2^b - 1), so a residual fed back shrinks in the max norm by 2/15 (int4)
 * or 2/255 (int8) every step and stays bounded: error feedback converges. */
const gcomp__vcoder gcomp__vcoder_int8 = INT_CODER(8);
const gcomp__vcoder gcomp__vcoder_int4 = INT_CODER(4);

GCOMP__QUANTIZER_CODEC(int8, int_params, GCOMP__COUNTOF(int_params), GCOMP_CODEC_STOCHASTIC, NULL,
                       "8-bit linear quantization, min and scale per bucket (~3.9x); usable as "
                       "values=");
GCOMP__QUANTIZER_CODEC(int4, int_params, GCOMP__COUNTOF(int_params), GCOMP_CODEC_STOCHASTIC, NULL,
                       "4-bit linear quantization, min and scale per bucket (~7.8x); usable as "
                       "values=");
