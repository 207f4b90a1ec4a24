/*
 * tests/launch_util.h: what the tests of real dsnode clusters share
 * (tests/test_dslaunch.c and tests/test_elastic.c).
 *
 * - A fresh run directory under /tmp per test (tmp_init / tmp_fini as a
 *   suite's .init / .fini). tmp_fini kills the dslaunch a test left running
 *   and every process whose command line names the directory, then removes
 *   it, so nothing outlives a failed test.
 * - dslaunch run to completion (run_dslaunch), or started and watched while
 *   it runs (live_*), its output read all along so its pipes never fill.
 * - dslaunch's --json line parsed with jansson, and the small accessors the
 *   tests use on it (jnum, jstr).
 * - The nodes' status documents (docs/status.md): dslaunch gives node nI the
 *   file DIR/nI/status.json when the base config turns status.file on
 *   (STATUS_FILE_ON). A test waits on what these documents say (a step
 *   reached, a view's members and their states), never on log text or a
 *   fixed sleep: live_wait polls a condition with a hard deadline and gives
 *   up at once when dslaunch exits first.
 *
 * Everything here runs on the test's own thread: the run directory, the
 * dslaunch to kill on failure and tmp_path's buffers are process-wide
 * statics, which is safe because Criterion runs each test in a process of
 * its own, one thread calling these.
 */
#ifndef DS_TESTS_LAUNCH_UTIL_H
#define DS_TESTS_LAUNCH_UTIL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifndef DS_CONF_EXAMPLES_DIR
#error "meson passes DS_CONF_EXAMPLES_DIR"
#endif
#define BASE_CONFIG DS_CONF_EXAMPLES_DIR "/cluster.ini"

/* The --set that turns status.file on: dslaunch then points each node at
 * DIR/nI/status.json (docs/dslaunch.md), whatever the value says. */
#define STATUS_FILE_ON "status.file=status.json"

/* ---- the run directory and the processes in it ------------------------------ */

/* Suite .init / .fini: make the directory; kill what runs in it, remove it. */
void tmp_init(void);
void tmp_fini(void);

/* DIR/name in one of 16 rotating static buffers (a test uses fewer at once). */
const char *tmp_path(const char *name);

void write_bytes(const char *path, const void *data, size_t n);

/* The whole file as a string (caller frees), or NULL when it cannot be read. */
char *read_text(const char *path);

/* The pids of every process (not ours) whose command line contains
 * `needle`; at most max. Returns how many. */
int procs_with(const char *needle, pid_t *out, int max);

/* 1 while pid exists and is not a zombie. */
int alive(pid_t pid);

/* The pid of node `name` of the run in `out` (its command line names
 * DIR/name.ini), or -1. */
pid_t node_pid(const char *out, const char *name);

/* ---- dslaunch, to completion ---------------------------------------------------- */

/* The program meson passes in environment variable env (DSLAUNCH, DSNODE). */
const char *bin(const char *env);

struct result {
    int code;
    char *out, *err;
};

void result_free(struct result *r);

/* dslaunch with args (NULL-terminated, at most 62), to completion or
 * timeout_ms. Fails the test if it cannot be run at all. */
struct result run_dslaunch(int timeout_ms, const char *const *args);

/* dsnode with args (NULL-terminated, at most 62) under a hard timeout
 * (a hang fails the test). */
struct result run_dsnode(int timeout_ms, const char *const *args);

/* Expect exit status `code`, every string of want (NULL-terminated, may
 * be NULL) in stderr and none of not; then frees r. */
void expect_result(struct result *r, int code, const char *const *want, const char *const *not);

/* "node.listen=127.0.0.1:P" with a port nothing is bound to now (the
 * kernel's pick; a single node without seeds dials nobody). One static
 * buffer. */
const char *listen_free(void);

/* sh -c (the formatted command) to completion, at most 60 s: its exit
 * status, or -1 when it could not run; its stdout in *out when out is not
 * NULL (caller frees). A failure's stderr goes to the test log. */
int sh(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The last line of stdout, which must be one JSON object (dslaunch --json).
 * Caller json_decref()s. */
json_t *last_json(const char *out);

/* A key of a JSON object that must be a number / a string (fails the test
 * otherwise). */
double jnum(const json_t *o, const char *key);
const char *jstr(const json_t *o, const char *key);

/* nodes.NAME of dslaunch's JSON (fails the test when it is missing). */
const json_t *jnode(const json_t *report, const char *name);

/* ---- dslaunch, watched while it runs ---------------------------------------------- */

/* A started dslaunch whose output we keep reading while we wait. */
struct live {
    pid_t pid;
    int fo, fe;
    char *out, *err;
    size_t ol, el;
    int exited; /* live_wait saw it exit (not reaped: live_end does that) */
};

/* Starts dslaunch with args (NULL-terminated); tmp_fini kills it if the
 * test fails before live_end. */
void live_start(struct live *l, const char *const *args);

/* Polls pred(arg) every 50 ms for up to ms, reading dslaunch's output in
 * between. Returns 1 as soon as pred does; 0 at the deadline, or at once
 * when dslaunch has exited (l->exited is then set). */
int live_wait(struct live *l, int ms, int (*pred)(void *), void *arg);

/* Waits up to ms for dslaunch to exit, reading its output; its exit status
 * (128 + signal when killed), or -1 at the deadline. l->out and l->err are
 * then whole. */
int live_end(struct live *l, int ms);

void live_free(struct live *l);

/* No process names `dir`, and no node of the report is alive. */
void no_process_left(const char *dir, const json_t *nodes);

/* ---- node configs ------------------------------------------------------------- */

/* `dsnode check-config FILE` accepts it; returns its dump (caller frees). */
char *config_valid(const char *path);

/* The rest of the line after `key` (which starts with "\n") in a dump. */
void dump_value(const char *dump, const char *key, char *val, size_t len);

/* The node exited 0 with status done, test_acc above min_acc, and byte
 * counts present. */
void check_node_ok(const json_t *nodes, const char *name, double min_acc);

/* ---- status documents (docs/status.md, schema 1) ------------------------------ */

/* The document node `name` of the run in `out` wrote last, or NULL while
 * there is none. The node replaces the file by rename, so a document read
 * is always whole; one that does not parse fails the test. Caller
 * json_decref()s. */
json_t *status_load(const char *out, const char *name);

/* train.step, node.state ("" when absent), view.size. */
long long status_step(const json_t *doc);
const char *status_state(const json_t *doc);
long long status_view_size(const json_t *doc);

/* The state ("alive", "suspect", "dead", "left") of member `name` in the
 * document's view, or NULL when the view does not list it. */
const char *status_member(const json_t *doc, const char *name);

/* A number at a dotted path ("membership.dead", "drops.bad_mac"); fails
 * the test when it is not there. */
double status_num(const json_t *doc, const char *path);

/* Waits (live_wait, up to ms) until node `name` of the run in `out` has
 * published train.step >= step; fails the test otherwise, saying the last
 * step seen. */
void wait_for_step(struct live *l, const char *out, const char *name, long long step, int ms);

#endif
