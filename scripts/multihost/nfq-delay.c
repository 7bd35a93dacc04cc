/*
 * nfq-delay.c - a fixed one-way delay for the packets an NFQUEUE receives, for the emulated
 * hosts of scripts/netns-cluster.sh (this kernel has no netem).
 *
 * Every packet queued to QUEUE gets its ACCEPT verdict DELAY_US after it arrived, in arrival
 * order (the delay is constant, so the release times are too). Only the packet's metadata comes
 * to user space, and GSO packets stay whole. A timerfd wakes the loop at the next release.
 * The program ends on SIGTERM / SIGINT, or after LIFETIME_S seconds in any case (a leftover
 * never outlives its cluster by long); packets still held are then accepted at once.
 *
 *   nfq-delay -q QUEUE -d DELAY_US [-l LIFETIME_S]
 *   iptables -t mangle -A PREROUTING -i ccl0 -j NFQUEUE --queue-num QUEUE   (in the same netns)
 * Build: gcc -O2 -o nfq-delay nfq-delay.c -lnetfilter_queue
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

/* Held packets: a power-of-two ring; when full, a packet passes undelayed. */
#define HELD (1u << 18)
static struct {
    uint32_t id;
    uint64_t due_ns;
} held[HELD];
static uint32_t first, next; /* oldest held, next free (free-running counters) */
static uint64_t delay_ns, passed_full;
static volatile sig_atomic_t stopping;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void on_signal(int s) {
    (void)s;
    stopping = 1;
}

static int on_packet(struct nfq_q_handle *q, struct nfgenmsg *m, struct nfq_data *d, void *u) {
    (void)m;
    (void)u;
    struct nfqnl_msg_packet_hdr *h = nfq_get_msg_packet_hdr(d);
    if (!h)
        return 0;
    uint32_t id = ntohl(h->packet_id);
    if (next - first == HELD) {
        passed_full++;
        return nfq_set_verdict(q, id, NF_ACCEPT, 0, NULL);
    }
    held[next % HELD].id = id;
    held[next % HELD].due_ns = now_ns() + delay_ns;
    next++;
    return 0;
}

/* Accepts every held packet due by `t` (all of them when `t` is UINT64_MAX). */
static void release(struct nfq_q_handle *q, uint64_t t) {
    while (first != next && held[first % HELD].due_ns <= t) {
        nfq_set_verdict(q, held[first % HELD].id, NF_ACCEPT, 0, NULL);
        first++;
    }
}

static void arm(int tfd) {
    struct itimerspec when = {0};
    if (first != next) {
        uint64_t due = held[first % HELD].due_ns;
        when.it_value.tv_sec = (time_t)(due / 1000000000u);
        when.it_value.tv_nsec = (long)(due % 1000000000u);
        if (!when.it_value.tv_sec && !when.it_value.tv_nsec)
            when.it_value.tv_nsec = 1;
    }
    timerfd_settime(tfd, TFD_TIMER_ABSTIME, &when, NULL);
}

int main(int argc, char **argv) {
    long queue = 0, delay_us = -1, lifetime_s = 3600;
    int o;
    while ((o = getopt(argc, argv, "q:d:l:")) != -1) {
        char *end = NULL;
        long v = strtol(optarg, &end, 10);
        if (!end || *end || v < 0) {
            fprintf(stderr, "nfq-delay: -%c: '%s' is not a non-negative integer\n", o, optarg);
            return 2;
        }
        if (o == 'q') queue = v;
        else if (o == 'd') delay_us = v;
        else if (o == 'l') lifetime_s = v;
        else return 2;
    }
    if (delay_us < 0 || queue > 65535) {
        fprintf(stderr, "usage: nfq-delay -q QUEUE(0-65535) -d DELAY_US [-l LIFETIME_S]\n");
        return 2;
    }
    delay_ns = (uint64_t)delay_us * 1000u;
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* the default 50 us slack would blur the delay */
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);

    struct nfq_handle *h = nfq_open();
    if (!h) {
        perror("nfq-delay: nfq_open");
        return 1;
    }
    struct nfq_q_handle *q = nfq_create_queue(h, (uint16_t)queue, on_packet, NULL);
    if (!q) {
        perror("nfq-delay: nfq_create_queue (is another delayer bound to this queue here?)");
        return 1;
    }
    if (nfq_set_mode(q, NFQNL_COPY_META, 0) < 0) {
        perror("nfq-delay: nfq_set_mode");
        return 1;
    }
    nfq_set_queue_maxlen(q, HELD);
    nfq_set_queue_flags(q, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO);
    nfnl_rcvbufsiz(nfq_nfnlh(h), 32u << 20);
    int fd = nfq_fd(h);
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (tfd < 0) {
        perror("nfq-delay: timerfd_create");
        return 1;
    }
    static char buf[1 << 16];
    uint64_t end = now_ns() + (uint64_t)lifetime_s * 1000000000u;
    while (!stopping && now_ns() < end) {
        struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = tfd, .events = POLLIN}};
        /* at most a second per wait, so that the lifetime and signals are seen */
        if (poll(p, 2, 1000) < 0 && errno != EINTR)
            break;
        for (int k = 0; k < 64 && (p[0].revents & POLLIN); k++) { /* bounded drain */
            ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (n < 0 && errno == ENOBUFS) {
                fprintf(stderr, "nfq-delay: netlink overrun: packets were dropped\n");
                continue;
            }
            if (n <= 0)
                break;
            nfq_handle_packet(h, buf, (int)n);
        }
        if (p[1].revents & POLLIN) {
            uint64_t ticks;
            (void)!read(tfd, &ticks, sizeof ticks);
        }
        release(q, now_ns());
        arm(tfd);
    }
    release(q, UINT64_MAX);
    if (passed_full)
        fprintf(stderr, "nfq-delay: %llu packets passed undelayed (too many held)\n",
                (unsigned long long)passed_full);
    nfq_destroy_queue(q);
    nfq_close(h);
    return 0;
}
