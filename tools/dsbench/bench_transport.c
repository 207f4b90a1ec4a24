/*
 * tools/dsbench/bench_transport.c: `dsbench transport`: goodput between two
 * processes on loopback, through node/net (modes none, auth, encrypt) and
 * through node/transport alone (mode "transport": no frames, no crypto),
 * beside fi_pingpong (libfabric-bin) for the same message sizes, run in the
 * same invocation so both see the same machine.
 *
 * Each row: a child process (forked, dying with us) runs the receiving
 * node; this process streams messages of `bytes` payload to it for about
 * --seconds, then sends a marker and waits for the receiver's answer, which
 * it sends once every earlier message has been delivered (delivery is in
 * order). goodput = payload bytes delivered / (answer time - first send).
 * Through node/net a message is one STATE_CHUNK frame (64-byte header,
 * 48-byte chunk prefix, payload, 16-byte tag), encoded and sealed on the
 * sending thread, opened and decoded on the receiver's net worker. It is
 * sent with ds_net_send_msg_ref (the payload lent, not copied, in modes
 * none and auth), or with --copy through ds_net_send_msg as before.
 *
 * The baseline is `fi_pingpong -p tcp -e rdm -S <bytes> -I <n>`: one
 * message in flight, echoed back; it prints MB/sec as all bytes moved (both
 * directions) over the elapsed time, which is what pingpong_mb_per_s holds.
 * Both figures are bytes moved through loopback per second, in MB (10^6).
 * The machine is shared and noisy, so each row alternates --reps times
 * between a fi_pingpong run and a burst of ours, and reports the best of
 * each: both see the same spells of load.
 *
 * Modes auth and encrypt run once per AEAD library (--libs, default
 * libsodium then openssl: ds_aead_lib, both ends the same), column `lib`.
 *
 *   nice dsbench transport [--json] [--seconds S] [--reps R] [--sizes 64K,1M,16M]
 *                          [--modes transport,none,auth,encrypt] [--no-pingpong] [--copy]
 *                          [--libs libsodium,openssl]
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "node/sec/crypto.h"
#include "node/train/train.h"
#include "node/wire/wire.h"
#include "node/net/net.h"
#include "tools/dsbench/bench.h"

#define CLUSTER "dsbench"

/* ---- a counter of completions with a byte window ------------------------ */

typedef struct window {
    pthread_mutex_t m;
    pthread_cond_t c;
    uint64_t outstanding; /* bytes sent, done not yet called */
    uint64_t failed;
} window;

typedef struct send_tok {
    window *w;
    uint64_t bytes;
} send_tok;

static void window_done(void *arg, int status)
{
    send_tok *t = arg;
    pthread_mutex_lock(&t->w->m);
    t->w->outstanding -= t->bytes;
    if (status)
        t->w->failed++;
    pthread_cond_broadcast(&t->w->c);
    pthread_mutex_unlock(&t->w->m);
    free(t);
}

static void window_wait_below(window *w, uint64_t limit)
{
    pthread_mutex_lock(&w->m);
    while (w->outstanding > limit)
        pthread_cond_wait(&w->c, &w->m);
    pthread_mutex_unlock(&w->m);
}

/* ---- the receiving side (child process) --------------------------------- */

typedef struct rx_side {
    ds_net *net;
    ds_transport *tp;
    uint64_t bytes, msgs;
} rx_side;

static void rx_net(void *ctx, ds_net_rx *rx)
{
    rx_side *s = ctx;
    if (rx->hdr.type == DS_MSG_STATE_CHUNK) {
        ds_wire_msg m;
        ds_wire_bufs bufs = {0};
        if (ds_net_decode(s->net, rx, &bufs, &m) == DS_DROP_NONE) {
            s->bytes += m.h.count;
            s->msgs++;
        }
        return;
    }
    if (rx->hdr.type == DS_MSG_STATE_REQ) {
        /* The marker: everything before it has been delivered. */
        ds_wire_msg m;
        memset(&m, 0, sizeof(m));
        m.h.type = DS_MSG_GOSSIP_STALE;
        m.h.round = s->bytes;
        m.u.stale.round_now = s->msgs;
        ds_net_send_opts o = {.deadline_ms = ds_now_ms() + 10000};
        if (ds_net_send_msg(s->net, rx->sender, NULL, &m, &o))
            fprintf(stderr, "dsbench transport: receiver could not answer\n");
        s->bytes = s->msgs = 0;
        /* Anything the receiver refused is a broken measurement: say why. */
        char kv[1024];
        if (ds_drop_total(ds_net_drops(s->net)) &&
            ds_drop_format(ds_net_drops(s->net), DS_DROP_FMT_KV, kv, sizeof(kv)) > 0)
            fprintf(stderr, "dsbench transport: receiver drops: %s\n", kv);
        ds_net_stats st;
        ds_net_stats_get(s->net, &st);
        for (int k = 0; k < DS_TP_DROP_COUNT; k++)
            if (st.transport.drops[k])
                fprintf(stderr, "dsbench transport: receiver transport drops %s=%" PRIu64 "\n",
                        ds_transport_drop_name(k), st.transport.drops[k]);
    }
}

static void rx_raw(void *ctx, ds_transport_msg *msg)
{
    rx_side *s = ctx;
    if (msg->len > 16) {
        s->bytes += msg->len;
        s->msgs++;
        return;
    }
    /* The marker (16 bytes or less): answer with the byte count. */
    uint64_t v[2] = {s->bytes, s->msgs};
    ds_transport_send_args a = {.buf = v, .len = sizeof(v), .deadline_ms = ds_now_ms() + 10000};
    if (ds_transport_send(s->tp, msg->peer, &a))
        fprintf(stderr, "dsbench transport: receiver could not answer\n");
    s->bytes = s->msgs = 0;
}

static size_t g_chunk; /* --chunk: transport chunk_bytes on both sides (0: default) */
static int g_copy;     /* --copy: ds_net_send_msg (payload copied) instead of _ref */

static int child_main(int mode, const ds_identity *id, const ds_cluster_key *key, int wfd)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    ds_log_setup("bench-rx", DS_LOG_WARN, stderr);
    rx_side s;
    memset(&s, 0, sizeof(s));
    char addr[DS_TRANSPORT_ADDR_MAX];
    int r;
    if (mode < 0) {
        ds_transport_opts o;
        ds_transport_opts_default(&o);
        if (g_chunk)
            o.chunk_bytes = g_chunk;
        o.on_recv = rx_raw;
        o.cb_ctx = &s;
        r = ds_transport_open(&o, &s.tp);
        if (!r)
            r = ds_transport_addr(s.tp, addr, sizeof(addr));
    } else {
        ds_net_cfg cfg;
        ds_net_cfg_default(&cfg);
        cfg.identity = id;
        cfg.name = "bench-rx";
        if (g_chunk)
            cfg.transport.chunk_bytes = g_chunk;
        cfg.cluster = CLUSTER;
        cfg.cluster_key = key;
        cfg.mode = (enum ds_sec_mode)mode;
        cfg.on_recv = rx_net;
        cfg.cb_ctx = &s;
        r = ds_net_open(&cfg, &s.net);
        if (!r)
            r = ds_net_addr(s.net, addr, sizeof(addr));
    }
    if (r) {
        fprintf(stderr, "dsbench transport: receiver: %s\n", strerror(-r));
        return 1;
    }
    size_t l = strlen(addr) + 1;
    if (write(wfd, addr, l) != (ssize_t)l)
        return 1;
    /* Serve until the parent closes its end. */
    char c;
    while (read(wfd, &c, 1) > 0)
        ;
    return 0;
}

/* ---- the sending side ----------------------------------------------------- */

typedef struct tx_side {
    ds_net *net;
    ds_transport *tp;
    pthread_mutex_t m;
    pthread_cond_t c;
    int answered;
    uint64_t ans_bytes, ans_msgs;
} tx_side;

static void tx_net_recv(void *ctx, ds_net_rx *rx)
{
    tx_side *s = ctx;
    if (rx->hdr.type != DS_MSG_GOSSIP_STALE)
        return;
    pthread_mutex_lock(&s->m);
    s->ans_bytes = rx->hdr.round;
    s->ans_msgs = 0;
    ds_wire_msg m;
    ds_wire_bufs bufs = {0};
    if (ds_net_decode(s->net, rx, &bufs, &m) == DS_DROP_NONE)
        s->ans_msgs = m.u.stale.round_now;
    s->answered = 1;
    pthread_cond_broadcast(&s->c);
    pthread_mutex_unlock(&s->m);
}

static void tx_raw_recv(void *ctx, ds_transport_msg *msg)
{
    tx_side *s = ctx;
    if (msg->len != 16)
        return;
    uint64_t v[2];
    memcpy(v, msg->data, sizeof(v));
    pthread_mutex_lock(&s->m);
    s->ans_bytes = v[0];
    s->ans_msgs = v[1];
    s->answered = 1;
    pthread_cond_broadcast(&s->c);
    pthread_mutex_unlock(&s->m);
}

static void no_release(void *arg, void *buf)
{
    (void)arg;
    (void)buf;
}

/* Send one payload of `bytes` (data is read-only and shared). */
static int send_one(tx_side *s, int mode, ds_transport_peer peer, uint64_t to, const uint8_t *data,
                    size_t bytes, window *w, uint64_t deadline)
{
    send_tok *tok = malloc(sizeof(*tok));
    if (!tok)
        return -ENOMEM;
    tok->w = w;
    tok->bytes = bytes;
    pthread_mutex_lock(&w->m);
    w->outstanding += bytes;
    pthread_mutex_unlock(&w->m);
    int r;
    if (mode < 0) {
        ds_transport_send_args a = {.buf = data, .len = bytes, .deadline_ms = deadline,
                                    .release = no_release, .done = window_done, .done_arg = tok};
        r = ds_transport_send(s->tp, peer, &a);
    } else {
        ds_wire_msg m;
        memset(&m, 0, sizeof(m));
        m.h.type = DS_MSG_STATE_CHUNK;
        m.h.count = (uint32_t)bytes;
        m.u.chunk.total = bytes;
        m.u.chunk.data = data;
        ds_net_send_opts o = {.deadline_ms = deadline, .done = window_done, .done_arg = tok};
        /* data outlives the net (freed after ds_net_close): lending it
         * needs no release bookkeeping. */
        r = g_copy ? ds_net_send_msg(s->net, to, NULL, &m, &o)
                   : ds_net_send_msg_ref(s->net, to, NULL, &m, &o, no_release, NULL);
    }
    if (r) {
        pthread_mutex_lock(&w->m);
        w->outstanding -= bytes;
        pthread_mutex_unlock(&w->m);
        free(tok);
    }
    return r;
}

static int send_marker(tx_side *s, int mode, ds_transport_peer peer, uint64_t to)
{
    pthread_mutex_lock(&s->m);
    s->answered = 0;
    pthread_mutex_unlock(&s->m);
    uint64_t dl = ds_now_ms() + 30000;
    if (mode < 0) {
        uint8_t mark[8] = {0};
        ds_transport_send_args a = {.buf = mark, .len = sizeof(mark), .deadline_ms = dl};
        return ds_transport_send(s->tp, peer, &a);
    }
    ds_wire_msg m;
    memset(&m, 0, sizeof(m));
    m.h.type = DS_MSG_STATE_REQ;
    ds_net_send_opts o = {.deadline_ms = dl};
    return ds_net_send_msg(s->net, to, NULL, &m, &o);
}

static int wait_answer(tx_side *s, int timeout_ms)
{
    uint64_t end = ds_now_ms() + (uint64_t)timeout_ms;
    pthread_mutex_lock(&s->m);
    while (!s->answered && ds_now_ms() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->c, &s->m, &ts);
    }
    int ok = s->answered;
    pthread_mutex_unlock(&s->m);
    return ok;
}

/* One burst of `bytes`-sized messages for about `seconds`: MB/s of payload,
 * or a negative value on failure. */
static double burst(tx_side *s, int mode, ds_transport_peer peer, uint64_t to, const uint8_t *data,
                    size_t bytes, double seconds, uint64_t *msgs_out)
{
    window w = {.m = PTHREAD_MUTEX_INITIALIZER, .c = PTHREAD_COND_INITIALIZER};
    /* Keep up to 64 MiB (at least 4 messages) accepted and not done: the
     * transport's per-peer in-flight cap, not this window, is the limit. */
    uint64_t limit = bytes * 4 > (64u << 20) ? bytes * 4 : (64u << 20);
    uint64_t n = 0;
    int r = 0;
    double t0 = ds_bench_now();
    while (ds_bench_now() - t0 < seconds) {
        window_wait_below(&w, limit - bytes);
        r = send_one(s, mode, peer, to, data, bytes, &w, ds_now_ms() + 30000);
        if (r)
            break;
        n++;
    }
    if (!r && (send_marker(s, mode, peer, to) || !wait_answer(s, 60000)))
        r = -ETIMEDOUT;
    double t = ds_bench_now() - t0;
    /* Every done callback must have run before w goes out of scope; the
     * deadlines above bound this wait. */
    window_wait_below(&w, 0);
    if (r) {
        fprintf(stderr, "dsbench transport: %s after %" PRIu64 " messages\n", strerror(-r), n);
        return -1;
    }
    if (w.failed || s->ans_bytes != n * bytes) {
        fprintf(stderr, "dsbench transport: %" PRIu64 " of %" PRIu64 " messages arrived, %" PRIu64
                " failed\n", s->ans_msgs, n, w.failed);
        return -1;
    }
    *msgs_out = n;
    return (double)(n * bytes) / 1e6 / t;
}

/* ---- fi_pingpong baseline ------------------------------------------------ */

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    int port = -1;
    if (!bind(fd, (struct sockaddr *)&a, sizeof(a)) && !getsockname(fd, (struct sockaddr *)&a, &l))
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* MB/sec fi_pingpong reports for `iters` round trips of `bytes`, or a
 * negative value. */
static double pingpong_run(size_t bytes, uint64_t iters)
{
    int port = free_port();
    if (port < 0)
        return -1;
    char sz[32], it[32], pt[16];
    snprintf(sz, sizeof(sz), "%zu", bytes);
    snprintf(it, sizeof(it), "%" PRIu64, iters);
    snprintf(pt, sizeof(pt), "%d", port);
    pid_t srv = fork();
    if (srv < 0)
        return -1;
    if (srv == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) {
            dup2(devnull, STDOUT_FILENO);
            dup2(devnull, STDERR_FILENO);
        }
        execlp("timeout", "timeout", "120", "fi_pingpong", "-p", "tcp", "-e", "rdm", "-S", sz,
               "-I", it, "-B", pt, (char *)NULL);
        _exit(127);
    }
    usleep(500000); /* the server listens */
    char cmd[256];
    snprintf(cmd, sizeof(cmd),
             "timeout 120 fi_pingpong -p tcp -e rdm -S %s -I %s -P %s 127.0.0.1 2>/dev/null", sz,
             it, pt);
    FILE *f = popen(cmd, "r");
    double mbs = -1;
    if (f) {
        char line[512];
        while (fgets(line, sizeof(line), f)) {
            char c1[32], c2[32], c3[32], c4[32], c5[32];
            double v;
            /* "64k  11k  =11k  1.3g  1.06s  1420.67  46.13  0.02" */
            if (sscanf(line, "%31s %31s %31s %31s %31s %lf", c1, c2, c3, c4, c5, &v) == 6 &&
                c3[0] == '=')
                mbs = v;
        }
        pclose(f);
    }
    kill(srv, SIGKILL);
    waitpid(srv, NULL, 0);
    return mbs;
}

/* fi_pingpong for about `seconds`: a short calibration run first (it
 * counts a fixed number of round trips, and under load a guess can take
 * minutes). */
static double pingpong(size_t bytes, double seconds)
{
    uint64_t iters = (uint64_t)(seconds * 0.1 * 1e9 / 2.0 / (double)bytes);
    if (iters < 10)
        iters = 10;
    double v = pingpong_run(bytes, iters);
    if (v <= 0)
        return v;
    iters = (uint64_t)(seconds * v * 1e6 / 2.0 / (double)bytes);
    if (iters < 10)
        iters = 10;
    double w = pingpong_run(bytes, iters);
    return w > v ? w : v;
}

/* ---- the command ------------------------------------------------------------ */

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k')
        v *= 1024;
    else if (*end == 'M' || *end == 'm')
        v *= 1024 * 1024;
    return v > 0 ? (size_t)v : 0;
}

static const char *mode_name(int mode)
{
    return mode < 0 ? "transport" : ds_sec_mode_name((enum ds_sec_mode)mode);
}

/* What the command line asked for (--chunk and --copy go to g_chunk and
 * g_copy, which the receiving child reads too). */
typedef struct tp_opts {
    int json, do_pp, reps, nsizes, nmodes, nlibs;
    double seconds;
    size_t sizes[8];
    int modes[8]; /* -1: "transport", else an enum ds_sec_mode */
    int libs[2];  /* enum ds_aead_lib, for auth and encrypt */
} tp_opts;

/* --sizes: the sizes that parse (at most 8), in order; arg is cut up. */
static void parse_sizes(tp_opts *o, char *arg)
{
    o->nsizes = 0;
    for (char *tok = strtok(arg, ","); tok && o->nsizes < 8; tok = strtok(NULL, ","))
        if ((o->sizes[o->nsizes] = parse_size(tok)))
            o->nsizes++;
}

/* --modes: the names that are modes (at most 8), in order; arg is cut up. */
static void parse_modes(tp_opts *o, char *arg)
{
    o->nmodes = 0;
    for (char *tok = strtok(arg, ","); tok && o->nmodes < 8; tok = strtok(NULL, ",")) {
        if (!strcmp(tok, "transport"))
            o->modes[o->nmodes++] = -1;
        else if (ds_sec_mode_parse(tok) >= 0)
            o->modes[o->nmodes++] = ds_sec_mode_parse(tok);
    }
}

/* --libs: the AEAD libraries that parse (at most 2), in order. */
static void parse_libs(tp_opts *o, char *arg)
{
    o->nlibs = 0;
    for (char *tok = strtok(arg, ","); tok && o->nlibs < 2; tok = strtok(NULL, ","))
        if (ds_aead_lib_parse(tok) >= 0)
            o->libs[o->nlibs++] = ds_aead_lib_parse(tok);
}

/* getopt_long over argv into o, g_chunk and g_copy. 0, or 2 (the usage
 * said). A --reps below 1 counts as 1, a --seconds not above 0 as 1. */
static int read_opts(tp_opts *o, int argc, char **argv)
{
    static const struct option options[] = {
        {"json", no_argument, NULL, 'j'},
        {"no-pingpong", no_argument, NULL, 'P'},
        {"copy", no_argument, NULL, 'c'},
        {"chunk", required_argument, NULL, 'C'},
        {"reps", required_argument, NULL, 'r'},
        {"seconds", required_argument, NULL, 's'},
        {"sizes", required_argument, NULL, 'S'},
        {"modes", required_argument, NULL, 'm'},
        {"libs", required_argument, NULL, 'l'},
        {NULL, 0, NULL, 0},
    };
    *o = (tp_opts){.do_pp = 1, .reps = 3, .seconds = 1.0,
                   .sizes = {64u << 10, 1u << 20, 16u << 20}, .nsizes = 3,
                   .modes = {-1, DS_SEC_NONE, DS_SEC_AUTH, DS_SEC_ENCRYPT}, .nmodes = 4,
                   .libs = {DS_AEAD_LIB_SODIUM, DS_AEAD_LIB_OPENSSL}, .nlibs = 2};
    g_chunk = 0;
    g_copy = 0;
    int bad = 0, opt;
    optind = 0; /* start afresh on this argv; messages are ours */
    opterr = 0;
    while (!bad && (opt = getopt_long(argc, argv, "+:", options, NULL)) != -1) {
        switch (opt) {
        case 'j': o->json = 1; break;
        case 'P': o->do_pp = 0; break;
        case 'c': g_copy = 1; break;
        case 'C': g_chunk = parse_size(optarg); break;
        case 'r': o->reps = atoi(optarg) < 1 ? 1 : atoi(optarg); break;
        case 's': o->seconds = atof(optarg) <= 0 ? 1.0 : atof(optarg); break;
        case 'S': parse_sizes(o, optarg); break;
        case 'm': parse_modes(o, optarg); break;
        case 'l': parse_libs(o, optarg); break;
        default: bad = 1; /* an unknown option or a missing value */
        }
    }
    if (bad || optind < argc || !o->nlibs) {
        fprintf(stderr, "usage: dsbench transport [--json] [--seconds S] [--reps R] [--sizes 64K,1M,16M] "
                        "[--modes transport,none,auth,encrypt] [--no-pingpong] [--copy] "
                        "[--libs libsodium,openssl]\n");
        return 2;
    }
    return 0;
}

/* What every mode's rows share: the options, both nodes' keys, the
 * payload and the table. Owned by ds_bench_transport, on its stack. */
typedef struct tp_run {
    const tp_opts *o;
    ds_cluster_key key;
    ds_identity id_tx, id_rx;
    uint8_t *data; /* the largest size's worth; lent to every send */
    ds_row row;
} tp_run;

/* Forks the receiving node of `mode`. 0 with *child and *fd, our end of
 * the socket pair: the child writes its address there, and serves until
 * we close it. -errno when it could not be started. */
static int rx_start(const tp_run *t, int mode, pid_t *child, int *fd)
{
    int pfd[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pfd))
        return -errno;
    const pid_t pid = fork();
    if (pid < 0) {
        const int e = errno;
        close(pfd[0]);
        close(pfd[1]);
        return -e;
    }
    if (pid == 0) {
        close(pfd[0]);
        _exit(child_main(mode, &t->id_rx, &t->key, pfd[1]));
    }
    close(pfd[1]);
    *child = pid;
    *fd = pfd[0];
    return 0;
}

/* The receiver's address, NUL-terminated, from fd. 0, or -EIO when it
 * ended (or ran past cap) without one. */
static int rx_read_addr(int fd, char *addr, size_t cap)
{
    size_t got = 0;
    while (got < cap) {
        ssize_t k = read(fd, addr + got, 1);
        if (k <= 0)
            break;
        if (addr[got++] == 0)
            break;
    }
    return got && addr[got - 1] == 0 ? 0 : -EIO;
}

/* Opens the sending side of `mode` on s and reaches the receiver at addr:
 * through node/transport alone (mode < 0; *peer is the receiver), or a
 * node/net connected to it (waits up to 10 s for the handshake). 0, or a
 * negative errno; what was opened stays in s for the caller to close. */
static int tx_open(tx_side *s, const tp_run *t, int mode, const char *addr, ds_transport_peer *peer)
{
    int r;
    if (mode < 0) {
        ds_transport_opts o;
        ds_transport_opts_default(&o);
        if (g_chunk)
            o.chunk_bytes = g_chunk;
        o.on_recv = tx_raw_recv;
        o.cb_ctx = s;
        r = ds_transport_open(&o, &s->tp);
        if (!r)
            r = ds_transport_peer_add(s->tp, addr, peer);
        return r;
    }
    ds_net_cfg cfg;
    ds_net_cfg_default(&cfg);
    cfg.identity = &t->id_tx;
    cfg.name = "bench-tx";
    if (g_chunk)
        cfg.transport.chunk_bytes = g_chunk;
    cfg.cluster = CLUSTER;
    cfg.cluster_key = &t->key;
    cfg.mode = (enum ds_sec_mode)mode;
    cfg.on_recv = tx_net_recv;
    cfg.cb_ctx = s;
    r = ds_net_open(&cfg, &s->net);
    if (!r)
        r = ds_net_connect(s->net, addr, t->id_rx.id);
    uint64_t end = ds_now_ms() + 10000;
    while (!r && !ds_net_connected(s->net, t->id_rx.id) && ds_now_ms() < end)
        usleep(2000);
    if (!r && !ds_net_connected(s->net, t->id_rx.id))
        r = -ETIMEDOUT;
    return r;
}

/* One row: messages of `bytes` in `mode`. Warms up (handshake,
 * connections, allocator), then alternates the baseline and ours --reps
 * times, keeping the best of each. 0, or -1 (said; no row). */
static int measure_size(tp_run *t, tx_side *s, int mode, ds_transport_peer peer, size_t bytes)
{
    const tp_opts *o = t->o;
    const uint64_t to = t->id_rx.id;
    uint64_t msgs = 0, m1 = 0;
    double mbs = burst(s, mode, peer, to, t->data, bytes, o->seconds * 0.2, &m1);
    double pp_best = -1;
    for (int rep = 0; rep < o->reps && mbs >= 0; rep++) {
        if (o->do_pp) {
            double v = pingpong(bytes, o->seconds);
            if (v < 0)
                v = pingpong(bytes, o->seconds); /* a slow server start */
            if (v > pp_best)
                pp_best = v;
        }
        double v = burst(s, mode, peer, to, t->data, bytes, o->seconds, &m1);
        if (v < 0) {
            mbs = -1;
            break;
        }
        if (rep == 0 || v > mbs) {
            mbs = v;
            msgs = m1;
        }
    }
    if (mbs < 0) {
        fprintf(stderr, "dsbench transport: mode %s, %zu bytes failed\n", mode_name(mode), bytes);
        return -1;
    }
    ds_row_str(&t->row, "mode", mode_name(mode));
    ds_row_str(&t->row, "lib", mode == DS_SEC_AUTH || mode == DS_SEC_ENCRYPT
                                   ? ds_aead_lib_name(ds_aead_lib_get())
                                   : "-");
    ds_row_int(&t->row, "bytes", (int64_t)bytes);
    ds_row_num(&t->row, "mb_per_s", mbs, 0);
    ds_row_num(&t->row, "pingpong_mb_per_s", pp_best > 0 ? pp_best : NAN, 0);
    ds_row_num(&t->row, "vs_pingpong", pp_best > 0 ? mbs / pp_best : NAN, 2);
    ds_row_int(&t->row, "msgs", (int64_t)msgs);
    ds_row_num(&t->row, "seconds", o->seconds, 1);
    ds_row_int(&t->row, "reps", o->reps);
    ds_row_end(&t->row);
    return 0;
}

/* Every size's row of one mode, between a fresh receiver and sender.
 * 0, 1 (a row or the setup failed: said), or -1 when no receiver could be
 * started. */
static int run_mode(tp_run *t, int mode)
{
    pid_t child = 0;
    int fd = -1;
    if (rx_start(t, mode, &child, &fd) < 0)
        return -1;
    tx_side s;
    memset(&s, 0, sizeof(s));
    pthread_mutex_init(&s.m, NULL);
    pthread_cond_init(&s.c, NULL);
    ds_transport_peer peer = 0;
    char addr[DS_TRANSPORT_ADDR_MAX];
    int status = 0;
    int r = rx_read_addr(fd, addr, sizeof(addr));
    if (!r)
        r = tx_open(&s, t, mode, addr, &peer);
    for (int k = 0; k < t->o->nsizes && !r; k++)
        if (measure_size(t, &s, mode, peer, t->o->sizes[k]) < 0)
            status = 1;
    if (r) {
        fprintf(stderr, "dsbench transport: mode %s: setup failed: %s\n", mode_name(mode),
                strerror(-r));
        status = 1;
    }
    ds_net_close(&s.net);
    ds_transport_close(&s.tp);
    close(fd);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    return status;
}

/* The payload: the largest of sizes[0..n) in fixed pseudo-random bytes (at
 * least 1 byte). The caller frees it; NULL when out of memory. */
static uint8_t *payload_new(const size_t *sizes, int n)
{
    size_t maxsz = 0;
    for (int i = 0; i < n; i++)
        if (sizes[i] > maxsz)
            maxsz = sizes[i];
    uint8_t *data = malloc(maxsz ? maxsz : 1);
    if (!data)
        return NULL;
    for (size_t i = 0; i < maxsz; i++)
        data[i] = (uint8_t)(i * 2654435761u >> 13);
    return data;
}

int ds_bench_transport(int argc, char **argv)
{
    tp_opts o;
    if (read_opts(&o, argc, argv))
        return 2;
    ds_log_setup("dsbench", DS_LOG_WARN, stderr);
    if (ds_crypto_init())
        return 1;
    signal(SIGPIPE, SIG_IGN);
    tp_run t;
    memset(&t, 0, sizeof(t));
    t.o = &o;
    int status = 1;
    if (ds_cluster_key_generate(&t.key) || ds_identity_generate(&t.id_tx) ||
        ds_identity_generate(&t.id_rx))
        goto out_wipe;
    if (!(t.data = payload_new(o.sizes, o.nsizes)))
        goto out_wipe;
    ds_row_table(&t.row, o.json);
    status = 0;
    for (int mi = 0; mi < o.nmodes && status >= 0; mi++) {
        const int aead = o.modes[mi] == DS_SEC_AUTH || o.modes[mi] == DS_SEC_ENCRYPT;
        for (int li = 0; li < (aead ? o.nlibs : 1); li++) {
            /* Set before the receiver forks: both ends use it. */
            ds_aead_lib_set(aead ? (enum ds_aead_lib)o.libs[li] : DS_AEAD_LIB_OPENSSL);
            const int r = run_mode(&t, o.modes[mi]);
            if (r < 0) {
                status = -1;
                break;
            }
            status |= r;
        }
    }
    if (status < 0)
        status = 1;
    free(t.data);
out_wipe:
    ds_identity_wipe(&t.id_tx);
    ds_identity_wipe(&t.id_rx);
    ds_cluster_key_wipe(&t.key);
    return status;
}
