/*
 * tools/dslaunch/dslaunch.h: the parts of dslaunch that are not its command
 * line, declared for one another and for tests/test_dslaunch.c.
 *
 * dslaunch starts and watches `dsnode` processes; it never links node/. What
 * it knows about a node comes from the node's text output (the contract in
 * docs/dslaunch.md) and from the files the node leaves behind (model.bin).
 * So this header has five small, separately testable parts:
 *
 *   ds_kv_*         key=value tokens of a log or summary line
 *   ds_json_*       dsnode's text as JSON values (jansson) and one-line output
 *   ds_consensus_*  reading model.bin files; the consensus distance
 *   ds_proc_*       spawning children that die with us; capturing a command;
 *                   probing free TCP ports
 *   ds_netns_*      one network namespace per node behind a rate-limited
 *                   link (--netns)
 *
 * and the `local` command itself (local.c), whose entry point is
 * ds_launch_local_main.
 */
#ifndef DS_TOOLS_DSLAUNCH_H
#define DS_TOOLS_DSLAUNCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <jansson.h>

/* ---- key=value lines ----------------------------------------------------- */

#define DS_KV_MAX 40
#define DS_KV_KEY_MAX 48
#define DS_KV_VAL_MAX 128

/* The key=value tokens of one line, in order. Plain value type: copy freely. */
typedef struct ds_kvline {
    int n;
    char key[DS_KV_MAX][DS_KV_KEY_MAX];
    char val[DS_KV_MAX][DS_KV_VAL_MAX];
} ds_kvline;

/* Split text (borrowed, not modified) on blanks and keep every token of the
 * form key=value with a non-empty key of at most DS_KV_KEY_MAX-1 bytes; other
 * tokens are ignored. A value longer than DS_KV_VAL_MAX-1 bytes is cut. A key
 * seen twice keeps its first value. Tokens past DS_KV_MAX are dropped.
 * Returns the number of pairs kept. */
int ds_kv_parse(const char *text, ds_kvline *out);

/* The value of key, or NULL. Borrowed from l. */
const char *ds_kv_get(const ds_kvline *l, const char *key);

/* 0 and *out when key is present and its whole value is a finite decimal
 * number; -ENOENT when absent; -EINVAL when it is not such a number. */
int ds_kv_get_double(const ds_kvline *l, const char *key, double *out);

/* A dsnode log line split in place: "TIME LEVEL NODE COMPONENT message...".
 * Fields point into the line the caller passed (borrowed). */
typedef struct ds_logline {
    const char *level;
    const char *node;
    const char *component;
    const char *msg; /* the rest of the line, "" when none */
} ds_logline;

/* Splits line (modified: NULs replace the blanks after the first four
 * fields). 0 when the line has the shape of a dsnode log line (a time stamp
 * starting with a digit and one of the four level names), -EINVAL otherwise
 * (line then unchanged). */
int ds_logline_split(char *line, ds_logline *out);

/* ---- JSON output ------------------------------------------------------------ */

/* The report's JSON is built with jansson; these decide how dsnode's text
 * becomes JSON values. Each returns a new reference (caller owns;
 * json_decref), or NULL only when out of memory. */

/* A JSON string for s: s when it is valid UTF-8, else each byte read as a
 * Latin-1 character, so any bytes give a string; JSON null for NULL. */
json_t *ds_json_text(const char *s);
/* v rounded to 10 significant digits, or JSON null when not finite. */
json_t *ds_json_number(double v);
/* 1 when s is exactly a JSON number (RFC 8259 grammar), else 0. */
int ds_json_is_number(const char *s);
/* s as a number when it is a JSON number (an integer when it fits in 64
 * bits, else a finite double), else s as ds_json_text gives it. */
json_t *ds_json_text_or_number(const char *s);
/* obj[key] = val, taking val (also on failure; NULL counts as out of
 * memory); a key that is not UTF-8 is read as ds_json_text reads it.
 * 0 or -ENOMEM. */
int ds_json_set(json_t *obj, const char *key, json_t *val);
/* v as one line of ASCII JSON (everything else escaped as \uXXXX) and a
 * newline; compact: no blank after ',' and ':'. Reals with up to 15
 * significant digits. 0, -ENOMEM or -EIO. */
int ds_json_write_line(FILE *f, const json_t *v, int compact);

/* ---- what a node waits on (its status.file) ------------------------------- */

#define DS_WAIT_SHOWN_S 0.5 /* a shorter wait is not shown */

/* The "waiting" object of a node's /status document (docs/status.md) as
 * a progress text into buf (n bytes): "waiting 1.4s on round 57: n2, n3",
 * "waiting 2.0s on group reduction with n3, n4", "waiting 3.0s for members:
 * 2 of 4 alive"; "" when the document says it is not waiting, or for
 * less than DS_WAIT_SHOWN_S. Bytes outside printable ASCII become '?'.
 * 0 (buf set, maybe ""), or -EINVAL when doc is not a /status document
 * (buf ""). */
int ds_wait_text(const char *doc, size_t len, char *buf, size_t n);

/* ---- final models ----------------------------------------------------------- */

/* "DSMODEL1", u64 little-endian n, then n little-endian float32. */
#define DS_MODEL_MAGIC "DSMODEL1"
#define DS_MODEL_HDR 16

typedef struct ds_consensus {
    int n_models;       /* models that entered the figures */
    uint64_t n_params;  /* their length */
    double rel;         /* mean_i ||theta_i - mean||_2 / ||mean||_2; NAN if undefined */
    double abs;         /* mean_i ||theta_i - mean||_2 */
    double mean_norm;   /* ||mean||_2 */
} ds_consensus;

/* Check one model file: 0 and *n_params, or a negative errno with a message
 * in err naming the file (-ENOENT missing, -EPROTO bad magic, -EMSGSIZE size
 * disagrees with the header, -EDOM a non-finite value, -EIO read error). */
int ds_model_check(const char *path, uint64_t *n_params, char *err, size_t errlen);

/* The consensus distance of the models in paths[0..n) (entries may be NULL:
 * no model). Every file is checked first; a file that fails, or whose length
 * differs from the first good file's, is left out: status[i] (caller's array
 * of n, may be NULL) gets 0 for a model used, else the negative errno
 * (-EXDEV for a length mismatch, -ENOENT for NULL). Streams the files in
 * chunks, so memory is O(n * chunk), not O(n * params). Returns 0 (even with
 * fewer than two models: then n_models says so and rel/abs are NAN), or a
 * negative errno on an I/O failure or -ENOMEM. Messages for left-out files go
 * to warn (may be NULL), one line each. */
int ds_consensus_compute(const char *const *paths, int n, int *status, ds_consensus *out,
                         FILE *warn);

/* ---- processes ---------------------------------------------------------------- */

/* Start argv[0] (a path; no PATH search) with argv. stdin is /dev/null;
 * stdout and stderr go to two new pipes whose read ends (O_CLOEXEC,
 * O_NONBLOCK) are returned in *out_fd and *err_fd (caller owns; close them).
 * The child gets its own process group, an empty signal mask and default
 * dispositions, and PR_SET_PDEATHSIG = SIGTERM, re-checked against the race
 * with our own death. A failed exec is reported here, not by the child:
 * returns the pid, or a negative errno with "cannot run PATH: why" in err. */
pid_t ds_proc_spawn(char *const argv[], int *out_fd, int *err_fd, char *err, size_t errlen);

/* ds_proc_spawn with a choice of stdin and stdout: stdin is in_fd when it is
 * >= 0 (dup'ed; the caller keeps its own), else with in_w a new pipe whose
 * write end (O_CLOEXEC) is returned in *in_w (caller owns), else /dev/null.
 * stdout is out_file when it is >= 0 (then *out_fd is -1 or out_fd NULL),
 * else a pipe as in ds_proc_spawn. */
pid_t ds_proc_spawn_io(char *const argv[], int in_fd, int *in_w, int out_file, int *out_fd,
                       int *err_fd, char *err, size_t errlen);

/* Run argv to completion, at most timeout_ms (then SIGKILL), collecting its
 * stdout and stderr (each cut at 4 MiB; NUL-terminated; caller frees both).
 * *exit_code: the status as a shell shows it (128 + signal if killed).
 * Returns 0, -ETIMEDOUT (output so far still returned), or another negative
 * errno with err filled (then *out and *errtext are NULL). */
int ds_proc_capture(char *const argv[], int timeout_ms, char **out, char **errtext, int *exit_code,
                    char *err, size_t errlen);

/* ds_proc_capture with stdin from in_fd and stdout to out_file when they
 * are >= 0 (then *out is ""). */
int ds_proc_capture_io(char *const argv[], int in_fd, int out_file, int timeout_ms, char **out,
                       char **errtext, int *exit_code, char *err, size_t errlen);

/* 128 + signal for a signalled child, else its exit status. */
int ds_proc_exit_code(int wstatus);

/* 1 when TCP ports [base, base+count) can all be bound on 127.0.0.1 now. */
int ds_port_range_free(int base, int count);

/* The same on host, an IPv4 or IPv6 address without brackets
 * (base/hostport.h); 0 for anything else. */
int ds_port_range_free_at(const char *host, int base, int count);

/* A base P with [P, P+count) free on 127.0.0.1: `preferred` if free, else the
 * next free block above it (wrapping within 1024..65535). -EADDRINUSE when
 * none was found. */
int ds_port_find(int preferred, int count);

/* The same on host (ds_port_range_free_at). */
int ds_port_find_at(const char *host, int preferred, int count);

/* ---- network namespaces (netns.c) ----------------------------------------------- */

/* --netns: node nI in namespace dsl-<pid>-nI at ds_netns_addr(I)/16, one veth
 * to a bridge dsl<pid in base 36>br in the root namespace, optional tbf rate
 * limit on both ends. Root only. */
#define DS_NETNS_MAX 256

typedef struct ds_netns {
    int n;                 /* namespaces to make */
    pid_t owner;           /* the dslaunch whose pid names them */
    uint64_t rate_bps;     /* tbf rate in bit/s each way; 0 = no limit */
    char tag[8];           /* owner in base 36: 6 characters at most for a pid */
    char bridge[16];       /* IFNAMSIZ */
    char ip[4096], tc[4096];
    int bridge_made;       /* teardown removes the bridge */
    int made;              /* namespaces [0, made) exist, the last maybe in part */
} ds_netns;

/* Bytes namespace i has sent out through its cable so far (its veth's
 * root side rx counter): with namespaces as hosts, the traffic between
 * hosts. 0, or a negative errno. */
int ds_netns_link_bytes(const ds_netns *ns, int i, uint64_t *out_bytes);

/* "100mbit", "1gbit", "1.5gbit", "500kbit" (unit required, any case) ->
 * bit/s. -EINVAL for another form, -ERANGE outside 8 kbit/s..100 Gbit/s. */
int ds_netns_rate_parse(const char *s, uint64_t *bits_per_s);

/* Node i's address in its namespace: 10.213.(1 + i/200).(1 + i%200). */
void ds_netns_addr(int i, char *buf, size_t len);

/* Node i's namespace name, dsl-<owner>-n<i>. */
void ds_netns_name(const ds_netns *ns, int i, char *buf, size_t len);

/* 0 when this process can make namespaces (root, ip and tc found, `ip netns
 * list` works); else a negative errno and why in err. */
int ds_netns_check(char *err, size_t len);

/* Fill *ns for n nodes owned by pid `owner`; creates nothing. 0, -EINVAL
 * (n out of range) or -ENOENT (ip/tc missing), with err. */
int ds_netns_init(ds_netns *ns, pid_t owner, int n, uint64_t rate_bps, char *err, size_t len);

/* Create the bridge and every namespace not made yet. 0, or -EIO with the
 * failing command and its message in err; what was made so far is recorded
 * in *ns, so ds_netns_teardown removes it. */
int ds_netns_setup(ds_netns *ns, char *err, size_t len);

/* The argv prefix {ip, "netns", "exec", NAME} that runs a command in node
 * i's namespace. NAME is written to name (caller's buffer, which argv[3]
 * then borrows); argv[0] borrows ns. */
void ds_netns_exec_prefix(const ds_netns *ns, int i, char *name, size_t name_len, char *argv[4]);

/* Remove every namespace and the bridge that *ns made (safe to call again,
 * and after a failed setup). 0, or -EIO when something would not go (said on
 * warn, which may be NULL). */
int ds_netns_teardown(ds_netns *ns, FILE *warn);

/* 1 and *pid when name is one of ours (a namespace dsl-<pid>-n<i> or a
 * bridge dsl<base 36 pid>br), else 0. */
int ds_netns_stale_owner(const char *name, long *pid);

/* Remove namespaces and bridges whose dslaunch is gone (killed before it
 * could clean up). Returns how many were removed (each said on note, may be
 * NULL), or -ENOENT without the ip program. */
int ds_netns_reap_stale(FILE *note);

/* ---- ssh (ssh.c) ------------------------------------------------------------------ */

/* `dslaunch hosts` runs Debian's OpenSSH client; these build its command
 * lines and the remote shell commands (docs/dslaunch.md). */
#define DS_SSH_HOST_MAX 256
#define DS_SSH_PATH_MAX 1024
#define DS_SSH_OPTS_MAX 32

typedef struct ds_ssh {
    const char *program;                   /* "ssh" when NULL (execvp'd by path below) */
    const char *config;                    /* -F FILE, or NULL */
    const char *opts[DS_SSH_OPTS_MAX];     /* each passed as -o OPT */
    int nopts;
} ds_ssh;

/* --hosts: a comma-separated list, or a file (an argument with a '/', or an
 * existing file) with one host a line, '#' comments. Entries are
 * [user@]host without blanks or quotes, not starting with '-', each once.
 * Returns the count (>= 1), or a negative errno with err. */
int ds_hosts_parse(const char *arg, char (*hosts)[DS_SSH_HOST_MAX], int max, char *err,
                   size_t len);

/* The host part of "[user@]host" (borrowed from entry). */
const char *ds_host_addr(const char *entry);

/* s in single quotes for a POSIX shell (a ' becomes '\''). The length, or
 * -ENAMETOOLONG. */
int ds_sh_quote(const char *s, char *buf, size_t len);

/* argv = ssh [-F config] -o BatchMode=yes [-o user opt]... -o
 * ServerAliveInterval=5 -o ServerAliveCountMax=3 -o ConnectTimeout=10 --
 * host cmd (strings borrowed). argv has max entries. Returns argc or
 * -E2BIG. */
int ds_ssh_argv(const ds_ssh *s, const char *host, const char *cmd, char **argv, int max);

/* The remote commands (buf, len): make dir (new, 0700) and unpack the tar
 * archive on stdin into it, every file 0600; run `dsnode run --config conf`
 * tied to the session's stdin (EOF: SIGTERM, 5 s later SIGKILL); a tar
 * archive of names (plain node names) under dir on stdout; remove dir. The
 * length, or -ENAMETOOLONG. */
int ds_ssh_ship_cmd(const char *dir, char *buf, size_t len);
int ds_ssh_run_cmd(const char *dsnode, const char *conf, char *buf, size_t len);
int ds_ssh_collect_cmd(const char *dir, const char *const *names, int n, char *buf, size_t len);
int ds_ssh_remove_cmd(const char *dir, char *buf, size_t len);

/* ---- commands ------------------------------------------------------------------- */

/* `dslaunch local ...`; argv[0] is "local". Returns the process exit status. */
int ds_launch_local_main(int argc, char **argv, const char *self_exe_dir);

/* `dslaunch hosts ...`; argv[0] is "hosts". Returns the process exit status. */
int ds_launch_hosts_main(int argc, char **argv, const char *self_exe_dir);

#endif
