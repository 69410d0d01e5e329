/*
 * values_natural.c - natural: natural compression (Horvath, Ho, Horvath, Sahu, Canini,
 * Richtarik 2019, "Natural Compression for Distributed Deep Learning").
 *
 * Each value is rounded at random to one of the two powers of two around it, with the
 * probabilities that keep it unbiased (the paper's C_nat): with a = 2^floor(log2|t|),
 *
 *     C(t) = sign(t) * a     with probability (2a - |t|) / a,
 *            sign(t) * 2a    with probability (|t| - a) / a,      so E[C(t)] = t,
 *
 * and E|C(x) - x|^2 <= |x|^2 / 8 (the variance a^2 p(1-p) over t^2 = a^2 (1+p)^2 is largest
 * at p = 1/3).  A power of two is its sign and exponent: 9 bits, against 32.  No scale, no
 * bucket, and a receiver sums such values exactly as floats.
 *
 * In float bits the rule is integer arithmetic: |t| = 2^(E-127) (1 + m / 2^23) for a
 * biased exponent E >= 1 and mantissa m, so the probability of rounding up is exactly
 * m / 2^23, and rounding up is E + 1.  A subnormal t (E = 0) lies between 0 and 2^-126,
 * and the same rule with the same m rounds it to one of them, unbiased.  So the encoder
 * draws a uniform 23-bit r per value and sends E + (r < m).  The one biased case: |t| >=
 * 2^127, whose upper power would be infinity; it is sent as 2^127 (with feedback=ef the
 * rest stays in the residual).  Draws come from the seeded stream of the quantizers
 * (values_quant.h), the whole vector as one bucket.
 *
 * Layout (docs/FORMAT.md, "natural"): nv exponent bytes E (0: the value is 0; 1..254:
 * 2^(E-127); 255 invalid), then the nv sign bits LSB-first (1: negative; 0 where E = 0).
 * Byte-wide exponents rather than 9-bit fields: the same 9 bits per value, and both passes
 * store and load whole bytes and 16-bit masks, 16 values per AVX-512 step.
 *
 * Rejected: deterministic rounding to the nearest power (biased; the point of C_nat is an
 * unbiased 9-bit value); the paper's variant with extra mantissa bits (natural dithering
 * and friends are other codecs); 8-bit exponents that drop the sign into a bias trick (a
 * negative zero or a NaN pattern would then need rules of its own).
 */
#include "values/values_quant.h"

static size_t sign_bytes(size_t nv) {
    return (nv + 7) / 8;
}

static size_t natural_bound(const gcomp__vparams *p, size_t nv) {
    (void)p;
    return nv + sign_bytes(nv);
}

/* One value, portable: the reference for the SIMD kernel, operation for operation.
 * Returns the exponent code; *neg the sign bit; *d the decoded value. */
static inline uint32_t nat1(float x, uint32_t r32, uint32_t *neg, float *d) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t e = (u >> 23) & 0xffu, m = u & 0x7fffffu;
    e += (r32 >> 9) < m; /* up with probability m / 2^23 */
    e = e < 254u ? e : 254u;
    *neg = (u >> 31) & (e != 0u);
    uint32_t db = (*neg << 31) | (e << 23);
    memcpy(d, &db, 4);
    return e;
}

static gcomp_status natural_encode(const gcomp__vparams *p, const float *v, size_t nv, float *res,
                                   uint64_t key, uint8_t *dst, size_t cap, size_t *len) {
    (void)p;
    size_t need = natural_bound(p, nv);
    if (cap < need) return GCOMP_E_DST_SIZE;
    uint8_t *exps = dst, *signs = dst + nv;
    memset(signs, 0, sign_bytes(nv));
    const uint64_t bkey = gcomp__q_bkey(key, 0);
    uint32_t inf = 0; /* some exponent was 255: Inf or NaN (checked in the same pass) */
    size_t i = 0;
#if GCOMP__Q_AVX512
    if (gcomp__quant_simd()) {
        const __m512i mmask = _mm512_set1_epi32(0x7fffff), ff = _mm512_set1_epi32(0xff),
                      one = _mm512_set1_epi32(1), top = _mm512_set1_epi32(254),
                      zero = _mm512_setzero_si512();
        __m512i ctr = gcomp__q_ctr(bkey, 0);
        for (; i + 16 <= nv; i += 16, ctr = _mm512_add_epi64(ctr, gcomp__q_ctr_step())) {
            __m512 x = _mm512_loadu_ps(v + i);
            __m512i u = _mm512_castps_si512(x);
            __m512i e = _mm512_and_si512(_mm512_srli_epi32(u, 23), ff);
            __m512i m = _mm512_and_si512(u, mmask);
            inf |= _mm512_cmpeq_epi32_mask(e, ff);
            __m512i r = _mm512_srli_epi32(gcomp__q_r32x16(ctr), 9);
            __mmask16 up = _mm512_cmplt_epu32_mask(r, m);
            e = _mm512_min_epu32(_mm512_mask_add_epi32(e, up, e, one), top);
            __mmask16 neg = _mm512_movepi32_mask(u) & _mm512_cmpneq_epu32_mask(e, zero);
            _mm_storeu_si128((__m128i *)(void *)(exps + i), _mm512_cvtepi32_epi8(e));
            gcomp__put16(signs + i / 8, (uint16_t)neg);
            if (res) {
                __m512i db =
                    _mm512_mask_or_epi32(_mm512_slli_epi32(e, 23), neg, _mm512_slli_epi32(e, 23),
                                         _mm512_set1_epi32((int)0x80000000u));
                _mm512_storeu_ps(res + i, _mm512_sub_ps(x, _mm512_castsi512_ps(db)));
            }
        }
    }
#endif
    for (; i < nv; i++) {
        uint32_t neg, u;
        float d;
        memcpy(&u, v + i, 4);
        inf |= (u & 0x7f800000u) == 0x7f800000u;
        exps[i] = (uint8_t)nat1(v[i], gcomp__q_r32(bkey, i), &neg, &d);
        signs[i / 8] = (uint8_t)(signs[i / 8] | (neg << (i & 7)));
        if (res) res[i] = v[i] - d;
    }
    /* The residual may be written over v (error feedback); the feedback stages hand
     * only finite vectors to a coder that does that, so nothing held back is lost. */
    if (inf) return GCOMP_E_NONFINITE;
    *len = need;
    return GCOMP_OK;
}

static gcomp_status natural_decode(const uint8_t *src, size_t len, size_t nv, float *acc,
                                   float scale) {
    if (len != nv + sign_bytes(nv)) return GCOMP_E_CORRUPT;
    const uint8_t *exps = src, *signs = src + nv;
    /* Exponent 255 is no power of two; a sign on a zero is no value either. */
    uint64_t bad = 0;
    size_t i = 0;
#if GCOMP__Q_AVX512
    if (gcomp__quant_simd()) {
        const __m512i all = _mm512_set1_epi8((char)0xff), none = _mm512_setzero_si512();
        for (; i + 64 <= nv; i += 64) {
            __m512i e = _mm512_loadu_si512((const void *)(exps + i));
            bad |= _mm512_cmpeq_epi8_mask(e, all) |
                   (_mm512_cmpeq_epi8_mask(e, none) & gcomp__get64(signs + i / 8));
        }
    }
#endif
    for (; i < nv; i++)
        bad |= (exps[i] == 255u) | ((exps[i] == 0u) & (signs[i / 8] >> (i & 7)) & 1u);
    if (bad) return GCOMP_E_CORRUPT;
    if ((nv & 7) && (signs[nv / 8] >> (nv & 7))) return GCOMP_E_CORRUPT; /* padding */
    if (!acc) return GCOMP_OK;
    i = 0;
#if GCOMP__Q_AVX512
    if (gcomp__quant_simd()) {
        const __m512 vs = _mm512_set1_ps(scale);
        const __m512i sbit = _mm512_set1_epi32((int)0x80000000u);
        for (; i + 16 <= nv; i += 16) {
            __m512i e =
                _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(exps + i)));
            __mmask16 neg = (__mmask16)gcomp__get16(signs + i / 8);
            __m512i db =
                _mm512_mask_or_epi32(_mm512_slli_epi32(e, 23), neg, _mm512_slli_epi32(e, 23), sbit);
            __m512 a = _mm512_loadu_ps(acc + i);
            _mm512_storeu_ps(acc + i, _mm512_add_ps(a, _mm512_mul_ps(vs, _mm512_castsi512_ps(db))));
        }
    }
#endif
    for (; i < nv; i++) {
        uint32_t db =
            ((uint32_t)((signs[i / 8] >> (i & 7)) & 1u) << 31) | ((uint32_t)exps[i] << 23);
        float d;
        memcpy(&d, &db, 4);
        acc[i] += scale * d;
    }
    return GCOMP_OK;
}

/*
 * E|C(v) - v|^2 <= |v|^2 / 8 for every v whose values are normal floats (the top of this
 * file), so error feedback converges (gcomp__vcoder.ef_ratio).  A subnormal value errs by
 * less than 2^-126 in absolute terms (it becomes 0 or +-2^-126), which keeps the residual
 * bounded as the threshold codecs' is.
 */
static double natural_ef_ratio(const gcomp__vparams *p, size_t nv, char *fix, size_t fixcap) {
    (void)p, (void)nv, (void)fix, (void)fixcap;
    return 0.125;
}

const gcomp__vcoder gcomp__vcoder_natural = {GCOMP__VCODER_NAME_ID(natural),
                                             .bound = natural_bound,
                                             .encode = natural_encode,
                                             .decode = natural_decode,
                                             .ef_ratio = natural_ef_ratio,
                                             .bits = 9,
                                             .traits =
                                                 GCOMP_SPEC_UNBIASED | GCOMP_SPEC_PRIVATE_DRAWS};

GCOMP__QUANTIZER_CODEC(natural, NULL, 0, GCOMP_CODEC_STOCHASTIC, NULL,
                       "natural compression (Horvath et al. 2019): each value rounded at random to "
                       "a neighbouring power of two, unbiased; sign + 8-bit exponent (~3.6x)");
