/*
 * tools/dslaunch/local.c: `dslaunch local`, a whole dsnode cluster on this
 * host.
 *
 * What it does, in order:
 *
 *  1. Validates the base config by running `dsnode check-config base.ini
 *     --set ...` (the user's overrides). dslaunch parses no config itself: the
 *     node's own loader is the only one, so dslaunch can never accept what
 *     dsnode refuses or read a key differently. Its printed effective config
 *     is read only for what the display needs (train.steps) and to see
 *     whether the status page and file are on.
 *  2. Makes the run directory and, with `dsnode keygen`, a cluster key and one
 *     identity per node (every node that will ever run, --add-at ones
 *     included, so one allow-list holding every public key can be written
 *     before anyone starts).
 *  3. Writes DIR/nI.ini for each node as the stdout of `dsnode check-config
 *     base.ini --set <user's> --set node.name=nI --set node.listen=...`: a
 *     complete ini, valid by construction, that loads back to exactly the
 *     configuration the node runs with. dslaunch's own --set come last, so
 *     they win over the user's for the keys dslaunch owns (name, listen,
 *     data_dir, seeds, key files, status address and file). When the
 *     config leaves train.dataset_cache empty, dslaunch gives every node of
 *     a host the same one, DIR/dataset-cache (the host's directory with
 *     hosts), so a host inflates the images once.
 *  4. With --netns, puts every node in a network namespace of its own behind
 *     an optionally rate-limited link (netns.c); the nodes then listen on
 *     their namespace's address instead of 127.0.0.1.
 *  5. Starts `dsnode run --config DIR/nI.ini` for every node (proc.c: they
 *     die with dslaunch; under `ip netns exec` with --netns), reads their
 *     stdout and stderr through pipes, copies
 *     every line to DIR/nI.log, and follows their train/eval log lines to
 *     show progress. --add-at STEP:COUNT starts COUNT more nodes once the
 *     slowest running node has logged STEP.
 *  6. Stops everything on SIGINT/SIGTERM/SIGHUP, on --timeout, or when
 *     dslaunch itself fails: SIGTERM to every child, 5 s grace, SIGKILL,
 *     and every child reaped. A node that fails does not stop the others.
 *     The namespaces go once every node is reaped, on every way out.
 *  7. Reports: a table of every node that ran, the relative consensus
 *     distance of their final models (consensus.c), and with --json one JSON
 *     object as the last line of stdout.
 *
 * One thread, one poll loop. Signals arrive through a signalfd (blocked from
 * the start, so a Ctrl-C during key generation is seen too, and no handler
 * races with the loop), child output through non-blocking pipes. Progress
 * goes to stderr: on a terminal one redrawn line per node, elsewhere a compact
 * status line every few seconds; the final table and JSON go to stdout.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <dirent.h>
#include <unistd.h>

#include "base/file.h"
#include "base/hostport.h"
#include "tools/dslaunch/dslaunch.h"

#define MAX_NODES 256        /* all nodes of one run, --add-at included */
#define MAX_SETS 100         /* user --set; dsnode takes 256 arguments */
#define MAX_ADD 32           /* --add-at options */
/* A node added at STEP enters the gossip view the membership lag after a
 * member admits it: at least 32 rounds (DS_LAG_MIN_ROUNDS in
 * node/runtime/lag.h, 5 s of rounds at speed), plus its start-up and join.
 * Twice the minimum lag, in rounds, is the least margin before train.steps
 * that leaves it a chance to train at all; nearer the end the others are
 * leaving and answer its JOIN with "cluster finishing". */
#define ADD_AT_MARGIN_ROUNDS 64
#define MAX_SEEDS 16         /* cluster.seeds holds at most 16 (conf/keys.h) */
#define SEEDS_TEXT (MAX_SEEDS * (DS_HOSTPORT_MAX + 1)) /* seeds as cluster.seeds text */
#define GRACE_MS 5000        /* SIGTERM -> SIGKILL */
/* dslaunch hosts: the remote watcher gives the node 5 s after the session's
 * stdin closes; the local ssh gets that plus time to bring the summary back. */
#define GRACE_SSH_MS 10000
#define MAX_HOSTS 64
#define SSH_CMD_MS 120000    /* ship and collect, each host */
#define DEFAULT_PORT_SSH 7000
#define DRAIN_MS 2000        /* pipes kept open after a child is reaped */
#define CMD_TIMEOUT_MS 60000 /* keygen, check-config */
#define STATUS_EVERY_MS 5000 /* the status line when stderr is not a terminal */
#define WAITS_EVERY_MS 500   /* the nodes' status.json read for their waits */
#define WAIT_DOC_MAX (4 << 20) /* a larger status.json is not read */
#define FORWARD_MAX 20       /* warn/error lines shown per node */
#define LINE_MAX_ 8192

/* Config keys dslaunch sets on every node; a user --set of one is overridden. */
static const char *const owned_keys[] = {
    "node.name",         "node.listen",          "node.data_dir",       "cluster.seeds",
    "cluster.key_file", "cluster.identity_file", "cluster.allowed_keys", "status.listen",
    "status.file",      "cluster.min_members",
};
/* And with dslaunch hosts --groups-by-host (the default). */
static const char *const owned_group_key = "node.group";

struct linebuf {
    char buf[LINE_MAX_];
    size_t len;
};

enum node_state { NODE_PENDING, NODE_RUNNING, NODE_DONE };

struct node {
    char name[16];
    int host;             /* dslaunch hosts: index into hosts; else 0 */
    int in_w;             /* dslaunch hosts: write end of ssh's stdin; -1 when closed */
    int host_lost;        /* dslaunch hosts: ssh itself failed (255) before a summary */
    int port, status_port;
    char status_url[96];  /* http://HOST:PORT/ of its status page; "" none */
    int64_t added_at;     /* the --add-at STEP that started it; -1 for the first N */
    char conf[PATH_MAX];  /* DIR/nI.ini */
    char key[PATH_MAX];   /* DIR/nI.key (+ .pub) */
    char data[PATH_MAX];  /* DIR/nI */
    char logp[PATH_MAX];  /* DIR/nI.log */
    char model[PATH_MAX]; /* DIR/nI/model.bin */
    enum node_state state;
    pid_t pid;
    int fd[2]; /* stdout, stderr read ends; -1 when closed */
    struct linebuf lb[2];
    FILE *log;
    int log_failed;
    int reaped, exit_code;
    int64_t t_start, t_reaped, t_end;
    /* progress, from the log */
    int have_train, have_eval;
    int64_t step;
    double loss, sps, test_acc;
    /* what it waits on, from its status.file (ds_wait_text); "" none */
    char waiting[160];
    /* the summary line */
    int have_summary;
    ds_kvline summary;
    int forwarded;
    char group[32];   /* local --groups: its node.group */
    int gidx;         /* and its index */
};

struct add_at {
    int64_t step;
    int count;
    int fired, abandoned;
};

struct launch {
    /* options */
    int n;
    const char *config;
    char *sets[MAX_SETS];
    int nsets;
    const char *out;
    int port_base; /* -1 = choose */
    int json;
    double timeout_s; /* 0 = none */
    struct add_at add[MAX_ADD];
    int nadd;
    const char *dsnode_opt;
    /* `dslaunch local ... -- CMD ARGS`: every node runs CMD instead of
     * `dsnode run` (a program over libdsnode), its config in $DSNODE_CONFIG. */
    char **user_cmd;
    int n_user_cmd;
    char user_prog[PATH_MAX]; /* CMD[0] found in PATH */
    int netns;             /* --netns */
    char host[48];         /* --host: the loopback address without brackets */
    int host_given;
    uint64_t netns_rate;   /* --netns-rate in bit/s; 0 = none */
    const char *netns_rate_text;
    /* dslaunch hosts */
    int hosts_mode;
    const char *cmd;       /* "local" or "hosts", for messages */
    const char *hosts_arg;
    char (*hosts)[DS_SSH_HOST_MAX];
    int nhosts;
    int per_host;
    ds_ssh ssh;
    const char *remote_dsnode_opt;
    const char *remote_base; /* --remote-dir */
    int groups_by_host;
    int groups;            /* local --groups G: node.group g0..g{G-1}; 0: none */
    int netns_hosts;       /* local --netns-hosts H: H namespaces of contiguous nodes */
    uint64_t *ns_out;      /* per namespace: bytes it sent out (read before teardown) */
    char ssh_prog[PATH_MAX];
    char tar_prog[PATH_MAX];
    char remote_dsnode[PATH_MAX];
    char run_id[64];
    int grace_ms;
    /* derived */
    char dsnode[PATH_MAX];
    char dir[256]; /* node.data_dir = DIR/nI holds 255 characters at most */
    char cluster_key[PATH_MAX];
    char allowed[PATH_MAX];
    int64_t steps;       /* train.steps of the effective config; 0 unknown */
    int64_t gossip_every; /* gossip.every of the effective config; 1 unknown */
    int status_listen;   /* status.listen is on in the base config */
    int status_file;     /* status.file is on */
    int dataset_cache;   /* train.dataset_cache left empty: DIR/dataset-cache */
    int total;           /* nodes planned in all */
    struct node *nodes;
    int started;         /* nodes[0..started) have been started */
    ds_netns ns;         /* --netns: what was made, for teardown */
    /* loop */
    int sigfd;
    int tty;
    int cols, rows;
    int drawn;           /* lines of the progress block on screen */
    int dirty;
    int64_t t0, last_draw, last_status, last_waits;
    int stopping;        /* 0, or why: */
    const char *stop_reason;
    int stop_signal;
    int64_t kill_at;     /* when SIGKILL follows; 0 = not yet */
    int killed_hard;
    int failed_self;     /* dslaunch's own failure */
};

static int find_prog(const char *name, char *buf, size_t len);

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void local_usage(FILE *f)
{
    fprintf(f,
            "usage: dslaunch local -n N --config FILE [options] [-- CMD [ARGS...]]\n"
            "\n"
            "Start N dsnode processes on this host, each with its own name (n0, n1, ...),\n"
            "port, data directory and identity key, show their progress, and report.\n"
            "With -- CMD, each node runs CMD ARGS instead of `dsnode run` (a program over\n"
            "libdsnode, e.g. python3 train.py), with DSNODE_CONFIG (its config file),\n"
            "DSNODE_NAME and DSNODE_RANK (0..N-1) in its environment.\n"
            "\n"
            "  -n N                 nodes to start (1..%d)\n"
            "  --config FILE        base configuration (every node's, before per-node keys)\n"
            "  --set SECTION.KEY=VALUE\n"
            "                       override a key of the base configuration (repeatable)\n"
            "  --out DIR            run directory (default runs/<UTC time>-<pid>); must be new or\n"
            "                       empty\n"
            "  --port-base P        node nI listens on HOST:P+I (default: a free block from\n"
            "                       20000 + 16 * (pid %% 2500))\n"
            "  --host HOST          the loopback address the nodes listen on: 127.0.0.1 (default),\n"
            "                       another 127.x.y.z, or ::1\n"
            "  --json               end stdout with one JSON object: every node's result and the\n"
            "                       consensus distance\n"
            "  --timeout SECONDS    stop every node after this long (then exit non-zero)\n"
            "  --add-at STEP:COUNT  when the slowest running node has reached STEP, start COUNT\n"
            "                       more nodes (repeatable)\n"
            "  --dsnode PATH        the dsnode program (default: the one beside dslaunch, else PATH)\n"
            "  --netns              run every node in a network namespace of its own (root only):\n"
            "                       nI listens on 10.213.x.y, all cabled to one bridge; removed at\n"
            "                       the end\n"
            "  --netns-rate RATE    with --netns: limit every node's link to RATE each way (tc\n"
            "                       tbf), e.g. 100mbit, 1gbit; implies --netns\n"
            "  --groups G           node.group = g0..g{G-1} in contiguous blocks of nodes (nodes\n"
            "                       added later: in turn); groups all-reduce inside and gossip\n"
            "                       between them; with --netns, one namespace per group\n"
            "  --netns-hosts H      --netns with H namespaces (\"hosts\"), nodes in contiguous\n"
            "                       blocks sharing their namespace's address; only the links\n"
            "                       between namespaces are rate-limited\n"
            "\n"
            "Exit status: 0 when every node exited 0; 1 when a node or dslaunch failed or\n"
            "--timeout struck; 2 for a usage or configuration error; 128+signal when stopped\n"
            "by a signal. See docs/dslaunch.md.\n",
            MAX_NODES);
}

static void hosts_usage(FILE *f)
{
    fprintf(f,
            "usage: dslaunch hosts --hosts H1,H2,...|FILE --per-host K --config FILE [options]\n"
            "\n"
            "Start K dsnode processes on each host over ssh (OpenSSH client, BatchMode): keys\n"
            "and configs made here, shipped to a new directory on each host, the nodes run\n"
            "there tied to their ssh sessions, progress shown, results collected back.\n"
            "\n"
            "  --hosts LIST|FILE    [user@]host entries, comma-separated or one a line in FILE;\n"
            "                       the host must be an address or name the other hosts reach\n"
            "  --per-host K         nodes on each host (1..%d in all)\n"
            "  --config FILE        base configuration\n"
            "  --set SECTION.KEY=VALUE\n"
            "                       override a key of the base configuration (repeatable)\n"
            "  --out DIR            local run directory (default runs/<UTC time>-<pid>)\n"
            "  --port-base P        the K nodes of a host listen on HOST:P..P+K-1 (default %d)\n"
            "  --json               end stdout with one JSON object\n"
            "  --timeout SECONDS    stop every node after this long (then exit non-zero)\n"
            "  --dsnode PATH        the dsnode program here (keys, configs)\n"
            "  --remote-dsnode PATH the dsnode program on the hosts (default: the same path as\n"
            "                       here)\n"
            "  --remote-dir DIR     where each host's run directory is made (default /tmp)\n"
            "  --ssh-config FILE    ssh -F FILE\n"
            "  --ssh-option OPT     ssh -o OPT, e.g. Port=2222, IdentityFile=~/.ssh/k (repeatable)\n"
            "  --groups-by-host     node.group = the host (the default)\n"
            "  --no-groups-by-host  leave node.group as the base config says\n"
            "\n"
            "Exit status as dslaunch local's: 0 when every node exited 0; 1 when a node,\n"
            "an ssh session or dslaunch failed; 2 for a usage or configuration error;\n"
            "128+signal when stopped by a signal. See docs/dslaunch.md.\n",
            MAX_NODES, DEFAULT_PORT_SSH);
}

/* ---- messages and progress ------------------------------------------------- */

static void term_size(struct launch *L)
{
    struct winsize ws;
    L->cols = 80;
    L->rows = 24;
    if (ioctl(2, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
        L->cols = ws.ws_col;
        L->rows = ws.ws_row;
    }
}

static void erase_block(struct launch *L)
{
    if (!L->tty || !L->drawn)
        return;
    fprintf(stderr, "\r\033[%dA\033[J", L->drawn);
    L->drawn = 0;
}

/* A line for the user, above the progress block. */
static void __attribute__((format(printf, 2, 3))) say(struct launch *L, const char *fmt, ...)
{
    erase_block(L);
    va_list ap;
    va_start(ap, fmt);
    fputs("dslaunch: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    L->dirty = 1;
}

static const char *node_state_text(const struct node *nd, char *buf, size_t len)
{
    if (nd->state == NODE_PENDING)
        return "pending";
    if (nd->state == NODE_RUNNING)
        return nd->reaped ? "exiting" : nd->have_train ? "running" : "starting";
    const char *st = nd->have_summary ? ds_kv_get(&nd->summary, "status") : NULL;
    if (st)
        snprintf(buf, len, "%s(%d)", st, nd->exit_code);
    else
        snprintf(buf, len, "%s(%d)", nd->host_lost ? "lost" : nd->exit_code > 128 ? "killed" : "failed",
                 nd->exit_code);
    return buf;
}

/* Seconds until the slowest running node reaches train.steps at its
 * average pace since it started; -1 when not known (no steps configured,
 * no node past step 0). */
static double eta_s(const struct launch *L, int64_t t)
{
    double worst = -1;
    for (int i = 0; i < L->started && L->steps > 0; i++) {
        const struct node *nd = &L->nodes[i];
        if (nd->state == NODE_DONE || nd->step <= 0 || t <= nd->t_start)
            continue;
        const double rate = (double)nd->step / ((double)(t - nd->t_start) / 1e3);
        const double left = nd->step < L->steps ? (double)(L->steps - nd->step) / rate : 0;
        worst = left > worst ? left : worst;
    }
    return worst;
}

static void eta_text(const struct launch *L, int64_t t, char *buf, size_t n)
{
    const double e = eta_s(L, t);
    if (e < 0)
        snprintf(buf, n, "eta -");
    else if (e < 120)
        snprintf(buf, n, "eta %.0fs", e);
    else
        snprintf(buf, n, "eta %.0fm%02.0fs", floor(e / 60), fmod(e, 60));
}

/* Each running node's waiting reason, from its status.file (local runs
 * with status.file on; a node's file is rewritten while it waits). */
static void read_waits(struct launch *L)
{
    L->last_waits = now_ms();
    for (int i = 0; i < L->started; i++) {
        struct node *nd = &L->nodes[i];
        char old[sizeof(nd->waiting)];
        memcpy(old, nd->waiting, sizeof(old));
        nd->waiting[0] = 0;
        char path[PATH_MAX + 16];
        snprintf(path, sizeof(path), "%s/status.json", nd->data);
        FILE *f = nd->state == NODE_RUNNING && !nd->reaped ? fopen(path, "rb") : NULL;
        struct stat sb;
        char *doc = NULL;
        size_t len = 0;
        if (f && fstat(fileno(f), &sb) == 0 && sb.st_size > 0 && sb.st_size <= WAIT_DOC_MAX &&
            (doc = malloc((size_t)sb.st_size)))
            len = fread(doc, 1, (size_t)sb.st_size, f);
        if (f)
            fclose(f);
        if (len)
            (void)ds_wait_text(doc, len, nd->waiting, sizeof(nd->waiting));
        free(doc);
        if (strcmp(old, nd->waiting) != 0)
            L->dirty = 1;
    }
}

static void draw_block(struct launch *L)
{
    const int64_t t = now_ms();
    char line[512], st[48];
    int lines = 0;
    int fits = L->started + 2 < L->rows;
    erase_block(L);
    int w = L->cols - 1 < (int)sizeof(line) - 1 ? L->cols - 1 : (int)sizeof(line) - 1;
    if (w < 20)
        w = 20;
    int running = 0, done = 0;
    for (int i = 0; i < L->started; i++)
        if (L->nodes[i].state == NODE_DONE)
            done++;
        else
            running++;
    char eta[32];
    eta_text(L, t, eta, sizeof(eta));
    snprintf(line, sizeof(line), "dslaunch: %.0fs  %s  %d running  %d exited  %s%s",
             (t - L->t0) / 1e3, eta, running, done, L->stopping ? "stopping: " : "",
             L->stopping ? L->stop_reason : "");
    fprintf(stderr, "%.*s\033[K\n", w, line);
    lines++;
    for (int i = 0; fits && i < L->started; i++) {
        const struct node *nd = &L->nodes[i];
        char stepbuf[48], lossbuf[24] = "-", accbuf[24] = "-", spsbuf[32] = "-";
        if (L->steps > 0)
            snprintf(stepbuf, sizeof(stepbuf), "%lld/%lld", (long long)nd->step, (long long)L->steps);
        else
            snprintf(stepbuf, sizeof(stepbuf), "%lld", (long long)nd->step);
        if (nd->have_train) {
            snprintf(lossbuf, sizeof(lossbuf), "%.4f", nd->loss);
            snprintf(spsbuf, sizeof(spsbuf), "%.0f", nd->sps);
        }
        if (nd->have_eval)
            snprintf(accbuf, sizeof(accbuf), "%.4f", nd->test_acc);
        if (nd->waiting[0]) /* what it is blocked on says more than its last rates */
            snprintf(line, sizeof(line), "  %-5s %-13s step %-11s %s  %s", nd->name,
                     node_state_text(nd, st, sizeof(st)), stepbuf, nd->waiting, nd->status_url);
        else
            snprintf(line, sizeof(line), "  %-5s %-13s step %-11s loss %-7s acc %-7s %s/s  %s",
                     nd->name, node_state_text(nd, st, sizeof(st)), stepbuf, lossbuf, accbuf,
                     spsbuf, nd->status_url);
        fprintf(stderr, "%.*s\033[K\n", w, line);
        lines++;
    }
    fflush(stderr);
    L->drawn = lines;
    L->dirty = 0;
    L->last_draw = t;
}

/* Not a terminal: one compact line every STATUS_EVERY_MS. */
static void status_line(struct launch *L)
{
    int running = 0, done = 0, nacc = 0, ntrain = 0;
    int64_t smin = INT64_MAX, smax = 0;
    double acc = 0, loss = 0, sps = 0;
    for (int i = 0; i < L->started; i++) {
        const struct node *nd = &L->nodes[i];
        if (nd->state == NODE_DONE) {
            done++;
            continue;
        }
        running++;
        smin = nd->step < smin ? nd->step : smin;
        smax = nd->step > smax ? nd->step : smax;
        if (nd->have_train) {
            loss += nd->loss;
            sps += nd->sps;
            ntrain++;
        }
        if (nd->have_eval) {
            acc += nd->test_acc;
            nacc++;
        }
    }
    char acc_s[32] = "-", loss_s[32] = "-";
    if (nacc)
        snprintf(acc_s, sizeof(acc_s), "%.4f", acc / nacc);
    if (ntrain)
        snprintf(loss_s, sizeof(loss_s), "%.4f", loss / ntrain);
    if (!running)
        smin = smax = 0;
    char eta[32];
    eta_text(L, now_ms(), eta, sizeof(eta));
    fprintf(stderr,
            "dslaunch: %.0fs  running %d  exited %d  step %lld..%lld/%lld  %s  loss %s  acc %s  "
            "%.0f samples/s in all\n",
            (now_ms() - L->t0) / 1e3, running, done, (long long)smin, (long long)smax,
            (long long)L->steps, eta, loss_s, acc_s, sps);
    for (int i = 0; i < L->started; i++)
        if (L->nodes[i].waiting[0])
            fprintf(stderr, "dslaunch:   %s %s\n", L->nodes[i].name, L->nodes[i].waiting);
    L->last_status = now_ms();
}

/* ---- argument parsing ---------------------------------------------------------- */

static int parse_int(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    if (!s || !*s || (*s < '0' || *s > '9'))
        return -EINVAL;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -EINVAL;
    *out = v;
    return 0;
}

/* Options of `dslaunch local` (getopt_long: "--opt VALUE", "--opt=VALUE",
 * "-n N", "-nN"). The long-only ones get codes above any character. */
enum {
    OPT_JSON = 256,
    OPT_CONFIG,
    OPT_SET,
    OPT_OUT,
    OPT_PORT_BASE,
    OPT_TIMEOUT,
    OPT_ADD_AT,
    OPT_NETNS,
    OPT_NETNS_RATE,
    OPT_DSNODE,
    OPT_HOST,
    OPT_HOSTS,
    OPT_PER_HOST,
    OPT_SSH_OPTION,
    OPT_SSH_CONFIG,
    OPT_REMOTE_DSNODE,
    OPT_REMOTE_DIR,
    OPT_GROUPS_BY_HOST,
    OPT_NO_GROUPS_BY_HOST,
    OPT_GROUPS,
    OPT_NETNS_HOSTS,
};

static const struct option local_options[] = {
    {"help", no_argument, NULL, 'h'},
    {"nodes", required_argument, NULL, 'n'},
    {"json", no_argument, NULL, OPT_JSON},
    {"config", required_argument, NULL, OPT_CONFIG},
    {"set", required_argument, NULL, OPT_SET},
    {"out", required_argument, NULL, OPT_OUT},
    {"port-base", required_argument, NULL, OPT_PORT_BASE},
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {"add-at", required_argument, NULL, OPT_ADD_AT},
    {"netns", no_argument, NULL, OPT_NETNS},
    {"netns-rate", required_argument, NULL, OPT_NETNS_RATE},
    {"dsnode", required_argument, NULL, OPT_DSNODE},
    {"host", required_argument, NULL, OPT_HOST},
    {"groups", required_argument, NULL, OPT_GROUPS},
    {"netns-hosts", required_argument, NULL, OPT_NETNS_HOSTS},
    {NULL, 0, NULL, 0},
};

static const struct option hosts_options[] = {
    {"help", no_argument, NULL, 'h'},
    {"json", no_argument, NULL, OPT_JSON},
    {"config", required_argument, NULL, OPT_CONFIG},
    {"set", required_argument, NULL, OPT_SET},
    {"out", required_argument, NULL, OPT_OUT},
    {"port-base", required_argument, NULL, OPT_PORT_BASE},
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {"dsnode", required_argument, NULL, OPT_DSNODE},
    {"hosts", required_argument, NULL, OPT_HOSTS},
    {"per-host", required_argument, NULL, OPT_PER_HOST},
    {"ssh-option", required_argument, NULL, OPT_SSH_OPTION},
    {"ssh-config", required_argument, NULL, OPT_SSH_CONFIG},
    {"remote-dsnode", required_argument, NULL, OPT_REMOTE_DSNODE},
    {"remote-dir", required_argument, NULL, OPT_REMOTE_DIR},
    {"groups-by-host", no_argument, NULL, OPT_GROUPS_BY_HOST},
    {"no-groups-by-host", no_argument, NULL, OPT_NO_GROUPS_BY_HOST},
    {NULL, 0, NULL, 0},
};

/* --add-at STEP:COUNT, appended to L->add. 0 or -EINVAL (said). */
static int take_add_at(struct launch *L, const char *val)
{
    const char *colon = val ? strchr(val, ':') : NULL;
    long long step, count;
    char stepbuf[32];
    if (!colon || (size_t)(colon - val) >= sizeof(stepbuf)) {
        fprintf(stderr, "dslaunch local: --add-at expects STEP:COUNT, found '%s'\n",
                val ? val : "");
        return -EINVAL;
    }
    memcpy(stepbuf, val, (size_t)(colon - val));
    stepbuf[colon - val] = '\0';
    if (parse_int(stepbuf, 1, INT64_MAX, &step) < 0 ||
        parse_int(colon + 1, 1, MAX_NODES, &count) < 0) {
        fprintf(stderr, "dslaunch local: --add-at expects STEP:COUNT with STEP >= 1 and "
                        "COUNT in 1..%d, found '%s'\n", MAX_NODES, val);
        return -EINVAL;
    }
    if (L->nadd >= MAX_ADD) {
        fprintf(stderr, "dslaunch local: at most %d --add-at options\n", MAX_ADD);
        return -EINVAL;
    }
    L->add[L->nadd].step = step;
    L->add[L->nadd].count = (int)count;
    L->nadd++;
    return 0;
}

/* One option c with its value (NULL when it was given without one); arg is
 * the command-line element it came from, for messages. 0, 1 (--help: done)
 * or -EINVAL (said). */
static int take_option(struct launch *L, int c, const char *val, const char *arg)
{
    long long v;
    switch (c) {
    case 'h':
        if (L->hosts_mode)
            hosts_usage(stdout);
        else
            local_usage(stdout);
        return 1;
    case OPT_HOSTS:
        L->hosts_arg = val;
        return 0;
    case OPT_PER_HOST:
        if (parse_int(val, 1, MAX_NODES, &v) < 0) {
            fprintf(stderr, "dslaunch hosts: --per-host expects a node count in 1..%d, found "
                            "'%s'\n", MAX_NODES, val ? val : "");
            return -EINVAL;
        }
        L->per_host = (int)v;
        return 0;
    case OPT_SSH_OPTION:
        if (!val || !*val || *val == '-') {
            fprintf(stderr, "dslaunch hosts: --ssh-option expects an ssh_config option such as "
                            "Port=2222, found '%s'\n", val ? val : "");
            return -EINVAL;
        }
        if (L->ssh.nopts >= DS_SSH_OPTS_MAX) {
            fprintf(stderr, "dslaunch hosts: at most %d --ssh-option\n", DS_SSH_OPTS_MAX);
            return -EINVAL;
        }
        L->ssh.opts[L->ssh.nopts++] = val;
        return 0;
    case OPT_SSH_CONFIG:
        if (!val || !*val || access(val, R_OK) < 0) {
            fprintf(stderr, "dslaunch hosts: --ssh-config %s: %s\n", val ? val : "",
                    val && *val ? strerror(errno) : "needs a file");
            return -EINVAL;
        }
        L->ssh.config = val;
        return 0;
    case OPT_REMOTE_DSNODE:
        if (!val || val[0] != '/') {
            fprintf(stderr, "dslaunch hosts: --remote-dsnode expects an absolute path, found "
                            "'%s'\n", val ? val : "");
            return -EINVAL;
        }
        L->remote_dsnode_opt = val;
        return 0;
    case OPT_REMOTE_DIR:
        if (!val || val[0] != '/' || strlen(val) > 160) {
            fprintf(stderr, "dslaunch hosts: --remote-dir expects an absolute path of at most "
                            "160 characters, found '%s'\n", val ? val : "");
            return -EINVAL;
        }
        L->remote_base = val;
        return 0;
    case OPT_GROUPS_BY_HOST:
        L->groups_by_host = 1;
        return 0;
    case OPT_GROUPS:
        if (parse_int(val, 1, MAX_NODES, &v) < 0) {
            fprintf(stderr, "dslaunch local: --groups expects a group count in 1..%d, found "
                            "'%s'\n", MAX_NODES, val ? val : "");
            return -EINVAL;
        }
        L->groups = (int)v;
        return 0;
    case OPT_NETNS_HOSTS:
        if (parse_int(val, 1, MAX_NODES, &v) < 0) {
            fprintf(stderr, "dslaunch local: --netns-hosts expects a namespace count in 1..%d, "
                            "found '%s'\n", MAX_NODES, val ? val : "");
            return -EINVAL;
        }
        L->netns_hosts = (int)v;
        L->netns = 1;
        return 0;
    case OPT_NO_GROUPS_BY_HOST:
        L->groups_by_host = 0;
        return 0;
    case OPT_JSON:
        L->json = 1;
        return 0;
    case 'n':
        if (parse_int(val, 1, MAX_NODES, &v) < 0) {
            fprintf(stderr, "dslaunch local: -n expects a node count in 1..%d, found '%s'\n",
                    MAX_NODES, val ? val : "");
            return -EINVAL;
        }
        L->n = (int)v;
        return 0;
    case OPT_CONFIG:
        if (!val || !*val) {
            fprintf(stderr, "dslaunch local: --config needs a file\n");
            return -EINVAL;
        }
        L->config = val;
        return 0;
    case OPT_SET:
        if (!val || !strchr(val, '=')) {
            fprintf(stderr, "dslaunch local: --set expects section.key=value, found '%s'\n",
                    val ? val : "");
            return -EINVAL;
        }
        if (L->nsets >= MAX_SETS) {
            fprintf(stderr, "dslaunch local: at most %d --set options\n", MAX_SETS);
            return -EINVAL;
        }
        L->sets[L->nsets++] = (char *)val;
        return 0;
    case OPT_OUT:
        if (!val || !*val) {
            fprintf(stderr, "dslaunch local: --out needs a directory\n");
            return -EINVAL;
        }
        L->out = val;
        return 0;
    case OPT_PORT_BASE:
        if (parse_int(val, 1024, 65535, &v) < 0) {
            fprintf(stderr, "dslaunch local: --port-base expects a port in 1024..65535, "
                            "found '%s'\n", val ? val : "");
            return -EINVAL;
        }
        L->port_base = (int)v;
        return 0;
    case OPT_TIMEOUT: {
        char *end;
        double t = val ? strtod(val, &end) : 0;
        if (!val || !*val || *end || !(t > 0) || t > 1e7) {
            fprintf(stderr, "dslaunch local: --timeout expects seconds > 0, found '%s'\n",
                    val ? val : "");
            return -EINVAL;
        }
        L->timeout_s = t;
        return 0;
    }
    case OPT_ADD_AT:
        return take_add_at(L, val);
    case OPT_NETNS:
        L->netns = 1;
        return 0;
    case OPT_NETNS_RATE:
        if (ds_netns_rate_parse(val, &L->netns_rate) < 0) {
            fprintf(stderr, "dslaunch local: --netns-rate expects a rate such as 100mbit or "
                            "1gbit (kbit, mbit, gbit; 8kbit..100gbit), found '%s'\n",
                    val ? val : "");
            return -EINVAL;
        }
        L->netns_rate_text = val;
        L->netns = 1;
        return 0;
    case OPT_HOST: {
        /* An address by the one parser (base/hostport.h), loopback: every
         * node runs on this host, and security.mode = none stays possible. */
        const int kind = val ? ds_host_kind_of(val) : -EINVAL;
        if ((kind != DS_HOST_IPV4 && kind != DS_HOST_IPV6) || !ds_host_is_loopback(val) ||
            strlen(val) >= sizeof(L->host)) {
            fprintf(stderr, "dslaunch local: --host expects a loopback address (127.0.0.0/8 or "
                            "::1, IPv6 without brackets), found '%s'\n",
                    val ? val : "");
            return -EINVAL;
        }
        snprintf(L->host, sizeof(L->host), "%s", val);
        L->host_given = 1;
        return 0;
    }
    case OPT_DSNODE:
        if (!val || !*val) {
            fprintf(stderr, "dslaunch local: --dsnode needs a path\n");
            return -EINVAL;
        }
        L->dsnode_opt = val;
        return 0;
    default:
        fprintf(stderr, "dslaunch %s: unknown argument '%s' (see dslaunch %s --help)\n", L->cmd,
                arg, L->cmd);
        return -EINVAL;
    }
}

static int parse_args(struct launch *L, int argc, char **argv)
{
    L->n = 0;
    L->port_base = -1;
    snprintf(L->host, sizeof(L->host), "127.0.0.1");
    /* "+": stop at the first element that is not an option (it is refused
     * below), so options are read strictly in order, as given; ":": a
     * missing value comes back as ':' and gets its option's own message.
     * optind = 0 makes getopt start afresh on this argv. */
    optind = 0;
    opterr = 0;
    for (;;) {
        const int at = optind > 0 ? optind : 1; /* the element being read */
        int c = getopt_long(argc, argv, L->hosts_mode ? "+:h" : "+:hn:",
                            L->hosts_mode ? hosts_options : local_options, NULL);
        if (c == -1)
            break;
        const char *val = optarg;
        if (c == ':') {
            c = optopt;
            val = NULL;
        } else if (c == '?') {
            c = 0;
        }
        /* "-n=5" meant -n 5 before getopt; keep it so. */
        if (c == 'n' && val && val[0] == '=' && !strncmp(argv[at], "-n=", 3))
            val++;
        const int r = take_option(L, c, val, argv[at]);
        if (r != 0)
            return r;
    }
    /* getopt stopped after "--": the rest is the command every node runs. */
    if (optind < argc && optind > 1 && !strcmp(argv[optind - 1], "--") && !L->hosts_mode) {
        L->user_cmd = &argv[optind];
        L->n_user_cmd = argc - optind;
        optind = argc;
        const char *prog = L->user_cmd[0];
        if (strchr(prog, '/'))
            snprintf(L->user_prog, sizeof(L->user_prog), "%s", prog);
        else if (find_prog(prog, L->user_prog, sizeof(L->user_prog)) < 0) {
            fprintf(stderr, "dslaunch local: -- %s: not found in PATH\n", prog);
            return -ENOENT;
        }
        if (access(L->user_prog, X_OK) < 0) {
            fprintf(stderr, "dslaunch local: -- %s: %s\n", L->user_prog, strerror(errno));
            return -ENOENT;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "dslaunch %s: unknown argument '%s' (see dslaunch %s --help)\n", L->cmd,
                argv[optind], L->cmd);
        return -EINVAL;
    }
    if (L->hosts_mode) {
        char why[512];
        if (!L->hosts_arg) {
            fprintf(stderr, "dslaunch hosts: --hosts is required (see dslaunch hosts --help)\n");
            return -EINVAL;
        }
        if (!L->per_host) {
            fprintf(stderr, "dslaunch hosts: --per-host K is required (see dslaunch hosts "
                            "--help)\n");
            return -EINVAL;
        }
        L->hosts = calloc(MAX_HOSTS, sizeof(*L->hosts));
        if (!L->hosts)
            return -ENOMEM;
        int nh = ds_hosts_parse(L->hosts_arg, L->hosts, MAX_HOSTS, why, sizeof(why));
        if (nh < 0) {
            fprintf(stderr, "dslaunch hosts: --hosts: %s\n", why);
            return -EINVAL;
        }
        L->nhosts = nh;
        if ((long long)nh * L->per_host > MAX_NODES) {
            fprintf(stderr, "dslaunch hosts: %d hosts x %d nodes: at most %d nodes in all\n", nh,
                    L->per_host, MAX_NODES);
            return -EINVAL;
        }
        L->n = nh * L->per_host;
    }
    if (!L->n) {
        fprintf(stderr, "dslaunch local: -n N is required (see dslaunch local --help)\n");
        return -EINVAL;
    }
    if (L->host_given && L->netns) {
        fprintf(stderr, "dslaunch local: --host cannot be combined with --netns (each node "
                        "then listens on its namespace's address)\n");
        return -EINVAL;
    }
    if (!L->config) {
        fprintf(stderr, "dslaunch %s: --config FILE is required (see dslaunch %s --help)\n",
                L->cmd, L->cmd);
        return -EINVAL;
    }
    if (L->netns_hosts > L->n) {
        fprintf(stderr, "dslaunch local: --netns-hosts %d: expected at most one namespace per "
                        "node (-n %d)\n", L->netns_hosts, L->n);
        return -EINVAL;
    }
    if (L->groups > L->n) {
        fprintf(stderr, "dslaunch local: --groups %d: expected at most one group per node (-n "
                        "%d)\n", L->groups, L->n);
        return -EINVAL;
    }
    L->total = L->n;
    for (int k = 0; k < L->nadd; k++)
        L->total += L->add[k].count;
    if (L->total > MAX_NODES) {
        fprintf(stderr, "dslaunch local: %d nodes in all (with --add-at); at most %d\n", L->total,
                MAX_NODES);
        return -EINVAL;
    }
    /* Fire in step order; equal steps in the order given. */
    for (int a = 1; a < L->nadd; a++)
        for (int b = a; b > 0 && L->add[b - 1].step > L->add[b].step; b--) {
            struct add_at t = L->add[b];
            L->add[b] = L->add[b - 1];
            L->add[b - 1] = t;
        }
    return 0;
}

/* ---- setup ---------------------------------------------------------------------- */

static int find_dsnode(struct launch *L, const char *self_dir)
{
    if (L->dsnode_opt) {
        if (access(L->dsnode_opt, X_OK) < 0) {
            fprintf(stderr, "dslaunch: --dsnode %s: %s\n", L->dsnode_opt, strerror(errno));
            return -ENOENT;
        }
        /* execv does no PATH search; make a bare name a path. */
        if (!strchr(L->dsnode_opt, '/'))
            snprintf(L->dsnode, sizeof(L->dsnode), "./%s", L->dsnode_opt);
        else
            snprintf(L->dsnode, sizeof(L->dsnode), "%s", L->dsnode_opt);
        return 0;
    }
    char tried[3][PATH_MAX];
    int nt = 0;
    if (self_dir && *self_dir) {
        /* build tree: build/tools/dslaunch/dslaunch -> build/node/dsnode;
         * installed: bin/dslaunch -> bin/dsnode. */
        snprintf(tried[nt++], PATH_MAX, "%s/../../node/dsnode", self_dir);
        snprintf(tried[nt++], PATH_MAX, "%s/dsnode", self_dir);
    }
    for (int i = 0; i < nt; i++)
        if (access(tried[i], X_OK) == 0) {
            if (!realpath(tried[i], L->dsnode))
                snprintf(L->dsnode, sizeof(L->dsnode), "%.*s", PATH_MAX - 1, tried[i]);
            return 0;
        }
    const char *path = getenv("PATH");
    if (path) {
        char *copy = strdup(path), *save = NULL;
        for (char *d = copy ? strtok_r(copy, ":", &save) : NULL; d; d = strtok_r(NULL, ":", &save)) {
            char cand[PATH_MAX];
            snprintf(cand, sizeof(cand), "%s/dsnode", *d ? d : ".");
            if (access(cand, X_OK) == 0) {
                snprintf(L->dsnode, sizeof(L->dsnode), "%s", cand);
                free(copy);
                return 0;
            }
        }
        free(copy);
    }
    fprintf(stderr, "dslaunch: cannot find the dsnode program (looked beside dslaunch%s%s and in "
                    "PATH); pass --dsnode PATH\n",
            nt ? ": " : "", nt ? tried[0] : "");
    return -ENOENT;
}

/* Drains the signalfd; returns the last SIGINT/SIGTERM/SIGHUP seen, or 0. */
static int take_signals(struct launch *L)
{
    struct signalfd_siginfo si;
    int stop = 0;
    while (read(L->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM || si.ssi_signo == SIGHUP)
            stop = (int)si.ssi_signo;
        else if (si.ssi_signo == SIGWINCH)
            term_size(L), L->dirty = 1;
    }
    return stop;
}

/* Runs a dsnode subcommand to completion. On failure prints what dsnode
 * said (its stderr) under `what` and returns -1; on success returns 0 with
 * its stdout in *out (caller frees) when out is non-NULL. */
static int run_dsnode(struct launch *L, char **argv, const char *what, char **out)
{
    char *o = NULL, *e = NULL, err[512];
    int code = 0;
    int ret = ds_proc_capture(argv, CMD_TIMEOUT_MS, &o, &e, &code, err, sizeof(err));
    if (ret < 0 || code != 0) {
        if (ret < 0 && ret != -ETIMEDOUT)
            fprintf(stderr, "dslaunch: %s: %s\n", what, err);
        else
            fprintf(stderr, "dslaunch: %s failed (%s):\n%s", what,
                    ret == -ETIMEDOUT ? err : "dsnode said", e && *e ? e : "(no message)\n");
        if (e && *e && e[strlen(e) - 1] != '\n')
            fputc('\n', stderr);
        free(o);
        free(e);
        return -1;
    }
    (void)L;
    free(e);
    if (out)
        *out = o;
    else
        free(o);
    return 0;
}

/* Value of section.key in the ini text check-config printed (our own dump
 * format: "[section]" lines and "key = value" lines). 0 or -ENOENT. */
static int dump_get(const char *text, const char *section, const char *key, char *val, size_t len)
{
    char cur[64] = "";
    const char *p = text;
    while (*p) {
        const char *eol = strchr(p, '\n');
        size_t n = eol ? (size_t)(eol - p) : strlen(p);
        if (n > 2 && p[0] == '[' && p[n - 1] == ']' && n - 2 < sizeof(cur)) {
            memcpy(cur, p + 1, n - 2);
            cur[n - 2] = '\0';
        } else if (!strcmp(cur, section)) {
            size_t kl = strlen(key);
            if (n > kl && !strncmp(p, key, kl) && (p[kl] == ' ' || p[kl] == '=')) {
                const char *v = p + kl;
                while (*v == ' ')
                    v++;
                if (*v == '=') {
                    v++;
                    while (*v == ' ')
                        v++;
                    size_t vl = (size_t)(p + n - v);
                    if (vl >= len)
                        vl = len - 1;
                    memcpy(val, v, vl);
                    val[vl] = '\0';
                    return 0;
                }
            }
        }
        p += n + (eol ? 1 : 0);
    }
    return -ENOENT;
}

/* argv for `dsnode check-config --offline base.ini --set <user>... --set
 * <extra>...`. --offline: the config is only being read and completed here
 * (each node's ports and directories are set by later --set's, its keys
 * written after); every node checks its own file system and ports when it
 * starts. Strings in extra are borrowed. */
static char **check_config_argv(struct launch *L, char **extra, int nextra)
{
    char **argv = calloc((size_t)(5 + 2 * (L->nsets + nextra)), sizeof(char *));
    if (!argv)
        return NULL;
    int k = 0;
    argv[k++] = L->dsnode;
    argv[k++] = "check-config";
    argv[k++] = "--offline";
    argv[k++] = (char *)L->config;
    for (int i = 0; i < L->nsets; i++) {
        argv[k++] = "--set";
        argv[k++] = L->sets[i];
    }
    for (int i = 0; i < nextra; i++) {
        argv[k++] = "--set";
        argv[k++] = extra[i];
    }
    argv[k] = NULL;
    return argv;
}

/* Refuse an --add-at past, or too close to, the end of training. */
static int check_add_margin(const struct launch *L)
{
    const int64_t margin = ADD_AT_MARGIN_ROUNDS * L->gossip_every;
    for (int k = 0; k < L->nadd; k++) {
        const struct add_at *a = &L->add[k];
        if (L->steps <= 0)
            continue;
        if (a->step > L->steps) {
            fprintf(stderr, "dslaunch: --add-at %lld:%d: the nodes stop at train.steps = %lld\n",
                    (long long)a->step, a->count, (long long)L->steps);
            return -EINVAL;
        }
        if (L->steps - a->step < margin) {
            fprintf(stderr,
                    "dslaunch: --add-at %lld:%d: too close to the end (train.steps = %lld): "
                    "STEP must be at most %lld, %lld steps (%d gossip rounds) before the end, "
                    "because a node added then enters the view at least 32 rounds after it "
                    "is admitted, and by then the others are leaving\n",
                    (long long)a->step, a->count, (long long)L->steps,
                    (long long)(L->steps - margin), (long long)margin, ADD_AT_MARGIN_ROUNDS);
            return -EINVAL;
        }
    }
    return 0;
}

static int check_base(struct launch *L)
{
    /* Without blocking: a FIFO given as the config is refused, not waited on. */
    char why[128];
    int fd = ds_file_open_regular(L->config, NULL, why, sizeof(why));
    if (fd < 0) {
        fprintf(stderr, "dslaunch: cannot read the config %s: %s\n", L->config, why);
        return fd;
    }
    close(fd);
    for (int i = 0; i < L->nsets; i++) {
        const size_t gl = strlen(owned_group_key);
        if (((L->hosts_mode && L->groups_by_host) || L->groups) &&
            !strncmp(L->sets[i], owned_group_key, gl) && L->sets[i][gl] == '=')
            fprintf(stderr, "dslaunch: note: --set %s is replaced per node (%s)\n", L->sets[i],
                    L->groups ? "--groups sets node.group"
                              : "--groups-by-host sets node.group to the host; "
                                "--no-groups-by-host keeps yours");
        for (size_t k = 0; k < sizeof(owned_keys) / sizeof(owned_keys[0]); k++) {
            size_t n = strlen(owned_keys[k]);
            if (!strncmp(L->sets[i], owned_keys[k], n) && L->sets[i][n] == '=')
                fprintf(stderr, "dslaunch: note: --set %s is replaced per node (dslaunch sets %s)\n",
                        L->sets[i], owned_keys[k]);
        }
    }
    char **argv = check_config_argv(L, NULL, 0);
    char *dump = NULL;
    if (!argv)
        return -ENOMEM;
    int ret = run_dsnode(L, argv, "the configuration is not valid: dsnode check-config", &dump);
    free(argv);
    if (ret < 0)
        return -EINVAL;
    char v[256];
    if (dump_get(dump, "train", "steps", v, sizeof(v)) == 0)
        L->steps = strtoll(v, NULL, 10);
    L->gossip_every = 1;
    if (dump_get(dump, "gossip", "every", v, sizeof(v)) == 0 && strtoll(v, NULL, 10) > 0)
        L->gossip_every = strtoll(v, NULL, 10);
    L->status_listen = dump_get(dump, "status", "listen", v, sizeof(v)) == 0 && v[0];
    L->status_file = dump_get(dump, "status", "file", v, sizeof(v)) == 0 && v[0];
    L->dataset_cache = dump_get(dump, "train", "dataset_cache", v, sizeof(v)) == 0 && !v[0];
    if (dump_get(dump, "node", "log_level", v, sizeof(v)) == 0 &&
        (!strcmp(v, "error") || !strcmp(v, "warn"))) {
        if (L->nadd) {
            fprintf(stderr, "dslaunch: --add-at follows the nodes' train log lines, but "
                            "node.log_level = %s hides them; use info or debug\n", v);
            free(dump);
            return -EINVAL;
        }
        fprintf(stderr, "dslaunch: note: node.log_level = %s: no progress until the nodes end\n", v);
    }
    free(dump);
    return check_add_margin(L);
}

static int mkdir_p(const char *path, mode_t mode)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, mode) < 0 && errno != EEXIST)
                return -errno;
            *p = '/';
        }
    if (mkdir(tmp, mode) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

static int dir_is_empty(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return -errno;
    struct dirent *e;
    int empty = 1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            empty = 0;
    closedir(d);
    return empty;
}

static int make_run_dir(struct launch *L)
{
    char want[PATH_MAX];
    if (L->out) {
        snprintf(want, sizeof(want), "%s", L->out);
    } else {
        time_t t = time(NULL);
        struct tm tm;
        gmtime_r(&t, &tm);
        snprintf(want, sizeof(want), "runs/%04d%02d%02dT%02d%02d%02dZ-%d", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)getpid());
    }
    {
        /* dslaunch hosts names each host's directory after the run. */
        time_t t = time(NULL);
        struct tm tm;
        gmtime_r(&t, &tm);
        snprintf(L->run_id, sizeof(L->run_id), "%04d%02d%02dT%02d%02d%02dZ-%d",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                 (int)getpid());
    }
    int ret = mkdir_p(want, 0755);
    if (ret < 0) {
        fprintf(stderr, "dslaunch: cannot create the run directory %s: %s\n", want, strerror(-ret));
        return ret;
    }
    ret = dir_is_empty(want);
    if (ret <= 0) {
        if (ret < 0)
            fprintf(stderr, "dslaunch: cannot read the run directory %s: %s\n", want,
                    strerror(-ret));
        else
            fprintf(stderr, "dslaunch: the run directory %s is not empty; give a new --out\n", want);
        return ret < 0 ? ret : -EEXIST;
    }
    char abs[PATH_MAX];
    if (!realpath(want, abs)) {
        fprintf(stderr, "dslaunch: %s: %s\n", want, strerror(errno));
        return -errno;
    }
    /* node.data_dir holds at most 255 characters: DIR + "/n255". */
    if (strlen(abs) + 6 > 255) {
        fprintf(stderr, "dslaunch: the run directory path %s is too long for node.data_dir "
                        "(255 characters at most); give a shorter --out\n", abs);
        return -ENAMETOOLONG;
    }
    memcpy(L->dir, abs, strlen(abs) + 1);
    snprintf(L->cluster_key, sizeof(L->cluster_key), "%s/cluster.key", L->dir);
    snprintf(L->allowed, sizeof(L->allowed), "%s/allowed_keys", L->dir);
    return 0;
}

static int choose_ports(struct launch *L)
{
    const int per = L->status_listen ? 2 : 1;
    const int need = per * L->total;
    int base;
    if (L->port_base > 0 && L->port_base + need - 1 > 65535) {
        fprintf(stderr, "dslaunch: --port-base %d: %d ports do not fit below 65536\n",
                L->port_base, need);
        return -EINVAL;
    }
    if (L->hosts_mode) {
        /* The K nodes of each host: P..P+K-1, status pages P+K..P+2K-1.
         * Ports on other hosts cannot be probed from here: a busy one makes
         * that node fail with the transport's error. */
        base = L->port_base > 0 ? L->port_base : DEFAULT_PORT_SSH;
        if (base + per * L->per_host - 1 > 65535) {
            fprintf(stderr, "dslaunch: --port-base %d: %d ports do not fit below 65536\n", base,
                    per * L->per_host);
            return -EINVAL;
        }
        for (int i = 0; i < L->total; i++) {
            const int j = i % L->per_host;
            L->nodes[i].port = base + j;
            L->nodes[i].status_port = L->status_listen ? base + L->per_host + j : 0;
        }
        return 0;
    } else if (L->netns) {
        /* Each node is alone in its namespace: no port there is taken, and
         * probing this one would say nothing about them. */
        base = L->port_base > 0 ? L->port_base : 7000;
    } else if (L->port_base > 0) {
        if (!ds_port_range_free_at(L->host, L->port_base, need)) {
            fprintf(stderr, "dslaunch: --port-base %d: a port in %d..%d is in use on %s\n",
                    L->port_base, L->port_base, L->port_base + need - 1, L->host);
            return -EADDRINUSE;
        }
        base = L->port_base;
    } else {
        /* 16 ports apart per pid, so launches started one after another
         * (consecutive pids) do not probe the same block and then race for
         * it; 2500 slots span 20000..59999. */
        base = ds_port_find_at(L->host, 20000 + 16 * (int)(getpid() % 2500), need);
        if (base < 0) {
            fprintf(stderr, "dslaunch: no block of %d free ports found on %s\n", need, L->host);
            return base;
        }
    }
    for (int i = 0; i < L->total; i++) {
        L->nodes[i].port = base + i;
        L->nodes[i].status_port = L->status_listen ? base + L->total + i : 0;
    }
    return 0;
}

static int make_keys(struct launch *L)
{
    char *kc[] = {L->dsnode, "keygen", "--cluster", "--out", L->cluster_key, NULL};
    if (run_dsnode(L, kc, "dsnode keygen --cluster", NULL) < 0)
        return -EIO;
    FILE *al = fopen(L->allowed, "w");
    if (!al) {
        fprintf(stderr, "dslaunch: cannot write %s: %s\n", L->allowed, strerror(errno));
        return -errno;
    }
    fprintf(al, "# allow-list written by dslaunch: the public identity key and name of every\n"
                "# node of this run (cluster.allowed_keys)\n");
    int ret = 0;
    for (int i = 0; i < L->total && ret == 0; i++) {
        struct node *nd = &L->nodes[i];
        if (take_signals(L)) {
            fprintf(stderr, "dslaunch: interrupted while making keys\n");
            ret = -EINTR;
            break;
        }
        char *kg[] = {L->dsnode, "keygen", "--out", nd->key, "--name", nd->name, NULL};
        char *line = NULL;
        if (run_dsnode(L, kg, "dsnode keygen", &line) < 0) {
            ret = -EIO;
            break;
        }
        /* keygen prints the allow-list line for the key ("hex name"); the
         * same line is in nI.key.pub. */
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        if (strlen(line) < 64) {
            fprintf(stderr, "dslaunch: dsnode keygen printed '%s', not a public key line\n", line);
            ret = -EPROTO;
        } else {
            fprintf(al, "%s\n", line);
        }
        free(line);
    }
    if (fclose(al) != 0 && ret == 0) {
        fprintf(stderr, "dslaunch: cannot write %s: %s\n", L->allowed, strerror(errno));
        ret = -EIO;
    }
    return ret;
}

/* dslaunch hosts: host h's run directory on that host. */
static void host_dir(const struct launch *L, int h, char *buf, size_t len)
{
    snprintf(buf, len, "%s/dslaunch-%s-h%d", L->remote_base ? L->remote_base : "/tmp", L->run_id,
             h);
}

/* node.group for host entry "[user@]host": the host, each character
 * outside [A-Za-z0-9_.-] made '-', at most 63 (conf's name rule). */
static void group_of(const char *entry, char *buf, size_t len)
{
    const char *h = ds_host_addr(entry);
    size_t k = 0;
    for (; h[k] && k < 63 && k + 1 < len; k++) {
        const char c = h[k];
        const int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                       (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
        buf[k] = ok ? c : '-';
    }
    buf[k] = '\0';
}

/* Node i's network namespace with --netns: its own, or with --groups its
 * group's (a group is one "host": its members share an address). */
static int node_ns(const struct launch *L, int i)
{
    if (L->netns_hosts)
        return i < L->n ? (int)((int64_t)i * L->netns_hosts / L->n) : (i - L->n) % L->netns_hosts;
    return L->groups ? L->nodes[i].gidx : i;
}

/* Namespaces --netns makes. */
static int ns_count(const struct launch *L)
{
    return L->netns_hosts ? L->netns_hosts : L->groups ? L->groups : L->total;
}

/* Node i's host address: its namespace's with --netns, else --host. */
static void node_host(const struct launch *L, int i, char *buf, size_t len)
{
    if (L->hosts_mode)
        snprintf(buf, len, "%s", ds_host_addr(L->hosts[L->nodes[i].host]));
    else if (L->netns)
        ds_netns_addr(node_ns(L, i), buf, len);
    else
        snprintf(buf, len, "%s", L->host);
}

/* Node i's host:port for `port` (IPv6 in brackets, base/hostport.h). */
static void node_hostport(const struct launch *L, int i, int port, char *buf, size_t len)
{
    char host[DS_HOST_MAX + 1];
    node_host(L, i, host, sizeof(host));
    if (ds_hostport_format(host, (uint16_t)port, buf, len) < 0)
        snprintf(buf, len, "?");
}

/* Up to MAX_SEEDS addresses of the nodes in cand[0..nc), spread evenly
 * around the ring starting after `self` (so the nearest successor is
 * always one of them). With founder >= 0 the founder's address comes
 * first, even for the founder itself: dsnode founds the cluster when its
 * own address is the first seed, and every other node joins through it. */
static void seeds_text(struct launch *L, int self, int founder, const int *cand, int nc,
                       char *out, size_t len)
{
    int order[MAX_NODES], no = 0;
    /* cand in ring order starting after self */
    for (int k = 1; k <= L->total; k++) {
        int j = (self + k) % L->total;
        for (int c = 0; c < nc; c++)
            if (cand[c] == j && j != self && j != founder)
                order[no++] = j;
    }
    size_t w = 0;
    char hp[DS_HOSTPORT_MAX + 1];
    out[0] = '\0';
    int max = MAX_SEEDS;
    if (founder >= 0) {
        node_hostport(L, founder, L->nodes[founder].port, hp, sizeof(hp));
        w += (size_t)snprintf(out, len, "%s", hp);
        max--;
    }
    int pick = no < max ? no : max;
    for (int t = 0; t < pick; t++) {
        int j = order[(int)((long long)t * no / pick)];
        node_hostport(L, j, L->nodes[j].port, hp, sizeof(hp));
        w += (size_t)snprintf(out + w, w < len ? len - w : 0, "%s%s", w ? "," : "", hp);
    }
}

/* Writes nd->conf from check-config's output; seeds as text. */
static int write_node_config(struct launch *L, struct node *nd, const char *seeds,
                             int min_members)
{
    char s_group[96], rpath[4][PATH_MAX + 8];
    char s_name[64], s_listen[DS_HOSTPORT_MAX + 16], s_data[PATH_MAX + 32],
        s_seeds[SEEDS_TEXT + 16], s_key[PATH_MAX + 32],
        s_id[PATH_MAX + 32], s_allow[PATH_MAX + 32], s_slisten[96], s_sfile[PATH_MAX + 32],
        s_min[64], s_cache[PATH_MAX + 48];
    char *extra[12], hp[DS_HOSTPORT_MAX + 1];
    int ne = 0;
    /* The paths the node sees: here, or in its host's directory. */
    const char *data = nd->data, *ckey = L->cluster_key, *idkey = nd->key, *allow = L->allowed;
    const char *home = L->dir; /* the run directory, or the node's host's */
    char hd[256];
    if (L->hosts_mode) {
        host_dir(L, nd->host, hd, sizeof(hd));
        home = hd;
        snprintf(rpath[0], sizeof(rpath[0]), "%s/%s", hd, nd->name);
        snprintf(rpath[1], sizeof(rpath[1]), "%s/cluster.key", hd);
        snprintf(rpath[2], sizeof(rpath[2]), "%s/%s.key", hd, nd->name);
        snprintf(rpath[3], sizeof(rpath[3]), "%s/allowed_keys", hd);
        data = rpath[0];
        ckey = rpath[1];
        idkey = rpath[2];
        allow = rpath[3];
    }
    node_hostport(L, (int)(nd - L->nodes), nd->port, hp, sizeof(hp));
    snprintf(s_name, sizeof(s_name), "node.name=%s", nd->name);
    snprintf(s_listen, sizeof(s_listen), "node.listen=%s", hp);
    snprintf(s_data, sizeof(s_data), "node.data_dir=%s", data);
    snprintf(s_seeds, sizeof(s_seeds), "cluster.seeds=%s", seeds);
    snprintf(s_key, sizeof(s_key), "cluster.key_file=%s", ckey);
    snprintf(s_id, sizeof(s_id), "cluster.identity_file=%s", idkey);
    snprintf(s_allow, sizeof(s_allow), "cluster.allowed_keys=%s", allow);
    extra[ne++] = s_name;
    extra[ne++] = s_listen;
    extra[ne++] = s_data;
    extra[ne++] = s_seeds;
    extra[ne++] = s_key;
    extra[ne++] = s_id;
    extra[ne++] = s_allow;
    /* The nodes of a host share one inflated copy of the dataset (the run
     * directory's, or the host's), unless the config names a cache. */
    if (L->dataset_cache) {
        snprintf(s_cache, sizeof(s_cache), "train.dataset_cache=%s/dataset-cache", home);
        extra[ne++] = s_cache;
    }
    /* The initial nodes start training together, once all are members. */
    snprintf(s_min, sizeof(s_min), "cluster.min_members=%d", min_members);
    extra[ne++] = s_min;
    if (L->hosts_mode && L->groups_by_host) {
        group_of(L->hosts[nd->host], s_group + 11, sizeof(s_group) - 11);
        memcpy(s_group, "node.group=", 11);
        extra[ne++] = s_group;
    } else if (L->groups) {
        snprintf(s_group, sizeof(s_group), "node.group=%s", nd->group);
        extra[ne++] = s_group;
    }
    if (L->status_listen) {
        /* With --netns too: loopback inside the node's namespace; with
         * hosts, loopback on the node's host. */
        char shp[64];
        if (ds_hostport_format(L->netns || L->hosts_mode ? "127.0.0.1" : L->host,
                               (uint16_t)nd->status_port, shp,
                               sizeof(shp)) < 0)
            snprintf(shp, sizeof(shp), "?");
        snprintf(s_slisten, sizeof(s_slisten), "status.listen=%s", shp);
        extra[ne++] = s_slisten;
        if (!nd->status_url[0]) {
            snprintf(nd->status_url, sizeof(nd->status_url), "http://%s/", shp);
            say(L, "%s: status page %s%s%s", nd->name, nd->status_url,
                L->netns ? " (inside its network namespace)" : L->hosts_mode ? " (on " : "",
                L->netns ? "" : L->hosts_mode ? "its host)" : "");
        }
    }
    if (L->status_file) {
        snprintf(s_sfile, sizeof(s_sfile), "status.file=%s/status.json", data);
        extra[ne++] = s_sfile;
    }
    char **argv = check_config_argv(L, extra, ne);
    if (!argv)
        return -ENOMEM;
    char what[64], *dump = NULL;
    snprintf(what, sizeof(what), "config of %s: dsnode check-config", nd->name);
    int ret = run_dsnode(L, argv, what, &dump);
    free(argv);
    if (ret < 0)
        return -EINVAL;
    if (mkdir(nd->data, 0755) < 0 && errno != EEXIST) {
        fprintf(stderr, "dslaunch: cannot create %s: %s\n", nd->data, strerror(errno));
        free(dump);
        return -errno;
    }
    FILE *f = fopen(nd->conf, "w");
    int ok = f != NULL;
    if (ok) {
        fprintf(f, "; %s: written by dslaunch %s from %s", nd->name, L->cmd, L->config);
        for (int i = 0; i < L->nsets; i++)
            fprintf(f, " --set %s", L->sets[i]);
        fprintf(f, "\n; (dsnode check-config output with this node's keys)\n");
        fputs(dump, f);
        ok = !ferror(f);
        ok = fclose(f) == 0 && ok;
    }
    if (!ok)
        fprintf(stderr, "dslaunch: cannot write %s: %s\n", nd->conf, strerror(errno));
    free(dump);
    return ok ? 0 : -EIO;
}

/* ---- running nodes ------------------------------------------------------------------ */

static void node_init(struct launch *L, int i)
{
    struct node *nd = &L->nodes[i];
    snprintf(nd->name, sizeof(nd->name), "n%d", i);
    snprintf(nd->conf, sizeof(nd->conf), "%s/%s.ini", L->dir, nd->name);
    snprintf(nd->key, sizeof(nd->key), "%s/%s.key", L->dir, nd->name);
    snprintf(nd->data, sizeof(nd->data), "%s/%s", L->dir, nd->name);
    snprintf(nd->logp, sizeof(nd->logp), "%s/%s.log", L->dir, nd->name);
    snprintf(nd->model, sizeof(nd->model), "%s/%s/model.bin", L->dir, nd->name);
    nd->fd[0] = nd->fd[1] = -1;
    nd->in_w = -1;
    nd->host = L->hosts_mode ? i / L->per_host : 0;
    nd->added_at = -1;
    /* --groups: contiguous blocks of the initial nodes, then in turn. */
    if (L->groups) {
        nd->gidx = i < L->n ? (int)((int64_t)i * L->groups / L->n) : (i - L->n) % L->groups;
        snprintf(nd->group, sizeof(nd->group), "g%d", nd->gidx);
    }
    nd->state = NODE_PENDING;
}

/* -- CMD: the node runs the user's command (after the netns prefix in
 * argv[0..k)), told its config, name and rank through the environment,
 * which the child inherits (dslaunch is one thread). */
static pid_t spawn_user_cmd(struct launch *L, struct node *nd, char **prefix, int k, char *err,
                            size_t errlen)
{
    char **argv = calloc((size_t)(k + L->n_user_cmd + 1), sizeof(*argv));
    if (!argv) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    for (int i = 0; i < k; i++)
        argv[i] = prefix[i];
    argv[k] = L->user_prog;
    for (int i = 1; i < L->n_user_cmd; i++)
        argv[k + i] = L->user_cmd[i];
    char rank[16];
    snprintf(rank, sizeof(rank), "%d", (int)(nd - L->nodes));
    setenv("DSNODE_CONFIG", nd->conf, 1);
    setenv("DSNODE_NAME", nd->name, 1);
    setenv("DSNODE_RANK", rank, 1);
    const pid_t pid = ds_proc_spawn(argv, &nd->fd[0], &nd->fd[1], err, errlen);
    unsetenv("DSNODE_CONFIG");
    unsetenv("DSNODE_NAME");
    unsetenv("DSNODE_RANK");
    free(argv);
    return pid;
}

static int start_node(struct launch *L, struct node *nd)
{
    char err[512];
    nd->log = fopen(nd->logp, "w");
    if (!nd->log) {
        say(L, "cannot write %s: %s", nd->logp, strerror(errno));
        return -errno;
    }
    /* Line-buffered: `tail -f DIR/nI.log` follows the node live. */
    setvbuf(nd->log, NULL, _IOLBF, 0);
    /* With --netns: `ip netns exec NS dsnode ...`. ip enters the namespace
     * and execs dsnode in the same process (no fork), so the pid we get,
     * signal and reap is the node's, and PDEATHSIG survives the exec. */
    char nsname[64];
    char *argv[9];
    int k = 0;
    pid_t pid;
    if (L->hosts_mode) {
        /* ssh HOST 'the run script': the node on its host, tied to this
         * session's stdin (ssh.c); its stdout and stderr come back here. */
        char *sargv[16 + 2 * DS_SSH_OPTS_MAX], hd[PATH_MAX], rconf[PATH_MAX + 32];
        char cmd[3 * PATH_MAX + 512];
        host_dir(L, nd->host, hd, sizeof(hd));
        snprintf(rconf, sizeof(rconf), "%s/%s.ini", hd, nd->name);
        if (ds_ssh_run_cmd(L->remote_dsnode, rconf, cmd, sizeof(cmd)) < 0 ||
            ds_ssh_argv(&L->ssh, L->hosts[nd->host], cmd, sargv,
                        (int)(sizeof(sargv) / sizeof(sargv[0]))) < 0) {
            say(L, "%s: the ssh command line is too long", nd->name);
            fclose(nd->log);
            nd->log = NULL;
            return -E2BIG;
        }
        pid = ds_proc_spawn_io(sargv, -1, &nd->in_w, -1, &nd->fd[0], &nd->fd[1], err,
                               sizeof(err));
    } else {
        if (L->netns) {
            ds_netns_exec_prefix(&L->ns, node_ns(L, (int)(nd - L->nodes)), nsname,
                                 sizeof(nsname), argv);
            k = 4;
        }
        if (L->user_cmd) {
            pid = spawn_user_cmd(L, nd, argv, k, err, sizeof(err));
        } else {
            argv[k++] = L->dsnode;
            argv[k++] = "run";
            argv[k++] = "--config";
            argv[k++] = nd->conf;
            argv[k] = NULL;
            /* Its local rank, for train.device = auto (the nodes of this
             * host spread over its GPUs). */
            char rank[16];
            snprintf(rank, sizeof(rank), "%d", (int)(nd - L->nodes));
            setenv("DSNODE_RANK", rank, 1);
            pid = ds_proc_spawn(argv, &nd->fd[0], &nd->fd[1], err, sizeof(err));
            unsetenv("DSNODE_RANK");
        }
    }
    if (pid < 0) {
        say(L, "%s: %s", nd->name, err);
        fclose(nd->log);
        nd->log = NULL;
        return (int)pid;
    }
    nd->pid = pid;
    nd->state = NODE_RUNNING;
    nd->t_start = now_ms();
    L->dirty = 1;
    return 0;
}

static void begin_stop(struct launch *L, const char *why)
{
    if (L->stopping)
        return;
    L->stopping = 1;
    L->stop_reason = why;
    L->kill_at = now_ms() + L->grace_ms;
    int sent = 0;
    for (int i = 0; i < L->started; i++) {
        struct node *nd = &L->nodes[i];
        if (nd->state == NODE_RUNNING && !nd->reaped) {
            if (L->hosts_mode) {
                /* EOF on the session's stdin: the remote watcher sends the
                 * node SIGTERM, and its summary still comes back. */
                if (nd->in_w >= 0) {
                    close(nd->in_w);
                    nd->in_w = -1;
                }
            } else {
                kill(nd->pid, SIGTERM);
            }
            sent++;
        }
    }
    for (int k = 0; k < L->nadd; k++)
        if (!L->add[k].fired)
            L->add[k].abandoned = 1;
    if (sent && L->hosts_mode)
        say(L, "stopping (%s): closing %d ssh session%s' input (the nodes get SIGTERM), "
            "killing ssh after %d s", why, sent, sent == 1 ? "" : "s", L->grace_ms / 1000);
    else if (sent)
        say(L, "stopping (%s): SIGTERM to %d node%s, SIGKILL after %d s", why, sent,
            sent == 1 ? "" : "s", L->grace_ms / 1000);
}

static void kill_hard(struct launch *L)
{
    int sent = 0;
    for (int i = 0; i < L->started; i++) {
        struct node *nd = &L->nodes[i];
        if (nd->state == NODE_RUNNING && !nd->reaped) {
            kill(nd->pid, SIGKILL);
            sent++;
        }
    }
    L->killed_hard = 1;
    if (sent)
        say(L, "SIGKILL to %d %s still running", sent,
            L->hosts_mode ? (sent == 1 ? "ssh session" : "ssh sessions")
                          : (sent == 1 ? "node" : "nodes"));
}

static void handle_line(struct launch *L, struct node *nd, int is_err, char *line)
{
    if (nd->log && !nd->log_failed) {
        if (fprintf(nd->log, "%s\n", line) < 0) {
            nd->log_failed = 1;
            say(L, "%s: cannot write %s: %s; its log is incomplete", nd->name, nd->logp,
                strerror(errno));
        }
    }
    if (!is_err) {
        if (!strncmp(line, "summary ", 8) && !nd->have_summary) {
            ds_kv_parse(line + 8, &nd->summary);
            nd->have_summary = 1;
        }
        return;
    }
    char copy[LINE_MAX_];
    snprintf(copy, sizeof(copy), "%s", line);
    ds_logline ll;
    if (ds_logline_split(copy, &ll) < 0) {
        /* dslaunch hosts: what ssh itself says ("Connection refused",
         * "Permission denied", "Timeout, server not responding") is the
         * only word on a lost session; show it. */
        if (L->hosts_mode && nd->forwarded < FORWARD_MAX && line[0]) {
            say(L, "%s: %s", nd->name, line);
            if (++nd->forwarded == FORWARD_MAX)
                say(L, "%s: further warnings only in %s", nd->name, nd->logp);
        }
        return;
    }
    ds_kvline kv;
    double v;
    if (!strcmp(ll.component, "train") && ds_kv_parse(ll.msg, &kv) > 0 &&
        ds_kv_get_double(&kv, "step", &v) == 0 && ds_kv_get(&kv, "loss")) {
        nd->step = (int64_t)v;
        ds_kv_get_double(&kv, "loss", &nd->loss);
        ds_kv_get_double(&kv, "samples_per_s", &nd->sps);
        nd->have_train = 1;
        L->dirty = 1;
    } else if (!strcmp(ll.component, "eval") && ds_kv_parse(ll.msg, &kv) > 0 &&
               ds_kv_get_double(&kv, "test_acc", &v) == 0) {
        nd->test_acc = v;
        nd->have_eval = 1;
        if (ds_kv_get_double(&kv, "step", &v) == 0 && (int64_t)v > nd->step)
            nd->step = (int64_t)v;
        L->dirty = 1;
    }
    /* Errors always reach the user; warnings unless we are stopping (then
     * every node says it is stopping, which the user knows). */
    int fwd = !strcmp(ll.level, "error") || (!strcmp(ll.level, "warn") && !L->stopping);
    if (fwd && nd->forwarded < FORWARD_MAX) {
        say(L, "%s %s %s: %s", nd->name, ll.level, ll.component, ll.msg);
        if (++nd->forwarded == FORWARD_MAX)
            say(L, "%s: further warnings only in %s", nd->name, nd->logp);
    }
}

/* Read what a pipe has; split lines. Returns 0 at EOF (fd closed), 1 open. */
static int read_pipe(struct launch *L, struct node *nd, int which)
{
    struct linebuf *b = &nd->lb[which];
    for (;;) {
        ssize_t r = read(nd->fd[which], b->buf + b->len, sizeof(b->buf) - 1 - b->len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 1;
        if (r <= 0) {
            if (b->len) { /* a last line without newline */
                b->buf[b->len] = '\0';
                handle_line(L, nd, which == 1, b->buf);
                b->len = 0;
            }
            close(nd->fd[which]);
            nd->fd[which] = -1;
            return 0;
        }
        b->len += (size_t)r;
        size_t start = 0;
        for (size_t i = 0; i < b->len; i++)
            if (b->buf[i] == '\n') {
                b->buf[i] = '\0';
                handle_line(L, nd, which == 1, b->buf + start);
                start = i + 1;
            }
        memmove(b->buf, b->buf + start, b->len - start);
        b->len -= start;
        if (b->len == sizeof(b->buf) - 1) { /* a line longer than the buffer: cut */
            b->buf[b->len] = '\0';
            handle_line(L, nd, which == 1, b->buf);
            b->len = 0;
        }
    }
}

static void node_finish(struct launch *L, struct node *nd)
{
    if (nd->in_w >= 0) {
        close(nd->in_w);
        nd->in_w = -1;
    }
    for (int w = 0; w < 2; w++)
        if (nd->fd[w] >= 0) {
            close(nd->fd[w]);
            nd->fd[w] = -1;
        }
    if (nd->log) {
        if (fclose(nd->log) != 0 && !nd->log_failed)
            say(L, "%s: cannot write %s: %s", nd->name, nd->logp, strerror(errno));
        nd->log = NULL;
    }
    nd->state = NODE_DONE;
    nd->t_end = now_ms();
    char st[48];
    const char *acc = nd->have_summary ? ds_kv_get(&nd->summary, "test_acc") : NULL;
    const char *steps = nd->have_summary ? ds_kv_get(&nd->summary, "steps") : NULL;
    if (nd->exit_code != 0 || !L->tty)
        say(L, "%s exited: %s, steps %s, test_acc %s%s%s", nd->name,
            node_state_text(nd, st, sizeof(st)), steps ? steps : "?", acc ? acc : "?",
            nd->exit_code && !L->stopping ? "; log: " : "",
            nd->exit_code && !L->stopping ? nd->logp : "");
    L->dirty = 1;
}

static void reap(struct launch *L)
{
    const int64_t t = now_ms();
    for (int i = 0; i < L->started; i++) {
        struct node *nd = &L->nodes[i];
        if (nd->state != NODE_RUNNING)
            continue;
        if (!nd->reaped) {
            int ws;
            pid_t r = waitpid(nd->pid, &ws, WNOHANG);
            if (r == nd->pid) {
                nd->reaped = 1;
                nd->exit_code = ds_proc_exit_code(ws);
                nd->t_reaped = t;
                /* ssh's own failures exit 255: connection refused or lost,
                 * authentication; dsnode exits 0, 1, 2 or 128 + signal. */
                nd->host_lost = L->hosts_mode && nd->exit_code == 255;
            } else if (r < 0 && errno == ECHILD) { /* cannot happen; do not spin */
                nd->reaped = 1;
                nd->exit_code = 255;
                nd->t_reaped = t;
            }
        }
        /* Done once reaped and its pipes are drained; a pipe someone else
         * still holds open is given up after DRAIN_MS. */
        if (nd->reaped && ((nd->fd[0] < 0 && nd->fd[1] < 0) || t - nd->t_reaped > DRAIN_MS))
            node_finish(L, nd);
    }
}

/* Start the nodes of add-at trigger k, seeded with the running nodes. */
static int fire_add(struct launch *L, int k)
{
    int cand[MAX_NODES], nc = 0;
    for (int i = 0; i < L->started; i++)
        if (L->nodes[i].state == NODE_RUNNING && !L->nodes[i].reaped)
            cand[nc++] = i;
    L->add[k].fired = 1;
    say(L, "--add-at %lld:%d: slowest running node at step %lld; starting %d node%s",
        (long long)L->add[k].step, L->add[k].count, (long long)L->add[k].step, L->add[k].count,
        L->add[k].count == 1 ? "" : "s");
    for (int c = 0; c < L->add[k].count; c++) {
        struct node *nd = &L->nodes[L->started];
        char seeds[SEEDS_TEXT];
        seeds_text(L, L->started, -1, cand, nc, seeds, sizeof(seeds));
        erase_block(L);
        if (write_node_config(L, nd, seeds, 1) < 0)
            return -EINVAL;
        nd->added_at = L->add[k].step;
        if (start_node(L, nd) < 0)
            return -EIO;
        L->started++;
    }
    return 0;
}

static void check_add(struct launch *L)
{
    if (L->stopping)
        return;
    for (int k = 0; k < L->nadd; k++) {
        if (L->add[k].fired || L->add[k].abandoned)
            continue;
        int64_t slowest = INT64_MAX;
        for (int i = 0; i < L->started; i++) {
            const struct node *nd = &L->nodes[i];
            if (nd->state == NODE_RUNNING && !nd->reaped && nd->step < slowest)
                slowest = nd->step;
        }
        if (slowest == INT64_MAX) { /* nobody left running: it can never fire */
            L->add[k].abandoned = 1;
            say(L, "--add-at %lld:%d not done: no node is running any more",
                (long long)L->add[k].step, L->add[k].count);
            continue;
        }
        if (slowest < L->add[k].step)
            break; /* sorted by step: later ones wait too */
        if (fire_add(L, k) < 0) {
            L->failed_self = 1;
            begin_stop(L, "cannot start the added nodes");
            return;
        }
    }
}

/* The signals dslaunch stops on, by name. */
static const char *sig_name(int sig)
{
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "signal";
}

static int any_running(const struct launch *L)
{
    for (int i = 0; i < L->started; i++)
        if (L->nodes[i].state == NODE_RUNNING)
            return 1;
    return 0;
}

static void loop(struct launch *L)
{
    struct pollfd *p = calloc((size_t)(1 + 2 * L->total), sizeof(*p));
    int *who = calloc((size_t)(1 + 2 * L->total), sizeof(int));
    if (!p || !who) {
        free(p);
        free(who);
        L->failed_self = 1;
        begin_stop(L, "out of memory");
        /* Without the arrays we cannot read the pipes: kill, then reap. */
        kill_hard(L);
        for (int i = 0; i < L->started; i++)
            if (L->nodes[i].state == NODE_RUNNING) {
                int ws;
                if (!L->nodes[i].reaped) {
                    while (waitpid(L->nodes[i].pid, &ws, 0) < 0 && errno == EINTR)
                        ;
                    L->nodes[i].exit_code = ds_proc_exit_code(ws);
                    L->nodes[i].reaped = 1;
                }
                node_finish(L, &L->nodes[i]);
            }
        return;
    }
    const int64_t deadline = L->timeout_s > 0 ? L->t0 + (int64_t)(L->timeout_s * 1000) : 0;
    while (any_running(L)) {
        int np = 0;
        p[np].fd = L->sigfd;
        p[np].events = POLLIN;
        who[np++] = -1;
        for (int i = 0; i < L->started; i++)
            for (int w = 0; w < 2; w++)
                if (L->nodes[i].fd[w] >= 0) {
                    p[np].fd = L->nodes[i].fd[w];
                    p[np].events = POLLIN;
                    who[np++] = 2 * i + w;
                }
        const int64_t t = now_ms();
        int64_t wait = L->tty ? 250 : 1000;
        if (deadline && !L->stopping && deadline - t < wait)
            wait = deadline - t;
        if (L->kill_at && !L->killed_hard && L->kill_at - t < wait)
            wait = L->kill_at - t;
        if (wait < 0)
            wait = 0;
        int r = poll(p, (nfds_t)np, (int)wait);
        if (r < 0 && errno != EINTR) {
            L->failed_self = 1;
            say(L, "poll: %s", strerror(errno));
            begin_stop(L, "internal error");
            kill_hard(L);
        }
        for (int k = 0; r > 0 && k < np; k++) {
            if (!p[k].revents)
                continue;
            if (who[k] < 0) {
                int sig = take_signals(L);
                if (sig && L->stopping) {
                    /* A signal while already stopping: the user does not
                     * want to wait for the grace period. */
                    if (!L->stop_signal)
                        L->stop_signal = sig;
                    say(L, "%s while stopping: killing every node now", sig_name(sig));
                    kill_hard(L);
                } else if (sig) {
                    L->stop_signal = sig;
                    begin_stop(L, sig_name(sig));
                }
                continue;
            }
            read_pipe(L, &L->nodes[who[k] / 2], who[k] % 2);
        }
        reap(L);
        check_add(L);
        const int64_t t2 = now_ms();
        if (deadline && !L->stopping && t2 >= deadline) {
            say(L, "--timeout %g s reached", L->timeout_s);
            begin_stop(L, "timeout");
        }
        if (L->kill_at && !L->killed_hard && t2 >= L->kill_at)
            kill_hard(L);
        if (L->status_file && !L->hosts_mode && t2 - L->last_waits >= WAITS_EVERY_MS)
            read_waits(L);
        if (L->tty) {
            if (L->dirty && t2 - L->last_draw >= 200)
                draw_block(L);
            else if (t2 - L->last_draw >= 1000)
                draw_block(L);
        } else if (t2 - L->last_status >= STATUS_EVERY_MS && any_running(L)) {
            status_line(L);
        }
    }
    for (int k = 0; k < L->nadd; k++)
        if (!L->add[k].fired && !L->add[k].abandoned)
            L->add[k].abandoned = 1;
    erase_block(L);
    free(p);
    free(who);
}

/* ---- report ---------------------------------------------------------------------------- */

static const char *node_status(const struct node *nd)
{
    const char *st = nd->have_summary ? ds_kv_get(&nd->summary, "status") : NULL;
    return st ? st : nd->host_lost ? "lost" : nd->exit_code > 128 ? "killed" : "failed";
}

static const char *summary_or_dash(const struct node *nd, const char *key)
{
    const char *v = nd->have_summary ? ds_kv_get(&nd->summary, key) : NULL;
    return v ? v : "-";
}

/* The summary value of key as JSON (null when absent); see docs/dslaunch.md. */
static json_t *summary_json(const struct node *nd, const char *key)
{
    const char *v = nd->have_summary ? ds_kv_get(&nd->summary, key) : NULL;
    return v ? ds_json_text_or_number(v) : json_null();
}

/* Node i's group: --groups' name, else the one its summary line names
 * (node.group from its config, "auto" resolved), else NULL. */
static const char *group_of_node(const struct node *nd)
{
    if (nd->group[0])
        return nd->group;
    const char *g = nd->have_summary ? ds_kv_get(&nd->summary, "group") : NULL;
    return g && g[0] && strcmp(g, "-") ? g : NULL;
}

/* One node's entry of the --json report: exit status, status, the four
 * fixed summary fields, every other summary key as dsnode wrote it, then
 * what dslaunch knows (pid, --add-at step, model, listen address, log).
 * model_ok: the model entered the consensus distance. NULL when out of
 * memory. */
static json_t *node_json(const struct launch *L, int i, int model_ok)
{
    static const char *const fixed[] = {"steps", "test_acc", "bytes_sent", "bytes_received"};
    const struct node *nd = &L->nodes[i];
    json_t *o = json_object();
    int bad = !o;
    bad = bad || ds_json_set(o, "exit_status", json_integer(nd->exit_code)) < 0;
    bad = bad || ds_json_set(o, "status", ds_json_text(node_status(nd))) < 0;
    for (size_t k = 0; !bad && k < sizeof(fixed) / sizeof(fixed[0]); k++)
        bad = ds_json_set(o, fixed[k], summary_json(nd, fixed[k])) < 0;
    for (int k = 0; !bad && nd->have_summary && k < nd->summary.n; k++) {
        const char *key = nd->summary.key[k];
        int skip = !strcmp(key, "node") || !strcmp(key, "status");
        for (size_t j = 0; j < sizeof(fixed) / sizeof(fixed[0]); j++)
            skip |= !strcmp(key, fixed[j]);
        if (!skip)
            bad = ds_json_set(o, key, ds_json_text_or_number(nd->summary.val[k])) < 0;
    }
    char listen[DS_HOSTPORT_MAX + 1];
    node_hostport(L, i, nd->port, listen, sizeof(listen));
    bad = bad || ds_json_set(o, "pid", json_integer(nd->pid)) < 0;
    bad = bad || ds_json_set(o, "added_at_step", nd->added_at >= 0 ? json_integer(nd->added_at)
                                                                  : json_null()) < 0;
    bad = bad || ds_json_set(o, "model", model_ok ? ds_json_text(nd->model) : json_null()) < 0;
    bad = bad || ds_json_set(o, "listen", ds_json_text(listen)) < 0;
    if (L->hosts_mode)
        bad = bad || ds_json_set(o, "host", ds_json_text(L->hosts[nd->host])) < 0;
    const char *grp = group_of_node(nd);
    bad = bad || ds_json_set(o, "group", grp ? ds_json_text(grp) : json_null()) < 0;
    bad = bad || ds_json_set(o, "log", ds_json_text(nd->logp)) < 0;
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* The largest relative consensus distance among the members of one group
 * (0 when members hold the same model), over the groups of two models or
 * more, their count in *n_groups; NAN without such a group. */
static double intra_group_consensus(const struct launch *L, const char **paths, int *n_groups)
{
    double worst = NAN;
    *n_groups = 0;
    const char **gp = calloc((size_t)L->started + 1, sizeof(char *));
    int *gst = calloc((size_t)L->started + 1, sizeof(int));
    for (int i = 0; gp && gst && i < L->started; i++) {
        const char *name = group_of_node(&L->nodes[i]);
        int first = name != NULL;
        for (int j = 0; first && j < i; j++) {
            const char *o = group_of_node(&L->nodes[j]);
            first = !o || strcmp(o, name);
        }
        if (!first)
            continue; /* no group, or one counted at its first member */
        int k = 0;
        for (int j = i; j < L->started; j++) {
            const char *o = group_of_node(&L->nodes[j]);
            if (o && !strcmp(o, name))
                gp[k++] = paths[j];
        }
        ds_consensus c = {0, 0, NAN, NAN, NAN};
        if (k >= 2 && ds_consensus_compute(gp, k, gst, &c, NULL) == 0 && c.n_models >= 2) {
            (*n_groups)++;
            if (isnan(worst) || c.rel > worst)
                worst = c.rel;
        }
    }
    free(gp);
    free(gst);
    return worst;
}

/* The --json report object (docs/dslaunch.md); NULL when out of memory. */
static json_t *report_json(const struct launch *L, const ds_consensus *cons, const int *mst,
                           double mean_acc, double wall, int exit_status, double intra)
{
    json_t *nodes = json_object(), *o = json_object();
    int bad = !nodes || !o;
    for (int i = 0; !bad && i < L->started; i++)
        bad = ds_json_set(nodes, L->nodes[i].name, node_json(L, i, mst && mst[i] == 0)) < 0;
    char net[64];
    if (L->hosts_mode)
        snprintf(net, sizeof(net), "ssh");
    else if (!L->netns)
        snprintf(net, sizeof(net), "loopback");
    else if (!L->netns_rate)
        snprintf(net, sizeof(net), "netns");
    else
        snprintf(net, sizeof(net), "netns %s", L->netns_rate_text);
    if (!bad) {
        bad = ds_json_set(o, "nodes", nodes) < 0; /* o owns nodes from here */
        nodes = NULL;
    }
    bad = bad || ds_json_set(o, "net", ds_json_text(net)) < 0;
    bad = bad || ds_json_set(o, "consensus_distance",
                             ds_json_number(cons->n_models >= 2 ? cons->rel : NAN)) < 0;
    bad = bad || ds_json_set(o, "consensus_distance_abs",
                             ds_json_number(cons->n_models >= 2 ? cons->abs : NAN)) < 0;
    bad = bad || ds_json_set(o, "consensus_models", json_integer(cons->n_models)) < 0;
    bad = bad || ds_json_set(o, "intra_group_consensus", ds_json_number(intra)) < 0;
    json_t *nsb = L->ns_out ? json_array() : json_null();
    for (int i = 0; L->ns_out && nsb && i < ns_count(L); i++)
        json_array_append_new(nsb, L->ns_out[i] == UINT64_MAX ? json_null()
                                                              : json_integer((json_int_t)L->ns_out[i]));
    bad = bad || !nsb || ds_json_set(o, "netns_out_bytes", nsb) < 0;
    bad = bad || ds_json_set(o, "mean_test_acc", ds_json_number(mean_acc)) < 0;
    bad = bad || ds_json_set(o, "wall_s", ds_json_number(wall)) < 0;
    bad = bad || ds_json_set(o, "out_dir", ds_json_text(L->dir)) < 0;
    bad = bad ||
          ds_json_set(o, "stopped_by", ds_json_text(L->stopping ? L->stop_reason : NULL)) < 0;
    bad = bad || ds_json_set(o, "exit_status", json_integer(exit_status)) < 0;
    if (bad) {
        json_decref(nodes);
        json_decref(o);
        return NULL;
    }
    return o;
}

static int report(struct launch *L, int exit_status)
{
    /* consensus distance */
    const char **paths = calloc((size_t)(L->started + 1), sizeof(char *));
    int *mst = calloc((size_t)(L->started + 1), sizeof(int));
    ds_consensus cons = {0, 0, NAN, NAN, NAN};
    if (!paths || !mst) {
        fprintf(stderr, "dslaunch: out of memory\n");
        exit_status = exit_status ? exit_status : 1;
    } else {
        for (int i = 0; i < L->started; i++)
            paths[i] = access(L->nodes[i].model, F_OK) == 0 ? L->nodes[i].model : NULL;
        if (ds_consensus_compute(paths, L->started, mst, &cons, stderr) < 0)
            fprintf(stderr, "dslaunch: could not compute the consensus distance\n");
    }
    const double wall = (now_ms() - L->t0) / 1e3;

    printf("%-6s %4s  %-8s %8s %8s %10s %12s %14s\n", "node", "exit", "status", "steps",
           "test_acc", "samples/s", "bytes_sent", "bytes_received");
    double acc_sum = 0;
    int acc_n = 0;
    for (int i = 0; i < L->started; i++) {
        const struct node *nd = &L->nodes[i];
        printf("%-6s %4d  %-8s %8s %8s %10s %12s %14s%s\n", nd->name, nd->exit_code,
               node_status(nd), summary_or_dash(nd, "steps"), summary_or_dash(nd, "test_acc"),
               summary_or_dash(nd, "samples_per_s"), summary_or_dash(nd, "bytes_sent"),
               summary_or_dash(nd, "bytes_received"), nd->added_at >= 0 ? "  (added)" : "");
        double a;
        if (nd->have_summary && ds_kv_get_double(&nd->summary, "test_acc", &a) == 0 && a >= 0) {
            acc_sum += a;
            acc_n++;
        }
    }
    if (cons.n_models >= 2 && isfinite(cons.rel))
        printf("consensus distance (relative: mean over nodes of ||theta_i - mean||_2 / "
               "||mean||_2; %d models of %llu parameters): %.6g\n",
               cons.n_models, (unsigned long long)cons.n_params, cons.rel);
    else if (cons.n_models >= 2)
        printf("consensus distance: the mean model is zero; absolute distance %.6g\n", cons.abs);
    else
        printf("consensus distance: not defined (%d final model%s readable)\n", cons.n_models,
               cons.n_models == 1 ? "" : "s");
    int n_groups = 0;
    const double intra = paths && mst ? intra_group_consensus(L, paths, &n_groups) : NAN;
    if (!isnan(intra))
        printf("intra-group consensus distance (the largest over %d group%s; 0: members hold "
               "the same model): %.6g\n", n_groups, n_groups == 1 ? "" : "s", intra);
    if (acc_n)
        printf("mean test accuracy: %.4f over %d node%s\n", acc_sum / acc_n, acc_n,
               acc_n == 1 ? "" : "s");
    for (int k = 0; k < L->nadd; k++)
        if (L->add[k].abandoned)
            printf("--add-at %lld:%d: not done (the run ended before every running node reached "
                   "step %lld)\n", (long long)L->add[k].step, L->add[k].count,
                   (long long)L->add[k].step);
    printf("wall %.1f s; configs, keys, logs and models in %s\n", wall, L->dir);

    if (L->json) {
        json_t *j = report_json(L, &cons, mst, acc_n ? acc_sum / acc_n : NAN, wall,
                                exit_status, intra);
        const int e = j ? ds_json_write_line(stdout, j, 0) : -ENOMEM;
        if (e < 0)
            fprintf(stderr, "dslaunch: cannot write the JSON report: %s\n", strerror(-e));
        json_decref(j);
    }
    fflush(stdout);
    free(paths);
    free(mst);
    return exit_status;
}

/* ---- the command ------------------------------------------------------------------------ */

static int final_status(const struct launch *L)
{
    if (L->stop_signal)
        return 128 + L->stop_signal;
    int bad = L->failed_self || (L->stopping && L->stop_reason);
    for (int i = 0; i < L->started; i++)
        bad |= L->nodes[i].exit_code != 0;
    for (int k = 0; k < L->nadd; k++)
        bad |= L->add[k].abandoned;
    bad |= L->started < L->total && !L->stopping; /* cannot happen; be safe */
    return bad ? 1 : 0;
}

static void raise_fd_limit(int nodes)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)(3 * nodes + 64)) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* From here on signals are read through a signalfd (returned, or -1 with
 * errno). SIGPIPE is ignored so that a closed stdout is a write error, not
 * our death (the nodes get it back at SIG_DFL in proc.c). */
static int signals_to_fd(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGWINCH);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    return signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
}

/* --netns: stale leftovers removed, then every namespace made (recorded in
 * L->ns for the teardown). 0; -1 when it failed (said); 128 + signal when
 * a signal came meanwhile. */
static int netns_up(struct launch *L)
{
    char why[700];
    ds_netns_reap_stale(stderr);
    if (ds_netns_init(&L->ns, getpid(), ns_count(L), L->netns_rate, why, sizeof(why)) < 0 ||
        ds_netns_setup(&L->ns, why, sizeof(why)) < 0) {
        fprintf(stderr, "dslaunch: cannot set up the network namespaces: %s\n", why);
        return -1;
    }
    const int sig = take_signals(L);
    if (sig) {
        fprintf(stderr, "dslaunch: interrupted before the nodes started\n");
        return 128 + sig;
    }
    char first[48];
    ds_netns_addr(0, first, sizeof(first));
    fprintf(stderr, "dslaunch: %d network namespace%s (dsl-%d-nI, nI at %s + I%s) on bridge "
            "%s, %s%s\n", ns_count(L), ns_count(L) == 1 ? "" : "s", (int)getpid(), first,
            L->groups ? "; one per group, its members on one address" : "",
            L->ns.bridge, L->netns_rate ? "each link limited to " : "no rate limit",
            L->netns_rate ? L->netns_rate_text : "");
    return 0;
}

/* ---- dslaunch hosts: shipping and collecting over ssh ------------------------------------ */

/* name's path in PATH into buf; 0 or -ENOENT. */
static int find_prog(const char *name, char *buf, size_t len)
{
    const char *path = getenv("PATH");
    char *copy = strdup(path && *path ? path : "/usr/bin:/bin"), *save = NULL;
    for (char *d = copy ? strtok_r(copy, ":", &save) : NULL; d; d = strtok_r(NULL, ":", &save)) {
        snprintf(buf, len, "%s/%s", *d ? d : ".", name);
        if (access(buf, X_OK) == 0) {
            free(copy);
            return 0;
        }
    }
    free(copy);
    return -ENOENT;
}

/* Runs argv (stdin in_fd, stdout out_file when >= 0) to completion within
 * SSH_CMD_MS; 0, or -1 with what it said on stderr under `what`. */
static int run_io(struct launch *L, char **argv, int in_fd, int out_file, const char *what)
{
    char *o = NULL, *e = NULL, err[512];
    int code = 0;
    int ret = ds_proc_capture_io(argv, in_fd, out_file, SSH_CMD_MS, &o, &e, &code, err,
                                 sizeof(err));
    int bad = ret < 0 || code != 0;
    if (bad) {
        erase_block(L);
        if (ret < 0 && ret != -ETIMEDOUT)
            fprintf(stderr, "dslaunch: %s: %s\n", what, err);
        else if (ret == -ETIMEDOUT)
            fprintf(stderr, "dslaunch: %s failed (%s):\n%s%s", what, err,
                    e && *e ? e : "(no message)\n",
                    e && *e && e[strlen(e) - 1] != '\n' ? "\n" : "");
        else
            fprintf(stderr, "dslaunch: %s failed (exit status %d):\n%s%s", what, code,
                    e && *e ? e : "(no message)\n",
                    e && *e && e[strlen(e) - 1] != '\n' ? "\n" : "");
    }
    free(o);
    free(e);
    return bad ? -1 : 0;
}

/* Host h's files (the cluster key, the allow-list, and for each of its
 * nodes the ini, the identity and the empty data directory) as a tar
 * archive into a new directory on the host. 0 or -1 (said). */
static int ship_host(struct launch *L, int h)
{
    char tarp[PATH_MAX], hd[256], cmd[PATH_MAX * 3 + 256], what[DS_SSH_HOST_MAX + 320];
    char names[MAX_NODES][3][24];
    char *targv[16 + 3 * MAX_NODES];
    int k = 0;
    snprintf(tarp, sizeof(tarp), "%s/h%d.tar", L->dir, h);
    targv[k++] = L->tar_prog;
    targv[k++] = "-c";
    targv[k++] = "-f";
    targv[k++] = tarp;
    targv[k++] = "-C";
    targv[k++] = L->dir;
    targv[k++] = "cluster.key";
    targv[k++] = "allowed_keys";
    int nn = 0;
    for (int i = 0; i < L->total; i++)
        if (L->nodes[i].host == h) {
            snprintf(names[nn][0], sizeof(names[nn][0]), "%s.ini", L->nodes[i].name);
            snprintf(names[nn][1], sizeof(names[nn][1]), "%s.key", L->nodes[i].name);
            snprintf(names[nn][2], sizeof(names[nn][2]), "%s", L->nodes[i].name);
            for (int j = 0; j < 3; j++)
                targv[k++] = names[nn][j];
            nn++;
        }
    targv[k] = NULL;
    if (run_io(L, targv, -1, -1, "tar (the files for the hosts)") < 0)
        return -1;
    int fd = open(tarp, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "dslaunch: %s: %s\n", tarp, strerror(errno));
        return -1;
    }
    char *sargv[16 + 2 * DS_SSH_OPTS_MAX];
    host_dir(L, h, hd, sizeof(hd));
    int ret = -1;
    if (ds_ssh_ship_cmd(hd, cmd, sizeof(cmd)) >= 0 &&
        ds_ssh_argv(&L->ssh, L->hosts[h], cmd, sargv, (int)(sizeof(sargv) / sizeof(sargv[0]))) >= 0) {
        snprintf(what, sizeof(what), "ssh %s (making %s there)", L->hosts[h], hd);
        ret = run_io(L, sargv, fd, -1, what);
    }
    close(fd);
    unlink(tarp);
    return ret;
}

/* Host h's node directories (model.bin, status.json) back into the run
 * directory, then the host's directory removed. 0 or -1 (said). */
static int collect_host(struct launch *L, int h)
{
    char tarp[PATH_MAX], hd[256], cmd[PATH_MAX * 3 + 64 * MAX_NODES];
    char what[DS_SSH_HOST_MAX + 320];
    const char *names[MAX_NODES];
    char *sargv[16 + 2 * DS_SSH_OPTS_MAX];
    int nn = 0;
    for (int i = 0; i < L->started; i++)
        if (L->nodes[i].host == h)
            names[nn++] = L->nodes[i].name;
    host_dir(L, h, hd, sizeof(hd));
    snprintf(tarp, sizeof(tarp), "%s/h%d-back.tar", L->dir, h);
    int ret = -1;
    int fd = open(tarp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "dslaunch: %s: %s\n", tarp, strerror(errno));
        return -1;
    }
    if (nn && ds_ssh_collect_cmd(hd, names, nn, cmd, sizeof(cmd)) >= 0 &&
        ds_ssh_argv(&L->ssh, L->hosts[h], cmd, sargv, (int)(sizeof(sargv) / sizeof(sargv[0]))) >= 0) {
        snprintf(what, sizeof(what), "ssh %s (collecting the node directories)", L->hosts[h]);
        ret = run_io(L, sargv, -1, fd, what);
    }
    close(fd);
    if (ret == 0) {
        char *xargv[] = {L->tar_prog, "-x", "-f", tarp, "-C", L->dir, NULL};
        ret = run_io(L, xargv, -1, -1, "tar (unpacking the node directories)");
    }
    unlink(tarp);
    if (ret < 0) {
        fprintf(stderr, "dslaunch: %s's node directories did not come back; %s stays there "
                        "(keys in it: remove it by hand)\n", L->hosts[h], hd);
        return ret;
    }
    if (ds_ssh_remove_cmd(hd, cmd, sizeof(cmd)) >= 0 &&
        ds_ssh_argv(&L->ssh, L->hosts[h], cmd, sargv, (int)(sizeof(sargv) / sizeof(sargv[0]))) >= 0) {
        snprintf(what, sizeof(what), "ssh %s (removing %s)", L->hosts[h], hd);
        ret = run_io(L, sargv, -1, -1, what);
    }
    return ret;
}

/* The programs dslaunch hosts runs here (ssh, tar) and the dsnode path on
 * the hosts. 0, or -ENOENT (said). */
static int hosts_setup(struct launch *L)
{
    if (find_prog("ssh", L->ssh_prog, sizeof(L->ssh_prog)) < 0) {
        fprintf(stderr, "dslaunch hosts: the OpenSSH client (ssh) is not in PATH (Debian: "
                        "apt-get install openssh-client)\n");
        return -ENOENT;
    }
    if (find_prog("tar", L->tar_prog, sizeof(L->tar_prog)) < 0) {
        fprintf(stderr, "dslaunch hosts: tar is not in PATH\n");
        return -ENOENT;
    }
    L->ssh.program = L->ssh_prog;
    if (L->remote_dsnode_opt) {
        snprintf(L->remote_dsnode, sizeof(L->remote_dsnode), "%s", L->remote_dsnode_opt);
    } else if (!realpath(L->dsnode, L->remote_dsnode)) {
        fprintf(stderr, "dslaunch hosts: %s: %s\n", L->dsnode, strerror(errno));
        return -ENOENT;
    }
    return 0;
}

static int launch_main(int argc, char **argv, const char *self_exe_dir, int hosts_mode)
{
    struct launch *L = calloc(1, sizeof(*L));
    int ret, status = 2;
    int shipped[MAX_HOSTS] = {0};
    if (!L) {
        fprintf(stderr, "dslaunch: out of memory\n");
        return 1;
    }
    L->sigfd = -1;
    L->t0 = now_ms();
    L->hosts_mode = hosts_mode;
    L->cmd = hosts_mode ? "hosts" : "local";
    L->groups_by_host = 1;
    L->grace_ms = hosts_mode ? GRACE_SSH_MS : GRACE_MS;
    ret = parse_args(L, argc, argv);
    if (ret != 0) {
        status = ret > 0 ? 0 : 2;
        goto free_launch;
    }

    if ((L->sigfd = signals_to_fd()) < 0) {
        fprintf(stderr, "dslaunch: signalfd: %s\n", strerror(errno));
        status = 1;
        goto free_launch;
    }
    const char *term = getenv("TERM");
    L->tty = isatty(2) && term && strcmp(term, "dumb") != 0;
    term_size(L);
    raise_fd_limit(L->total);

    if (L->netns) {
        char why[512];
        if (ds_netns_check(why, sizeof(why)) < 0) {
            fprintf(stderr, "dslaunch: %s\n", why);
            goto close_sigfd;
        }
    }
    if (find_dsnode(L, self_exe_dir) < 0 || (L->hosts_mode && hosts_setup(L) < 0) ||
        check_base(L) < 0)
        goto close_sigfd;
    L->nodes = calloc((size_t)L->total, sizeof(struct node));
    if (!L->nodes) {
        fprintf(stderr, "dslaunch: out of memory\n");
        status = 1;
        goto close_sigfd;
    }
    if (make_run_dir(L) < 0)
        goto free_nodes;
    for (int i = 0; i < L->total; i++)
        node_init(L, i);
    if (choose_ports(L) < 0)
        goto free_nodes;
    status = 1;
    if ((ret = make_keys(L)) < 0) {
        if (ret == -EINTR)
            status = 130;
        goto free_nodes;
    }
    int initial[MAX_NODES];
    for (int i = 0; i < L->n; i++)
        initial[i] = i;
    for (int i = 0; i < L->n; i++) {
        char seeds[SEEDS_TEXT];
        seeds_text(L, i, 0, initial, L->n, seeds, sizeof(seeds));
        if (write_node_config(L, &L->nodes[i], seeds, L->n) < 0) {
            status = 2;
            goto free_nodes;
        }
    }
    int sig = take_signals(L);
    if (sig) {
        fprintf(stderr, "dslaunch: interrupted before the nodes started\n");
        status = 128 + sig;
        goto free_nodes;
    }
    if (L->netns && (ret = netns_up(L)) != 0) {
        if (ret > 0)
            status = ret;
        goto teardown;
    }
    for (int h = 0; L->hosts_mode && h < L->nhosts; h++) {
        if (ship_host(L, h) < 0)
            goto teardown;
        shipped[h] = 1;
        if ((sig = take_signals(L))) {
            fprintf(stderr, "dslaunch: interrupted before the nodes started\n");
            status = 128 + sig;
            goto teardown;
        }
    }
    if (L->hosts_mode)
        fprintf(stderr, "dslaunch: %d node%s on %d host%s (%d each, ports from %d), run "
                "directory %s, dsnode %s there\n", L->n, L->n == 1 ? "" : "s", L->nhosts,
                L->nhosts == 1 ? "" : "s", L->per_host, L->nodes[0].port, L->dir,
                L->remote_dsnode);
    else
        fprintf(stderr, "dslaunch: %d node%s, run directory %s, ports from %d, dsnode %s\n",
                L->n, L->n == 1 ? "" : "s", L->dir, L->nodes[0].port, L->dsnode);
    L->t0 = L->last_status = now_ms();
    for (int i = 0; i < L->n; i++) {
        if (start_node(L, &L->nodes[i]) < 0) {
            L->failed_self = 1;
            begin_stop(L, "a node could not be started");
            break;
        }
        L->started++;
    }
    loop(L);
    /* Every ssh session is over: bring the node directories home. */
    for (int h = 0; L->hosts_mode && h < L->nhosts; h++)
        if (shipped[h]) {
            if (collect_host(L, h) < 0)
                L->failed_self = 1;
            shipped[h] = 0;
        }
    /* Every started node is reaped: nothing lives in the namespaces now.
     * What each sent out (the traffic between them) goes in the report. */
    if (L->netns && (L->ns_out = calloc((size_t)ns_count(L), sizeof(uint64_t))))
        for (int i = 0; i < ns_count(L); i++)
            if (ds_netns_link_bytes(&L->ns, i, &L->ns_out[i]) < 0)
                L->ns_out[i] = UINT64_MAX;
    if (L->netns && ds_netns_teardown(&L->ns, stderr) < 0)
        L->failed_self = 1;
    status = report(L, final_status(L));

teardown:
    /* dslaunch hosts, before any node ran: remove the host directories
     * made so far (keys in them). */
    for (int h = 0; L->hosts_mode && h < L->nhosts; h++)
        if (shipped[h]) {
            char hd[256], cmd[PATH_MAX + 64], what[DS_SSH_HOST_MAX + 320];
            char *sargv[16 + 2 * DS_SSH_OPTS_MAX];
            host_dir(L, h, hd, sizeof(hd));
            snprintf(what, sizeof(what), "ssh %s (removing %s)", L->hosts[h], hd);
            if (ds_ssh_remove_cmd(hd, cmd, sizeof(cmd)) >= 0 &&
                ds_ssh_argv(&L->ssh, L->hosts[h], cmd, sargv,
                            (int)(sizeof(sargv) / sizeof(sargv[0]))) >= 0)
                run_io(L, sargv, -1, -1, what);
        }
    /* A no-op after the teardown above; here for the ways out before the
     * nodes started. */
    if (L->netns && ds_netns_teardown(&L->ns, stderr) < 0 && status == 0)
        status = 1;
free_nodes:
    for (int i = 0; L->nodes && i < L->started; i++) {
        /* loop() reaped every started node; close what it left open. */
        if (L->nodes[i].log)
            fclose(L->nodes[i].log);
        for (int w = 0; w < 2; w++)
            if (L->nodes[i].fd[w] >= 0)
                close(L->nodes[i].fd[w]);
    }
    free(L->nodes);
    free(L->ns_out);
close_sigfd:
    close(L->sigfd);
free_launch:
    free(L->hosts);
    free(L);
    return status;
}

int ds_launch_local_main(int argc, char **argv, const char *self_exe_dir)
{
    return launch_main(argc, argv, self_exe_dir, 0);
}

int ds_launch_hosts_main(int argc, char **argv, const char *self_exe_dir)
{
    return launch_main(argc, argv, self_exe_dir, 1);
}
