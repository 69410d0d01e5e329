/*
 * data.h — the data half of gradcomp's reference trainer: Fashion-MNIST from Debian's
 * dataset-fashion-mnist package (gzip'd IDX files, read with zlib and validated), a learnable
 * synthetic stand-in for dataset-free smoke runs, and the per-epoch shuffle and per-rank shard
 * that every rank computes identically from (seed, epoch) without talking to the others.
 *
 * How a rank takes its data (data-parallel, P ranks, local batch B):
 *     gtrain_shuffle(perm, n, seed, epoch);                 identical on every rank
 *     count = gtrain_shard(perm, n, rank, P, mine);         mine[i] = perm[rank + P·i]
 *     for (s = 0; s + B <= count; s += B)                   same number of steps on every rank
 *         gtrain_data_gather(&d, mine + s, B, xb, yb), then forward_backward(xb, yb, B)
 * The stride is PyTorch DistributedSampler's: global step s then covers exactly perm[s·P·B ...
 * (s+1)·P·B), the same samples one process with batch P·B would see, so a P-rank run and a
 * 1-rank run at the same global batch train on the same batches. Every rank gets floor(n/P)
 * samples (the last n mod P of each epoch's permutation are dropped, different ones each epoch),
 * because ranks that take different numbers of steps deadlock in the collective.
 *
 * Statuses are gtrain_status from model.h. Nothing prints, exits or aborts.
 *
 * A validation split (gtrain_data_hold_out) comes out of the training set, so that a decision
 * taken on accuracy (the accuracy controller, the sensitivity probe) never looks at the test
 * set the results are reported on.
 *
 * Rejected: a fixed 28×28×60000 layout with no validation (a truncated download would train on
 * zeros); torchvision-style download on demand (the machines have no network; Debian packages the
 * data); a generic loader for any IDX type (the models take 28×28 uint8 images only).
 */
#ifndef GTRAIN_DATA_H
#define GTRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "model.h" /* gtrain_status, GTRAIN_INPUT_DIM, GTRAIN_CLASSES */

#ifdef __cplusplus
extern "C" {
#endif

/* Where Debian's dataset-fashion-mnist package puts the files. */
#define GTRAIN_FMNIST_DIR "/usr/share/datasets/fashion-mnist"
/* Pixel statistics of the Fashion-MNIST training set after x/255, used to standardise. */
#define GTRAIN_FMNIST_MEAN 0.2860f
#define GTRAIN_FMNIST_STD 0.3530f
/* Largest sample count a file may declare (Fashion-MNIST has 60000); caps what a corrupt header
 * can make the loader allocate. */
#define GTRAIN_DATA_MAX_SAMPLES 1000000u

/* A labelled dataset owned by the struct (free with gtrain_data_free). */
typedef struct gtrain_data {
    float *x;   /* n × dim floats, row-major, standardised: (p/255 − mean) / std */
    uint8_t *y; /* n labels, each < GTRAIN_CLASSES */
    size_t n;   /* samples */
    size_t dim; /* features per sample, GTRAIN_INPUT_DIM */
} gtrain_data;

/*
 * Loads one split of Fashion-MNIST: <dir>/<split>-images-idx3-ubyte.gz and
 * <dir>/<split>-labels-idx1-ubyte.gz (each also accepted without .gz; zlib reads plain files
 * as is).
 *   dir     NULL for GTRAIN_FMNIST_DIR
 *   split   "train" (60000) or "t10k" (10000)
 *   out     filled on success; zeroed on failure (nothing left allocated)
 *   err     if not NULL, receives a one-line message on failure (naming the file and what is
 *           wrong, and for a missing file the package to install); "" on success
 * Checks: magic 0x00000803 / 0x00000801, 28×28 images, equal and nonzero counts (at most
 * GTRAIN_DATA_MAX_SAMPLES), exactly as many bytes as declared (not fewer, not more), the gzip
 * stream's CRC, every label < 10.
 * Returns GTRAIN_OK, GTRAIN_ERR_ARG, GTRAIN_ERR_NOFILE, GTRAIN_ERR_IO, GTRAIN_ERR_FORMAT or
 * GTRAIN_ERR_NOMEM.
 */
int gtrain_data_load(const char *dir, const char *split, gtrain_data *out, char *err,
                     size_t errlen);

/*
 * A learnable synthetic 784-feature, 10-class problem for runs without the dataset: each class is
 * a mixture of two prototypes with N(0, 0.2²) entries (drawn once from a constant seed, so every
 * call poses the same problem); a sample is one of its class's prototypes plus unit noise, class
 * and prototype chosen uniformly. Noisy enough that it takes real training: the default MLP goes
 * from 10 % to ~95 % held-out accuracy in 300 steps of 64. Only the samples depend on seed: seeds
 * 1 and 2 give a training and a test set of the same problem.
 * The noise is an Irwin–Hall sum of uniforms (integer arithmetic, no libm), so the data are
 * bit-identical on every platform. Returns GTRAIN_OK, GTRAIN_ERR_ARG (n == 0 or too large) or
 * GTRAIN_ERR_NOMEM; on failure *out is zeroed.
 */
int gtrain_data_synthetic(size_t n, uint64_t seed, gtrain_data *out);

/*
 * Moves `n` samples of *d into *val, a held-out validation split: a uniformly random subset
 * drawn from GTRAIN_VAL_SEED, so every rank and every --seed holds out the same samples (a
 * fixed validation set; the training order still follows the run's seed). *d keeps the other
 * d->n − n samples in their order. Returns GTRAIN_OK; GTRAIN_ERR_ARG (n == 0, or n >= d->n:
 * nothing would be left to train on) or GTRAIN_ERR_NOMEM, with *d untouched and *val zeroed.
 */
#define GTRAIN_VAL_SEED 0x76616c6964617465ull /* "validate" */
int gtrain_data_hold_out(gtrain_data *d, size_t n, gtrain_data *val);

/* Frees what a dataset owns and zeroes it. NULL or an already freed dataset is a no-op. */
void gtrain_data_free(gtrain_data *d);

/*
 * perm ← a uniformly random permutation of 0..n−1, determined by (seed, epoch) alone: every rank
 * calling it with the same arguments gets the same permutation, on any platform (Fisher–Yates
 * driven by splitmix64, unbiased bounded draws by Lemire's method). Returns GTRAIN_OK or
 * GTRAIN_ERR_ARG (perm NULL with n > 0, or n > UINT32_MAX).
 */
int gtrain_shuffle(uint32_t *perm, size_t n, uint64_t seed, uint64_t epoch);

/*
 * Rank `rank` of `nranks` takes out[i] = perm[rank + nranks·i] for i < floor(n / nranks) and
 * returns that count (0 if nranks == 0 or rank >= nranks). out needs n / nranks entries.
 */
size_t gtrain_shard(const uint32_t *perm, size_t n, unsigned rank, unsigned nranks, uint32_t *out);

/* Copies the samples idx[0..count) of d into contiguous batch buffers x (count × dim) and y
 * (count), ready for gtrain_model_forward_backward. Indices must be < d->n. */
void gtrain_data_gather(const gtrain_data *d, const uint32_t *idx, size_t count, float *x,
                        uint8_t *y);

#ifdef __cplusplus
}
#endif

#endif /* GTRAIN_DATA_H */
