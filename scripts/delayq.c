/* delayq - constant one-way packet delay for scripts/netsim (a stand-in for netem).
 *
 * usage: delayq QUEUE_NUM DELAY_US
 *
 * The kernel on our test machines has no netem (CONFIG_NET_SCH_NETEM unset, no modules),
 * so netsim sends every packet arriving on a host's eth0 to an NFQUEUE
 * (iptables -t mangle -A PREROUTING -i eth0 -j NFQUEUE --queue-num Q --queue-bypass)
 * and this daemon gives each packet its verdict DELAY_US after it was queued.
 *
 * Algorithm: packets arrive in order and all wait the same time, so a FIFO of
 * (packet id, due time) is already sorted by due time; the loop accepts the head while it
 * is due and otherwise sleeps in ppoll() until the head is due or a new packet arrives.
 *
 * Why ingress and not egress: a packet parked in an egress queue is still charged to the
 * sender's TCP-small-queues budget, which caps TCP at a few Mbit/s. On PREROUTING the skb is
 * already orphaned, so throughput stays at the shaped rate.
 *
 * Failure modes are fail-open on purpose: a full FIFO or a full kernel queue lets the packet
 * pass at once (counted and reported at exit), and --queue-bypass in the rule lets traffic
 * through if this daemon is gone. On SIGTERM/SIGINT every held packet is accepted before exit,
 * so stopping the daemon never drops traffic.
 *
 * Build: cc -O2 -o delayq delayq.c -lnetfilter_queue   (Debian: libnetfilter-queue-dev)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <linux/netfilter.h>
#include <libnetfilter_queue/libnetfilter_queue.h>

/* 256 Ki packets: 100 ms of 1 Gbit/s at 1500-byte packets is ~8.3 Ki, so this never fills
 * in the scenarios netsim is meant for. */
#define FIFO_CAP (1u << 18)

static uint32_t fifo_id[FIFO_CAP];
static uint64_t fifo_due[FIFO_CAP];
static uint32_t fifo_head, fifo_tail; /* free-running; index with % FIFO_CAP */
static uint64_t delay_ns;
static uint64_t n_delayed, n_passed_full;
static volatile sig_atomic_t stop_requested;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa,
                     void *data) {
    (void)msg;
    (void)data;
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
    if (!ph) return 0;
    uint32_t id = ntohl(ph->packet_id);
    if (fifo_tail - fifo_head >= FIFO_CAP) {
        n_passed_full++;
        return nfq_set_verdict(qh, id, NF_ACCEPT, 0, NULL);
    }
    fifo_id[fifo_tail % FIFO_CAP] = id;
    fifo_due[fifo_tail % FIFO_CAP] = now_ns() + delay_ns;
    fifo_tail++;
    n_delayed++;
    return 0;
}

/* Accepts every held packet due at or before `until`. */
static void release_due(struct nfq_q_handle *qh, uint64_t until) {
    while (fifo_head != fifo_tail && fifo_due[fifo_head % FIFO_CAP] <= until) {
        nfq_set_verdict(qh, fifo_id[fifo_head % FIFO_CAP], NF_ACCEPT, 0, NULL);
        fifo_head++;
    }
}

static int parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv) {
    uint64_t qnum, delay_us;
    if (argc != 3 || parse_u64(argv[1], &qnum) || qnum > 65535 || parse_u64(argv[2], &delay_us) ||
        delay_us > 10000000u) {
        fprintf(stderr, "usage: %s QUEUE_NUM(0-65535) DELAY_US(0-10000000)\n", argv[0]);
        return 2;
    }
    delay_ns = delay_us * 1000u;

    /* Signals stay blocked except inside ppoll(), so a stop request can never be lost
     * between the check of stop_requested and the sleep. */
    sigset_t block, wait_mask;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, &wait_mask);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);

    struct nfq_handle *h = nfq_open();
    if (!h) {
        perror("delayq: nfq_open");
        return 1;
    }
    struct nfq_q_handle *qh = nfq_create_queue(h, (uint16_t)qnum, &on_packet, NULL);
    if (!qh) {
        perror("delayq: nfq_create_queue (is another daemon bound to this queue?)");
        nfq_close(h);
        return 1;
    }
    nfq_set_mode(qh, NFQNL_COPY_META, 0); /* only the id is needed, never the payload */
    nfq_set_queue_maxlen(qh, 65536);
    uint32_t flags = NFQA_CFG_F_GSO | NFQA_CFG_F_FAIL_OPEN;
    nfq_set_queue_flags(qh, flags, flags);

    int fd = nfq_fd(h);
    int rcvbuf = 32 << 20, one = 1;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf);
    setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);

    fprintf(stderr, "delayq: queue %u, %llu us one-way\n", (unsigned)qnum,
            (unsigned long long)delay_us);
    static char buf[65536 + 4096];
    while (!stop_requested) {
        uint64_t t = now_ns();
        release_due(qh, t);
        uint64_t wait_ns = 100000000u; /* idle: wake every 100 ms */
        if (fifo_head != fifo_tail) wait_ns = fifo_due[fifo_head % FIFO_CAP] - t;
        struct timespec ts = {(time_t)(wait_ns / 1000000000u), (long)(wait_ns % 1000000000u)};
        struct pollfd p = {fd, POLLIN, 0};
        if (ppoll(&p, 1, &ts, &wait_mask) > 0) {
            ssize_t n;
            while ((n = recv(fd, buf, sizeof buf, MSG_DONTWAIT)) > 0)
                nfq_handle_packet(h, buf, (int)n);
        }
    }
    release_due(qh, UINT64_MAX);
    fprintf(stderr, "delayq: stopped; %llu packets delayed, %llu passed undelayed (fifo full)\n",
            (unsigned long long)n_delayed, (unsigned long long)n_passed_full);
    nfq_destroy_queue(qh);
    nfq_close(h);
    return 0;
}
