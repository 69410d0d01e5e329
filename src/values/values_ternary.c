/*
 * values_ternary.c - ternary: TernGrad (Wen et al. 2017, "TernGrad: Ternary Gradients to
 * Reduce Communication in Distributed Deep Learning").
 *
 *     s = max |x| over the bucket,   b_i ~ Bernoulli(|x_i| / s),   x^_i = s * sign(x_i) * b_i
 *
 * so E[x^] = x (unbiased; the draws come from the seeded per-bucket stream).  The paper
 * uses one s per layer: bucket=0 does that; the default bucket=512 gives each bucket its
 * own s, which lowers the variance (it scales with s * |x|) for 4 bytes per 512 values.
 * Optional gradient clipping as in the paper (section 3.3): with clip_sigma=c > 0 every
 * value is first clipped to [-c*sigma, c*sigma], sigma the standard deviation of the whole vector
 * (c = 2.5 in the paper); that makes the coder biased on purpose, and with feedback=ef
 * the clipped part stays in the residual.
 *
 * Layout: docs/FORMAT.md, "ternary": 2 bits per value, 16 per u32 word, least significant
 * first; 01 = +s, 10 = -s, 00 = 0, 11 invalid.  Rejected: base-3 packing (5 values per
 * byte, 1.6 bits): 20% smaller, but needs a division per byte on both sides and would
 * keep no word alignment with the buckets.
 */
#include "values/values_quant.h"

#include <stdio.h>

static const gcomp_param_info ternary_params[] = {
    {"bucket", GCOMP_PARAM_INT, 0, 4294967295.0, 0, "512", NULL,
     "values sharing one scale s = max |x| (0: one s for all values, as in the paper)"},
    /* Not `clip`: DGC's feedback has a `clip` of its own (an L2 norm), and a spec may
     * name both (ternary:feedback=dgc). */
    {"clip_sigma", GCOMP_PARAM_FLOAT, 0, 1.0e6, 0, "0", NULL,
     "clip values to +-clip_sigma*sigma before ternarizing (TernGrad uses 2.5; 0: off)"},
};

static size_t section_bytes(size_t nv, size_t B) {
    return 4 + 4 * gcomp__q_nbuckets(nv, B) + 4 * ((nv + 15) / 16);
}

static size_t ternary_bound(const gcomp__vparams *p, size_t nv) {
    return section_bytes(nv, gcomp__q_bucket(p, nv));
}

typedef struct tern_b {
    float s, f, inv, lim; /* lim: clipping bound (+inf when off) */
    uint64_t bkey;
} tern_b;

/* One value: 0, 1 (+s) or 2 (-s); writes the residual. */
static inline uint32_t tern1(const tern_b *b, float x, size_t k, float *r) {
    float xc = x < b->lim ? x : b->lim;
    xc = xc > -b->lim ? xc : -b->lim;
    float p = ((fabsf(xc) * b->f) * b->inv) * 16777216.0f;
    uint32_t c = 0;
    float d = 0.0f;
    if (gcomp__q_u24(b->bkey, k) < p) {
        c = x < 0.0f ? 2u : 1u;
        d = x < 0.0f ? -b->s : b->s;
    }
    if (r) *r = x - d;
    return c;
}

static gcomp_status ternary_encode(const gcomp__vparams *p, const float *v, size_t nv, float *res,
                                   uint64_t key, uint8_t *dst, size_t cap, size_t *len) {
    size_t B = gcomp__q_bucket(p, nv);
    if (B > UINT32_MAX) return GCOMP_E_LIMIT;
    size_t nb = gcomp__q_nbuckets(nv, B), need = section_bytes(nv, B);
    if (cap < need) return GCOMP_E_DST_SIZE;
    double clip = gcomp__spec_num(p->spec, "clip_sigma", 0);
    float lim = INFINITY;
    if (clip > 0 && nv > 0) {
        double s1 = 0, s2 = gcomp__q_sum_sq(v, nv);
        for (size_t i = 0; i < nv; i++) s1 += v[i];
        if (!isfinite(s1) || !isfinite(s2)) return GCOMP_E_NONFINITE;
        double mean = s1 / (double)nv, var = s2 / (double)nv - mean * mean;
        lim = (float)(clip * sqrt(var > 0 ? var : 0));
    }
    gcomp__put32(dst, (uint32_t)B);
    uint8_t *scales = dst + 4, *words = dst + 4 + 4 * nb;
    size_t nwords = (nv + 15) / 16;
    bool simd = gcomp__quant_simd() && B % 16 == 0;
    if (!simd) memset(words, 0, 4 * nwords);
    for (size_t b = 0; b < nb; b++) {
        size_t s = b * B, e = s + B < nv ? s + B : nv;
        uint32_t mb = gcomp__q_max_abs_bits(v + s, e - s);
        if (mb >= 0x7f800000u) return GCOMP_E_NONFINITE;
        float mx;
        memcpy(&mx, &mb, 4);
        tern_b tb;
        tb.lim = lim;
        tb.s = mx < lim ? mx : lim;
        tb.f = gcomp__q_prescale(tb.s);
        tb.inv = tb.s > 0.0f ? 1.0f / (tb.s * tb.f) : 0.0f;
        tb.bkey = gcomp__q_bkey(key, b);
        gcomp__putf(scales + 4 * b, tb.s);
        size_t i = s;
#if GCOMP__Q_AVX512
        if (simd) {
            const __m512 vlim = _mm512_set1_ps(lim), vnlim = _mm512_set1_ps(-lim),
                         vf = _mm512_set1_ps(tb.f), vinv = _mm512_set1_ps(tb.inv),
                         two24 = _mm512_set1_ps(16777216.0f), zero = _mm512_setzero_ps(),
                         vs = _mm512_set1_ps(tb.s), vns = _mm512_set1_ps(-tb.s);
            for (; i < e; i += 16) {
                gcomp__q_prefetch(v, i, gcomp__q_ahead(B), nv);
                __mmask16 in = e - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (e - i)) - 1);
                __m512 x = _mm512_maskz_loadu_ps(in, v + i);
                __m512 xc = _mm512_max_ps(_mm512_min_ps(x, vlim), vnlim);
                __m512 pr =
                    _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_abs_ps(xc), vf), vinv), two24);
                __mmask16 hit =
                    _mm512_mask_cmp_ps_mask(in, gcomp__q_u24x16(tb.bkey, i - s), pr, _CMP_LT_OQ);
                __mmask16 ng = _mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ);
                uint32_t P = (uint32_t)(hit & ~ng) & 0xffffu, N = (uint32_t)(hit & ng);
#if defined(__BMI2__)
                uint32_t w = _pdep_u32(P, 0x55555555u) | _pdep_u32(N, 0xaaaaaaaau);
#else
                uint32_t w = 0;
                for (unsigned k = 0; k < 16; k++)
                    w |= (((P >> k) & 1u) | (((N >> k) & 1u) << 1)) << (2 * k);
#endif
                gcomp__put32(words + i / 4, w);
                if (res) {
                    __m512 d = _mm512_mask_blend_ps(
                        (__mmask16)N, _mm512_mask_blend_ps((__mmask16)P, zero, vs), vns);
                    _mm512_mask_storeu_ps(res + i, in, _mm512_sub_ps(x, d));
                }
            }
        }
#endif
        for (; i < e; i++) {
            uint32_t c = tern1(&tb, v[i], i - s, res ? res + i : NULL);
            words[i / 4] = (uint8_t)(words[i / 4] | (c << (2 * (i & 3))));
        }
    }
    *len = need;
    return GCOMP_OK;
}

static gcomp_status ternary_decode(const uint8_t *src, size_t len, size_t nv, float *acc,
                                   float scale) {
    if (len < 4) return GCOMP_E_CORRUPT;
    size_t B = gcomp__get32(src);
    if (B == 0 || len != section_bytes(nv, B)) return GCOMP_E_CORRUPT;
    size_t nb = gcomp__q_nbuckets(nv, B), nw = (nv + 15) / 16;
    const uint8_t *scales = src + 4, *words = src + 4 + 4 * nb;
    for (size_t b = 0; b < nb; b++)
        if (gcomp__get32(scales + 4 * b) >= 0x7f800000u) return GCOMP_E_CORRUPT;
    uint32_t bad = 0;
    for (size_t j = 0; j < nw; j++) {
        uint32_t w = gcomp__get32(words + 4 * j);
        bad |= w & (w >> 1) & 0x55555555u; /* code 11 */
    }
    if (bad) return GCOMP_E_CORRUPT;
    if ((nv & 15) && (gcomp__get32(words + 4 * (nw - 1)) >> (2 * (nv & 15))))
        return GCOMP_E_CORRUPT; /* padding */
    if (!acc) return GCOMP_OK;
    const float z = scale * 0.0f;
    for (size_t b = 0; b < nb; b++) {
        size_t s = b * B, e = s + B < nv ? s + B : nv, i = s;
        float sc = gcomp__getf(scales + 4 * b), up = scale * sc, dn = scale * -sc;
#if GCOMP__Q_AVX512 && defined(__BMI2__)
        if (gcomp__quant_simd() && (s & 15) == 0) {
            const __m512 vup = _mm512_set1_ps(up), vdn = _mm512_set1_ps(dn), vz = _mm512_set1_ps(z);
            for (; i + 16 <= e; i += 16) {
                uint32_t w = gcomp__get32(words + i / 4);
                __mmask16 P = (__mmask16)_pext_u32(w, 0x55555555u),
                          N = (__mmask16)_pext_u32(w, 0xaaaaaaaau);
                __m512 q = _mm512_mask_blend_ps(N, _mm512_mask_blend_ps(P, vz, vup), vdn);
                _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), q));
            }
        }
#endif
        for (; i < e; i++) {
            uint32_t c = (words[i / 4] >> (2 * (i & 3))) & 3u;
            acc[i] += c == 1u ? up : c == 2u ? dn : z;
        }
    }
    return GCOMP_OK;
}

/*
 * Worst case of E|T(v) - v|^2 / |v|^2 over a bucket of d values, for error feedback
 * (gcomp__vcoder.ef_ratio).  Value i becomes m sign(v_i) with probability |v_i|/m
 * (m = max|v|), so its variance is m|v_i| - v_i^2 and the bucket's m|v|_1 - |v|^2.  With
 * m = 1, the largest |v|_1 for a given |v|^2 puts the other d - 1 values equal, and
 * maximising over their size gives m|v|_1 / |v|^2 <= (1 + sqrt(d)) / 2, so
 *
 *     E|T(v) - v|^2 <= (sqrt(d) - 1) / 2 |v|^2,
 *
 * below 1 only for buckets of at most 8 values.  Gaussian buckets of 512 measure 1.6;
 * error feedback around them does not blow up as QSGD's does (no error exceeds the
 * bucket's max) but its residual levels off near 70 |g|^2 on Gaussian gradients, eight
 * gradients' worth of stale update, and nothing guarantees convergence.  Clipping (clip_sigma=)
 * keeps the bound: the clipped part r and the ternarized part y = v - r err independently of sign
 * and |r|^2 + |y|^2 <= |v|^2.
 */
static double ternary_ef_ratio(const gcomp__vparams *p, size_t nv, char *fix, size_t fixcap) {
    size_t B = gcomp__q_bucket(p, nv);
    double d = (double)(B < nv ? B : nv);
    double r = (sqrt(d) - 1.0) / 2.0;
    if (r >= 1.0) snprintf(fix, fixcap, "bucket <= 8");
    return r;
}

/* Clipping makes it biased on purpose (see the top). */
static void ternary_describe(const gcomp__vparams *p, gcomp__desc *d) {
    if (gcomp__spec_num(p->spec, "clip_sigma", 0) > 0) d->traits &= ~GCOMP_SPEC_UNBIASED;
}

const gcomp__vcoder gcomp__vcoder_ternary = {GCOMP__VCODER_NAME_ID(ternary),
                                             .params = ternary_params,
                                             .nparams = GCOMP__COUNTOF(ternary_params),
                                             .bound = ternary_bound,
                                             .encode = ternary_encode,
                                             .decode = ternary_decode,
                                             .ef_ratio = ternary_ef_ratio,
                                             .bits = 2,
                                             .traits =
                                                 GCOMP_SPEC_UNBIASED | GCOMP_SPEC_PRIVATE_DRAWS,
                                             .describe = ternary_describe};

GCOMP__QUANTIZER_CODEC(ternary, ternary_params, GCOMP__COUNTOF(ternary_params),
                       GCOMP_CODEC_STOCHASTIC, NULL,
                       "TernGrad: {-1,0,+1} * max|x| per bucket, stochastic and unbiased (~15x)");
