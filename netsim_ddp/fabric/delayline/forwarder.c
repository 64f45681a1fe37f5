/* nsd-delayline: a userspace netem for kernels without sch_netem.
 *
 * Reads every frame arriving on --in (AF_PACKET, bound to that interface), holds it for
 * delay +- jitter, drops it with probability --loss, else transmits it on --out. The reverse
 * direction is not handled here: the Python side redirects it in the kernel (tc mirred).
 *
 * Why it looks like this:
 *  - PACKET_VNET_HDR on both sockets: GSO super-packets (up to 64 KB) cross intact, so one
 *    syscall moves ~44 MTU-1500 segments. When loss > 0 a super-packet is cut into its wire
 *    segments here (TCP over IPv4/IPv6) so that loss applies per wire packet, as on a real link.
 *  - Receive timestamps come from the kernel (SO_TIMESTAMPNS, taken when the frame entered the
 *    namespace), mapped to CLOCK_MONOTONIC: a frame that waited in the socket queue while this
 *    process was descheduled still gets its true arrival time. The clocks' offset is read
 *    bracketed by two CLOCK_MONOTONIC reads, the tightest of a few tries (sample_offset).
 *  - Arrival order is kept whatever the clocks do: a frame's arrival time is never earlier than
 *    the previous frame's (counted in arrivals_clamped), and without jitter its due time never
 *    earlier than the previous frame's. Issue 21: one interrupted offset sample put a batch's
 *    due times 16 us before the previous batch's and the heap released them first.
 *  - Waiting uses ppoll (hrtimer based) with the timer slack set to 1 ns, plus an optional short
 *    busy-wait before each due time: microsecond resolution, no millisecond epoll timeout.
 *  - recvmmsg/sendmmsg batches; a binary min-heap ordered by (due time, arrival sequence): FIFO
 *    when the delay is constant, netem-like reordering when jitter makes due times cross.
 *    `reordered` counts the frames released after a frame that arrived later (RFC 4737's
 *    reordered packets): 0 without jitter, by construction.
 *
 * Exit: SIGTERM/SIGINT end the loop; one JSON line of counters goes to stdout. At start, one
 * JSON line {"event": "ready", ...} goes to stdout once both sockets are bound. SIGUSR1 prints
 * the same counters line at once (cumulative, stamped with CLOCK_MONOTONIC), so the harness
 * can judge the line's health while it runs, window by window.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <math.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64
#define SLOT_BYTES (65536 + 1024) /* a 64 KB GSO frame + headers + vnet header */
#define VNET_LEN ((int)sizeof(struct virtio_net_hdr))
#define HIST_BUCKETS 200000 /* lateness histogram: 1 us buckets up to 200 ms */
/* Ranges the options must fall in. An hour of delay or jitter keeps every due time far from
 * int64 overflow (a wrapped due time would release frames at once, undelayed); the queue's
 * ceiling bounds the memory a forwarder can hold whatever it is asked. */
#define MAX_DELAY_NS (3600ll * 1000000000ll)
#define MAX_QUEUE_BYTES (1ull << 30)
#define MAX_RCVBUF (1ll << 30)
#define MIN_GSO_SIZE 48 /* net.ipv4.tcp_min_snd_mss: no Linux TCP sends smaller segments */

/* ---- options ------------------------------------------------------------------------- */

enum dist { DIST_UNIFORM, DIST_NORMAL, DIST_PARETO, DIST_PARETONORMAL };

struct options {
    const char *in_if, *out_if;
    int64_t delay_ns, jitter_ns, spin_ns, rcvbuf;
    int64_t late_bound_ns; /* frames released later than this are counted (late_over_bound) */
    double loss; /* probability 0..1 */
    enum dist dist;
    uint64_t seed;
    uint64_t queue_bytes;
    int rt_priority;
    int segment; /* -1: when loss > 0; 0 never; 1 always */
    /* Tests only: added to the clocks' sampled offset after every second recvmmsg, as an
     * interrupted sample would be (tests/delayline: the cause of issue 21, made deterministic). */
    int64_t test_offset_error_ns;
};

static void die(const char *what) {
    fprintf(stderr, "nsd-delayline: %s: %s\n", what, strerror(errno));
    exit(2);
}

static void usage_error(const char *msg) {
    fprintf(stderr, "nsd-delayline: %s\n", msg);
    exit(64);
}

static void range_error(const char *option, const char *value, const char *want) {
    fprintf(stderr, "nsd-delayline: --%s %s: %s\n", option, value, want);
    exit(64);
}

/* A whole decimal integer in [lo, hi]; anything else (units, blanks, overflow) exits 64. */
static long long parse_int(const char *option, const char *value, long long lo, long long hi) {
    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (errno || end == value || *end || v < lo || v > hi) {
        char want[96];
        snprintf(want, sizeof(want), "want a whole number in [%lld, %lld]", lo, hi);
        range_error(option, value, want);
    }
    return v;
}

static unsigned long long parse_uint(const char *option, const char *value) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(value, &end, 10);
    if (errno || end == value || *end || value[strspn(value, " \t")] == '-')
        range_error(option, value, "want a whole number >= 0");
    return v;
}

static double parse_probability(const char *option, const char *value) {
    char *end;
    errno = 0;
    double v = strtod(value, &end);
    if (errno || end == value || *end || !isfinite(v) || v < 0 || v > 1)
        range_error(option, value, "want a probability in [0, 1]");
    return v;
}

static struct options opt;

static void parse_options(int argc, char **argv, struct options *o) {
    static const struct option longs[] = {
        {"in", required_argument, 0, 'i'},       {"out", required_argument, 0, 'o'},
        {"delay-ns", required_argument, 0, 'd'}, {"jitter-ns", required_argument, 0, 'j'},
        {"dist", required_argument, 0, 'D'},     {"loss", required_argument, 0, 'l'},
        {"seed", required_argument, 0, 's'},     {"queue-bytes", required_argument, 0, 'q'},
        {"spin-ns", required_argument, 0, 'S'},  {"rt-priority", required_argument, 0, 'r'},
        {"segment", required_argument, 0, 'g'},  {"rcvbuf", required_argument, 0, 'b'},
        {"late-bound-ns", required_argument, 0, 'L'},
        {"test-offset-error-ns", required_argument, 0, 'T'},
        {0, 0, 0, 0}};
    memset(o, 0, sizeof(*o));
    o->queue_bytes = 64ull << 20;
    o->spin_ns = 200000; /* cap on the learnt spin */
    o->segment = -1;
    o->rcvbuf = 1 << 20; /* the kernel doubles it */
    o->late_bound_ns = 1000000;
    int c;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'i': o->in_if = optarg; break;
        case 'o': o->out_if = optarg; break;
        case 'd': o->delay_ns = parse_int("delay-ns", optarg, 0, MAX_DELAY_NS); break;
        case 'j': o->jitter_ns = parse_int("jitter-ns", optarg, 0, MAX_DELAY_NS); break;
        case 'l': o->loss = parse_probability("loss", optarg); break;
        case 's': o->seed = parse_uint("seed", optarg); break;
        case 'q':
            o->queue_bytes = (uint64_t)parse_int("queue-bytes", optarg, 1, MAX_QUEUE_BYTES);
            break;
        case 'S': o->spin_ns = parse_int("spin-ns", optarg, 0, 1000000000ll); break;
        case 'r': o->rt_priority = (int)parse_int("rt-priority", optarg, 0, 99); break;
        case 'g': o->segment = (int)parse_int("segment", optarg, -1, 1); break;
        case 'b': o->rcvbuf = parse_int("rcvbuf", optarg, 4096, MAX_RCVBUF); break;
        case 'L': o->late_bound_ns = parse_int("late-bound-ns", optarg, 0, MAX_DELAY_NS); break;
        case 'T':
            o->test_offset_error_ns = parse_int("test-offset-error-ns", optarg, 0, MAX_DELAY_NS);
            break;
        case 'D':
            if (!strcmp(optarg, "uniform")) o->dist = DIST_UNIFORM;
            else if (!strcmp(optarg, "normal")) o->dist = DIST_NORMAL;
            else if (!strcmp(optarg, "pareto")) o->dist = DIST_PARETO;
            else if (!strcmp(optarg, "paretonormal")) o->dist = DIST_PARETONORMAL;
            else usage_error("--dist must be uniform, normal, pareto or paretonormal");
            break;
        default: usage_error("usage: --in IF --out IF [--delay-ns N] [--jitter-ns N] ...");
        }
    }
    if (!o->in_if || !o->out_if) usage_error("--in and --out are required");
}

/* ---- randomness (xoshiro256**, seeded by splitmix64: reproducible per seed) ------------ */

static uint64_t rng_s[4];

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rng_seed(uint64_t seed) {
    for (int i = 0; i < 4; i++) rng_s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t rng_next(void) {
    uint64_t result = rotl(rng_s[1] * 5, 7) * 9, t = rng_s[1] << 17;
    rng_s[2] ^= rng_s[0]; rng_s[3] ^= rng_s[1]; rng_s[1] ^= rng_s[2]; rng_s[0] ^= rng_s[3];
    rng_s[2] ^= t; rng_s[3] = rotl(rng_s[3], 45);
    return result;
}

/* uniform in [0, 1) with 53 bits */
static inline double rng_unit(void) { return (rng_next() >> 11) * 0x1.0p-53; }

static double rng_normal(void) {
    double u1 = 1.0 - rng_unit(), u2 = rng_unit(); /* u1 in (0, 1] */
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* iproute2's pareto.dist: (U^(-1/3) - 1.5) * 4/3 (shape 3, mean 0), capped at 4 as its table. */
static double rng_pareto(void) {
    double u = 1.0 - rng_unit();
    double x = (1.0 / cbrt(u) - 1.5) * (4.0 / 3.0);
    return x > 4.0 ? 4.0 : x;
}

/* Standardised jitter sample x; the packet's delay is delay + x * jitter, clamped at 0. */
static double jitter_sample(enum dist d) {
    switch (d) {
    case DIST_UNIFORM: return 2.0 * rng_unit() - 1.0;
    case DIST_NORMAL: return rng_normal();
    case DIST_PARETO: return rng_pareto();
    case DIST_PARETONORMAL: return 0.25 * rng_normal() + 0.75 * rng_pareto();
    }
    return 0.0;
}

/* ---- clock --------------------------------------------------------------------------- */

static inline int64_t clock_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* ---- the queue: a min-heap of packets by (due, seq) ---------------------------------- */

struct pkt {
    int64_t due;
    uint64_t seq;
    uint32_t len; /* bytes in data, vnet header included */
    uint8_t data[];
};

static struct pkt **heap;
static size_t heap_n, heap_cap;

static inline int pkt_before(const struct pkt *a, const struct pkt *b) {
    return a->due < b->due || (a->due == b->due && a->seq < b->seq);
}

static void heap_push(struct pkt *p) {
    if (heap_n == heap_cap) {
        heap_cap = heap_cap ? heap_cap * 2 : 4096;
        heap = realloc(heap, heap_cap * sizeof(*heap));
        if (!heap) die("realloc");
    }
    size_t i = heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!pkt_before(p, heap[parent])) break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = p;
}

static struct pkt *heap_pop(void) {
    struct pkt *top = heap[0], *last = heap[--heap_n];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= heap_n) break;
        if (child + 1 < heap_n && pkt_before(heap[child + 1], heap[child])) child++;
        if (!pkt_before(heap[child], last)) break;
        heap[i] = heap[child];
        i = child;
    }
    if (heap_n) heap[i] = last;
    return top;
}

/* ---- counters ------------------------------------------------------------------------ */

static struct {
    uint64_t received, received_bytes, forwarded, forwarded_bytes;
    uint64_t dropped_loss, dropped_queue_full, dropped_socket, dropped_truncated, tx_errors;
    uint64_t segmented_frames, segments_made, not_segmented, late_over_hist;
    uint64_t late_recorded, late_over_bound;
    uint64_t reordered, arrivals_clamped;
    int64_t late_max_ns;
    uint64_t queued_bytes, queued_bytes_max;
} st;
static uint32_t *late_hist;

static void record_late(int64_t late_ns) {
    if (late_ns < 0) late_ns = 0;
    if (late_ns > st.late_max_ns) st.late_max_ns = late_ns;
    if (late_ns > opt.late_bound_ns) st.late_over_bound++;
    st.late_recorded++;
    int64_t bucket = late_ns / 1000;
    if (bucket >= HIST_BUCKETS) st.late_over_hist++;
    else late_hist[bucket]++;
}

/* Called for each frame as it leaves, in release order. A frame is reordered when a frame that
 * arrived after it (higher sequence) has already left: RFC 4737's definition, so each frame
 * overtaken counts once however many overtook it. With jitter that is the netem-like
 * reordering the distribution makes; without jitter it cannot happen (handle_frame). */
static uint64_t released_seq_max;
static int released_any;

static void note_release(const struct pkt *p) {
    if (released_any && p->seq < released_seq_max) {
        st.reordered++;
        return;
    }
    released_seq_max = p->seq;
    released_any = 1;
}

/* Upper edge (us) of the bucket holding quantile q, or -1 when nothing was sent. The scan stops
 * at that bucket (a few in a healthy line), so a report mid-run costs microseconds. */
static double late_quantile_us(double q) {
    uint64_t total = st.late_recorded;
    if (!total) return -1;
    uint64_t want = (uint64_t)ceil(q * total), seen = 0;
    if (want == 0) want = 1;
    for (int i = 0; i < HIST_BUCKETS; i++) {
        seen += late_hist[i];
        if (seen >= want) return i + 1;
    }
    return st.late_max_ns / 1000.0;
}

/* ---- segmentation of TCP GSO frames (only when loss > 0) ------------------------------ */

static uint32_t csum_add(uint32_t sum, const void *data, size_t len) {
    const uint8_t *p = data;
    for (; len > 1; p += 2, len -= 2) sum += (uint32_t)(p[0] << 8 | p[1]);
    if (len) sum += (uint32_t)(p[0] << 8);
    return sum;
}

static uint16_t csum_fold(uint32_t sum) {
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    return (uint16_t)sum;
}

static struct pkt *pkt_new(uint32_t len) {
    struct pkt *p = malloc(sizeof(*p) + len);
    if (!p) die("malloc");
    p->len = len;
    return p;
}


static uint64_t next_seq;

/* What a queued packet holds besides its bytes: its header, malloc's, its heap slot. The queue
 * bound counts these too, so a stream of tiny segments cannot hold more memory than it says. */
#define PKT_OVERHEAD ((uint32_t)(sizeof(struct pkt) + 16 + sizeof(struct pkt *)))

static inline uint64_t held_bytes(uint32_t len) { return (uint64_t)len + PKT_OVERHEAD; }

static int admit(uint32_t len) {
    if (st.queued_bytes + held_bytes(len) > opt.queue_bytes) {
        st.dropped_queue_full++;
        return 0;
    }
    return 1;
}

static void push(struct pkt *p, int64_t due) {
    p->due = due;
    p->seq = next_seq++;
    st.queued_bytes += held_bytes(p->len);
    if (st.queued_bytes > st.queued_bytes_max) st.queued_bytes_max = st.queued_bytes;
    heap_push(p);
}

static inline int lost(void) { return opt.loss > 0 && rng_unit() < opt.loss; }

/* Cut a TCP GSO frame into its wire segments, rolling loss per segment. Each segment keeps
 * checksum offload (NEEDS_CSUM with the pseudo-header sum in place), as TSO would emit it.
 * Returns 0 when the frame is not plain TCP over IPv4/IPv6 or its lengths do not add up (the
 * caller then treats it whole): every length read from the frame is checked against the
 * frame before it is used, since the segments are built from them. */
static int segment_tcp(const uint8_t *buf, uint32_t len, int64_t due) {
    const struct virtio_net_hdr *vh = (const void *)buf;
    if (len < (uint32_t)VNET_LEN) return 0;
    const uint8_t *f = buf + VNET_LEN;
    uint32_t flen = len - VNET_LEN, l3 = ETH_HLEN, l4, mss = vh->gso_size;
    int gso = vh->gso_type & ~VIRTIO_NET_HDR_GSO_ECN, v4;
    if (flen < l3 + 40 || mss < MIN_GSO_SIZE) return 0;
    uint16_t eth_type = (uint16_t)(f[12] << 8 | f[13]);
    if (eth_type == ETH_P_IP && gso == VIRTIO_NET_HDR_GSO_TCPV4 && (f[l3] >> 4) == 4 &&
        f[l3 + 9] == IPPROTO_TCP) {
        uint32_t ihl = (f[l3] & 0xf) * 4u;
        if (ihl < 20) return 0; /* IHL below 5 words: not an IPv4 header */
        v4 = 1;
        l4 = l3 + ihl;
    } else if (eth_type == ETH_P_IPV6 && gso == VIRTIO_NET_HDR_GSO_TCPV6 && (f[l3] >> 4) == 6 &&
               f[l3 + 6] == IPPROTO_TCP) {
        v4 = 0;
        l4 = l3 + 40;
    } else {
        return 0;
    }
    if (l4 + 20 > flen) return 0;
    uint32_t doff = (f[l4 + 12] >> 4) * 4u, hdrs = l4 + doff;
    if (doff < 20 || hdrs > flen) return 0; /* data offset below 5 words, or past the frame */
    if (hdrs - l3 + mss > 65535) return 0;  /* a segment's IP length must fit 16 bits */
    uint32_t payload = flen - hdrs, nseg = (payload + mss - 1) / mss, seq0, tmp;
    memcpy(&tmp, f + l4 + 4, 4);
    seq0 = ntohl(tmp);
    uint16_t id0 = v4 ? (uint16_t)(f[l3 + 4] << 8 | f[l3 + 5]) : 0;
    st.segmented_frames++;
    for (uint32_t i = 0; i < nseg; i++) {
        uint32_t chunk = payload - i * mss < mss ? payload - i * mss : mss;
        uint32_t seglen = VNET_LEN + hdrs + chunk, tcplen = doff + chunk;
        st.segments_made++;
        if (lost()) { st.dropped_loss++; continue; }
        if (!admit(seglen)) continue;
        struct pkt *p = pkt_new(seglen);
        struct virtio_net_hdr *nh = (void *)p->data;
        memset(nh, 0, sizeof(*nh));
        nh->flags = VIRTIO_NET_HDR_F_NEEDS_CSUM;
        nh->gso_type = VIRTIO_NET_HDR_GSO_NONE;
        nh->csum_start = (uint16_t)l4;
        nh->csum_offset = 16; /* offsetof(struct tcphdr, check) */
        uint8_t *s = p->data + VNET_LEN;
        memcpy(s, f, hdrs);
        memcpy(s + hdrs, f + hdrs + i * mss, chunk);
        uint32_t seq = htonl(seq0 + i * mss);
        memcpy(s + l4 + 4, &seq, 4);
        if (i > 0) s[l4 + 13] &= (uint8_t)~0x80;          /* CWR only on the first */
        if (i + 1 < nseg) s[l4 + 13] &= (uint8_t)~0x09;   /* FIN, PSH only on the last */
        uint32_t sum;
        if (v4) {
            uint32_t ihl = l4 - l3;
            uint16_t tot = htons((uint16_t)(ihl + tcplen)), id = htons((uint16_t)(id0 + i)), ck;
            memcpy(s + l3 + 2, &tot, 2);
            memcpy(s + l3 + 4, &id, 2);
            s[l3 + 10] = s[l3 + 11] = 0;
            ck = htons((uint16_t)~csum_fold(csum_add(0, s + l3, ihl)));
            memcpy(s + l3 + 10, &ck, 2);
            sum = csum_add(0, s + l3 + 12, 8);
        } else {
            uint16_t plen = htons((uint16_t)tcplen);
            memcpy(s + l3 + 4, &plen, 2);
            sum = csum_add(0, s + l3 + 8, 32);
        }
        sum += IPPROTO_TCP + tcplen;
        uint16_t pseudo = htons(csum_fold(sum)); /* not inverted: the offload finishes it */
        memcpy(s + l4 + 16, &pseudo, 2);
        push(p, due);
    }
    return 1;
}

static void enqueue_frame(const uint8_t *buf, uint32_t len, int64_t due) {
    const struct virtio_net_hdr *vh = (const void *)buf;
    int gso = vh->gso_type != VIRTIO_NET_HDR_GSO_NONE;
    int cut = opt.segment == 1 || (opt.segment == -1 && opt.loss > 0);
    if (gso && cut) {
        if (segment_tcp(buf, len, due)) return;
        st.not_segmented++;
    }
    if (lost()) { st.dropped_loss++; return; }
    if (!admit(len)) return;
    struct pkt *p = pkt_new(len);
    memcpy(p->data, buf, len);
    push(p, due);
}

/* ---- sockets ------------------------------------------------------------------------- */

static int open_packet_socket(const char *ifname, int for_rx) {
    int fd = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0), one = 1, big = 32 << 20;
    /* The receive buffer is a queue in front of the delay: frames wait there only when this
     * process falls behind (CPU-bound), and that wait shows up as lateness. Kept moderate so
     * an overloaded host drops (dropped_socket) instead of silently adding delay. */
    int rcvbuf = (int)opt.rcvbuf;
    if (fd < 0) die("socket(AF_PACKET) (needs CAP_NET_RAW in the delay namespace)");
    if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof(one))) die("PACKET_VNET_HDR");
    unsigned ifindex = if_nametoindex(ifname);
    if (!ifindex) {
        fprintf(stderr, "nsd-delayline: no interface %s in this namespace\n", ifname);
        exit(2);
    }
    if (for_rx) {
        /* Frames the kernel redirects out of IN (the reverse path) are not ours to delay. */
        if (setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof(one)))
            die("PACKET_IGNORE_OUTGOING");
        if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf)))
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
        if (setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one))) die("SO_TIMESTAMPNS");
    } else if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof(big))) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
    }
    /* Protocol 0 on the sending socket: it never receives anything. */
    struct sockaddr_ll addr = {.sll_family = AF_PACKET,
                               .sll_protocol = for_rx ? htons(ETH_P_ALL) : 0,
                               .sll_ifindex = (int)ifindex};
    if (bind(fd, (struct sockaddr *)&addr, sizeof(addr))) die("bind(AF_PACKET)");
    return fd;
}

/* ---- receive and release ------------------------------------------------------------- */

static struct mmsghdr rx_msgs[BATCH];
static struct iovec rx_iov[BATCH];
static struct sockaddr_ll rx_addr[BATCH];
static char rx_ctl[BATCH][CMSG_SPACE(sizeof(struct timespec))];
static uint8_t *rx_buf;

static void rx_setup(void) {
    rx_buf = malloc((size_t)BATCH * SLOT_BYTES);
    if (!rx_buf) die("malloc");
    for (int i = 0; i < BATCH; i++) {
        rx_iov[i] = (struct iovec){rx_buf + (size_t)i * SLOT_BYTES, SLOT_BYTES};
        rx_msgs[i].msg_hdr = (struct msghdr){.msg_iov = &rx_iov[i], .msg_iovlen = 1};
    }
}

/* delay + x * jitter in [0, 2 * MAX_DELAY_NS]: computed in double and clamped before the
 * conversion, so no sample can overflow (normal samples are unbounded in principle). */
static int64_t frame_delay(void) {
    double d = (double)opt.delay_ns;
    if (opt.jitter_ns > 0) d += jitter_sample(opt.dist) * (double)opt.jitter_ns;
    if (!(d > 0)) return 0;
    return d > 2.0 * MAX_DELAY_NS ? 2 * MAX_DELAY_NS : llround(d);
}

/* arrival + delay, saturating: a due time must never wrap into the past. */
static int64_t due_after(int64_t arrival, int64_t delay) {
    return arrival > INT64_MAX - delay ? INT64_MAX : arrival + delay;
}

/* CLOCK_REALTIME - CLOCK_MONOTONIC now. The REALTIME read is bracketed by two MONOTONIC reads
 * and compared with their midpoint, so the error is at most half the bracket; of up to
 * OFFSET_TRIES tries the tightest counts, stopping at the first within OFFSET_TIGHT_NS. One
 * bare MONOTONIC-then-REALTIME pair (what this replaced) is wrong by however long it was
 * interrupted between the two reads: here about 1 pair in 100 000 took 2 us to 4 ms, and
 * one such sample put a whole batch's due times before the previous batch's (issue 21). */
#define OFFSET_TRIES 4
#define OFFSET_TIGHT_NS 1000

static int64_t sample_offset(void) {
    int64_t best = 0, best_width = INT64_MAX;
    for (int i = 0; i < OFFSET_TRIES && best_width > OFFSET_TIGHT_NS; i++) {
        int64_t m1 = clock_ns(CLOCK_MONOTONIC), r = clock_ns(CLOCK_REALTIME);
        int64_t m2 = clock_ns(CLOCK_MONOTONIC);
        if (m2 - m1 < best_width) {
            best_width = m2 - m1;
            best = r - (m1 + (m2 - m1) / 2);
        }
    }
    return best;
}

/* Arrival time of a frame on CLOCK_MONOTONIC, from its kernel receive stamp (CLOCK_REALTIME).
 * The offset between the clocks is sampled right after each recvmmsg, so a clock step only
 * affects frames stamped before it; stamps from the future or >1 s old fall back to now. */
static int64_t arrival_ns(struct msghdr *m, int64_t mono_now, int64_t real_offset) {
    for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
            struct timespec ts;
            memcpy(&ts, CMSG_DATA(c), sizeof(ts));
            int64_t t = (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec - real_offset;
            if (t <= mono_now && t > mono_now - 1000000000ll) return t;
        }
    }
    return mono_now;
}

static int64_t last_arrival = INT64_MIN, last_due = INT64_MIN;

/* One frame read from IN (vnet header + Ethernet frame) that arrived at `arrival` (ns).
 * Frames come in arrival order, so an arrival time earlier than the previous frame's is the
 * clocks' error (an interrupted offset sample, a step of CLOCK_REALTIME, a stamp that fell back
 * to "now"): it is taken as the previous one, and counted. Then only jitter can make due times
 * cross; without jitter a due time is also never earlier than the previous one, whatever the
 * cause, so the heap (due, then sequence) releases in arrival order. */
static void handle_frame(const uint8_t *buf, uint32_t len, int truncated, int64_t arrival) {
    st.received++;
    st.received_bytes += len > (uint32_t)VNET_LEN ? len - VNET_LEN : 0;
    if (truncated || len <= (uint32_t)VNET_LEN) {
        st.dropped_truncated++;
        return;
    }
    if (arrival < last_arrival) {
        st.arrivals_clamped++;
        arrival = last_arrival;
    }
    last_arrival = arrival;
    int64_t due = due_after(arrival, frame_delay());
    if (opt.jitter_ns == 0 && due < last_due) due = last_due;
    last_due = due;
    enqueue_frame(buf, len, due);
}

static int receive_batch(int fd) {
    for (int i = 0; i < BATCH; i++) {
        rx_msgs[i].msg_hdr.msg_name = &rx_addr[i];
        rx_msgs[i].msg_hdr.msg_namelen = sizeof(rx_addr[i]);
        rx_msgs[i].msg_hdr.msg_control = rx_ctl[i];
        rx_msgs[i].msg_hdr.msg_controllen = sizeof(rx_ctl[i]);
    }
    int n = recvmmsg(fd, rx_msgs, BATCH, MSG_DONTWAIT, NULL);
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return 0;
        die("recvmmsg");
    }
    static uint64_t batches;
    int64_t offset = sample_offset(), mono = clock_ns(CLOCK_MONOTONIC);
    if (opt.test_offset_error_ns && batches++ % 2) offset += opt.test_offset_error_ns;
    for (int i = 0; i < n; i++) {
        struct msghdr *m = &rx_msgs[i].msg_hdr;
        uint32_t len = rx_msgs[i].msg_len;
        if (rx_addr[i].sll_pkttype == PACKET_OUTGOING) continue;
        handle_frame(rx_iov[i].iov_base, len, m->msg_flags & MSG_TRUNC,
                     arrival_ns(m, mono, offset));
    }
    return n;
}

static void release_due(int fd) {
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH];
    struct pkt *batch[BATCH];
    for (;;) {
        int64_t now = clock_ns(CLOCK_MONOTONIC);
        int n = 0;
        while (heap_n && n < BATCH && heap[0]->due <= now) {
            struct pkt *p = batch[n] = heap_pop();
            iov[n] = (struct iovec){p->data, p->len};
            msgs[n].msg_hdr = (struct msghdr){.msg_iov = &iov[n], .msg_iovlen = 1};
            n++;
        }
        if (!n) return;
        for (int off = 0; off < n;) {
            int r = sendmmsg(fd, msgs + off, (unsigned)(n - off), 0);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) { st.tx_errors++; off++; } /* skip the frame the kernel refused */
            else off += r;
        }
        for (int i = 0; i < n; i++) {
            note_release(batch[i]);
            record_late(now - batch[i]->due);
            st.forwarded++;
            st.forwarded_bytes += batch[i]->len - VNET_LEN;
            st.queued_bytes -= held_bytes(batch[i]->len);
            free(batch[i]);
        }
    }
}

/* ---- main ---------------------------------------------------------------------------- */

/* Wakeup latency, learnt: a running estimate of its 99th percentile (stochastic quantile
 * tracking: step up 99 units when a wakeup overshoots it, down 1 unit otherwise). The
 * forwarder spins for that long plus a margin before each due time, capped by --spin-ns:
 * about 10 us on bare metal, ~100+ us on a VM whose idle vCPUs halt. */
#define SPIN_STEP_NS 100
#define SPIN_MARGIN_NS 5000
static int64_t wakeup_p99_ns = 20000;

static void learn_wakeup(int64_t overshoot) {
    if (overshoot > wakeup_p99_ns) wakeup_p99_ns += 99 * SPIN_STEP_NS;
    else if (wakeup_p99_ns > SPIN_STEP_NS) wakeup_p99_ns -= SPIN_STEP_NS;
    if (wakeup_p99_ns > opt.spin_ns) wakeup_p99_ns = opt.spin_ns;
}

static inline int64_t spin_ns(void) {
    int64_t spin = wakeup_p99_ns + SPIN_MARGIN_NS;
    return spin < opt.spin_ns ? spin : opt.spin_ns;
}

static uint64_t socket_drops(int fd) {
    struct tpacket_stats ps;
    socklen_t len = sizeof(ps);
    if (getsockopt(fd, SOL_PACKET, PACKET_STATISTICS, &ps, &len)) return 0;
    return ps.tp_drops; /* since the last call: the caller accumulates */
}

static volatile sig_atomic_t stop, report;
static void on_signal(int sig) { (void)sig; stop = 1; }
static void on_report(int sig) { (void)sig; report = 1; }

static void print_stats(void) {
    printf("{\"event\": \"stats\", \"received\": %llu, \"received_bytes\": %llu, "
           "\"forwarded\": %llu, \"forwarded_bytes\": %llu, \"dropped_loss\": %llu, "
           "\"dropped_queue_full\": %llu, \"dropped_socket\": %llu, \"dropped_truncated\": %llu, \"tx_errors\": %llu, "
           "\"segmented_frames\": %llu, \"segments_made\": %llu, \"not_segmented\": %llu, "
           "\"queued_at_exit\": %zu, \"packet_overhead_bytes\": %u, "
           "\"queued_bytes_max\": %llu, \"late_p50_us\": %.0f, \"late_p99_us\": %.0f, "
           "\"late_max_us\": %.1f, \"spin_us\": %.1f, \"late_bound_us\": %.1f, "
           "\"late_over_bound\": %llu, \"jitter_us\": %.3f, \"reordered\": %llu, "
           "\"arrivals_clamped\": %llu, \"monotonic_ns\": %lld}\n",
           (unsigned long long)st.received, (unsigned long long)st.received_bytes,
           (unsigned long long)st.forwarded, (unsigned long long)st.forwarded_bytes,
           (unsigned long long)st.dropped_loss, (unsigned long long)st.dropped_queue_full,
           (unsigned long long)st.dropped_socket,
           (unsigned long long)st.dropped_truncated, (unsigned long long)st.tx_errors,
           (unsigned long long)st.segmented_frames, (unsigned long long)st.segments_made,
           (unsigned long long)st.not_segmented, heap_n, PKT_OVERHEAD, (unsigned long long)st.queued_bytes_max, late_quantile_us(0.5),
           late_quantile_us(0.99), st.late_max_ns / 1000.0, spin_ns() / 1000.0,
           opt.late_bound_ns / 1000.0, (unsigned long long)st.late_over_bound,
           opt.jitter_ns / 1000.0, (unsigned long long)st.reordered,
           (unsigned long long)st.arrivals_clamped, (long long)clock_ns(CLOCK_MONOTONIC));
    fflush(stdout);
}

static struct timespec ns_to_ts(int64_t ns) {
    return (struct timespec){.tv_sec = ns / 1000000000ll, .tv_nsec = ns % 1000000000ll};
}

#ifndef NSD_DELAYLINE_NO_MAIN /* the frame tests link this file into their own driver */
int main(int argc, char **argv) {
    parse_options(argc, argv, &opt);
    rng_seed(opt.seed);
    late_hist = calloc(HIST_BUCKETS, sizeof(*late_hist));
    if (!late_hist) die("calloc");
    rx_setup();
    prctl(PR_SET_TIMERSLACK, 1UL); /* hrtimer wakeups at the requested ns, not +50 us */
    if (opt.rt_priority > 0) {
        struct sched_param sp = {.sched_priority = opt.rt_priority};
        if (sched_setscheduler(0, SCHED_FIFO, &sp))
            fprintf(stderr, "nsd-delayline: SCHED_FIFO refused (%s); running SCHED_OTHER\n",
                    strerror(errno));
    }
    int rx = open_packet_socket(opt.in_if, 1), tx = open_packet_socket(opt.out_if, 0);

    /* SIGTERM/SIGINT/SIGUSR1 stay blocked except inside ppoll, so no syscall is cut short
     * elsewhere. "ready" is printed after the handlers exist: a SIGUSR1 then never kills. */
    sigset_t block, open_mask;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGUSR1);
    sigprocmask(SIG_BLOCK, &block, &open_mask);
    struct sigaction sa = {.sa_handler = on_signal}, sa_report = {.sa_handler = on_report};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa_report, NULL);

    printf("{\"event\": \"ready\", \"pid\": %d, \"in\": \"%s\", \"out\": \"%s\", "
           "\"test_offset_error_ns\": %lld}\n",
           getpid(), opt.in_if, opt.out_if, (long long)opt.test_offset_error_ns);
    fflush(stdout);

    struct pollfd pfd = {.fd = rx, .events = POLLIN};
    const struct timespec zero = {0, 0};
    while (!stop) {
        release_due(tx);
        int64_t now = clock_ns(CLOCK_MONOTONIC), wait = -1, wake_at = 0;
        if (heap_n) {
            wait = heap[0]->due - now;
            if (wait <= 0) continue;
        }
        /* Sleep until `spin` before the next due time, then poll without sleeping: the tail
         * of an hrtimer sleep is where wakeup latency lands (~60 us on a halting VM vCPU). */
        struct timespec ts;
        const struct timespec *timeout = NULL;
        if (wait >= 0) {
            int64_t spin = spin_ns();
            ts = wait > spin ? ns_to_ts(wait - spin) : zero;
            wake_at = wait > spin ? now + wait - spin : 0;
            timeout = &ts;
        }
        int r = ppoll(&pfd, 1, timeout, &open_mask);
        if (r < 0 && errno != EINTR) die("ppoll");
        if (r == 0 && wake_at) learn_wakeup(clock_ns(CLOCK_MONOTONIC) - wake_at);
        if (r > 0) receive_batch(rx);
        if (report) {
            report = 0;
            st.dropped_socket += socket_drops(rx);
            print_stats();
        }
    }
    st.dropped_socket += socket_drops(rx);
    print_stats();
    return 0;
}
#endif
