/*
 * half.c - float32 <-> IEEE binary16 and bfloat16, portable and exact.
 *
 * Round to nearest even in both directions of precision loss, NaN stays NaN (quiet),
 * overflow goes to infinity as the hardware does (or, for the _sat form, clips at +-65504
 * first).  The vector loops in the value coders and the MPI half sums use F16C when
 * compiled for it and are tested against these.  Shared by both libraries (common.h, which
 * also holds the bf16 casts inline: they are a shift and a rounding add, and array loops
 * over them vectorise only when the compiler can see them).
 */
#include "common.h"

uint16_t gcomp__f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
    if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504 */
    if (absx < 0x38800000u) {                                   /* subnormal or zero in f16 */
        if (absx < 0x33000000u) return (uint16_t)sign;          /* below half the smallest */
        uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(absx >> 23); /* 14..24 */
        uint32_t r = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (absx - 0x38000000u) >> 13; /* rebias 127 -> 15 */
    uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

uint16_t gcomp__f32_to_f16_sat(float f) {
    /* NaN fails both comparisons and stays NaN. */
    if (f > 65504.0f)
        f = 65504.0f;
    else if (f < -65504.0f)
        f = -65504.0f;
    return gcomp__f32_to_f16(f);
}

float gcomp__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0) {
        if (m == 0) {
            x = sign;
        } else { /* subnormal: normalise */
            e = 113;
            while (!(m & 0x400u)) {
                m <<= 1;
                e--;
            }
            x = sign | (e << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (e == 31) {
        x = sign | 0x7f800000u | (m << 13);
    } else {
        x = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}
