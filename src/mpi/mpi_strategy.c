/*
 * mpi_strategy.c - the table of strategy components, their names, and auto.
 *
 * The table is the only list of strategies in the library (mpi_strategy.h says how one is
 * added).  Several components may provide one strategy, as several of Open MPI's coll
 * components provide allreduce: `allreduce` is the linear pack (mpi_allreduce.c) and the
 * multi-phase protocol (mpi_lowrank.c), and the query picks between them.  Names, parsing and the
 * auto choice are derived from it: auto asks every component's query for a score and takes the
 * highest, the earlier entry on a tie, so the order below matters only for ties (the built-in
 * scores never tie).  Rejected: a switch on the id in the engine (every new strategy touched the
 * engine), and a registry filled at run time (Open MPI's dlopen'ed components: a static library
 * needs no plugins).
 */
#include "mpi_strategy.h"

#include <limits.h>

/* One line per strategy component (mpi_NAME.c defines gm_strategy_NAME). */
#define GM_COMPONENTS(X)                                                                           \
    X(allgather)                                                                                   \
    X(sparse)                                                                                      \
    X(allreduce)                                                                                   \
    X(rsag)                                                                                        \
    X(lowrank)

#define GM_EXTERN(n) extern const gm_strategy gm_strategy_##n;
GM_COMPONENTS(GM_EXTERN)
#undef GM_EXTERN

#define GM_ENTRY(n) &gm_strategy_##n,
static const gm_strategy *const table[] = {GM_COMPONENTS(GM_ENTRY)};
#undef GM_ENTRY

#define NCOMP (sizeof table / sizeof table[0])

size_t gm_strategy_count(void) {
    return NCOMP;
}

const gm_strategy *gm_strategy_at(size_t i) {
    return i < NCOMP ? table[i] : NULL;
}

const gm_strategy *gm_strategy_by_id(int id) {
    for (size_t i = 0; i < NCOMP; i++)
        if (table[i]->id == id) return table[i];
    return NULL;
}

const gm_strategy *gm_strategy_choose(const gm_query *q, int id, const char **why) {
    const gm_strategy *best = NULL;
    int top = INT_MIN;
    *why = "no strategy can carry it";
    for (size_t i = 0; i < NCOMP; i++) {
        if (id != GCOMP_MPI_AUTO && table[i]->id != id) continue;
        const char *w = NULL;
        int s = table[i]->query(q, &w);
        if (s > top) {
            top = s;
            best = table[i];
            if (s < 0 && w) *why = w; /* the closest refusal says most */
        }
    }
    /* Auto takes only what a component offers (> 0); a strategy named by the caller also
     * what it merely accepts (0). */
    return top > 0 || (top == 0 && id != GCOMP_MPI_AUTO) ? best : NULL;
}

/* ---- names --------------------------------------------------------------------------------- */

#define HIER "hierarchical"

gcomp_status gcomp_mpi_strategy_parse(const char *s, int *out) {
    if (!s || !out) return GCOMP_E_ARG;
    int flag = 0;
    size_t hl = sizeof HIER - 1;
    if (!strncmp(s, HIER, hl)) {
        flag = GCOMP_MPI_HIERARCHICAL;
        s += hl;
        if (*s == 0) {
            *out = flag | GCOMP_MPI_AUTO;
            return GCOMP_OK;
        }
        if (*s != ':') return GCOMP_E_ARG;
        s++;
    }
    if (!strcmp(s, "auto")) {
        *out = flag | GCOMP_MPI_AUTO;
        return GCOMP_OK;
    }
    for (size_t i = 0; i < NCOMP; i++)
        if (!strcmp(s, table[i]->name)) {
            *out = flag | table[i]->id;
            return GCOMP_OK;
        }
    return GCOMP_E_ARG;
}

const char *gcomp_mpi_strategy_name(int strategy) {
    int base = strategy & 0xff, flags = strategy & ~0xff;
    if (flags & ~GCOMP_MPI_HIERARCHICAL) return "?";
    if (base == GCOMP_MPI_AUTO) return flags ? HIER : "auto";
    const gm_strategy *S = gm_strategy_by_id(base);
    if (!S) return "?";
    return flags ? S->hier_name : S->name;
}

/* ---- auto ----------------------------------------------------------------------------------- */

gcomp_status gcomp_mpi_strategy_auto(const char *spec, int nranks, int *out) {
    if (!spec || !out) return GCOMP_E_ARG;
    char canon[512];
    gcomp_spec_info info;
    gcomp_status st = gm_spec_describe(spec, canon, sizeof canon, NULL, &info, NULL);
    if (st != GCOMP_OK) return st;
    gm_query q = {canon, &info, 0, 0, 0, nranks};
    const char *why;
    const gm_strategy *S = gm_strategy_choose(&q, GCOMP_MPI_AUTO, &why);
    if (!S) return GCOMP_E_UNSUPPORTED;
    *out = S->id;
    return GCOMP_OK;
}
