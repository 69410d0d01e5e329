/*
 * values_quant.c - reductions the quantizers share (values_quant.h says why they are
 * written this way), and the test hook that selects the portable kernels.
 *
 * The sums run in double: a float sum of squares overflows for |x| > 1.8e19 and
 * underflows to zero for |x| < 1e-23, both of which real gradients can reach; the
 * conversion to double costs nothing next to reading the values from memory.  Rejected:
 * Kahan summation in float (slower, still overflows).
 */
#include "values/values_quant.h"

static bool force_portable;

void gcomp__test_quant_portable(bool on) {
    force_portable = on;
}
bool gcomp__quant_simd(void) {
    return GCOMP__Q_AVX512 && !force_portable;
}

/* The one reduction order both paths use. */
static double reduce16(double lane[16]) {
    for (size_t step = 8; step > 0; step >>= 1)
        for (size_t l = 0; l < step; l++) lane[l] += lane[l + step];
    return lane[0];
}

static double sum_lanes(const float *v, size_t n, bool square) {
    double lane[16] = {0};
    size_t i = 0;
#if GCOMP__Q_AVX512
    if (gcomp__quant_simd()) {
        __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
        for (; i + 16 <= n; i += 16) {
            __m512 x = _mm512_loadu_ps(v + i);
            __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
            __m512d b = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));
            if (square) {
                /* a*a is exact in double, so the fused form rounds as x*x + lane does. */
                lo = _mm512_fmadd_pd(a, a, lo);
                hi = _mm512_fmadd_pd(b, b, hi);
            } else {
                lo = _mm512_add_pd(lo, _mm512_abs_pd(a));
                hi = _mm512_add_pd(hi, _mm512_abs_pd(b));
            }
        }
        _mm512_storeu_pd(lane, lo);
        _mm512_storeu_pd(lane + 8, hi);
    }
#endif
    /* Element i goes to lane i % 16, in increasing i: exactly what the SIMD loop did.  The
     * lanes are independent, so a compiler may vectorise this without reordering a sum. */
    for (; i + 16 <= n; i += 16)
        for (size_t l = 0; l < 16; l++) {
            double x = (double)v[i + l];
            lane[l] += square ? x * x : fabs(x);
        }
    for (; i < n; i++) {
        double x = (double)v[i];
        lane[i & 15] += square ? x * x : fabs(x);
    }
    return reduce16(lane);
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
