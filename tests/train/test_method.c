/*
 * test_method.c — gtrain_method_policy, the one reading of a trainer method that `gradcomp
 * train` and `gradcomp plan` share: each form's policy string, the defaults filled in only
 * where the method's own items leave them out (matched as whole keys, not substrings), no
 * min_k item when the default floor is 0, a refusal when the policy does not fit, and every
 * string it writes accepted by the core's policy parser.
 */
#include <string.h>

#include "check.h"
#include "gradcomp.h"
#include "method.h"

static const gtrain_policy_defaults PD = {8192, 512, "none:values=f16"};

/* method -> expected policy under pd, and the policy parses. */
static void expect(const char *method, const gtrain_policy_defaults *pd, const char *want) {
    char out[512];
    int rc = gtrain_method_policy(method, pd, out, sizeof out);
    CHECK(rc == 0, "%s: rc %d", method, rc);
    CHECK(!strcmp(out, want), "%s:\n  got  %s\n  want %s", method, out, want);
    gcomp_policy *p = NULL;
    gcomp_error e = {0};
    CHECK(gcomp_policy_create(&p, out, &e) == GCOMP_OK, "%s: policy '%s' refused: %s", method, out,
          e.message);
    gcomp_policy_free(p);
}

int main(void) {
    expect("dense", &PD, "spec=none;dense=none");
    expect("policy:spec=int8;min_elements=1", &PD, "spec=int8;min_elements=1");
    expect("dgc:density=0.001", &PD,
           "spec=dgc:density=0.001;min_elements=8192;min_k=512;dense=none:values=f16");
    /* the method's own items win, each on its own key */
    expect("twobit:threshold=0.5;min_elements=16384", &PD,
           "spec=twobit:threshold=0.5;min_elements=16384;min_k=512;dense=none:values=f16");
    expect("topk:density=0.01;min_k=0;dense=int8", &PD,
           "spec=topk:density=0.01;min_k=0;dense=int8;min_elements=8192");
    /* a glob rule's spec that sets min_k is that tensor's, not the method's floor */
    expect("dgc:density=0.001;fc3.weight=dgc:density=0.01,min_k=0", &PD,
           "spec=dgc:density=0.001;fc3.weight=dgc:density=0.01,min_k=0;min_elements=8192;"
           "min_k=512;dense=none:values=f16");
    /* "dense_1d=0" is not "dense=": the default dense spec is still added */
    expect("topk:density=0.01;dense_1d=0", &PD,
           "spec=topk:density=0.01;dense_1d=0;min_elements=8192;min_k=512;dense=none:values=f16");
    /* a floor of 0 writes no item; a NULL dense spec is "none" */
    gtrain_policy_defaults bare = {1024, 0, NULL};
    expect("topk:density=0.01", &bare, "spec=topk:density=0.01;min_elements=1024;dense=none");

    /* dense-f16: the core's spelling of the dense codec with f16 values, on every tensor */
    char out[512], f16[128];
    CHECK(gcomp_spec_set("none", "values", "f16", f16, sizeof f16, NULL) == GCOMP_OK, "f16");
    char want[300];
    snprintf(want, sizeof want, "spec=%s;dense=%s", f16, f16);
    expect("dense-f16", &PD, want);

    /* too long: refused, never a policy cut in the middle of an item */
    CHECK(gtrain_method_policy("dgc:density=0.001", &PD, out, 30) == -1, "cap 30 accepted");
    CHECK(gtrain_method_policy("dense", &PD, out, 5) == -1, "cap 5 accepted");
    CHECK(gtrain_method_policy("dense", &PD, out, 0) == -1, "cap 0 accepted");
    if (check_failures) fprintf(stderr, "test_method: %d failure(s)\n", check_failures);
    return check_failures != 0;
}
