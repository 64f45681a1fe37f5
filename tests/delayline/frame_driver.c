/* Test driver for the forwarder's option parsing and frame handling, without sockets.
 *
 * Compiled by tests/delayline/test_frames.py with -fsanitize=address,undefined: it links
 * forwarder.c itself (minus its main) and feeds the frames it reads to the same handle_frame
 * the forwarder calls after recvmmsg, so a malformed frame that would overflow a buffer in the
 * forwarder aborts here.
 *
 *   frame_driver [forwarder options...] < frames
 *
 * stdin: frames, each a 4-byte little-endian length, then that many bytes (virtio_net_hdr +
 * Ethernet frame); every frame "arrives" at $NSD_ARRIVAL_NS (default 1 s), or frame i at the
 * i-th of the comma-separated times in $NSD_ARRIVALS_NS (arrival times as the forwarder would
 * compute them from the clocks, going backwards if the test says so). Each frame gets a
 * buffer of exactly its length, so a read past its end is caught.
 * stdout: one line per queued packet in release order (by due time, as the forwarder's
 * release_due pops them, and counted by the same note_release), "DUE LEN HEX" (HEX: vnet
 * header and frame), then the forwarder's JSON stats line.
 */
#define NSD_DELAYLINE_NO_MAIN
#include "forwarder.c"

int main(int argc, char **argv) {
    parse_options(argc, argv, &opt);
    rng_seed(opt.seed);
    late_hist = calloc(HIST_BUCKETS, sizeof(*late_hist));
    if (!late_hist) die("calloc");
    const char *env = getenv("NSD_ARRIVAL_NS");
    int64_t arrival = env ? strtoll(env, NULL, 10) : 1000000000ll;
    char *arrivals = getenv("NSD_ARRIVALS_NS");
    uint8_t head[4];
    while (fread(head, 1, 4, stdin) == 4) {
        uint32_t len = (uint32_t)head[0] | (uint32_t)head[1] << 8 | (uint32_t)head[2] << 16 |
                       (uint32_t)head[3] << 24;
        if (len > SLOT_BYTES) {
            fprintf(stderr, "frame_driver: a frame of %u bytes exceeds a receive slot\n", len);
            return 3;
        }
        uint8_t *frame = malloc(len ? len : 1);
        if (!frame || fread(frame, 1, len, stdin) != len) {
            fprintf(stderr, "frame_driver: short frame on stdin\n");
            return 3;
        }
        if (arrivals && *arrivals) arrival = strtoll(arrivals, &arrivals, 10);
        if (arrivals && *arrivals == ',') arrivals++;
        handle_frame(frame, len, 0, arrival);
        free(frame);
    }
    while (heap_n) {
        struct pkt *p = heap_pop();
        note_release(p);
        printf("%lld %u ", (long long)p->due, p->len);
        for (uint32_t i = 0; i < p->len; i++) printf("%02x", p->data[i]);
        printf("\n");
        st.queued_bytes -= held_bytes(p->len);
        free(p);
    }
    print_stats();
    free(late_hist);
    free(heap);
    return 0;
}
