/*
 * ps_train.h - the reference trainer over a parameter server (issue 13): `gradcomp train
 * --ps S[:MODE,...]` runs each method through libgradcomp_mpi's `ps` strategy, on the same
 * workers, data and initial weights as the collective run of that method.
 *
 * Of the communicator's P ranks the last S serve (they build the model only to know its
 * tensors, and to give each key its optimizer: no weight decay on biases, no momentum
 * where DGC keeps it) and W = P - S train.  Modes:
 *   sync    dist_sync: every step every worker pushes its gradient; the servers sum the W
 *           pushes in worker order and every worker pulls the average, then applies the
 *           trainer's SGD itself (update = 0), or pulls the weights the servers' SGD made
 *           (update = 1, kv.set_optimizer).  Bit-identical weights on every worker.
 *   async   dist_async: the servers hold the weights and apply each push as it comes; a
 *           worker pulls the weights its push produced and goes on.  The run is measured in
 *           updates: W x steps_per_epoch x epochs pushes in all (the same samples as sync),
 *           so a fast worker makes more steps than a slow one; evaluations happen when the
 *           update count passes each evaluation point (every worker finishes its step, all
 *           pull the same weights, and the test set is shared as in sync).
 *   device  dist_sync_device: sync through hierarchical:ps, ranks_per_node workers per node
 *           summing densely first (the servers alone in their nodes).
 * Time to accuracy is training time: wall time on the workers minus evaluations.
 */
#ifndef GTRAIN_PS_TRAIN_H
#define GTRAIN_PS_TRAIN_H

#include "trainer.h"

enum { GTRAIN_PS_SYNC = 0, GTRAIN_PS_ASYNC = 1, GTRAIN_PS_DEVICE = 2 };

typedef struct gtrain_ps_config {
    int servers;          /* S >= 1 */
    int mode;             /* GTRAIN_PS_SYNC, _ASYNC or _DEVICE */
    int update;           /* sync and device: 1 = the servers run SGD; async always does */
    const char *pull;     /* NULL, "same" or a spec: BytePS's compressed pulls (sync, update 0) */
    int ranks_per_node;   /* device: workers per node (0: 2) */
    float async_momentum; /* async: the servers' momentum; < 0 (auto): see gtrain_ps_momentum */
} gtrain_ps_config;

/*
 * The servers' momentum in async mode for the trainer's momentum m and W workers, unless
 * set: max(0, 1 - W (1 - m)), i.e. a horizon 1/(1 - m_s) of 1/W of the sync run's.
 * Asynchrony itself acts like momentum 1 - 1/W (Mitliagkas et al. 2016, "Asynchrony begets
 * momentum"): stale gradients already average over about W updates.  Measured on the
 * Fashion-MNIST MLP of docs/BENCHMARKS.md, 4 workers, twobit, one epoch: the servers'
 * momentum 0.9 (the trainer's) reached 54 % where sync reached 86 %; 0.6 (this rule)
 * 85.7 % against sync's 86.0 % at the same momentum; 0.15 (m - (1 - 1/W)) 1.2 pp below sync
 * after three epochs.  Sync modes use m unchanged.
 */
float gtrain_ps_momentum(const gtrain_config *cfg, const gtrain_ps_config *pc, int workers);

/* Parses "S[:MODE[,MODE...]]" (MODE: sync, async, device; default sync) into *servers and
 * up to 3 modes.  Returns 0, or 1 with a message in err. */
int gtrain_ps_parse(const char *s, int *servers, int *modes, int *nmodes, char *err, size_t errlen);
/* "sync", "async", "device". */
const char *gtrain_ps_mode_name(int mode);

/* Trains `method` through the parameter server.  Collective over comm (workers and servers).
 * out is complete on worker 0 (rank 0); returns 0, or non-zero with a message in err. */
int gtrain_run_ps(const gtrain_config *cfg, const gtrain_ps_config *pc, const char *method,
                  const gtrain_data *train, const gtrain_data *test, MPI_Comm comm,
                  gtrain_result *out, char *err, size_t errlen);

#endif
