/*
 * mpi_hier.c - the hierarchical wrapper: a dense float32 sum inside each node, the
 * compressed exchange between node leaders only, a broadcast back inside the node
 * (the two-level scheme of Horovod's hierarchical allreduce and BytePS, with the
 * compression only where bandwidth is scarce).
 *
 *   reduce    MPI_Ireduce(SUM) of each tensor to the node leader (node rank 0), into the
 *             tensor's work buffer: shared memory inside a node is cheap, so it stays
 *             exact and dense
 *   (inner)   the leaders run the tensor's strategy among themselves on the node sums,
 *             with the compressors living on the leaders only; with a single node there
 *             is nothing to exchange and the exact sum is kept
 *   bcast     a status word and each result from the leader to its node
 *   finish    copy (and scale, single node) into the caller's buffers
 *
 * The node communicator is MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), or consecutive
 * groups of ranks_per_node ranks for tests on one machine.  Collectives on the node
 * communicator are issued in the same (group, step) order by leaders and other ranks,
 * because the inner steps in between are only on the leaders' communicator.
 */
#include "mpi_internal.h"

#include <stdio.h>

static gcomp_status hier_reduce(gcomp_mpi_bucket *b, gm_group *g) {
    bool leader = b->comm->node_rank == 0;
    for (size_t k = 0; k < g->nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        int rc = MPI_Ireduce(t->data, leader ? t->work.p : NULL, (int)t->n, MPI_FLOAT, MPI_SUM, 0,
                             b->bnode, &g->req[k]);
        if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Ireduce (inside the node)");
        g->nreq = (int)k + 1;
        t->call.node_bytes += 4 * (uint64_t)t->n;
        g->node_bytes += 4 * (uint64_t)t->n;
    }
    return GCOMP_OK;
}

static gcomp_status hier_bcast(gcomp_mpi_bucket *b, gm_group *g) {
    bool leader = b->comm->node_rank == 0;
    if (leader && g->single_node && g->st == GCOMP_OK) {
        /* No codec saw the sum: check it here, or a NaN would pass silently. */
        for (size_t k = 0; k < g->nt && g->st == GCOMP_OK; k++) {
            const gm_tensor *t = &b->t[g->t0 + k];
            const float *w = t->work.p;
            float acc = 0.0f;
            for (size_t i = 0; i < t->n; i++) acc += w[i] * 0.0f; /* NaN/Inf make it NaN */
            if (acc != acc) gm_group_shared_fail(b, g, GCOMP_E_NONFINITE, -1, g->t0 + k);
        }
    }
    g->hstat = leader && g->st != GCOMP_OK ? gm_marker(g->st, b->comm->node_index) : 0;
    int rc = MPI_Ibcast(&g->hstat, 1, MPI_UINT64_T, 0, b->bnode, &g->req[0]);
    if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Ibcast (status, inside the node)");
    g->nreq = 1;
    for (size_t k = 0; k < g->nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        rc = MPI_Ibcast(t->work.p, (int)t->n, MPI_FLOAT, 0, b->bnode, &g->req[k + 1]);
        if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Ibcast (inside the node)");
        g->nreq = (int)k + 2;
        t->call.node_bytes += 4 * (uint64_t)t->n;
        g->node_bytes += 4 * (uint64_t)t->n;
    }
    return GCOMP_OK;
}

static gcomp_status hier_finish(gcomp_mpi_bucket *b, gm_group *g) {
    if (b->comm->node_rank != 0 && (g->hstat & GM_MARK) && g->st == GCOMP_OK) {
        /* The leader's group message stays on the leader; say where to look. */
        g->st = gm_marker_status(g->hstat);
        snprintf(g->msg, sizeof g->msg,
                 "sub-bucket at tensor '%s': %s (reported by the leader of node %d)",
                 b->t[g->t0].name, gcomp_status_str(g->st), gm_marker_rank(g->hstat));
    }
    if (g->st != GCOMP_OK) return GCOMP_OK;
    float s = g->single_node ? b->scale : 1.0f;
    for (size_t k = 0; k < g->nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        const float *w = t->work.p;
        if (s == 1.0f)
            memcpy(t->data, w, t->n * sizeof(float));
        else
            for (size_t i = 0; i < t->n; i++) t->data[i] = s * w[i];
    }
    return GCOMP_OK;
}

void gm_steps_hier_prefix(gm_group *g) {
    gm_add_step(g, true, hier_reduce, "summing inside the node (MPI_Ireduce)");
}

void gm_steps_hier_suffix(gm_group *g) {
    gm_add_step(g, true, hier_bcast, "broadcasting inside the node (MPI_Ibcast)");
    gm_add_step(g, false, hier_finish, "copying the node result");
}
