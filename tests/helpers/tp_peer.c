/*
 * tests/helpers/tp_peer.c: a transport peer in its own process, for the
 * multi-process tests in tests/test_transport.c.
 *
 *   tp_peer [--provider P] [--listen host:port] [--chunk-kb N] [--sink]
 *           [--flood host:port]
 *
 * Opens a transport, prints "ADDR host:port" on stdout, then serves until
 * killed: every message received is sent back, unchanged, to its sender
 * (echo), or just counted (--sink). The echo keeps the received buffer and
 * hands it to the transport without a copy. With --flood it also streams
 * 4 MiB messages to that address as fast as they go (a peer to kill in the
 * middle of large transfers). It asks for SIGKILL when its parent dies, so
 * a crashed test leaves no peer behind.
 */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "node/transport/transport.h"

static ds_transport *g_tp;
static int g_sink;
static _Atomic int g_outstanding;

static void flood_done(void *arg, int status)
{
    (void)arg;
    (void)status;
    g_outstanding--;
}
static volatile sig_atomic_t g_stop;

static void release_base(void *arg, void *buf)
{
    (void)buf;
    free(arg);
}

static void on_recv(void *ctx, ds_transport_msg *msg)
{
    (void)ctx;
    if (g_sink)
        return;
    void *base = ds_transport_msg_take(msg);
    ds_transport_send_args a = {
        .buf = msg->data,
        .len = msg->len,
        .deadline_ms = ds_now_ms() + 60000,
        .release = release_base,
        .release_arg = base,
    };
    if (ds_transport_send(g_tp, msg->peer, &a))
        free(base);
}

static void on_term(int sig)
{
    (void)sig;
    g_stop = 1;
}

int main(int argc, char **argv)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    ds_transport_opts o;
    ds_transport_opts_default(&o);
    const char *flood = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--provider") && i + 1 < argc)
            o.provider = argv[++i];
        else if (!strcmp(argv[i], "--listen") && i + 1 < argc)
            o.listen = argv[++i];
        else if (!strcmp(argv[i], "--chunk-kb") && i + 1 < argc)
            o.chunk_bytes = (size_t)strtoul(argv[++i], NULL, 10) * 1024;
        else if (!strcmp(argv[i], "--sink"))
            g_sink = 1;
        else if (!strcmp(argv[i], "--flood") && i + 1 < argc)
            flood = argv[++i];
        else {
            fprintf(stderr, "tp_peer: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    const char *lv = getenv("DS_TP_PEER_LOG"); /* e.g. "debug" */
    int level = lv ? ds_log_level_parse(lv) : -1;
    ds_log_setup("tp_peer", level >= 0 ? (enum ds_log_level)level : DS_LOG_WARN, stderr);
    o.on_recv = on_recv;
    int r = ds_transport_open(&o, &g_tp);
    if (r) {
        fprintf(stderr, "tp_peer: open failed: %s\n", strerror(-r));
        return 1;
    }
    char addr[DS_TRANSPORT_ADDR_MAX];
    if (ds_transport_addr(g_tp, addr, sizeof(addr)))
        return 1;
    printf("ADDR %s\n", addr);
    fflush(stdout);
    signal(SIGTERM, on_term);
    if (flood) {
        ds_transport_peer p;
        if (ds_transport_peer_add(g_tp, flood, &p))
            return 1;
        static uint8_t big[4u << 20];
        memset(big, 0x5a, sizeof(big));
        while (!g_stop) {
            if (g_outstanding >= 8) {
                usleep(1000);
                continue;
            }
            ds_transport_send_args a = {.buf = big, .len = sizeof(big),
                                        .deadline_ms = ds_now_ms() + 5000,
                                        .done = flood_done};
            g_outstanding++;
            if (ds_transport_send(g_tp, p, &a)) {
                g_outstanding--;
                usleep(1000);
            }
        }
    }
    while (!g_stop)
        pause();
    ds_transport_close(&g_tp);
    return 0;
}
