/*
 * values_float.c - value coders that keep a float: f32 (exact), f16 and bf16 (casts).
 *
 * Layout: nv little-endian values, nothing else (docs/FORMAT.md, "f32/f16/bf16").
 * f16 saturates at +-65504 instead of overflowing to infinity: a gradient outlier must
 * not poison every receiver's sum, and with error feedback the clipped excess stays in
 * the residual.  The residual res[i] = v[i] - decoded(v[i]) is written in the same pass.
 * With F16C the conversions run 8 or 16 lanes at a time; half.c is the reference.
 */
#include "core/internal.h"

#include <math.h>

#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#define F16_MAX 65504.0f

static size_t bound4(const gcomp__vparams *p, size_t nv) {
    (void)p;
    return 4 * nv;
}
static size_t bound2(const gcomp__vparams *p, size_t nv) {
    (void)p;
    return 2 * nv;
}

static gcomp_status f32_encode(const gcomp__vparams *p, const float *v, size_t nv, float *res,
                               uint64_t key, uint8_t *dst, size_t cap, size_t *len) {
    (void)p;
    (void)key;
    if (cap < 4 * nv) return GCOMP_E_DST_SIZE;
    if (!gcomp__all_finite(v, nv)) return GCOMP_E_NONFINITE;
    memcpy(dst, v, 4 * nv);
    if (res) memset(res, 0, 4 * nv);
    *len = 4 * nv;
    return GCOMP_OK;
}

static gcomp_status f32_decode(const uint8_t *src, size_t len, size_t nv, float *acc, float scale) {
    if (len != 4 * nv) return GCOMP_E_CORRUPT;
    for (size_t i = 0; i < nv; i++)
        if ((gcomp__get32(src + 4 * i) & 0x7f800000u) == 0x7f800000u) return GCOMP_E_CORRUPT;
    if (!acc) return GCOMP_OK;
    const float *s = (const float *)(const void *)src;
    if (((uintptr_t)src & 3) == 0) {
        for (size_t i = 0; i < nv; i++) acc[i] += scale * s[i];
    } else {
        for (size_t i = 0; i < nv; i++) acc[i] += scale * gcomp__getf(src + 4 * i);
    }
    return GCOMP_OK;
}

static gcomp_status f16_encode(const gcomp__vparams *p, const float *v, size_t nv, float *res,
                               uint64_t key, uint8_t *dst, size_t cap, size_t *len) {
    (void)p;
    (void)key;
    if (cap < 2 * nv) return GCOMP_E_DST_SIZE;
    if (!gcomp__all_finite(v, nv)) return GCOMP_E_NONFINITE;
    size_t i = 0;
#if defined(__AVX512F__)
    const __m512 hi = _mm512_set1_ps(F16_MAX), lo = _mm512_set1_ps(-F16_MAX);
    for (; i + 16 <= nv; i += 16) {
        __m512 x = _mm512_loadu_ps(v + i);
        __m512 c = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
        __m256i h = _mm512_cvtps_ph(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_si256((__m256i *)(void *)(dst + 2 * i), h);
        if (res) _mm512_storeu_ps(res + i, _mm512_sub_ps(x, _mm512_cvtph_ps(h)));
    }
#elif defined(__F16C__)
    const __m256 hi = _mm256_set1_ps(F16_MAX), lo = _mm256_set1_ps(-F16_MAX);
    for (; i + 8 <= nv; i += 8) {
        __m256 x = _mm256_loadu_ps(v + i);
        __m256 c = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
        __m128i h = _mm256_cvtps_ph(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(void *)(dst + 2 * i), h);
        if (res) _mm256_storeu_ps(res + i, _mm256_sub_ps(x, _mm256_cvtph_ps(h)));
    }
#endif
    for (; i < nv; i++) {
        float x = v[i];
        float c = x > F16_MAX ? F16_MAX : (x < -F16_MAX ? -F16_MAX : x);
        uint16_t h = gcomp__f32_to_f16(c);
        gcomp__put16(dst + 2 * i, h);
        if (res) res[i] = x - gcomp__f16_to_f32(h);
    }
    *len = 2 * nv;
    return GCOMP_OK;
}

static gcomp_status f16_decode(const uint8_t *src, size_t len, size_t nv, float *acc, float scale) {
    if (len != 2 * nv) return GCOMP_E_CORRUPT;
    /* The encoder never writes inf or NaN (it saturates); refuse them from the wire so
     * a corrupt message cannot poison the sum. */
    for (size_t i = 0; i < nv; i++)
        if ((gcomp__get16(src + 2 * i) & 0x7c00u) == 0x7c00u) return GCOMP_E_CORRUPT;
    if (!acc) return GCOMP_OK;
    size_t i = 0;
#if defined(__AVX512F__)
    const __m512 s = _mm512_set1_ps(scale);
    for (; i + 16 <= nv; i += 16) {
        __m512 x =
            _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(src + 2 * i)));
        _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(s, x, _mm512_loadu_ps(acc + i)));
    }
#elif defined(__F16C__)
    const __m256 s = _mm256_set1_ps(scale);
    for (; i + 8 <= nv; i += 8) {
        __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i)));
        _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(s, x)));
    }
#endif
    for (; i < nv; i++) acc[i] += scale * gcomp__f16_to_f32(gcomp__get16(src + 2 * i));
    return GCOMP_OK;
}

static gcomp_status bf16_encode(const gcomp__vparams *p, const float *v, size_t nv, float *res,
                                uint64_t key, uint8_t *dst, size_t cap, size_t *len) {
    (void)p;
    (void)key;
    if (cap < 2 * nv) return GCOMP_E_DST_SIZE;
    if (!gcomp__all_finite(v, nv)) return GCOMP_E_NONFINITE;
    for (size_t i = 0; i < nv; i++) {
        uint16_t h = gcomp__f32_to_bf16(v[i]);
        /* Rounding up past FLT_MAX would give inf: truncate instead. */
        if ((h & 0x7f80u) == 0x7f80u) h = (uint16_t)(h - 1);
        gcomp__put16(dst + 2 * i, h);
        if (res) res[i] = v[i] - gcomp__bf16_to_f32(h);
    }
    *len = 2 * nv;
    return GCOMP_OK;
}

static gcomp_status bf16_decode(const uint8_t *src, size_t len, size_t nv, float *acc,
                                float scale) {
    if (len != 2 * nv) return GCOMP_E_CORRUPT;
    for (size_t i = 0; i < nv; i++)
        if ((gcomp__get16(src + 2 * i) & 0x7f80u) == 0x7f80u) return GCOMP_E_CORRUPT;
    if (!acc) return GCOMP_OK;
    for (size_t i = 0; i < nv; i++) acc[i] += scale * gcomp__bf16_to_f32(gcomp__get16(src + 2 * i));
    return GCOMP_OK;
}

/* f32 is exact (unbiased, trivially); f16 and bf16 round to nearest. */
const gcomp__vcoder gcomp__vcoder_f32 = {
    GCOMP__VCODER_NAME_ID(f32), .bound = bound4, .encode = f32_encode,         .decode = f32_decode,
    .type = GCOMP_VALUES_F32,   .bits = 32,      .traits = GCOMP_SPEC_UNBIASED};
const gcomp__vcoder gcomp__vcoder_f16 = {GCOMP__VCODER_NAME_ID(f16), .bound = bound2,
                                         .encode = f16_encode,       .decode = f16_decode,
                                         .type = GCOMP_VALUES_F16,   .bits = 16};
const gcomp__vcoder gcomp__vcoder_bf16 = {GCOMP__VCODER_NAME_ID(bf16), .bound = bound2,
                                          .encode = bf16_encode,       .decode = bf16_decode,
                                          .type = GCOMP_VALUES_BF16,   .bits = 16};
