/*
 * values_twobit.c - twobit: MXNet's 2-bit gradient compression, kvstore semantics.
 *
 * MXNet (kvstore gradient compression, type '2bit', Huilgol 2017) keeps a residual r per
 * tensor on the worker; each step
 *
 *     r += g;   q = +t if r >= t,  -t if r <= -t,  else 0;   r -= q
 *
 * and sends 2 bits per value, 16 values per 32-bit word.  Here r is the error-feedback
 * residual (the `twobit` codec fixes feedback=ef): r + g, the two comparisons and r - q
 * are the same float operations in the same order as MXNet's, so the messages and the
 * residual match MXNet's step for step.  The receiver needs only t and the words.
 *
 * Word layout, MXNet's (docs/FORMAT.md, "twobit"): value k of a word (k = 0..15) sits in
 * byte k/4 of the little-endian word, in bits 7-2(k%4) (high) and 6-2(k%4) (low), i.e.
 * the first value of each byte in its two most significant bits; codes 11 = +t,
 * 10 = -t, 00 = 0.  01 is never written and is rejected (MXNet reads it as 0).
 *
 * Speed: one pass, 16 values per AVX-512 step: two compare masks, a blend for the
 * residual, and the masks interleaved into the word with two bit deposits.  When every
 * element travels, the coder fuses the residual update r + g into that pass (a fused
 * residual, encode_fused below, which the ef feedback honours), so it reads r and g and
 * writes r once, as MXNet's kernel does.
 *
 * As `values=` of a selector it quantizes the kept values the same way (with
 * feedback=ef that is MXNet's rule applied to a sparse set).  The `threshold` selector
 * calls its own cut-off `tau`, so `threshold:tau=1e-3,values=twobit,threshold=0.5` names
 * both.
 *
 * Rejected: letting the generic ef feedback form r + g in a pass of its own (five
 * streams of n floats instead of three: ~0.4x memcpy instead of ~0.6x); a copy of the ef
 * feedback inside this file that the codec swapped in at create (the stage's code twice,
 * and a codec reaching into the feedback); reading code 01 as 0 like MXNet (a damaged
 * message should fail, not turn into zeros); a threshold per bucket (MXNet has one per
 * tensor, and the point of the method is its simplicity).
 */
#include "values/values_quant.h"

static const gcomp_param_info twobit_params[] = {
    {"threshold", GCOMP_PARAM_FLOAT, 0, 3.0e38, 1, "0.5", NULL,
     "t: residual >= t sends +t, <= -t sends -t, else 0 (MXNet's 2bit threshold)"},
};

static size_t section_bytes(size_t nv) {
    return 4 + 4 * ((nv + 15) / 16);
}

static size_t twobit_bound(const gcomp__vparams *p, size_t nv) {
    (void)p;
    return section_bytes(nv);
}

/* Bit position of the low bit of value k (0..15) in its word: MXNet's order. */
static inline unsigned code_shift(size_t k) {
    return (unsigned)(8 * (k >> 2) + 6 - 2 * (k & 3));
}

#if GCOMP__Q_AVX512
/* Reverses the bit order inside each nibble of a 16-bit mask: value k's bit moves to bit
 * 4(k/4) + 3 - k%4, so that depositing it at even bit positions lands on code_shift(k). */
static inline uint32_t nibble_reverse(uint32_t x) {
    x = ((x & 0x5555u) << 1) | ((x >> 1) & 0x5555u);
    return ((x & 0x3333u) << 2) | ((x >> 2) & 0x3333u);
}
/* Bit j of x to bit 2j (and the inverse). */
static inline uint32_t spread_even(uint32_t x) {
#if defined(__BMI2__)
    return _pdep_u32(x, 0x55555555u);
#else
    x = (x | (x << 8)) & 0x00ff00ffu;
    x = (x | (x << 4)) & 0x0f0f0f0fu;
    x = (x | (x << 2)) & 0x33333333u;
    return (x | (x << 1)) & 0x55555555u;
#endif
}
static inline uint32_t gather_even(uint32_t x) {
#if defined(__BMI2__)
    return _pext_u32(x, 0x55555555u);
#else
    x &= 0x55555555u;
    x = (x | (x >> 1)) & 0x33333333u;
    x = (x | (x >> 2)) & 0x0f0f0f0fu;
    x = (x | (x >> 4)) & 0x00ff00ffu;
    return (x | (x >> 8)) & 0x0000ffffu;
#endif
}
#endif

/* The pass: x = v[i] (+ add[i] when add is not NULL: the fused r + g of the dense codec),
 * 16 values per word, residual x - q into res (may alias v or add).  `nt`: write res with
 * non-temporal stores (a residual far larger than the caches is not read again this step,
 * and skipping the read-for-ownership saves a third of the traffic). */
#if GCOMP__Q_AVX512
/* The SIMD pass over whole words; `has_add`, `has_res` and `nt` are constants where it is
 * inlined, so each variant runs without branches.  Returns the largest |x| bit pattern. */
static inline __attribute__((always_inline)) uint32_t
twobit_simd(float t, const float *v, const float *add, float *res, size_t nv, uint8_t *words,
            bool has_add, bool has_res, bool nt, size_t *done) {
    const __m512 vt = _mm512_set1_ps(t), vnt = _mm512_set1_ps(-t), zero = _mm512_setzero_ps();
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
    /* Lanes reversed within each group of four: compared in this order, value k's bit
     * lands on bit 4(k/4) + 3 - k%4, and depositing those at even positions gives MXNet's
     * order (first value of each byte in its top bits) without shuffling bits. */
    const __m512i rev = _mm512_setr_epi32(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12);
    __m512i vab = _mm512_setzero_si512();
    size_t i = 0;
    for (; i + 16 <= nv; i += 16) {
        __m512 x = _mm512_loadu_ps(v + i);
        if (has_add) x = _mm512_add_ps(x, _mm512_loadu_ps(add + i));
        vab = _mm512_max_epu32(vab, _mm512_and_si512(_mm512_castps_si512(x), absmask));
        __m512 xr = _mm512_permutexvar_ps(rev, x);
        uint32_t pr = _mm512_cmp_ps_mask(xr, vt, _CMP_GE_OQ);
        uint32_t nr = _mm512_cmp_ps_mask(xr, vnt, _CMP_LE_OQ);
        gcomp__put32(words + i / 4, spread_even(pr) | (spread_even(pr | nr) << 1));
        if (has_res) {
            __mmask16 P = _mm512_cmp_ps_mask(x, vt, _CMP_GE_OQ);
            __mmask16 N = _mm512_cmp_ps_mask(x, vnt, _CMP_LE_OQ);
            __m512 r =
                _mm512_sub_ps(x, _mm512_mask_blend_ps(N, _mm512_mask_blend_ps(P, zero, vt), vnt));
            if (nt)
                _mm512_stream_ps(res + i, r);
            else
                _mm512_storeu_ps(res + i, r);
        }
    }
    if (nt) _mm_sfence();
    *done = i;
    return (uint32_t)_mm512_reduce_max_epu32(vab);
}
#endif

/* The pass: x = v[i] (+ add[i] when add is not NULL: the fused r + g of the dense codec),
 * 16 values per word, residual x - q into res (may alias v or add).  `nt`: write res with
 * non-temporal stores (a residual far larger than the caches is not read again this step,
 * and skipping the read-for-ownership saves a third of the traffic). */
static gcomp_status twobit_run(float t, const float *v, const float *add, float *res, size_t nv,
                               uint8_t *words, bool nt) {
    const float nt_ = -t;
    uint32_t bad = 0;
    size_t i = 0;
#if GCOMP__Q_AVX512
    if (gcomp__quant_simd()) {
        nt = nt && res && ((uintptr_t)res & 63) == 0;
        if (add && nt)
            bad = twobit_simd(t, v, add, res, nv, words, true, true, true, &i);
        else if (add && res)
            bad = twobit_simd(t, v, add, res, nv, words, true, true, false, &i);
        else if (res)
            bad = twobit_simd(t, v, NULL, res, nv, words, false, true, false, &i);
        else
            bad = twobit_simd(t, v, add, NULL, nv, words, add != NULL, false, false, &i);
    }
#endif
    (void)nt;
    /* Portable (and the tail): the rule exactly as written at the top. */
    for (; i < nv; i += 16) {
        uint32_t w = 0;
        size_t m = nv - i < 16 ? nv - i : 16;
        for (size_t k = 0; k < m; k++) {
            float x = add ? v[i + k] + add[i + k] : v[i + k];
            uint32_t u;
            memcpy(&u, &x, 4);
            u &= 0x7fffffffu;
            bad = u > bad ? u : bad;
            float q = 0.0f;
            if (x >= t) {
                w |= 3u << code_shift(k);
                q = t;
            } else if (x <= nt_) {
                w |= 2u << code_shift(k);
                q = nt_;
            }
            if (res) res[i + k] = x - q;
        }
        gcomp__put32(words + i / 4, w);
    }
    return bad >= 0x7f800000u ? GCOMP_E_NONFINITE : GCOMP_OK;
}

static gcomp_status twobit_encode(const gcomp__vparams *p, const float *v, size_t nv, float *res,
                                  uint64_t key, uint8_t *dst, size_t cap, size_t *len) {
    (void)key;
    size_t need = section_bytes(nv);
    if (cap < need) return GCOMP_E_DST_SIZE;
    const float t = (float)gcomp__spec_num(p->spec, "threshold", 0.5);
    gcomp__putf(dst, t);
    gcomp_status st = twobit_run(t, v, NULL, res, nv, dst + 4, false);
    if (st != GCOMP_OK) return st;
    *len = need;
    return GCOMP_OK;
}

static gcomp_status twobit_decode(const uint8_t *src, size_t len, size_t nv, float *acc,
                                  float scale) {
    if (len != section_bytes(nv)) return GCOMP_E_CORRUPT;
    float t = gcomp__getf(src);
    if (!isfinite(t) || !(t > 0.0f)) return GCOMP_E_CORRUPT;
    const uint8_t *words = src + 4;
    size_t nw = (nv + 15) / 16;
    /* Code 01 (low bit without high bit) anywhere is invalid. */
    uint32_t bad = 0;
    for (size_t j = 0; j < nw; j++) {
        uint32_t w = gcomp__get32(words + 4 * j);
        bad |= w & ~(w >> 1) & 0x55555555u;
    }
    if (bad) return GCOMP_E_CORRUPT;
    if (nv & 15) { /* padding values of the last word must be 00 */
        uint32_t w = gcomp__get32(words + 4 * (nw - 1)), pad = 0;
        for (size_t k = nv & 15; k < 16; k++) pad |= 3u << code_shift(k);
        if (w & pad) return GCOMP_E_CORRUPT;
    }
    if (!acc) return GCOMP_OK;
    const float up = scale * t, dn = scale * -t, z = scale * 0.0f;
    size_t i = 0;
#if GCOMP__Q_AVX512
    if (gcomp__quant_simd()) {
        const __m512 vup = _mm512_set1_ps(up), vdn = _mm512_set1_ps(dn), vz = _mm512_set1_ps(z);
        for (; i + 16 <= nv; i += 16) {
            uint32_t w = gcomp__get32(words + i / 4);
            uint32_t lo = nibble_reverse(gather_even(w)), hi = nibble_reverse(gather_even(w >> 1));
            __m512 q = _mm512_mask_blend_ps((__mmask16)(hi & ~lo),
                                            _mm512_mask_blend_ps((__mmask16)lo, vz, vup), vdn);
            _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), q));
        }
    }
#endif
    for (; i < nv; i++) {
        uint32_t c = (gcomp__get32(words + 4 * (i / 16)) >> code_shift(i & 15)) & 3u;
        acc[i] += c == 3u ? up : c == 2u ? dn : z;
    }
    return GCOMP_OK;
}

/* The fused residual (gcomp__vcoder.encode_fused): MXNet's kernel reads the residual r and
 * the gradient g and writes r once -- three streams of n floats -- where forming r + g in
 * a pass of its own and coding it would be five.  So the error-feedback stage hands the
 * coder e and g, and the coder forms x = e + g in its one pass (e first, as feedback_ef.c
 * would: the same float operations in the same order, so messages and residuals are
 * bit-identical to the unfused pipeline; tests/unit/test_twobit.c checks it).  A residual
 * far larger than the caches is written with non-temporal stores: it is not read again
 * this step. */
static gcomp_status twobit_encode_fused(const gcomp__vparams *p, const float *e, const float *g,
                                        size_t nv, float *res, uint64_t key, uint8_t *dst,
                                        size_t cap, size_t *len) {
    (void)key;
    size_t need = section_bytes(nv);
    if (cap < need) return GCOMP_E_DST_SIZE;
    const float t = (float)gcomp__spec_num(p->spec, "threshold", 0.5);
    gcomp__putf(dst, t);
    gcomp_status st = twobit_run(t, e, g, res, nv, dst + 4, nv >= (1u << 21));
    if (st != GCOMP_OK) return st;
    *len = need;
    return GCOMP_OK;
}

/* At most t per element whatever the input: saturating. */
const gcomp__vcoder gcomp__vcoder_twobit = {GCOMP__VCODER_NAME_ID(twobit),
                                            .params = twobit_params,
                                            .nparams = GCOMP__COUNTOF(twobit_params),
                                            .bound = twobit_bound,
                                            .encode = twobit_encode,
                                            .encode_fused = twobit_encode_fused,
                                            .decode = twobit_decode,
                                            .bits = 2,
                                            .traits = GCOMP_SPEC_SATURATING};

/* The residual (feedback=ef) is part of MXNet's method. */
GCOMP__QUANTIZER_CODEC(twobit, twobit_params, GCOMP__COUNTOF(twobit_params), 0, "ef",
                       "MXNet 2-bit: residual +g, send +-t where |r| >= t, 16 values per word "
                       "(~16x); the residual (feedback=ef) is part of the method");
