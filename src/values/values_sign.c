/*
 * values_sign.c - sign: one bit per value plus one scale per bucket.
 *
 *     x^ = s_b * sign(x),   s_b = mean |x| over the bucket (scale=mean)
 *                           s_b = ||x||_2 / sqrt(n_b)   (scale=l2)
 *
 * With feedback=ef this is EF-signSGD (Karimireddy et al. 2019, "Error feedback fixes
 * SignSGD and other gradient compression schemes"), whose scaled sign uses ||x||_1 / d,
 * i.e. scale=mean; without feedback it is signSGD (Bernstein et al. 2018) with a
 * magnitude.  Of the choices for one scale, mean |x| minimises ||x - s*sign(x)||_2.
 * Zero is sent as +s (a bit cannot say "zero"; with error feedback the residual takes it
 * back next step).  Layout: docs/FORMAT.md, "sign" -- 32 values per u32 word, not one
 * byte per value as some frameworks ship, so the ratio is ~30x at bucket=512.
 *
 * Speed: the scale needs the whole bucket before the first bit, so two passes per bucket
 * (the second from L1).  With bucket % 16 == 0 every group of 16 values lands on a
 * 16-bit half word and the AVX-512 kernel stores its compare mask directly; other bucket
 * sizes use the portable kernel (the same bytes).
 *
 * Rejected: 1-bit SGD's two reconstruction values per column (Seide et al. 2014) -- it
 * needs a matrix shape and doubles the scales for no gain under error feedback.
 */
#include "values/values_quant.h"

static const gcomp_param_info sign_params[] = {
    {"bucket", GCOMP_PARAM_INT, 0, 4294967295.0, 0, "512", NULL,
     "values sharing one scale (0: all values in one bucket)"},
    {"scale", GCOMP_PARAM_ENUM, 0, 0, 0, "mean", "mean|l2",
     "scale of a bucket: mean |x| (EF-signSGD) or L2 norm / sqrt(n)"},
};

static size_t section_bytes(size_t nv, size_t B) {
    return 4 + 4 * gcomp__q_nbuckets(nv, B) + 4 * ((nv + 31) / 32);
}

static size_t sign_bound(const gcomp__vparams *p, size_t nv) {
    return section_bytes(nv, gcomp__q_bucket(p, nv));
}

static gcomp_status sign_encode(const gcomp__vparams *p, const float *v, size_t nv, float *res,
                                uint64_t key, uint8_t *dst, size_t cap, size_t *len) {
    (void)key;
    size_t B = gcomp__q_bucket(p, nv);
    if (B > UINT32_MAX) return GCOMP_E_LIMIT;
    size_t nb = gcomp__q_nbuckets(nv, B), need = section_bytes(nv, B);
    if (cap < need) return GCOMP_E_DST_SIZE;
    bool l2 = gcomp__spec_num(p->spec, "scale", 0) == 1;
    gcomp__put32(dst, (uint32_t)B);
    uint8_t *scales = dst + 4, *words = dst + 4 + 4 * nb;
    size_t nwords = (nv + 31) / 32;
    bool simd = gcomp__quant_simd() && B % 16 == 0;
    if (!simd)
        memset(words, 0, 4 * nwords);
    else if (nwords)
        memset(words + 4 * (nwords - 1), 0, 4); /* padding of the last word */
    for (size_t b = 0; b < nb; b++) {
        size_t s = b * B, e = s + B < nv ? s + B : nv, n = e - s;
        double sum = l2 ? gcomp__q_sum_sq(v + s, n) : gcomp__q_sum_abs(v + s, n);
        if (!isfinite(sum)) return GCOMP_E_NONFINITE;
        float sc = (float)(l2 ? sqrt(sum / (double)n) : sum / (double)n);
        gcomp__putf(scales + 4 * b, sc);
        size_t i = s;
#if GCOMP__Q_AVX512
        if (simd) {
            const __m512 pos = _mm512_set1_ps(sc), neg = _mm512_set1_ps(-sc),
                         zero = _mm512_setzero_ps();
            for (; i < e; i += 16) {
                gcomp__q_prefetch(v, i, gcomp__q_ahead(B), nv);
                __mmask16 in = e - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (e - i)) - 1);
                __m512 x = _mm512_maskz_loadu_ps(in, v + i);
                __mmask16 m = _mm512_mask_cmp_ps_mask(in, x, zero, _CMP_LT_OQ);
                gcomp__put16(words + i / 8, (uint16_t)m);
                if (res) {
                    __m512 d = _mm512_mask_blend_ps(m, pos, neg);
                    _mm512_mask_storeu_ps(res + i, in, _mm512_sub_ps(x, d));
                }
            }
        }
#endif
        for (; i < e; i++) {
            float x = v[i];
            bool ng = x < 0.0f;
            if (ng) words[i / 8] = (uint8_t)(words[i / 8] | (1u << (i & 7)));
            if (res) res[i] = x - (ng ? -sc : sc);
        }
    }
    *len = need;
    return GCOMP_OK;
}

static gcomp_status sign_decode(const uint8_t *src, size_t len, size_t nv, float *acc,
                                float scale) {
    if (len < 4) return GCOMP_E_CORRUPT;
    size_t B = gcomp__get32(src);
    if (B == 0 || len != section_bytes(nv, B)) return GCOMP_E_CORRUPT;
    size_t nb = gcomp__q_nbuckets(nv, B), nwords = (nv + 31) / 32;
    const uint8_t *scales = src + 4, *words = src + 4 + 4 * nb;
    for (size_t b = 0; b < nb; b++) {
        uint32_t u = gcomp__get32(scales + 4 * b);
        if (u >= 0x7f800000u) return GCOMP_E_CORRUPT; /* negative (sign bit), Inf or NaN */
    }
    if ((nv & 31) && (gcomp__get32(words + 4 * (nwords - 1)) >> (nv & 31)))
        return GCOMP_E_CORRUPT; /* padding bits */
    if (!acc) return GCOMP_OK;
    for (size_t b = 0; b < nb; b++) {
        size_t s = b * B, e = s + B < nv ? s + B : nv, i = s;
        float sc = gcomp__getf(scales + 4 * b);
        float up = scale * sc, dn = scale * -sc;
#if GCOMP__Q_AVX512
        if (gcomp__quant_simd() && (s & 15) == 0) {
            const __m512 vup = _mm512_set1_ps(up), vdn = _mm512_set1_ps(dn);
            for (; i + 16 <= e; i += 16) {
                __mmask16 m = (__mmask16)gcomp__get16(words + i / 8);
                __m512 a = _mm512_loadu_ps(acc + i);
                _mm512_storeu_ps(acc + i, _mm512_add_ps(a, _mm512_mask_blend_ps(m, vup, vdn)));
            }
        }
#endif
        for (; i < e; i++) acc[i] += (words[i / 8] >> (i & 7)) & 1 ? dn : up;
    }
    return GCOMP_OK;
}

const gcomp__vcoder gcomp__vcoder_sign = {GCOMP__VCODER_NAME_ID(sign),
                                          .params = sign_params,
                                          .nparams = GCOMP__COUNTOF(sign_params),
                                          .bound = sign_bound,
                                          .encode = sign_encode,
                                          .decode = sign_decode,
                                          .bits = 1};

GCOMP__QUANTIZER_CODEC(sign, sign_params, GCOMP__COUNTOF(sign_params), 0, NULL,
                       "1 bit per value and a scale per bucket (~30x): signSGD, EF-signSGD with "
                       "feedback=ef");
