/*
 * model.h — the model half of gradcomp's reference trainer: an MLP and a LeNet-like CNN for
 * 28×28 grey images in 10 classes, with an explicit list of parameter tensors, a hand-written
 * backward pass that reports each tensor's gradient as soon as it is final (so the caller can
 * start compressing and sending it while earlier layers are still being computed), and SGD with
 * momentum whose momentum can be left to a compressor (DGC) tensor by tensor.
 *
 * Conventions, said once:
 * - Activations are row-major float32, one sample per row; an input batch is batch × 784.
 * - Tensors are listed in forward order (fc1.weight, fc1.bias, fc2.weight, ...); the weights of
 *   all tensors lie back to back in one flat buffer in that order, and so do the gradients, so a
 *   dense baseline can allreduce every gradient with one call on tensors[0].g over
 *   gtrain_model_num_params() floats.
 * - Every forward_backward OVERWRITES each g with the gradient of the MEAN loss of that batch
 *   (or of its SUMMED loss after gtrain_model_set_summed_loss; see there).
 * - A model is used by one thread at a time; distinct models are independent. Matrix products go
 *   through OpenBLAS, whose own thread count is set by the caller (OPENBLAS_NUM_THREADS=1 for
 *   one MPI rank per core); this library never changes it.
 * - Nothing here prints, exits or aborts; fallible calls return a gtrain_status.
 *
 * Rejected: a general autograd tape (three fixed architectures do not need one, and a tape would
 * allocate per step); per-tensor allocations (no flat buffer for a one-call dense allreduce);
 * returning the loss as a float with NaN for misuse (the project's error model is a status plus
 * out-parameters).
 */
#ifndef GTRAIN_MODEL_H
#define GTRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Image geometry and class count of the data the models take (Fashion-MNIST's). */
#define GTRAIN_IMAGE_SIDE 28
#define GTRAIN_INPUT_DIM (GTRAIN_IMAGE_SIDE * GTRAIN_IMAGE_SIDE)
#define GTRAIN_CLASSES 10

/* The kinds gtrain_model_create accepts, for help texts. */
#define GTRAIN_MODEL_KINDS "mlp, mlp-large, cnn"

/* Status of every fallible call in src/train (model.h and data.h). Values are never renumbered. */
typedef enum gtrain_status {
    GTRAIN_OK = 0,
    GTRAIN_ERR_ARG = 1,    /* a bad argument: unknown kind, bad hidden list, batch 0, label >= 10 */
    GTRAIN_ERR_NOMEM = 2,  /* an allocation failed; nothing is left allocated */
    GTRAIN_ERR_NOFILE = 3, /* a data file does not exist (the message says how to install it) */
    GTRAIN_ERR_FORMAT = 4, /* a data file is corrupt, truncated or not what its name says */
    GTRAIN_ERR_IO = 5      /* a data file exists but could not be opened or read */
} gtrain_status;

/* A static English name for a status; never NULL. */
const char *gtrain_strerror(int status);

/*
 * One parameter tensor. Borrowed from the model (valid until gtrain_model_free); the caller may
 * read and write w and g in place but must not free them or change the other fields.
 *   name    "fc1.weight", "fc1.bias", "conv1.weight", ...
 *   w, g    n floats of weights and of gradient (g written by forward_backward)
 *   rows, cols  the tensor seen as a matrix: dense weights out × in, conv weights
 *           out_channels × (in_channels·kh·kw), biases n × 1 (rows·cols == n always)
 *   is_bias 1 for biases (no weight decay; a layer-wise compression policy usually sends them
 *           dense), 0 for weights
 */
typedef struct gtrain_tensor {
    const char *name;
    float *w;
    float *g;
    size_t n;
    size_t rows, cols;
    int is_bias;
} gtrain_tensor;

typedef struct gtrain_model gtrain_model;

/* Called from inside gtrain_model_forward_backward, on the caller's thread, as soon as
 * tensors[tensor_index].g is final for this batch. Calls come once per tensor per step in
 * strictly decreasing tensor_index (the last layer's bias first, the first layer's weight last).
 * The callback may read g (e.g. start an MPI_Isend on it) but must not write g or w, and must not
 * call back into the model. */
typedef void (*gtrain_grad_ready_fn)(void *ctx, size_t tensor_index);

/*
 * Creates a model with all its buffers (weights, gradients, momentum, activations and scratch for
 * up to max_batch samples), so that no later call allocates.
 *   kind       "mlp" (784-h1-...-hk-10, ReLU), "mlp-large" (784-4096-4096-10), or "cnn"
 *              (conv 5×5 1→c1 pad 2 + max-pool 2×2 + ReLU, conv 5×5 c1→c2 pad 0 + max-pool 2×2 +
 *              ReLU, fc c2·5·5→f + ReLU, fc f→10; LeNet-5's geometry: 28→28→14→10→5)
 *   hidden     NULL for the kind's default, else a comma list: for "mlp" the hidden widths
 *              (default "1024,1024"; "" means no hidden layer, i.e. softmax regression; at most
 *              8 layers of 1..65536), for "cnn" exactly "c1,c2,f" (default "16,32,128"); must be
 *              NULL for "mlp-large"
 *   seed       weight init: He-uniform U(±sqrt(6/fan_in)) for layers followed by ReLU,
 *              U(±sqrt(3/fan_in)) for the output layer, biases 0; each tensor draws from its own
 *              splitmix64 stream keyed by (seed, tensor index), so the same seed gives
 *              bit-identical weights on every platform
 *   max_batch  largest batch forward_backward will be given (1..65536)
 *   out        receives the model; set to NULL on failure
 * Returns GTRAIN_OK, GTRAIN_ERR_ARG or GTRAIN_ERR_NOMEM. A failed create leaves nothing allocated.
 */
int gtrain_model_create(const char *kind, const char *hidden, uint64_t seed, size_t max_batch,
                        gtrain_model **out);

/* Frees a model and everything it owns. NULL is a no-op. */
void gtrain_model_free(gtrain_model *m);

/* The model's tensors in forward order; *count receives their number (may be NULL). */
gtrain_tensor *gtrain_model_tensors(gtrain_model *m, size_t *count);

/* The backward work, in multiply-adds a sample, between tensor i's gradient and the one
 * before it in backward order (the cost model's gcomp_cost_tensor.work): a weight's layer's
 * forward multiply-adds, a bias's output elements (before pooling for a conv).  0 for an
 * index out of range. */
double gtrain_model_tensor_macs(const gtrain_model *m, size_t i);

/* Total number of parameters = sum of tensors[i].n = length of the flat w and g buffers. */
size_t gtrain_model_num_params(const gtrain_model *m);

/* The max_batch the model was created with. */
size_t gtrain_model_max_batch(const gtrain_model *m);

/* Sets (or with fn == NULL clears) the gradient-ready callback; ctx is passed back as is. */
void gtrain_model_set_grad_ready(gtrain_model *m, gtrain_grad_ready_fn fn, void *ctx);

/*
 * Chooses the unit of g: on == 0 (the default) the gradient of the batch's mean loss, PyTorch's
 * convention; on != 0 that of its summed loss, MXNet/Gluon's, whose Trainer.step(batch_size)
 * divides by batch_size inside the optimizer. gtrain_sgd_step then divides g by the batch of the
 * last forward_backward, so the weights follow the same path either way; what changes is the
 * number a compressor sees between the two: codecs with an absolute threshold (MXNet's 2-bit
 * quantizer, `threshold`) act B times finer in the summed unit; scale-free ones (top-k, sign
 * with a scale, PowerSGD, QSGD) do not care.
 */
void gtrain_model_set_summed_loss(gtrain_model *m, int on);

/*
 * One training pass: forward, mean softmax cross-entropy, backward from the last layer to the
 * first, calling the gradient-ready callback for each tensor as soon as its g is final.
 *   x      batch × 784 floats (borrowed for the call)
 *   y      batch labels, each < 10
 *   batch  1..max_batch
 *   loss   receives the mean loss over the batch (may be NULL)
 * Returns GTRAIN_OK, or GTRAIN_ERR_ARG (nothing computed, no callback made) for a NULL pointer,
 * a batch out of range or a label >= 10.
 */
int gtrain_model_forward_backward(gtrain_model *m, const float *x, const uint8_t *y, size_t batch,
                                  float *loss);

/* Predicted class of each of count samples (any count; done in chunks of max_batch).
 * Returns GTRAIN_OK or GTRAIN_ERR_ARG. Does not touch gradients. */
int gtrain_model_predict(gtrain_model *m, const float *x, size_t count, uint8_t *pred);

/* Mean cross-entropy and accuracy (fraction in [0,1]) over count labelled samples, in chunks of
 * max_batch. Either out-pointer may be NULL. Returns GTRAIN_OK or GTRAIN_ERR_ARG (count 0, a
 * label >= 10, NULL x or y). Does not touch gradients. */
int gtrain_model_evaluate(gtrain_model *m, const float *x, const uint8_t *y, size_t count,
                          double *loss, double *accuracy);

/*
 * One SGD step on every tensor from its current g, with PyTorch's torch.optim.SGD semantics
 * (dampening 0): d = g + wd·w (wd = 0 for biases; g/B instead of g when the loss is summed, B
 * the batch of the last forward_backward); v = momentum·v + d; w -= lr·(nesterov ?
 * d + momentum·v : v). Momentum buffers start at zero and are owned by the model.
 *   skip_momentum  NULL, or one flag per tensor: a flagged tensor gets w -= lr·d and its
 *                  momentum buffer is untouched (DGC keeps the momentum inside the compressor and
 *                  hands back an update that already contains it), but for the decaying tail
 *                  of a buffer released by gtrain_sgd_release_tensor
 * momentum == 0 is plain SGD. One pass over each tensor.
 */
void gtrain_sgd_step(gtrain_model *m, float lr, float momentum, float weight_decay, int nesterov,
                     const unsigned char *skip_momentum);

/* Sets every momentum buffer to zero (e.g. when a run restarts from saved weights). */
void gtrain_sgd_reset(gtrain_model *m);
/*
 * Tensor i's momentum moves into its compressor (an adaptive method switched it to DGC, which
 * keeps the momentum from its next step on; the caller flags it in skip_momentum from now).
 * What the buffer holds is gradient the optimizer still owes the weights: m·v + m²·v + ...
 * = m·v/(1 − m) over the steps it would have decayed through.  Dropping it would lose that
 * (9 steps' worth at m = 0.9), so the flagged tensor goes on applying it, decaying by the
 * momentum a step with no new gradient added, w -= lr·(d + m^k·v) (Nesterov: m^(k+1)·v),
 * until m^k < 2^-24, when the rest is below float precision of it and the buffer is zeroed.
 * A tensor whose momentum comes back to the optimizer before then (unflagged) continues
 * from the buffer as it is.
 */
void gtrain_sgd_release_tensor(gtrain_model *m, size_t i);

#ifdef __cplusplus
}
#endif

#endif /* GTRAIN_MODEL_H */
