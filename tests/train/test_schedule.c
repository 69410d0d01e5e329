/*
 * test_schedule.c — gtrain_lr_at, the learning-rate schedules every method of a comparison
 * follows: constant, cosine (lr at the start, lr/2 halfway, 0 at the end, monotone) and step
 * (lr, lr/10 from half the run, lr/100 from three quarters), and clamping outside [0, 1].
 */
#include <math.h>
#include <stdio.h>

#include "check.h"
#include "trainer.h"

static int near(double a, double b) {
    return fabs(a - b) <= 1e-6 * (fabs(b) + 1e-6);
}

int main(void) {
    gtrain_config c = {0};
    c.lr = 0.2f;
    c.lr_schedule = GTRAIN_LR_CONST;
    for (double p = -0.5; p <= 1.5; p += 0.25)
        CHECK(gtrain_lr_at(&c, p) == c.lr, "const at %g: %g", p, (double)gtrain_lr_at(&c, p));

    c.lr_schedule = GTRAIN_LR_COSINE;
    CHECK(near(gtrain_lr_at(&c, 0), 0.2), "cosine at 0: %g", (double)gtrain_lr_at(&c, 0));
    CHECK(near(gtrain_lr_at(&c, 0.5), 0.1), "cosine at 1/2: %g", (double)gtrain_lr_at(&c, 0.5));
    CHECK(fabs(gtrain_lr_at(&c, 1)) < 1e-7, "cosine at 1: %g", (double)gtrain_lr_at(&c, 1));
    CHECK(gtrain_lr_at(&c, 2) == gtrain_lr_at(&c, 1) && gtrain_lr_at(&c, -1) == gtrain_lr_at(&c, 0),
          "cosine clamps progress to [0, 1]");
    float prev = gtrain_lr_at(&c, 0);
    for (int i = 1; i <= 100; i++) {
        float lr = gtrain_lr_at(&c, i / 100.0);
        CHECK(lr <= prev, "cosine rises at %d%%: %g after %g", i, (double)lr, (double)prev);
        prev = lr;
    }

    c.lr_schedule = GTRAIN_LR_STEP;
    CHECK(near(gtrain_lr_at(&c, 0.49), 0.2), "step before 1/2: %g", (double)gtrain_lr_at(&c, 0.49));
    CHECK(near(gtrain_lr_at(&c, 0.5), 0.02), "step at 1/2: %g", (double)gtrain_lr_at(&c, 0.5));
    CHECK(near(gtrain_lr_at(&c, 0.74), 0.02), "step before 3/4: %g",
          (double)gtrain_lr_at(&c, 0.74));
    CHECK(near(gtrain_lr_at(&c, 0.75), 0.002), "step at 3/4: %g", (double)gtrain_lr_at(&c, 0.75));
    if (!check_failures) printf("train_schedule: all checks passed\n");
    return check_failures != 0;
}
