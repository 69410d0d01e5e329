/*
 * test_paired_se.c - gtrain_paired_se, the standard error of the difference between two
 * methods' test accuracies from their verdicts on the same samples: against the sample
 * standard deviation of the per-sample differences computed directly, zero for identical
 * verdicts, symmetric, and NaN where a verdict is missing or the sets differ.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "trainer.h"

/* The sample standard deviation of d_i = a_i - b_i over sqrt(n), in two passes. */
static double direct_se(const unsigned char *a, const unsigned char *b, size_t n) {
    double mean = 0, ss = 0;
    for (size_t i = 0; i < n; i++) mean += (double)a[i] - (double)b[i];
    mean /= (double)n;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i] - mean;
        ss += d * d;
    }
    return sqrt(ss / (double)(n - 1) / (double)n);
}

int main(void) {
    enum { N = 10000 };
    static unsigned char va[N], vb[N];
    gtrain_verdicts a = {va, N}, b = {vb, N};
    unsigned s = 12345;
    for (int i = 0; i < N; i++) { /* ~88 % right each, disagreeing on ~6 % */
        s = s * 1103515245u + 12345u;
        int u = (int)((s >> 8) % 1000);
        va[i] = u < 880;
        vb[i] = u < 850 || (u >= 880 && u < 910);
    }
    double se = gtrain_paired_se(&a, &b), want = direct_se(va, vb, N);
    CHECK(fabs(se - want) <= 1e-12 * want, "se %.15g, the per-sample differences' %.15g", se, want);
    CHECK(se > 0.002 && se < 0.003, "se %.4f for ~6 %% disagreement on 10000 samples", se);
    CHECK(gtrain_paired_se(&b, &a) == se, "se(b, a) %.15g != se(a, b) %.15g",
          gtrain_paired_se(&b, &a), se);
    CHECK(gtrain_paired_se(&a, &a) == 0, "identical verdicts: %g", gtrain_paired_se(&a, &a));

    /* one disagreement alone: d has one 1 among N; its sample variance is 1/N */
    for (int i = 0; i < N; i++) vb[i] = va[i];
    vb[7] = !va[7];
    se = gtrain_paired_se(&a, &b);
    want = direct_se(va, vb, N);
    CHECK(fabs(se - want) <= 1e-12 * want, "one disagreement: %.15g, direct %.15g", se, want);

    gtrain_verdicts none = {NULL, N}, shorter = {vb, N - 1};
    CHECK(isnan(gtrain_paired_se(&a, &none)), "no verdicts: %g", gtrain_paired_se(&a, &none));
    CHECK(isnan(gtrain_paired_se(&none, &a)), "no verdicts first: %g", gtrain_paired_se(&none, &a));
    CHECK(isnan(gtrain_paired_se(&a, &shorter)), "other sizes: %g", gtrain_paired_se(&a, &shorter));
    if (!check_failures) printf("train_paired_se: all checks passed\n");
    return check_failures != 0;
}
