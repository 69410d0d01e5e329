/*
 * mpi_ps.h - what the parameter-server files share (mpi_ps.c: the server object and the
 * strategy component's worker side; mpi_ps_serve.c: the server loop; mpi_ps_state.c:
 * checkpoints and statistics).  Never installed.
 *
 * A key is a tensor of a bucket created with a gcomp_mpi_ps; it is cut into parts, each
 * owned by one server (partitioning: mpi_ps.c).  A worker's sub-bucket (gm_group) sends
 * one push frame to each server that owns parts of it and receives one reply frame from
 * each.  Frames (docs/FORMAT.md, "MPI parameter-server frames") are little-endian: a
 * 48-byte header, a table of entries (tensor, part, length), the CRC-32C of header, table
 * and any dense payload, then the payload (gcomp messages, or dense float32 parts).
 *
 * Who talks on which communicator:
 *   pushes and their replies   the bucket's duplicate (b->bc), tags PS_TAG_PUSH + 2 gi and
 *                              PS_TAG_PUSH + 2 gi + 1 for the bucket's gi-th sub-bucket
 *   init and pull requests     b->bc, PS_TAG_CTRL (servers probe for them); replies on
 *                              PS_TAG_PULL_REPLY and PS_TAG_INIT_REPLY (ps_reply_tag)
 *   shutdown                   the server object's duplicate (ps->pc), PS_TAG_STOP
 * Messages between two ranks on one (communicator, tag) are matched in the order they
 * were sent (MPI's non-overtaking rule), and a worker has at most one push per sub-bucket
 * in flight, so pre-posted receives never see two pushes of one worker mixed up.  Init
 * replies have a tag of their own: only pusher 0 sends the init, and the server answers
 * every pusher, so a worker that is still in its pull may already have the reply to an
 * init it has not called yet on its way; on one tag that reply would be taken as the
 * pull's.
 */
#ifndef GCOMP_MPI_PS_H
#define GCOMP_MPI_PS_H

#include "mpi_strategy.h"

#define PS_TAG_CTRL 100
#define PS_TAG_PULL_REPLY 101
#define PS_TAG_STOP 102
#define PS_TAG_INIT_REPLY 103
#define PS_TAG_PUSH 1000

/* ---- frames (docs/FORMAT.md) --------------------------------------------------------- */

#define PS_HDR 48
#define PS_ENTRY 16
#define PS_PUSH_MAGIC "GCpf"
#define PS_REPLY_MAGIC "GCpr"
enum { PS_PUSH = 1, PS_INIT = 2, PS_PULL = 3 }; /* kinds; a reply has its request's */
enum { PS_F_AVERAGE = 1, PS_F_COMPRESSED = 1 }; /* push flags / reply flags */

/* The tag the reply to a request of this kind travels on. */
static inline int ps_reply_tag(int kind) {
    return kind == PS_INIT ? PS_TAG_INIT_REPLY : PS_TAG_PULL_REPLY;
}

static inline size_t ps_frame_fixed(size_t m) {
    return PS_HDR + PS_ENTRY * m + 4;
}
/* Bound of a frame with m entries and `payload` bytes of payload (+4 for a dense CRC). */
static inline size_t ps_frame_bound(size_t m, size_t payload) {
    return ps_frame_fixed(m) + payload + 4;
}

/* A parsed frame header (both directions: `who` is the sender's pusher or server index,
 * `extra` the reply's lost-worker count or 0, `stale` the reply's staleness). */
typedef struct ps_hdr {
    int kind;
    unsigned flags;
    uint32_t who, group, lost, stale, m;
    uint64_t round, version, marker;
    float lr;
    unsigned session; /* requests: the sender's session (its shutdowns so far, mod 2^16) */
} ps_hdr;

/* Writes a header and its table's fixed fields; entries are filled by ps_put_entry. */
void gm_ps_put_hdr(uint8_t *f, bool reply, const ps_hdr *h);
static inline void ps_put_entry(uint8_t *f, size_t e, uint32_t tensor, uint32_t part,
                                uint64_t len) {
    uint8_t *p = f + PS_HDR + PS_ENTRY * e;
    gcomp__put32(p, tensor);
    gcomp__put32(p + 4, part);
    gcomp__put64(p + 8, len);
}
static inline void ps_get_entry(const uint8_t *f, size_t e, uint32_t *tensor, uint32_t *part,
                                uint64_t *len) {
    const uint8_t *p = f + PS_HDR + PS_ENTRY * e;
    *tensor = gcomp__get32(p);
    *part = gcomp__get32(p + 4);
    *len = gcomp__get64(p + 8);
}
/* The CRC-32C of header and table, after the table.  A frame with dense float32 payload
 * (init values, dense replies) ends with a second CRC-32C, of those `dense` bytes
 * (gm_ps_seal_dense); gcomp messages carry their own. */
void gm_ps_seal(uint8_t *f, size_t m);
void gm_ps_seal_dense(uint8_t *f, size_t m, size_t dense);
/* Checks magic, m <= max_m, that the frame fits in cap, the CRC, then the kind and the
 * reserved fields, and fills *h.  GCOMP_E_TRUNCATED, _BAD_MAGIC, _CHECKSUM, _CORRUPT. */
gcomp_status gm_ps_open(const uint8_t *f, size_t cap, bool reply, size_t max_m, ps_hdr *h);
/* Checks the dense payload's CRC (`dense` bytes after the table, inside cap). */
gcomp_status gm_ps_check_dense(const uint8_t *f, size_t cap, size_t m, size_t dense);

/* ---- keys ------------------------------------------------------------------------------ */

/* One part of a tensor: elements [off, off + n) of it, owned by server `server`. */
typedef struct ps_part {
    size_t off, n, rows, cols;
    int server;
    gcomp_compressor *c;    /* worker: its compressor (residual); NULL on servers */
    gcomp_compressor *pdec; /* worker: decoder of compressed pulls (NULL: dense) */
    uint64_t version;       /* worker: the update count of its last reply */
    /* server, owned parts only: */
    gcomp_compressor *dec;   /* decoder of the pushes (the tensor's spec) */
    gcomp_compressor **wdec; /* per pusher, when pushers have seeds of their own */
    gcomp_compressor *pull;  /* the server's pull compressor (its own residual), or NULL */
    gm_buf store;            /* n floats: weights (update) or the last sum (aggregate) */
    gm_buf mom;              /* n floats: momentum (update with momentum > 0) */
    gm_buf acc;              /* n floats: this round's sum / this push's gradient */
    uint64_t sversion;       /* updates applied (rounds or pushes) */
    bool inited;             /* store holds weights from an init or a load */
    gcomp_mpi_ps_optimizer opt;
} ps_part;

typedef struct ps_tensor {
    gcomp_mpi_ps *ps;
    int mode;    /* hierarchical: 1, else 0 (index into the pusher tables) */
    bool server; /* this rank serves */
    size_t nparts;
    ps_part *part;
    char pspec[512]; /* the pull spec, canonical ("" : dense) */
    uint64_t pfp;
    uint64_t *wfp; /* per pusher: the fingerprint of its pushes */
    gcomp_mpi_ps_stats stats;
} ps_tensor;

/* ---- sub-buckets --------------------------------------------------------------------- */

/* A server's view of one pusher of one sub-bucket. */
typedef struct ps_slot {
    gm_buf in;      /* its push frames */
    gm_buf out;     /* async: its replies; sync: unused (the shared reply) */
    bool arrived;   /* sync: this round's push is here */
    bool parked;    /* its push belongs to the next session: taken at the next serve */
    uint64_t round; /* async: pushes of this pusher so far (sync: the group's round) */
    size_t in_len;
    uint64_t t_arrived; /* when it arrived (queue depth) */
} ps_slot;

typedef struct ps_group {
    gcomp_mpi_ps *ps;
    gcomp_mpi_bucket *b;
    gm_group *g;
    size_t gi;                         /* index of the sub-bucket in b->g */
    int mode;                          /* 0 flat, 1 hierarchical */
    bool server;                       /* registered as a server's group */
    int tag;                           /* PS_TAG_PUSH + 2 gi (reply: + 1) */
    int nsrv;                          /* servers this sub-bucket's parts go to */
    int *srv;                          /* their indices, ascending */
    size_t *cnt;                       /* entries per involved server */
    size_t *soff, *scap, *roff, *rcap; /* worker: send / receive areas per involved server */
    size_t *slen;                      /* worker: this call's frame length per server */
    size_t *ecnt;                      /* worker: entries written per server (encode) */
    size_t init_cap;                   /* worker: send room an init frame needs (pusher 0) */
    uint64_t round;                    /* pushes (worker) / rounds (server) so far */
    int tamper;                        /* test hook: what to spoil in the next push */
    const char *tamper_spec;           /* test hook: the other spec of tamper 3 */

    /* server */
    int me;            /* this server's index */
    size_t m;          /* entries (parts) this server owns in the sub-bucket */
    uint32_t *et, *ep; /* m: tensor index and part of each entry, frame order */
    int npush;         /* pushers */
    ps_slot *slot;     /* npush */
    gm_buf reply;      /* sync: the round's reply, sent to every pusher */
    gm_buf init_reply; /* the last init's reply, sent to every pusher */
    size_t reply_cap;  /* bound of one reply frame */
    size_t push_cap;   /* bound of one push frame */
    size_t ctrl_cap;   /* bound of one init frame */
    int next;          /* sync: next pusher to decode */
    int arrived;       /* sync: pushes here this round */
    uint64_t round_t0;
    gcomp_status rst; /* sync: this round's outcome so far */
    uint64_t rmark;   /* its marker */
    float rlr;
    unsigned rflags;
    int rreq0; /* first request slot of this group in the server's table */
} ps_group;

/* ---- the server object ------------------------------------------------------------- */

struct gcomp_mpi_ps {
    gcomp_mpi_comm *comm;
    unsigned epoch;
    MPI_Comm pc;
    gcomp_mpi_ps_options opt;
    char *pull; /* opt.pull copied, NULL for dense */
    int P, rank, S, W;
    int *srv_rank;  /* S */
    int *wrk_rank;  /* W */
    int *role;      /* P: worker index, or -1 - server index */
    int *node;      /* P: node index */
    bool device_ok; /* no node mixes roles; every server alone in its node */
    char device_why[200];
    int npush[2]; /* pushers: [0] every worker, [1] one per worker node (its leader) */
    int *push_rank[2];
    int *push_of[2]; /* P: a rank's pusher index, -1 */
    int me_srv, me_wrk, me_push[2];
    uint64_t *load[2]; /* S: bytes of live parts per server (flat, hierarchical keys) */
    int tag_ub;

    ps_group **groups; /* registered by reserve, in creation order */
    size_t ngroups, gcap;
    size_t nkeys; /* live ps tensors set up on this rank */
    float lr;     /* set_lr (NaN: the servers') */
    bool serving;
    bool refused_serve; /* serve refused once (no part here): the object is for freeing only */

    gcomp_mpi_ps_stats stats;
    gcomp_mpi_ps_stats *peer; /* P */
    uint32_t lost_seen;       /* worker: the largest count a reply reported */
    gm_buf ctrl;              /* server: a received init / pull frame */
    uint64_t stop_word;       /* worker: its shutdown message: the session it ends */
    uint16_t session;         /* sessions ended: worker, its shutdowns; server, its serves */
    struct ps_parked *parked; /* server: requests of the next session, received early */
};

/* A request received during a session from a worker already in the next one: kept, and
 * taken at the start of the next serve. */
typedef struct ps_parked {
    struct ps_parked *next;
    gcomp_mpi_bucket *b;
    int src;
    size_t len;
    uint8_t frame[];
} ps_parked;

/* Pusher index -> owning rank, and the other way (mpi_ps.c). */
static inline int ps_pusher_rank(const gcomp_mpi_ps *ps, int mode, int p) {
    return ps->push_rank[mode][p];
}

/* Server side of a key's parts (mpi_ps.c, for the serve loop and the state blob). */
const ps_tensor *gm_ps_tensor(const gm_tensor *t);
/* The serve loop (mpi_ps_serve.c). */
gcomp_status gm_ps_serve(gcomp_mpi_ps *ps, double timeout_s, gcomp_error *err);
/* Counts a frame into the statistics of this rank, its peer and the tensors' (mpi_ps.c). */
void gm_ps_count(gcomp_mpi_ps *ps, int peer, bool push, uint64_t bytes);
/* Whether optimizer settings are valid (mpi_ps.c). */
bool gm_ps_opt_ok(const gcomp_mpi_ps_optimizer *o);
/* The layer's failure message for a marker found by a server (mpi_ps.c). */
void gm_ps_group_fail(gcomp_mpi_bucket *b, gm_group *g, uint64_t marker, int server,
                      const char *what);

#endif /* GCOMP_MPI_PS_H */
