/*
 * tests/helpers/net_peer.c: a node of the secured layer (node/net/net.h) in its
 * own process, driven line by line on stdin, for tests/test_net.c. It plays
 * the honest peer and, on command, the attacker: it can seal a frame with
 * its genuine session and then damage, replay or re-address it, or replay
 * its recorded handshake frames.
 *
 *   net_peer --identity F --cluster NAME [--key F] [--allow F]
 *            [--mode encrypt|auth|none] [--name N] [--listen host:port]
 *
 * Prints "ADDR <host:port> ID <16 hex>" once listening, then one reply line
 * per command:
 *
 *   connect <addr>            handshake; "UP <id>" or "FAIL <errno>"
 *   send <id> <round>         a good GOSSIP_STALE with that round; "OK"
 *   flip <id> <round> <off>   the same, sealed, with byte `off` flipped
 *   replay <id>               the last frame sent by `send`, again
 *   forge <id> <round>        sealed, then the sender field changed
 *   hsreplay <id>             our recorded HELLO, then our old HELLO_FIN
 *   quit
 *
 * Frames it receives are reported as "RECV <id> <type> <round>" lines.
 * It asks for SIGKILL when its parent dies.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "node/sec/crypto.h"
#include "base/log.h"
#include "node/net/net.h"

static ds_net *g_net;
static pthread_mutex_t g_out = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static uint64_t g_up_peer;
static int g_failed_status;
static uint8_t *g_last;
static size_t g_last_len;
static uint8_t g_hello[DS_WIRE_MAX_HS_FRAME], g_fin[DS_WIRE_MAX_HS_FRAME];
static size_t g_hello_len, g_fin_len;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&g_out);
    vprintf(fmt, ap);
    putchar('\n');
    fflush(stdout);
    pthread_mutex_unlock(&g_out);
    va_end(ap);
}

static void on_recv(void *ctx, ds_net_rx *rx)
{
    (void)ctx;
    say("RECV %016" PRIx64 " %s %" PRIu64, rx->sender, ds_msg_type_name(rx->hdr.type),
        rx->hdr.round);
}

static void on_event(void *ctx, const ds_net_event *ev)
{
    (void)ctx;
    pthread_mutex_lock(&g_lock);
    if (ev->kind == DS_NET_EV_PEER_UP)
        g_up_peer = ev->peer;
    else if (ev->kind == DS_NET_EV_HANDSHAKE_FAILED)
        g_failed_status = ev->status ? ev->status : -EIO;
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
}

static void hs_tap(void *ctx, char dir, const uint8_t *frame, size_t len)
{
    (void)ctx;
    if (dir != 'S' || len < DS_WIRE_HDR_SIZE || len > DS_WIRE_MAX_HS_FRAME)
        return;
    if (frame[DS_WH_TYPE] == DS_MSG_HELLO && !g_hello_len) {
        memcpy(g_hello, frame, len);
        g_hello_len = len;
    } else if (frame[DS_WH_TYPE] == DS_MSG_HELLO_FIN && !g_fin_len) {
        memcpy(g_fin, frame, len);
        g_fin_len = len;
    }
}

static int seal_stale(uint64_t to, uint64_t round, uint8_t **out, size_t *len)
{
    ds_wire_msg m;
    memset(&m, 0, sizeof(m));
    m.h.type = DS_MSG_GOSSIP_STALE;
    m.h.round = round;
    m.u.stale.round_now = round;
    return ds_net_seal_for_test(g_net, to, &m, out, len);
}

static void cmd_connect(const char *addr)
{
    pthread_mutex_lock(&g_lock);
    g_up_peer = 0;
    g_failed_status = 0;
    pthread_mutex_unlock(&g_lock);
    int r = ds_net_connect(g_net, addr, 0);
    if (r) {
        say("FAIL %d", r);
        return;
    }
    uint64_t end = ds_now_ms() + 8000;
    pthread_mutex_lock(&g_lock);
    while (!g_up_peer && !g_failed_status && ds_now_ms() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g_cond, &g_lock, &ts);
    }
    uint64_t up = g_up_peer;
    int failed = g_failed_status;
    pthread_mutex_unlock(&g_lock);
    if (up)
        say("UP %016" PRIx64, up);
    else
        say("FAIL %d", failed ? failed : -ETIMEDOUT);
}

int main(int argc, char **argv)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const char *idfile = NULL, *cluster = NULL, *keyfile = NULL, *allowfile = NULL;
    const char *mode = "encrypt", *name = "peer", *listen = "127.0.0.1:0";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--identity"))
            idfile = argv[i + 1];
        else if (!strcmp(argv[i], "--cluster"))
            cluster = argv[i + 1];
        else if (!strcmp(argv[i], "--key"))
            keyfile = argv[i + 1];
        else if (!strcmp(argv[i], "--allow"))
            allowfile = argv[i + 1];
        else if (!strcmp(argv[i], "--mode"))
            mode = argv[i + 1];
        else if (!strcmp(argv[i], "--name"))
            name = argv[i + 1];
        else if (!strcmp(argv[i], "--listen"))
            listen = argv[i + 1];
        else {
            fprintf(stderr, "net_peer: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    ds_log_setup(name, DS_LOG_WARN, stderr);
    if (ds_crypto_init() || !idfile || !cluster) {
        fprintf(stderr, "net_peer: need --identity and --cluster\n");
        return 2;
    }
    char err[256];
    ds_identity id;
    ds_cluster_key key;
    ds_allowlist *allow = NULL;
    if (ds_identity_load(&id, idfile, err, sizeof(err))) {
        fprintf(stderr, "net_peer: %s\n", err);
        return 1;
    }
    if (keyfile && ds_cluster_key_load(&key, keyfile, err, sizeof(err))) {
        fprintf(stderr, "net_peer: %s\n", err);
        return 1;
    }
    if (allowfile && ds_allowlist_load(&allow, allowfile, err, sizeof(err))) {
        fprintf(stderr, "net_peer: %s\n", err);
        return 1;
    }
    ds_net_cfg cfg;
    ds_net_cfg_default(&cfg);
    cfg.identity = &id;
    cfg.name = name;
    cfg.cluster = cluster;
    cfg.cluster_key = keyfile ? &key : NULL;
    cfg.allow = allow;
    int m = ds_sec_mode_parse(mode);
    if (m < 0)
        return 2;
    cfg.mode = (enum ds_sec_mode)m;
    cfg.transport.listen = listen;
    cfg.handshake_timeout_ms = 3000;
    cfg.on_recv = on_recv;
    cfg.on_event = on_event;
    cfg.hs_tap = hs_tap;
    int r = ds_net_open(&cfg, &g_net);
    if (r) {
        fprintf(stderr, "net_peer: ds_net_open: %s\n", strerror(-r));
        return 1;
    }
    char addr[DS_TRANSPORT_ADDR_MAX];
    if (ds_net_addr(g_net, addr, sizeof(addr)))
        return 1;
    say("ADDR %s ID %016" PRIx64, addr, ds_net_self_id(g_net));

    char line[512];
    while (fgets(line, sizeof(line), stdin)) {
        char cmd[32], a1[200];
        uint64_t to = 0, round = 0, off = 0;
        int nf = sscanf(line, "%31s %199s %" SCNu64 " %" SCNu64, cmd, a1, &round, &off);
        if (nf < 1)
            continue;
        if (nf >= 2 && strcmp(cmd, "connect"))
            to = strtoull(a1, NULL, 16);
        uint64_t dl = ds_now_ms() + 5000;
        uint8_t *f = NULL;
        size_t len = 0;
        if (!strcmp(cmd, "quit")) {
            break;
        } else if (!strcmp(cmd, "connect") && nf >= 2) {
            cmd_connect(a1);
        } else if (!strcmp(cmd, "send") && nf >= 3) {
            r = seal_stale(to, round, &f, &len);
            if (!r)
                r = ds_net_send_raw(g_net, to, f, len, dl);
            if (!r) {
                free(g_last);
                g_last = f;
                g_last_len = len;
                f = NULL;
            }
            say(r ? "ERR %d" : "OK", r);
        } else if (!strcmp(cmd, "flip") && nf >= 4) {
            r = seal_stale(to, round, &f, &len);
            if (!r && off < len) {
                f[off] ^= 0x01;
                r = ds_net_send_raw(g_net, to, f, len, dl);
            }
            say(r ? "ERR %d" : "OK", r);
        } else if (!strcmp(cmd, "replay") && nf >= 2) {
            r = g_last ? ds_net_send_raw(g_net, to, g_last, g_last_len, dl) : -ENOENT;
            say(r ? "ERR %d" : "OK", r);
        } else if (!strcmp(cmd, "forge") && nf >= 3) {
            r = seal_stale(to, round, &f, &len);
            if (!r) {
                /* Claim another node's id as the sender. */
                uint64_t other = ds_net_self_id(g_net) ^ 0x5a5a5a5a5a5a5a5aull;
                for (int i = 0; i < 8; i++)
                    f[DS_WH_SENDER + i] = (uint8_t)(other >> (8 * i));
                r = ds_net_send_raw(g_net, to, f, len, dl);
            }
            say(r ? "ERR %d" : "OK", r);
        } else if (!strcmp(cmd, "hsreplay") && nf >= 2) {
            r = g_hello_len && g_fin_len ? 0 : -ENOENT;
            if (!r)
                r = ds_net_send_raw(g_net, to, g_hello, g_hello_len, dl);
            usleep(200000); /* let the victim answer the HELLO first */
            if (!r)
                r = ds_net_send_raw(g_net, to, g_fin, g_fin_len, dl);
            say(r ? "ERR %d" : "OK", r);
        } else {
            say("ERR unknown command");
        }
        free(f);
    }
    ds_net_close(&g_net);
    free(g_last);
    ds_allowlist_free(&allow);
    ds_identity_wipe(&id);
    ds_cluster_key_wipe(&key);
    return 0;
}
