/*
 * values_quant.c - reductions the quantizers share (values_quant.h says why they are
 * written this way), and the test hook that selects the portable kernels.
 *
 * Rejected for the sums: double throughout (the conversions made the first pass a quarter
 * of qsgd's time); Kahan summation (slower, still overflows).
 */
#include "values/values_quant.h"

static bool force_portable;

void gcomp__test_quant_portable(bool on) {
    force_portable = on;
}
bool gcomp__quant_simd(void) {
    return GCOMP__Q_AVX512 && !force_portable;
}

/* Sums run in float in 64 lanes (element i goes to lane i % 64): four chains of 16, so
 * the adds do not wait on each other's latency, then one fixed tree,
 *     u[l] = (L[l] + L[l+16]) + (L[l+32] + L[l+48]),  l < 16,  then halving 16 -> 1,
 * that the SIMD and the portable code both follow.  Float is four times cheaper than
 * double here (no conversions) and the pass is a quarter of a quantizer's work; its
 * relative error (~1e-6) only touches a scale.  Where float is not enough -- a sum that
 * overflows (|x| > 1.8e19 squared) or one so small that squares may have underflowed --
 * the sum is taken again in double, sequentially, by code shared by both paths. */
#define LANES 64

static float tree16(float u[16]) {
    for (size_t step = 8; step > 0; step >>= 1)
        for (size_t l = 0; l < step; l++) u[l] += u[l + step];
    return u[0];
}

static float fsum(const float *v, size_t n, bool square) {
    float lane[LANES] = {0}, u[16];
    size_t i = 0;
#if GCOMP__Q_AVX512
    if (gcomp__quant_simd()) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (; i + LANES <= n; i += LANES) {
            __m512 x0 = _mm512_loadu_ps(v + i), x1 = _mm512_loadu_ps(v + i + 16),
                   x2 = _mm512_loadu_ps(v + i + 32), x3 = _mm512_loadu_ps(v + i + 48);
            if (square) {
                a0 = _mm512_add_ps(a0, _mm512_mul_ps(x0, x0));
                a1 = _mm512_add_ps(a1, _mm512_mul_ps(x1, x1));
                a2 = _mm512_add_ps(a2, _mm512_mul_ps(x2, x2));
                a3 = _mm512_add_ps(a3, _mm512_mul_ps(x3, x3));
            } else {
                a0 = _mm512_add_ps(a0, _mm512_abs_ps(x0));
                a1 = _mm512_add_ps(a1, _mm512_abs_ps(x1));
                a2 = _mm512_add_ps(a2, _mm512_abs_ps(x2));
                a3 = _mm512_add_ps(a3, _mm512_abs_ps(x3));
            }
        }
        if (i == n) { /* no tail: reduce in registers, in the tree's order */
            __m512 t = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
            __m256 h = _mm256_add_ps(_mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1));
            __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
            q = _mm_add_ps(q, _mm_movehl_ps(q, q));
            q = _mm_add_ss(q, _mm_movehdup_ps(q));
            return _mm_cvtss_f32(q);
        }
        _mm512_storeu_ps(lane, a0);
        _mm512_storeu_ps(lane + 16, a1);
        _mm512_storeu_ps(lane + 32, a2);
        _mm512_storeu_ps(lane + 48, a3);
    }
#endif
    /* Element i to lane i % 64, in increasing i: exactly what the SIMD loop did.  The lanes
     * are independent, so a compiler may vectorise this without reordering any sum. */
    for (; i + LANES <= n; i += LANES)
        for (size_t l = 0; l < LANES; l++)
            lane[l] += square ? v[i + l] * v[i + l] : fabsf(v[i + l]);
    for (size_t l = 0; i < n; i++, l++) lane[l] += square ? v[i] * v[i] : fabsf(v[i]);
    for (size_t l = 0; l < 16; l++) u[l] = (lane[l] + lane[l + 16]) + (lane[l + 32] + lane[l + 48]);
    return tree16(u);
}

static double sum_lanes(const float *v, size_t n, bool square) {
    float f = fsum(v, n, square);
    /* Adding |x| cannot underflow; squares below 2^-60 in total may have. */
    if (f <= FLT_MAX && (!square || f >= 0x1p-60f)) return f;
    if (f == 0.0f && gcomp__q_max_abs_bits(v, n) == 0) return 0.0; /* all zero */
    double d = 0;
    for (size_t i = 0; i < n; i++) d += square ? (double)v[i] * v[i] : fabs((double)v[i]);
    return d;
}

double gcomp__q_sum_abs(const float *v, size_t n) {
    return sum_lanes(v, n, false);
}
double gcomp__q_sum_sq(const float *v, size_t n) {
    return sum_lanes(v, n, true);
}

uint32_t gcomp__q_max_abs_bits(const float *v, size_t n) {
    uint32_t mx = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, v + i, 4);
        u &= 0x7fffffffu;
        mx = u > mx ? u : mx;
    }
    return mx;
}
