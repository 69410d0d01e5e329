/*
 * method.c - a trainer method as a layer policy (method.h).  It was written twice, in the
 * trainer and in `gradcomp plan`, and the two copies had drifted (one matched "dense=" as
 * a substring of any item); now both call this.
 */
#include "method.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "gradcomp.h"

/* Whether the ';'-separated items of `items` set policy key `key`. */
static bool sets_key(const char *items, const char *key) {
    size_t kl = strlen(key);
    for (const char *p = items; p; p = strchr(p, ';')) {
        if (*p == ';') p++;
        while (*p == ' ') p++;
        if (!strncmp(p, key, kl) && p[kl] == '=') return true;
    }
    return false;
}

/* Appends to out[*n..cap); false once it no longer fits. */
static bool append(char *out, size_t cap, size_t *n, const char *fmt, ...) {
    if (*n >= cap) return false;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(out + *n, cap - *n, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w >= cap - *n) {
        *n = cap;
        return false;
    }
    *n += (size_t)w;
    return true;
}

int gtrain_method_policy(const char *method, const gtrain_policy_defaults *pd, char *out,
                         size_t cap) {
    if (cap == 0) return -1;
    out[0] = 0;
    size_t n = 0;
    bool ok;
    if (!strcmp(method, "dense")) {
        ok = append(out, cap, &n, "spec=none;dense=none");
    } else if (!strcmp(method, "dense-f16")) {
        /* The dense codec with f16 values, spelled by the core (a bad spec makes the policy
         * refuse "spec="). */
        char f16[128] = "";
        gcomp_spec_set("none", "values", "f16", f16, sizeof f16, NULL);
        ok = append(out, cap, &n, "spec=%s;dense=%s", f16, f16);
    } else if (!strncmp(method, "policy:", 7)) {
        ok = append(out, cap, &n, "%s", method + 7);
    } else {
        const char *semi = strchr(method, ';');
        ok = append(out, cap, &n, "spec=%s", method);
        if (ok && (!semi || !sets_key(semi, "min_elements")))
            ok = append(out, cap, &n, ";min_elements=%zu", pd->min_elements);
        if (ok && pd->min_k && (!semi || !sets_key(semi, "min_k")))
            ok = append(out, cap, &n, ";min_k=%zu", pd->min_k);
        if (ok && (!semi || !sets_key(semi, "dense")))
            ok = append(out, cap, &n, ";dense=%s", pd->dense_spec ? pd->dense_spec : "none");
    }
    return ok ? 0 : -1;
}
