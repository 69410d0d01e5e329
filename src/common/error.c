/*
 * error.c - error detail for both libraries: a status and a message a user can act on.
 */
#include "common.h"

#include <stdarg.h>
#include <stdio.h>

gcomp_status gcomp__fail(gcomp_error *err, gcomp_status st, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->status = st;
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return st;
}
