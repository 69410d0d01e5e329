/*
 * mpi_wire.h - the sizes by which the MPI layer (src/mpi) cuts and routes its messages, in
 * the one place that both it and the cost model (src/adapt/cost_laws.c, in the core
 * library, which does not see the MPI internals) read them from: a change here moves the
 * wire and its prediction together.
 */
#ifndef GCOMP_MPI_WIRE_H
#define GCOMP_MPI_WIRE_H

/* A sparse-allreduce slice's header (docs/FORMAT.md, "MPI sparse-allreduce slice"). */
#define GM_SLICE_HDR 8
/* A pack's reductions go in slices of this many bytes, below Open MPI's TCP eager limit
 * (64 KiB), at most GM_SLICES_MAX of them in flight. */
#define GM_SLICE_BYTES ((size_t)32 << 10)
#define GM_SLICES_MAX 16
/* Packs of at least this many bytes are reduced by the ring, smaller ones by the tree. */
#define GM_RING_MIN_BYTES ((size_t)256 << 10)

#endif
