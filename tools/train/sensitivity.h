/*
 * sensitivity.h - `gradcomp train --sensitivity SPEC`: each layer's accuracy cost of
 * compression, one short run per layer, and the layer policy it suggests.
 */
#ifndef GCOMP_TOOLS_SENSITIVITY_H
#define GCOMP_TOOLS_SENSITIVITY_H

#include <mpi.h>

#include "data.h"
#include "trainer.h"

/* Runs the probe (collective over comm) and writes OUT/sensitivity.txt and
 * OUT/layer_policy.txt on rank 0.  Returns 0, 1 on a failed run, 2 on bad input. */
int train_sensitivity(const gtrain_config *cfg, const char *spec, double threshold_pp,
                      const gtrain_data *train, const gtrain_data *test, const char *outdir,
                      MPI_Comm comm);

#endif
