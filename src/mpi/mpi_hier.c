/*
 * mpi_hier.c - the hierarchical wrapper: a dense float32 sum inside each node, the
 * compressed exchange between node leaders only, and the result sent back inside the
 * node (the two-level scheme of Horovod's hierarchical allreduce and BytePS, with the
 * compression only where bandwidth is scarce).
 *
 *   copy      work = this rank's gradient
 *   up        binomial tree to the node leader (node rank 0): in round k (d = 2^k) rank
 *             q with q mod 2d == d sends its partial sum to q - d, which adds it (LOCAL)
 *   (inner)   the leaders run the tensor's strategy among themselves on the node sums,
 *             with the compressors living on the leaders only; with a single node there
 *             is nothing to exchange and the exact sum is kept
 *   down      the same tree in reverse: a status word and each result travel from the
 *             leader back to every rank of the node
 *   finish    copy (and scale, single node) into the caller's buffers
 *
 * Point-to-point (MPI_Isend / MPI_Irecv) rather than MPI_Ireduce / MPI_Ibcast: Open MPI's
 * non-blocking collectives (libnbc) moved an 8 MB reduce between two ranks of one node
 * at 80-500 MB/s here (one pipeline segment per progress call), while point-to-point
 * messages use the shared-memory transport's single copy; 2 nodes x 2 ranks, 2M floats:
 * 82 ms with libnbc, see docs/BENCHMARKS.md for the tree.  Rejected: an MPI shared-memory
 * window (MPI_Win_allocate_shared is blocking, so a dead peer could hang set-up).
 * The node communicator is MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), or consecutive
 * groups of ranks_per_node ranks for tests on one machine.  Every rank of a node runs
 * the same rounds (the same node size), and messages between two ranks are posted in
 * the same order on both sides, so they match without tags.
 */
#include "mpi_internal.h"

#include <stdio.h>

#define HIER_TAG 7001

static int rounds_of(int size) {
    int r = 0;
    while ((1 << r) < size) r++;
    return r;
}

static gcomp_status hier_copy(gcomp_mpi_bucket *b, gm_group *g) {
    for (size_t k = 0; k < g->nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        uint64_t t0 = gm_now_ns();
        memcpy(t->work.p, t->data, t->n * sizeof(float));
        t->call.codec_ns += gm_now_ns() - t0;
    }
    g->hround = 0;
    g->hdown = rounds_of(b->comm->node_size) - 1;
    *g->hstat = 0;
    return GCOMP_OK;
}

static gcomp_status hier_up(gcomp_mpi_bucket *b, gm_group *g) {
    int q = b->comm->node_rank, S = b->comm->node_size, d = 1 << g->hround;
    bool send = q % (2 * d) == d, recv = q % (2 * d) == 0 && q + d < S;
    for (size_t k = 0; k < g->nt && (send || recv); k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        int rc =
            send ? MPI_Isend(t->work.p, (int)t->n, MPI_FLOAT, q - d, HIER_TAG, b->bnode, &g->req[k])
                 : MPI_Irecv(t->tmp.p, (int)t->n, MPI_FLOAT, q + d, HIER_TAG, b->bnode, &g->req[k]);
        if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Isend/Irecv (inside the node)");
        g->nreq = (int)k + 1;
        t->call.node_bytes += 4 * (uint64_t)t->n;
        g->node_bytes += 4 * (uint64_t)t->n;
    }
    return GCOMP_OK;
}

static gcomp_status hier_add(gcomp_mpi_bucket *b, gm_group *g) {
    int q = b->comm->node_rank, S = b->comm->node_size, d = 1 << g->hround;
    if (q % (2 * d) == 0 && q + d < S)
        for (size_t k = 0; k < g->nt; k++) {
            gm_tensor *t = &b->t[g->t0 + k];
            uint64_t t0 = gm_now_ns();
            float *w = t->work.p;
            const float *x = t->tmp.p;
            for (size_t i = 0; i < t->n; i++) w[i] += x[i];
            t->call.codec_ns += gm_now_ns() - t0;
        }
    g->hround++;
    return GCOMP_OK;
}

/* The leader's verdict for its node, computed once before anything goes down. */
static void leader_status(gcomp_mpi_bucket *b, gm_group *g) {
    if (g->single_node && g->st == GCOMP_OK) {
        /* No codec saw the sum: check it here, or a NaN would pass silently. */
        for (size_t k = 0; k < g->nt && g->st == GCOMP_OK; k++) {
            const gm_tensor *t = &b->t[g->t0 + k];
            if (!gm_finite(t->work.p, t->n)) /* a NaN/Inf input, or an overflowed sum */
                gm_group_shared_fail(b, g, GCOMP_E_NONFINITE, -1, g->t0 + k);
        }
    }
    *g->hstat = g->st != GCOMP_OK ? gm_marker(g->st, b->comm->node_index) : 0;
}

static gcomp_status hier_down(gcomp_mpi_bucket *b, gm_group *g) {
    int q = b->comm->node_rank, S = b->comm->node_size, d = 1 << g->hdown;
    if (q == 0 && g->hdown == rounds_of(S) - 1) leader_status(b, g);
    g->hdown--;
    bool send = q % (2 * d) == 0 && q + d < S, recv = q % (2 * d) == d;
    if (!send && !recv) return GCOMP_OK;
    int peer = send ? q + d : q - d, rc;
    rc = send ? MPI_Isend(g->hstat, 1, MPI_UINT64_T, peer, HIER_TAG, b->bnode, &g->req[0])
              : MPI_Irecv(g->hstat, 1, MPI_UINT64_T, peer, HIER_TAG, b->bnode, &g->req[0]);
    if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Isend/Irecv (status, inside the node)");
    g->nreq = 1;
    for (size_t k = 0; k < g->nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        rc = send ? MPI_Isend(t->work.p, (int)t->n, MPI_FLOAT, peer, HIER_TAG, b->bnode,
                              &g->req[k + 1])
                  : MPI_Irecv(t->work.p, (int)t->n, MPI_FLOAT, peer, HIER_TAG, b->bnode,
                              &g->req[k + 1]);
        if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Isend/Irecv (inside the node)");
        g->nreq = (int)k + 2;
        t->call.node_bytes += 4 * (uint64_t)t->n;
        g->node_bytes += 4 * (uint64_t)t->n;
    }
    return GCOMP_OK;
}

static gcomp_status hier_finish(gcomp_mpi_bucket *b, gm_group *g) {
    if (b->comm->node_rank == 0 && b->comm->node_size == 1) leader_status(b, g);
    if (b->comm->node_rank != 0 && (*g->hstat & GM_MARK) && g->st == GCOMP_OK) {
        /* The leader's group message stays on the leader; say where to look. */
        g->st = gm_marker_status(*g->hstat);
        snprintf(g->msg, sizeof g->msg,
                 "sub-bucket at tensor '%s': %s (reported by the leader of node %d)",
                 b->t[g->t0].name, gcomp_status_str(g->st), gm_marker_rank(*g->hstat));
    }
    if (g->st != GCOMP_OK) return GCOMP_OK;
    float s = g->single_node ? b->scale : 1.0f;
    for (size_t k = 0; k < g->nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        uint64_t t0 = gm_now_ns();
        const float *w = t->work.p;
        if (s == 1.0f)
            memcpy(t->data, w, t->n * sizeof(float));
        else
            for (size_t i = 0; i < t->n; i++) t->data[i] = s * w[i];
        t->call.codec_ns += gm_now_ns() - t0;
    }
    return GCOMP_OK;
}

void gm_steps_hier_prefix(gm_group *g, int node_size) {
    gm_add_step(g, false, hier_copy, "copying into the node buffer");
    for (int k = 0; k < rounds_of(node_size); k++) {
        gm_add_step(g, true, hier_up, "summing inside the node (MPI_Isend/Irecv)");
        gm_add_step(g, false, hier_add, "adding inside the node");
    }
}

void gm_steps_hier_suffix(gm_group *g, int node_size) {
    for (int k = 0; k < rounds_of(node_size); k++)
        gm_add_step(g, true, hier_down, "sending the result inside the node (MPI_Isend/Irecv)");
    gm_add_step(g, false, hier_finish, "copying the node result");
}
