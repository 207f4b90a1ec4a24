/*
 * tests/test_conf.c: the configuration system (conf/, design §8).
 *
 * Every key gets a valid value (checked through the typed field or the dump)
 * and an invalid one whose exact error text is asserted, both through --set
 * and through a file; the suite refuses to pass while conf/keys.h holds a key
 * without a case here. Then every error class by its message, --set, the
 * dump -> load round trip (memcmp of the structs), the cross-key checks, the
 * host:port parser and every file in conf/examples/.
 *
 * Files are written to a fresh directory under /tmp per test process.
 * Run: meson test -C build conf --verbose
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <float.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conf/conf.h"
#include "helpers/conf_enum_keys.h"

#ifndef DS_CONF_EXAMPLES_DIR
#error "meson passes DS_CONF_EXAMPLES_DIR"
#endif

/* ---- helpers -------------------------------------------------------------- */

static char tmpdir[64];

static void tmp_init(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/ds_test_conf.XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void tmp_fini(void)
{
    /* Our own directory only (files in it, then itself). */
    if (tmpdir[0] && nftw(tmpdir, remove_one, 8, FTW_DEPTH | FTW_PHYS) != 0)
        fprintf(stderr, "test_conf: could not remove %s\n", tmpdir);
}

TestSuite(conf, .init = tmp_init, .fini = tmp_fini);

/* Write n bytes of text to tmpdir/name; returns the path (static). */
static const char *write_file_n(const char *name, const char *text, size_t n)
{
    static char path[4][256];
    static int slot;
    char *p = path[slot++ % 4];
    snprintf(p, 256, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f, "fopen %s: %s", p, strerror(errno));
    cr_assert_eq(fwrite(text, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
    return p;
}

static const char *write_file(const char *name, const char *text)
{
    return write_file_n(name, text, strlen(text));
}

/* "PATH:LINE: msg" as the loader writes it. */
static const char *at(const char *path, int line, const char *msg)
{
    static char buf[4][DS_CONF_ERR_MAX];
    static int slot;
    char *b = buf[slot++ % 4];
    snprintf(b, DS_CONF_ERR_MAX, "%s:%d: %s", path, line, msg);
    return b;
}

/* The value of "section.key" as ds_conf_dump writes it (static buffer). */
static const char *dumped(const ds_conf *c, const char *full_key)
{
    static char value[DS_CONF_LINE_MAX];
    char *text = NULL, want_sec[64];
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_not_null(f);
    cr_assert_eq(ds_conf_dump(c, f), 0);
    fclose(f);
    const char *dot = strchr(full_key, '.');
    snprintf(want_sec, sizeof(want_sec), "[%.*s]", (int)(dot - full_key), full_key);
    const char *key = dot + 1;
    bool in = false;
    value[0] = '\0';
    int found = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '[') {
            in = !strcmp(line, want_sec);
            continue;
        }
        size_t kn = strlen(key);
        if (in && !strncmp(line, key, kn) && line[kn] == ' ' && line[kn + 1] == '=') {
            const char *v = line + kn + 2;
            if (*v == ' ')
                v++;
            snprintf(value, sizeof(value), "%s", v);
            found++;
        }
    }
    free(text);
    cr_assert_eq(found, 1, "%s appears %d times in the dump", full_key, found);
    return value;
}

/* Escape like the library does for quoted text (control characters, the
 * backslash and the quote), so expected --set prefixes can be built. */
static const char *esc(const char *s)
{
    static char out[4][1024];
    static int slot;
    char *o = out[slot++ % 4];
    size_t n = 0;
    for (; *s && n + 5 < 1024; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch < 0x20 || ch == 0x7f)
            n += (size_t)sprintf(o + n, "\\x%02x", ch);
        else if (ch == '\\' || ch == '\'')
            n += (size_t)sprintf(o + n, "\\%c", ch);
        else
            o[n++] = (char)ch;
    }
    o[n] = '\0';
    return o;
}

static ds_conf defaults(void)
{
    ds_conf c;
    ds_conf_defaults(&c);
    return c;
}

/* ---- one case per key ----------------------------------------------------- */

#define T_KEY_NAME_(type, sec, key, ...) #sec "." #key,
#define T_SECTION_(sec, X) DS_CONF_KEYS_##sec(X)
static const char *const all_keys[] = {DS_CONF_SECTIONS(T_SECTION_, T_KEY_NAME_)};
#define NALL (sizeof(all_keys) / sizeof(all_keys[0]))

typedef struct key_case {
    const char *key;       /* section.key */
    const char *good;      /* a valid value other than the default */
    const char *good_dump; /* how the dump writes it back */
    const char *bad;       /* an invalid value */
    const char *bad_err;   /* the error after "WHERE: " */
} key_case;

#define NAME_WHAT "a name of 1..63 characters from A-Z a-z 0-9 _ . -"
#define HP_WHAT "host:port (IPv4 address, [IPv6] address or hostname; port 1..65535)"
#define BOOL_WHAT "a boolean (true/false, yes/no, on/off, 1/0)"

static const key_case cases[] = {
    {"node.name", "worker-3.a_b", "worker-3.a_b", "bad name",
     "node.name: expected " NAME_WHAT ", found 'bad name'"},
    {"node.listen", "localhost:7100", "localhost:7100", "127.0.0.1:70000",
     "node.listen: expected " HP_WHAT ", found '127.0.0.1:70000'"},
    {"node.advertise", "[2001:db8::7]:7100", "[2001:db8::7]:7100", "2001:db8::7:7100",
     "node.advertise: expected empty or " HP_WHAT ", found '2001:db8::7:7100'"},
    {"node.group", "rack1", "rack1", "a/b",
     "node.group: expected empty or " NAME_WHAT ", found 'a/b'"},
    {"node.data_dir", "/var/lib/dsnode", "/var/lib/dsnode", "", "node.data_dir: empty value"},
    {"node.log_level", "DEBUG", "debug", "verbose",
     "node.log_level: expected one of error|warn|info|debug, found 'verbose'"},
    {"cluster.id", "lab-cluster.2", "lab-cluster.2", "my cluster",
     "cluster.id: expected " NAME_WHAT ", found 'my cluster'"},
    {"cluster.seeds", "127.0.0.1:7000 ,node1:7001", "127.0.0.1:7000, node1:7001", "127.0.0.1",
     "cluster.seeds: expected " HP_WHAT ", found '127.0.0.1' (item 1)"},
    {"cluster.seed", "9223372036854775807", "9223372036854775807", "-1",
     "cluster.seed: expected an integer >= 0, found '-1'"},
    {"cluster.key_file", "keys/cluster.key", "keys/cluster.key", "a\tb",
     "cluster.key_file: expected no control characters, found 'a\\x09b'"},
    {"cluster.identity_file", "/etc/dsnode/id.key", "/etc/dsnode/id.key", "x\x7fy",
     "cluster.identity_file: expected no control characters, found 'x\\x7fy'"},
    {"cluster.allowed_keys", "allowed.txt", "allowed.txt", "it's\x1b[1m",
     "cluster.allowed_keys: expected no control characters, found 'it\\'s\\x1b[1m'"},
    {"cluster.min_members", "4", "4", "0",
     "cluster.min_members: expected an integer in 1..65536, found '0'"},
    {"cluster.join_timeout_s", "30", "30", "0",
     "cluster.join_timeout_s: expected an integer in 1..86400, found '0'"},
    {"train.backend", "cpu", "cpu", "gpu",
     "train.backend: expected one of auto|cpu|cuda, found 'gpu'"},
    {"train.device", "3", "3", "1024",
     "train.device: expected auto or a device index in 0..1023, found '1024'"},

    {"train.model", "CNN", "cnn", "resnet",
     "train.model: expected one of mlp|cnn|custom, found 'resnet'"},
    {"train.hidden", "512, 128,10", "512, 128, 10", "64,0",
     "train.hidden: expected 1..8 comma-separated integers in 1..65536, found '0' (item 2)"},
    {"train.layers", "conv5x5:8 , relu,maxpool2, flatten, linear:10",
     "conv5x5:8 , relu,maxpool2, flatten, linear:10", "conv3x3:32, rleu, flatten, linear:10",
     "train.layers: expected a layer: conv<K>x<K>:<C>, maxpool2, relu, flatten or linear:<N>, "
     "found 'rleu' (layer 2)"},
    {"train.dataset_dir", "/data/fmnist", "/data/fmnist", "", "train.dataset_dir: empty value"},
    {"train.dataset_cache", "/var/cache/dsnode", "/var/cache/dsnode", "c\x02",
     "train.dataset_cache: expected no control characters, found 'c\\x02'"},
    {"train.batch_size", "128", "128", "65537",
     "train.batch_size: expected an integer in 1..65536, found '65537'"},
    {"train.lr", "0.1", "0.1", "0", "train.lr: expected a number in (0, 10], found '0'"},
    {"train.momentum", "0", "0", "1", "train.momentum: expected a number in [0, 1), found '1'"},
    {"train.weight_decay", "5e-4", "0.0005", "-0.1",
     "train.weight_decay: expected a number in [0, 1], found '-0.1'"},
    {"train.nesterov", "on", "true", "maybe",
     "train.nesterov: expected " BOOL_WHAT ", found 'maybe'"},
    {"train.lr_schedule", "Constant", "constant", "linear",
     "train.lr_schedule: expected one of constant|cosine, found 'linear'"},
    {"train.warmup_steps", "100", "100", "-5",
     "train.warmup_steps: expected an integer >= 0, found '-5'"},
    {"train.steps", "10", "10", "0", "train.steps: expected an integer >= 1, found '0'"},
    {"train.eval_every", "0", "0", "1.5",
     "train.eval_every: expected an integer >= 0, found '1.5'"},
    {"train.log_every", "10", "10", "0",
     "train.log_every: expected an integer >= 1, found '0'"},
    {"train.threads", "4", "4", "257", "train.threads: expected an integer in 1..256, found '257'"},
    {"train.checkpoint_every", "100", "100", "-1",
     "train.checkpoint_every: expected an integer >= 0, found '-1'"},
    {"train.stop_after", "300", "300", "x",
     "train.stop_after: expected an integer >= 0, found 'x'"},
    {"sparsify.method", "topk", "topk", "top-k",
     "sparsify.method: expected one of none|random|topk|threshold|sage|micro|deft, found 'top-k'"},
    {"sparsify.density", "1", "1", "0",
     "sparsify.density: expected a number in (0, 1], found '0'"},
    {"sparsify.error_feedback", "no", "false", "2",
     "sparsify.error_feedback: expected " BOOL_WHAT ", found '2'"},
    {"sparsify.threshold", "1e-3", "0.001", "-1",
     "sparsify.threshold: expected a number >= 0, found '-1'"},
    {"sparsify.value_format", "bf16", "bf16", "fp16",
     "sparsify.value_format: expected one of f32|f16|bf16, found 'fp16'"},
    {"gossip.topology", "ring", "ring", "star",
     "gossip.topology: expected one of crossover|ring|exponential|random|allreduce, found 'star'"},
    {"gossip.mix", "crossover", "crossover", "average",
     "gossip.mix: expected one of pairwise|crossover, found 'average'"},
    {"gossip.weight", "0.5", "0.5", "0.6",
     "gossip.weight: expected a number in (0, 0.5], found '0.6'"},
    {"gossip.segments", "8", "8", "1000000000",
     "gossip.segments: expected an integer in 0..65536, found '1000000000'"},
    {"gossip.every", "4", "4", "0", "gossip.every: expected an integer >= 1, found '0'"},
    {"gossip.timeout_ms", "600000", "600000", "600001",
     "gossip.timeout_ms: expected an integer in 1..600000, found '600001'"},
    {"gossip.min_wait_ms", "100", "100", "0",
     "gossip.min_wait_ms: expected an integer in 1..600000, found '0'"},
    {"gossip.overlap", "1", "true", "ja", "gossip.overlap: expected " BOOL_WHAT ", found 'ja'"},
    {"group.sparsify", "deft", "deft", "topk",
     "group.sparsify: expected one of none|micro|deft, found 'topk'"},
    {"group.allreduce", "auto", "auto", "tree",
     "group.allreduce: expected one of direct|ring|butterfly|auto, found 'tree'"},
    {"group.density", "0.05", "0.05", "1.5",
     "group.density: expected a number in (0, 1], found '1.5'"},
    {"group.overlap", "yes", "true", "sometimes",
     "group.overlap: expected " BOOL_WHAT ", found 'sometimes'"},
    {"transport.provider", "tcp;ofi_rxm", "tcp;ofi_rxm", "", "transport.provider: empty value"},
    {"transport.op_timeout_ms", "1", "1", "0",
     "transport.op_timeout_ms: expected an integer in 1..600000, found '0'"},
    {"transport.max_inflight_mb", "65536", "65536", "1e3",
     "transport.max_inflight_mb: expected an integer in 1..65536, found '1e3'"},
    {"security.mode", "auth", "auth", "plain",
     "security.mode: expected one of encrypt|auth|none, found 'plain'"},
    {"status.listen", "0.0.0.0:9100", "0.0.0.0:9100", "localhost",
     "status.listen: expected empty or " HP_WHAT ", found 'localhost'"},
    {"status.file", "/run/dsnode/status.json", "/run/dsnode/status.json", "st\x01",
     "status.file: expected no control characters, found 'st\\x01'"},
    {"status.file_interval_ms", "50", "50", "19",
     "status.file_interval_ms: expected an integer in 20..60000, found '19'"},
    {"slurm.port_base", "65535", "65535", "0",
     "slurm.port_base: expected an integer in 1..65535, found '0'"},
    {"slurm.seeds", "16", "16", "17", "slurm.seeds: expected an integer in 1..16, found '17'"},
};
#define NCASES (sizeof(cases) / sizeof(cases[0]))

Test(conf, every_key_has_a_case)
{
    for (size_t i = 0; i < NALL; i++) {
        int n = 0;
        for (size_t j = 0; j < NCASES; j++)
            n += !strcmp(all_keys[i], cases[j].key);
        cr_expect_eq(n, 1, "%s has %d cases in tests/test_conf.c (want 1)", all_keys[i], n);
    }
    cr_expect_eq(NCASES, NALL, "cases for keys that do not exist");
}

Test(conf, every_key_valid_value_by_set)
{
    for (size_t i = 0; i < NCASES; i++) {
        const key_case *k = &cases[i];
        ds_conf c = defaults();
        char a[512], err[DS_CONF_ERR_MAX] = "";
        snprintf(a, sizeof(a), "%s=%s", k->key, k->good);
        cr_expect_eq(ds_conf_set(&c, a, err, sizeof(err)), 0, "%s: %s", a, err);
        cr_expect_str_eq(dumped(&c, k->key), k->good_dump, "%s", a);
        ds_conf d = defaults();
        cr_expect_str_neq(dumped(&d, k->key), k->good_dump, "%s: pick a non-default", k->key);
    }
}

/* The keys whose relative values a file's directory resolves. */
static bool is_path_key(const char *key)
{
    static const char *const paths[] = {"node.data_dir", "cluster.key_file",
                                        "cluster.identity_file", "cluster.allowed_keys",
                                        "train.dataset_dir", "train.dataset_cache",
                                        "status.file"};
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
        if (!strcmp(key, paths[i]))
            return true;
    return false;
}

/* value as a file in tmpdir that sets key to it loads it (static). */
static const char *in_file_dir(const char *key, const char *value)
{
    static char out[2][PATH_MAX + DS_CONF_STR_MAX + 2];
    static int slot;
    char *o = out[slot++ % 2], dir[PATH_MAX];
    if (!is_path_key(key) || !value[0] || value[0] == '/')
        return value;
    cr_assert_not_null(realpath(tmpdir, dir));
    snprintf(o, sizeof(out[0]), "%s/%s", dir, value);
    return o;
}

Test(conf, every_key_valid_value_by_file)
{
    for (size_t i = 0; i < NCASES; i++) {
        const key_case *k = &cases[i];
        const char *dot = strchr(k->key, '.');
        char text[512], err[DS_CONF_ERR_MAX] = "";
        snprintf(text, sizeof(text), "; case %zu\n[%.*s]\n%s = %s\n", i, (int)(dot - k->key),
                 k->key, dot + 1, k->good);
        const char *path = write_file("good.ini", text);
        ds_conf c = defaults();
        cr_expect_eq(ds_conf_load(&c, path, err, sizeof(err)), 0, "%s: %s", k->key, err);
        cr_expect_str_eq(dumped(&c, k->key), in_file_dir(k->key, k->good_dump), "%s", k->key);
    }
}

Test(conf, every_key_invalid_value_by_set)
{
    for (size_t i = 0; i < NCASES; i++) {
        const key_case *k = &cases[i];
        ds_conf c = defaults(), before = c;
        char a[512], want[DS_CONF_ERR_MAX], err[DS_CONF_ERR_MAX] = "";
        snprintf(a, sizeof(a), "%s=%s", k->key, k->bad);
        snprintf(want, sizeof(want), "--set %s: %s", esc(a), k->bad_err);
        cr_expect_eq(ds_conf_set(&c, a, err, sizeof(err)), -EINVAL, "%s", a);
        cr_expect_str_eq(err, want);
        cr_expect_eq(memcmp(&c, &before, sizeof(c)), 0, "%s changed the config", a);
    }
}

Test(conf, every_key_invalid_value_by_file)
{
    for (size_t i = 0; i < NCASES; i++) {
        const key_case *k = &cases[i];
        const char *dot = strchr(k->key, '.');
        char text[512], err[DS_CONF_ERR_MAX] = "";
        snprintf(text, sizeof(text), "[%.*s]\n%s = %s\n", (int)(dot - k->key), k->key, dot + 1,
                 k->bad);
        const char *path = write_file("bad.ini", text);
        ds_conf c = defaults(), before = c;
        cr_expect_eq(ds_conf_load(&c, path, err, sizeof(err)), -EINVAL, "%s", k->key);
        cr_expect_str_eq(err, at(path, 2, k->bad_err));
        cr_expect_eq(memcmp(&c, &before, sizeof(c)), 0, "%s changed the config", k->key);
    }
}

/* ---- defaults and typed access -------------------------------------------- */

Test(conf, defaults_are_the_documented_ones)
{
    ds_conf c = defaults();
    char err[DS_CONF_ERR_MAX] = "";
    cr_expect_str_eq(c.node.name, "node0");
    cr_expect_str_eq(c.node.listen, "127.0.0.1:7000");
    cr_expect_str_eq(c.node.group, "");
    cr_expect_str_eq(c.node.data_dir, ".");
    cr_expect_eq(c.node.log_level, DS_LOG_INFO);
    cr_expect_str_eq(c.cluster.id, "dsnode");
    cr_expect_eq(c.cluster.seeds_count, 0);
    cr_expect_eq(c.cluster.seed, 1);
    cr_expect_str_eq(c.cluster.key_file, "");
    cr_expect_eq(c.train.backend, DS_OPS_AUTO);
    cr_expect_eq(c.train.model, DS_MODEL_MLP);
    cr_expect_eq(c.train.hidden_count, 2);
    cr_expect_eq(c.train.hidden[0], 256);
    cr_expect_eq(c.train.hidden[1], 256);
    cr_expect_eq(c.train.hidden[2], 0);
    cr_expect_str_eq(c.train.dataset_dir, "/usr/share/datasets/fashion-mnist");
    cr_expect_eq(c.train.batch_size, 64);
    cr_expect_eq(c.train.lr, 0.05);
    cr_expect_eq(c.train.momentum, 0.9);
    cr_expect_eq(c.train.weight_decay, 0.0001);
    cr_expect_eq(c.train.nesterov, false);
    cr_expect_eq(c.train.steps, 3000);
    cr_expect_eq(c.train.eval_every, 500);
    cr_expect_eq(c.train.log_every, 100);
    cr_expect_eq(c.train.threads, 1);
    cr_expect_eq(c.sparsify.method, DS_SPARSIFY_MICRO);
    cr_expect_eq(c.sparsify.density, 0.01);
    cr_expect_eq(c.sparsify.error_feedback, true);
    cr_expect_eq(c.sparsify.threshold, 0.0);
    cr_expect_eq(c.gossip.topology, DS_TOPO_CROSSOVER);
    cr_expect_eq(c.gossip.mix, DS_MIX_PAIRWISE);
    cr_expect_eq(c.gossip.weight, 0.3333333333);
    cr_expect_eq(c.gossip.segments, 0);
    cr_expect_eq(c.gossip.every, 1);
    cr_expect_eq(c.gossip.timeout_ms, 2000);
    cr_expect_eq(c.gossip.overlap, false);
    cr_expect_str_eq(c.transport.provider, "tcp");
    cr_expect_eq(c.transport.op_timeout_ms, 5000);
    cr_expect_eq(c.transport.max_inflight_mb, 8);
    cr_expect_eq(c.security.mode, DS_SEC_ENCRYPT);
    cr_expect_str_eq(c.status.listen, "");
    cr_expect_str_eq(c.status.file, "");
    cr_expect_eq(ds_conf_check(&c, err, sizeof(err)), 0, "%s", err);
}

Test(conf, typed_fields_after_load)
{
    const char *path = write_file("typed.ini",
                                  "[train]\n"
                                  "hidden = 1, 65536, 3\n"
                                  "lr = 2.5e-2\n"
                                  "batch_size = +32\n"
                                  "nesterov = Yes\n"
                                  "[cluster]\n"
                                  "seeds = 10.0.0.1:7000, host-b.example:9\n"
                                  "seed = 0\n");
    ds_conf c = defaults();
    char err[DS_CONF_ERR_MAX] = "";
    cr_assert_eq(ds_conf_load(&c, path, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(c.train.hidden_count, 3);
    cr_expect_eq(c.train.hidden[0], 1);
    cr_expect_eq(c.train.hidden[1], 65536);
    cr_expect_eq(c.train.hidden[2], 3);
    cr_expect_eq(c.train.lr, 0.025);
    cr_expect_eq(c.train.batch_size, 32);
    cr_expect_eq(c.train.nesterov, true);
    cr_expect_eq(c.cluster.seeds_count, 2);
    cr_expect_str_eq(c.cluster.seeds[0], "10.0.0.1:7000");
    cr_expect_str_eq(c.cluster.seeds[1], "host-b.example:9");
    cr_expect_eq(c.cluster.seed, 0);
    /* Keys the file does not name keep what the struct held. */
    cr_expect_eq(c.train.steps, 3000);
    cr_expect_str_eq(c.node.name, "node0");
}

Test(conf, enum_fields_hold_the_list_values)
{
    /* Any case in, the list's value stored. security.mode's values are not
     * their positions in the list (encrypt 2, auth 1, none 0). */
    const char *path = write_file("enums.ini",
                                  "[node]\nlog_level = Warn\n"
                                  "[train]\nbackend = CUDA\nlr_schedule = constant\n"
                                  "[sparsify]\nmethod = DEFT\n"
                                  "[gossip]\ntopology = Exponential\n"
                                  "[security]\nmode = none\n");
    ds_conf c = defaults();
    char err[DS_CONF_ERR_MAX] = "";
    cr_assert_eq(ds_conf_load(&c, path, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(c.node.log_level, DS_LOG_WARN);
    cr_expect_eq(c.train.backend, DS_OPS_CUDA);
    cr_expect_eq(c.train.lr_schedule, DS_LR_CONSTANT);
    cr_expect_eq(c.sparsify.method, DS_SPARSIFY_DEFT);
    cr_expect_eq(c.gossip.topology, DS_TOPO_EXPONENTIAL);
    cr_expect_eq(c.security.mode, DS_SEC_NONE);
    cr_expect_eq((int)c.security.mode, 0);
    cr_assert_eq(ds_conf_set(&c, "security.mode=Auth", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(c.security.mode, DS_SEC_AUTH);
    cr_expect_str_eq(dumped(&c, "security.mode"), "auth");
    cr_expect_str_eq(dumped(&c, "train.backend"), "cuda");
}

Test(conf, load_over_existing_values)
{
    ds_conf c = defaults();
    char err[DS_CONF_ERR_MAX] = "";
    cr_assert_eq(ds_conf_set(&c, "train.steps=7", err, sizeof(err)), 0, "%s", err);
    const char *path = write_file("over.ini", "[train]\nlr = 0.2\n");
    cr_assert_eq(ds_conf_load(&c, path, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(c.train.steps, 7);
    cr_expect_eq(c.train.lr, 0.2);
}

/* ---- error classes (files) ------------------------------------------------ */

static void expect_load_error(const char *text, int rc, int line, const char *msg)
{
    const char *path = write_file("err.ini", text);
    ds_conf c = defaults(), before = c;
    char err[DS_CONF_ERR_MAX] = "";
    cr_expect_eq(ds_conf_load(&c, path, err, sizeof(err)), rc, "for: %s", text);
    cr_expect_str_eq(err, at(path, line, msg));
    cr_expect_eq(memcmp(&c, &before, sizeof(c)), 0, "a failed load changed the config");
    cr_expect_eq(strchr(err, '\n'), NULL, "error is not one line");
}

Test(conf, unknown_section)
{
    expect_load_error("[node]\nname = a\n\n[trian]\n", -EINVAL, 4,
                      "unknown section [trian]; did you mean [train]?");
    expect_load_error("[frobnicate]\nx = 1\n", -EINVAL, 1, "unknown section [frobnicate]");
    expect_load_error("[ train ]\n", -EINVAL, 1, "unknown section [ train ]; did you mean [train]?");
    expect_load_error("[]\n", -EINVAL, 1, "unknown section []");
}

Test(conf, unknown_key)
{
    expect_load_error("[train]\nlrr = 0.1\n", -EINVAL, 2,
                      "unknown key 'lrr' in [train]; did you mean 'lr'?");
    expect_load_error("[gossip]\ntimout_ms = 5\n", -EINVAL, 2,
                      "unknown key 'timout_ms' in [gossip]; did you mean 'timeout_ms'?");
    expect_load_error("[train]\nrl = 0.1\n", -EINVAL, 2,
                      "unknown key 'rl' in [train]; did you mean 'lr'?");
    expect_load_error("[train]\nmomentun = 0.5\n", -EINVAL, 2,
                      "unknown key 'momentun' in [train]; did you mean 'momentum'?");
    expect_load_error("[train]\nlearning_rate = 0.1\n", -EINVAL, 2,
                      "unknown key 'learning_rate' in [train]");
    /* Far from every key of [train], but the name of a key elsewhere. */
    expect_load_error("[train]\nmethod = topk\n", -EINVAL, 2,
                      "unknown key 'method' in [train]; 'method' is in [sparsify]");
    expect_load_error("lr = 0.1\n", -EINVAL, 1, "key 'lr' before any [section]; 'lr' is in [train]");
}

Test(conf, bad_number_and_out_of_range)
{
    expect_load_error("[train]\nbatch_size = 12abc\n", -EINVAL, 2,
                      "train.batch_size: expected an integer in 1..65536, found '12abc'");
    expect_load_error("[train]\nbatch_size = 99999999999999999999\n", -EINVAL, 2,
                      "train.batch_size: expected an integer in 1..65536, "
                      "found '99999999999999999999'");
    expect_load_error("[train]\nbatch_size = 0x40\n", -EINVAL, 2,
                      "train.batch_size: expected an integer in 1..65536, found '0x40'");
    expect_load_error("[train]\nlr = 0x1p-3\n", -EINVAL, 2,
                      "train.lr: expected a number in (0, 10], found '0x1p-3'");
    expect_load_error("[train]\nlr = nan\n", -EINVAL, 2,
                      "train.lr: expected a number in (0, 10], found 'nan'");
    expect_load_error("[train]\nlr = 1e999\n", -EINVAL, 2,
                      "train.lr: expected a number in (0, 10], found '1e999'");
    expect_load_error("[train]\nlr = 10.000001\n", -EINVAL, 2,
                      "train.lr: expected a number in (0, 10], found '10.000001'");
    /* Only ';' after a blank starts an inline comment; '#' does not. */
    expect_load_error("[train]\nlr = 0.1 # fast\n", -EINVAL, 2,
                      "train.lr: expected a number in (0, 10], found '0.1 # fast'");
    expect_load_error("[gossip]\nweight = 0\n", -EINVAL, 2,
                      "gossip.weight: expected a number in (0, 0.5], found '0'");
    expect_load_error("[cluster]\nseed = 9223372036854775808\n", -EINVAL, 2,
                      "cluster.seed: expected an integer >= 0, found '9223372036854775808'");
}

Test(conf, bounds_are_inclusive_where_documented)
{
    ds_conf c = defaults();
    char err[DS_CONF_ERR_MAX] = "";
    cr_expect_eq(ds_conf_set(&c, "train.lr=10", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(ds_conf_set(&c, "train.weight_decay=1", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(ds_conf_set(&c, "train.weight_decay=0", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(ds_conf_set(&c, "train.momentum=0.999999", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(ds_conf_set(&c, "sparsify.density=1", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(ds_conf_set(&c, "gossip.weight=0.5", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(ds_conf_set(&c, "train.batch_size=1", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(ds_conf_set(&c, "train.batch_size=65536", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(ds_conf_set(&c, "gossip.timeout_ms=1", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(ds_conf_set(&c, "train.hidden=65536,1,1,1,1,1,1,1", err, sizeof(err)), 0, "%s",
                 err);
    cr_expect_eq(ds_conf_set(&c, "train.lr=1e-300", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(ds_conf_set(&c, "train.momentum=-0", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(signbit(c.train.momentum), 0, "-0 is stored as 0");
}

Test(conf, duplicate_key)
{
    expect_load_error("[train]\nlr = 0.1\n; again\nlr = 0.2\n", -EINVAL, 4,
                      "train.lr: duplicate key (first set at line 2)");
    /* A section may be opened twice; its keys still count once. */
    expect_load_error("[train]\nsteps = 5\n[node]\nname = a\n[train]\nsteps = 6\n", -EINVAL, 6,
                      "train.steps: duplicate key (first set at line 2)");
}

Test(conf, empty_value)
{
    expect_load_error("[train]\nlr =\n", -EINVAL, 2, "train.lr: empty value");
    expect_load_error("[train]\nhidden =   ; none\n", -EINVAL, 2, "train.hidden: empty value");
    expect_load_error("[node]\nname=\n", -EINVAL, 2, "node.name: empty value");
    /* Where empty means "off" it is a value. */
    const char *path = write_file("empty.ini",
                                  "[node]\ngroup =\n[cluster]\nseeds =\nkey_file=\n"
                                  "[status]\nlisten =\nfile =\n");
    ds_conf c = defaults();
    char err[DS_CONF_ERR_MAX] = "";
    cr_assert_eq(ds_conf_set(&c, "cluster.seeds=127.0.0.1:1", err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(ds_conf_set(&c, "node.group=g", err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(ds_conf_load(&c, path, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(c.cluster.seeds_count, 0);
    cr_expect_str_eq(c.node.group, "");
}

Test(conf, list_items_and_counts)
{
    expect_load_error("[train]\nhidden = 1,2,3,4,5,6,7,8,9\n", -EINVAL, 2,
                      "train.hidden: expected 1..8 comma-separated integers in 1..65536, "
                      "found '1,2,3,4,5,6,7,8,9' (9 items)");
    expect_load_error("[train]\nhidden = 64,,64\n", -EINVAL, 2,
                      "train.hidden: expected 1..8 comma-separated integers in 1..65536, "
                      "found '' (item 2)");
    expect_load_error("[train]\nhidden = 64,\n", -EINVAL, 2,
                      "train.hidden: expected 1..8 comma-separated integers in 1..65536, "
                      "found '' (item 2)");
    expect_load_error("[cluster]\nseeds = a:1,b:2,c:3,d:4,e:5,f:6,g:7,h:8,i:9,j:10,k:11,l:12,"
                      "m:13,n:14,o:15,p:16,q:17\n",
                      -EINVAL, 2,
                      "cluster.seeds: expected 0..16 comma-separated items, each " HP_WHAT
                      ", found 'a:1,b:2,c:3,d:4,e:5,f:6,g:7,h:8,i:9,j:10,k:11,l:12,m:13,n:14,o:1"
                      "...' (17 items)");
}

Test(conf, long_and_odd_text)
{
    char text[600], want[DS_CONF_ERR_MAX], x300[301];
    memset(x300, 'x', 300);
    x300[300] = '\0';
    snprintf(text, sizeof(text), "[node]\ndata_dir = %s\n", x300);
    snprintf(want, sizeof(want),
             "node.data_dir: expected at most 255 characters, found '%.64s...' (300 characters)",
             x300);
    expect_load_error(text, -EINVAL, 2, want);

    /* 255 characters fit. */
    char ok[300];
    snprintf(ok, sizeof(ok), "node.data_dir=%.255s", x300);
    ds_conf c = defaults();
    char err[DS_CONF_ERR_MAX] = "";
    cr_expect_eq(ds_conf_set(&c, ok, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(strlen(c.node.data_dir), 255);

    /* 64 characters is one too many for a name. */
    snprintf(text, sizeof(text), "[node]\nname = %.64s\n", x300);
    snprintf(want, sizeof(want), "node.name: expected " NAME_WHAT ", found '%.64s'", x300);
    expect_load_error(text, -EINVAL, 2, want);

    /* A value with " ;" could not be written back into an ini file. */
    cr_expect_eq(ds_conf_set(&c, "node.data_dir=a ;b", err, sizeof(err)), -EINVAL);
    cr_expect_str_eq(err, "--set node.data_dir=a ;b: node.data_dir: expected no ';' after a "
                          "blank (it starts a comment), found 'a ;b'");
    /* ...while a ';' inside a word is text (libfabric's "tcp;ofi_rxm"). */
    cr_expect_eq(ds_conf_set(&c, "node.data_dir=a;b", err, sizeof(err)), 0, "%s", err);
}

Test(conf, control_bytes_and_nul)
{
    static const char nul[] = "[node]\nname = a\0b\n";
    const char *path = write_file_n("nul.ini", nul, sizeof(nul) - 1);
    ds_conf c = defaults();
    char err[DS_CONF_ERR_MAX] = "";
    cr_expect_eq(ds_conf_load(&c, path, err, sizeof(err)), -EINVAL);
    cr_expect_str_eq(err, at(path, 2, "expected text, found a NUL byte"));
    expect_load_error("[node]\nname = a\x1b[2Jb\n", -EINVAL, 2,
                      "node.name: expected no control characters, found 'a\\x1b[2Jb'");
}

Test(conf, line_too_long)
{
    size_t n = DS_CONF_LINE_MAX + 20;
    char *text = malloc(n + 32);
    cr_assert_not_null(text);
    int o = sprintf(text, "[node]\ndata_dir = ");
    memset(text + o, 'y', n - (size_t)o);
    strcpy(text + n, "\n");
    char want[128];
    snprintf(want, sizeof(want), "line too long (%zu bytes; at most %d)", n - 7,
             DS_CONF_LINE_MAX);
    expect_load_error(text, -EINVAL, 2, want);
    free(text);
}

Test(conf, long_lines_within_the_limit_load_whole)
{
    /* inih's default line buffer is 200 bytes; longer lines must neither be
     * split nor cut. 16 seeds of 250 characters make a 4 KB line. */
    char *text = malloc(16 * 260 + 64), label[64];
    cr_assert_not_null(text);
    int o = sprintf(text, "[cluster]\nseeds = ");
    for (int i = 0; i < 16; i++) {
        /* hostnames of four 61-character labels plus ":7000" */
        memset(label, 'a' + i, 61);
        label[61] = '\0';
        o += sprintf(text + o, "%s%s.%s.%s.%s:7000", i ? ", " : "", label, label, label, label);
    }
    strcpy(text + o, "\n[train]\nsteps = 9\n");
    const char *path = write_file("long.ini", text);
    ds_conf c = defaults();
    char err[DS_CONF_ERR_MAX] = "";
    cr_assert_eq(ds_conf_load(&c, path, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(c.cluster.seeds_count, 16);
    cr_expect_eq(strlen(c.cluster.seeds[15]), 4 * 61 + 3 + 5);
    cr_expect_eq(c.cluster.seeds[15][0], 'p');
    cr_expect_eq(c.train.steps, 9);
    free(text);
}

Test(conf, line_of_exactly_the_limit)
{
    /* A comment line of DS_CONF_LINE_MAX bytes must reach inih whole: a
     * split would turn its tail into a syntax error on the next line. */
    char *text = malloc(DS_CONF_LINE_MAX + 64);
    cr_assert_not_null(text);
    text[0] = ';';
    memset(text + 1, 'c', DS_CONF_LINE_MAX - 1);
    strcpy(text + DS_CONF_LINE_MAX, "\n[train]\nlr = 0.3\n");
    const char *path = write_file("limit.ini", text);
    free(text);
    ds_conf c = defaults();
    char err[DS_CONF_ERR_MAX] = "";
    cr_assert_eq(ds_conf_load(&c, path, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(c.train.lr, 0.3);
}

Test(conf, missing_file)
{
    char path[128], err[DS_CONF_ERR_MAX] = "", want[256];
    snprintf(path, sizeof(path), "%s/no-such.ini", tmpdir);
    ds_conf c = defaults();
    cr_expect_eq(ds_conf_load(&c, path, err, sizeof(err)), -ENOENT);
    snprintf(want, sizeof(want), "%s: cannot open: No such file or directory", path);
    cr_expect_str_eq(err, want);
}

Test(conf, directory_is_not_a_file)
{
    char err[DS_CONF_ERR_MAX] = "", want[256];
    ds_conf c = defaults();
    cr_expect_eq(ds_conf_load(&c, tmpdir, err, sizeof(err)), -EISDIR);
    snprintf(want, sizeof(want), "%s: cannot open: Is a directory", tmpdir);
    cr_expect_str_eq(err, want);
}

Test(conf, fifo_is_refused_without_blocking)
{
    /* Before issue 16 the open waited for a writer; alarm() makes that a
     * crash rather than a hang. */
    char err[DS_CONF_ERR_MAX] = "", want[256], path[128];
    snprintf(path, sizeof(path), "%s/config.fifo", tmpdir);
    cr_assert_eq(mkfifo(path, 0600), 0, "mkfifo: %s", strerror(errno));
    ds_conf c = defaults();
    alarm(10);
    cr_expect_eq(ds_conf_load(&c, path, err, sizeof(err)), -EINVAL);
    alarm(0);
    snprintf(want, sizeof(want), "%s: cannot open: not a regular file (a FIFO)", path);
    cr_expect_str_eq(err, want);
}

Test(conf, unreadable_file)
{
    /* root reads a mode-000 file anyway (CI runs as root): the directory
     * test above covers an unreadable path there. */
    if (geteuid() == 0) {
        tmp_fini(); /* a skipped test does not run the suite's fini */
        cr_skip_test("running as root, which can read a mode-000 file");
    }
    const char *path = write_file("secret.ini", "[train]\nlr = 0.1\n");
    cr_assert_eq(chmod(path, 0), 0);
    char err[DS_CONF_ERR_MAX] = "", want[256];
    ds_conf c = defaults();
    cr_expect_eq(ds_conf_load(&c, path, err, sizeof(err)), -EACCES);
    snprintf(want, sizeof(want), "%s: cannot open: Permission denied", path);
    cr_expect_str_eq(err, want);
}

Test(conf, file_too_large)
{
    size_t n = DS_CONF_FILE_MAX + 1;
    char *text = malloc(n);
    cr_assert_not_null(text);
    memset(text, '\n', n);
    const char *path = write_file_n("big.ini", text, n);
    free(text);
    char err[DS_CONF_ERR_MAX] = "", want[256];
    ds_conf c = defaults();
    cr_expect_eq(ds_conf_load(&c, path, err, sizeof(err)), -EFBIG);
    snprintf(want, sizeof(want), "%s: cannot open: file larger than %d bytes", path,
             DS_CONF_FILE_MAX);
    cr_expect_str_eq(err, want);
}

Test(conf, syntax_errors)
{
    expect_load_error("[train]\nlr = 0.1\nthis line has no equals\n", -EINVAL, 3,
                      "syntax error: expected 'key = value', found 'this line has no equals'");
    expect_load_error("[train\nlr = 0.1\n", -EINVAL, 1,
                      "syntax error: expected ']' to close the section name, found '[train'");
    expect_load_error("[train] lr = 0.1\n", -EINVAL, 1,
                      "syntax error: expected nothing after ']', found 'lr = 0.1'");
    /* The first error in the file wins, whoever finds it. */
    expect_load_error("[train]\nbogus\nlr = 99\n", -EINVAL, 2,
                      "syntax error: expected 'key = value', found 'bogus'");
    expect_load_error("[train]\nlr = 99\nbogus\n", -EINVAL, 2,
                      "train.lr: expected a number in (0, 10], found '99'");
}

Test(conf, stops_at_first_error_and_changes_nothing)
{
    const char *path = write_file("first.ini", "[train]\nsteps = 5\nlr = -1\nbatch_size = 0\n");
    ds_conf c = defaults(), before = c;
    char err[DS_CONF_ERR_MAX] = "";
    cr_expect_eq(ds_conf_load(&c, path, err, sizeof(err)), -EINVAL);
    cr_expect_str_eq(err, at(path, 3, "train.lr: expected a number in (0, 10], found '-1'"));
    cr_expect_eq(memcmp(&c, &before, sizeof(c)), 0);
}

Test(conf, quoted_text_is_escaped_and_cut)
{
    char text[400], want[DS_CONF_ERR_MAX], v[201];
    memset(v, 'z', 200);
    v[200] = '\0';
    v[3] = '\'';
    snprintf(text, sizeof(text), "[train]\nbackend = %s\n", v);
    snprintf(want, sizeof(want),
             "train.backend: expected one of auto|cpu|cuda, found 'zzz\\'%.60s...'", v + 4);
    expect_load_error(text, -EINVAL, 2, want);
}

Test(conf, ini_syntax_accepted)
{
    /* BOM, CRLF, comments of both kinds, inline ';' comments, "key: value",
     * indentation (a key, not a continuation), blank lines. */
    const char *path = write_file("syntax.ini",
                                  "\xEF\xBB\xBF; leading comment\r\n"
                                  "# another\r\n"
                                  "\r\n"
                                  "[train]   ; the section\r\n"
                                  "  lr = 0.2 ; inline\r\n"
                                  "  steps: 12\r\n"
                                  "\tbatch_size=16\r\n"
                                  "    ; indented comment\r\n"
                                  "[node]\n"
                                  "name=n1");
    ds_conf c = defaults();
    char err[DS_CONF_ERR_MAX] = "";
    cr_assert_eq(ds_conf_load(&c, path, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(c.train.lr, 0.2);
    cr_expect_eq(c.train.steps, 12);
    cr_expect_eq(c.train.batch_size, 16);
    cr_expect_str_eq(c.node.name, "n1");
    /* An empty file is a valid (empty) config. */
    path = write_file("void.ini", "");
    ds_conf d = defaults(), e = defaults();
    cr_expect_eq(ds_conf_load(&d, path, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(memcmp(&d, &e, sizeof(d)), 0);
}

/* ---- --set ---------------------------------------------------------------- */

Test(conf, set_valid)
{
    ds_conf c = defaults();
    char err[DS_CONF_ERR_MAX] = "";
    cr_expect_eq(ds_conf_set(&c, "train.lr=0.125", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(c.train.lr, 0.125);
    cr_expect_eq(ds_conf_set(&c, "  gossip.timeout_ms =  750 ", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(c.gossip.timeout_ms, 750);
    cr_expect_eq(ds_conf_set(&c, "cluster.seeds=127.0.0.1:7001,127.0.0.2:7002", err, sizeof(err)),
                 0, "%s", err);
    cr_expect_eq(c.cluster.seeds_count, 2);
    cr_expect_str_eq(c.cluster.seeds[1], "127.0.0.2:7002");
    cr_expect_eq(ds_conf_set(&c, "cluster.seeds=", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(c.cluster.seeds_count, 0);
    cr_expect_str_eq(c.cluster.seeds[0], "", "cleared items are zeroed");
    /* Later --set of the same key wins (no duplicate rule on the command line). */
    cr_expect_eq(ds_conf_set(&c, "train.lr=0.5", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(c.train.lr, 0.5);
    cr_expect_eq(ds_conf_set(&c, "node.data_dir=a=b", err, sizeof(err)), 0, "%s", err);
    cr_expect_str_eq(c.node.data_dir, "a=b");
}

static void expect_set_error(const char *a, const char *msg)
{
    ds_conf c = defaults(), before = c;
    char err[DS_CONF_ERR_MAX] = "", want[DS_CONF_ERR_MAX];
    snprintf(want, sizeof(want), "--set %s: %s", esc(a), msg);
    cr_expect_eq(ds_conf_set(&c, a, err, sizeof(err)), -EINVAL, "%s", a);
    cr_expect_str_eq(err, want);
    cr_expect_eq(memcmp(&c, &before, sizeof(c)), 0);
}

Test(conf, set_errors)
{
    expect_set_error("train.lrr=0.1", "unknown key 'lrr' in [train]; did you mean 'lr'?");
    expect_set_error("train.method=topk", "unknown key 'method' in [train]; 'method' is in [sparsify]");
    expect_set_error("trian.lr=0.1", "unknown section [trian]; did you mean [train]?");
    expect_set_error("train.lr=fast", "train.lr: expected a number in (0, 10], found 'fast'");
    expect_set_error("train.lr=", "train.lr: empty value");
    expect_set_error("train.lr", "expected section.key=value, found no '='");
    expect_set_error("", "expected section.key=value, found no '='");
    expect_set_error("lr=0.1", "expected section.key before '=', found 'lr'; did you mean 'train.lr'?");
    expect_set_error("listen=1", "expected section.key before '=', found 'listen'");
    expect_set_error("=5", "expected section.key before '=', found ''");
    expect_set_error("train.=5", "expected section.key before '=', found 'train.'");
    expect_set_error("cluster.seeds=127.0.0.1:1,,127.0.0.1:2",
                     "cluster.seeds: expected 0..16 comma-separated items, each " HP_WHAT
                     ", found '' (item 2)");
}

Test(conf, set_long_assignment_is_cut_in_the_prefix)
{
    char a[400], err[DS_CONF_ERR_MAX] = "";
    snprintf(a, sizeof(a), "node.name=");
    memset(a + 10, 'n', 300);
    a[310] = '\0';
    ds_conf c = defaults();
    cr_expect_eq(ds_conf_set(&c, a, err, sizeof(err)), -EINVAL);
    char want[DS_CONF_ERR_MAX];
    snprintf(want, sizeof(want),
             "--set %.64s...: node.name: expected at most 255 characters, found '%.64s...' "
             "(300 characters)",
             a, a + 10);
    cr_expect_str_eq(err, want);
}

/* ---- dump -> load ------------------------------------------------------------ */

/* The dump of a configuration whose paths are resolved (as dsnode's are
 * before check-config prints them) loads back equal, from another
 * directory (tmpdir) than the one the paths were resolved against. */
static void round_trip(const ds_conf *in)
{
    char *text = NULL;
    size_t len = 0;
    ds_conf c = *in;
    char err[DS_CONF_ERR_MAX] = "";
    cr_assert_eq(ds_conf_resolve_paths(&c, err, sizeof(err)), 0, "%s", err);
    FILE *f = open_memstream(&text, &len);
    cr_assert_not_null(f);
    cr_assert_eq(ds_conf_dump(&c, f), 0);
    fclose(f);
    const char *path = write_file("dump.ini", text);
    ds_conf back = defaults();
    cr_assert_eq(ds_conf_load(&back, path, err, sizeof(err)), 0, "%s\n%s", err, text);
    cr_expect_eq(memcmp(&back, &c, sizeof(back)), 0, "dump did not load back equal:\n%s", text);
    free(text);
}

Test(conf, dump_round_trip_defaults)
{
    ds_conf c = defaults();
    round_trip(&c);
}

Test(conf, dump_round_trip_every_key_changed)
{
    ds_conf c = defaults();
    char a[512], err[DS_CONF_ERR_MAX] = "";
    for (size_t i = 0; i < NCASES; i++) {
        snprintf(a, sizeof(a), "%s=%s", cases[i].key, cases[i].good);
        cr_assert_eq(ds_conf_set(&c, a, err, sizeof(err)), 0, "%s", err);
    }
    round_trip(&c);
}

Test(conf, dump_round_trip_extremes)
{
    ds_conf c = defaults();
    char a[DS_CONF_LINE_MAX], err[DS_CONF_ERR_MAX] = "";
    static const char *const sets[] = {
        "train.lr=0.1", "train.lr=1e-300", "gossip.weight=0.1", "train.momentum=0.30000000000000004",
        "sparsify.threshold=1.7976931348623157e308", "sparsify.density=4.9e-324",
        "cluster.seed=9223372036854775807", "train.hidden=1,2,3,4,5,6,7,65536",
    };
    for (size_t i = 0; i < sizeof(sets) / sizeof(sets[0]); i++) {
        cr_assert_eq(ds_conf_set(&c, sets[i], err, sizeof(err)), 0, "%s", err);
        round_trip(&c);
    }
    /* Sixteen seeds of maximal length. */
    int o = sprintf(a, "cluster.seeds=");
    for (int i = 0; i < 16; i++) {
        char label[62];
        memset(label, 'a' + i, 61);
        label[61] = '\0';
        o += sprintf(a + o, "%s%s.%s.%s.%s:65535", i ? "," : "", label, label, label, label);
    }
    cr_assert_eq(ds_conf_set(&c, a, err, sizeof(err)), 0, "%s", err);
    char p[300];
    memset(p, 'p', 255);
    p[255] = '\0';
    snprintf(a, sizeof(a), "status.file=/%s", p + 1);
    cr_assert_eq(ds_conf_set(&c, a, err, sizeof(err)), 0, "%s", err);
    round_trip(&c);
}

/* A config with key set to choice i through --set; also_set (NULL or an
 * assignment) first. */
static ds_conf with_choice(const enum_key *k, size_t i, const char *also_set)
{
    ds_conf c = defaults();
    char a[256], err[DS_CONF_ERR_MAX] = "";
    if (also_set)
        cr_assert_eq(ds_conf_set(&c, also_set, err, sizeof(err)), 0, "%s: %s", also_set, err);
    snprintf(a, sizeof(a), "%s=%s", k->key, k->names[i]);
    cr_assert_eq(ds_conf_set(&c, a, err, sizeof(err)), 0, "%s: %s", a, err);
    cr_assert_eq(k->get(&c), k->values[i], "%s", a);
    return c;
}

Test(conf, enum_lists_are_well_formed)
{
    cr_assert_gt(NENUM, 0);
    for (size_t e = 0; e < NENUM; e++) {
        const enum_key *k = &enum_keys[e];
        cr_expect_gt(k->n, 0, "%s has no choices", k->key);
        for (size_t i = 0; i < k->n; i++) {
            const char *n = k->names[i];
            /* Written in the list's spelling by the dump, matched in any
             * case by the loader, joined with '|' in the help and errors. */
            cr_expect(n[0] != '\0', "%s: choice %zu has no name", k->key, i);
            for (const char *p = n; *p; p++)
                cr_expect((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_',
                          "%s: choice '%s' is not lower-case [a-z0-9_]", k->key, n);
            for (size_t j = 0; j < i; j++) {
                cr_expect(strcasecmp(n, k->names[j]) != 0, "%s: '%s' twice", k->key, n);
                cr_expect_neq(k->values[i], k->values[j], "%s: '%s' and '%s' share a value",
                              k->key, n, k->names[j]);
            }
        }
    }
}

Test(conf, enum_choices_in_help_and_errors)
{
    /* The help's constraint column and the error's "one of" list every
     * choice of the list, in its order. */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_not_null(f);
    ds_conf_help(f);
    fclose(f);
    for (size_t e = 0; e < NENUM; e++) {
        const enum_key *k = &enum_keys[e];
        char joined[512] = "", line_start[64], a[128], want[DS_CONF_ERR_MAX];
        char err[DS_CONF_ERR_MAX] = "";
        for (size_t i = 0; i < k->n; i++)
            snprintf(joined + strlen(joined), sizeof(joined) - strlen(joined), "%s%s",
                     i ? "|" : "", k->names[i]);
        snprintf(line_start, sizeof(line_start), "\n%s ", k->key);
        const char *line = strstr(text, line_start);
        cr_assert_not_null(line, "%s not in the help", k->key);
        const char *eol = strchr(line + 1, '\n');
        char field[600];
        snprintf(field, sizeof(field), " %s ", joined);
        const char *at_ = strstr(line, field);
        cr_expect(at_ && (!eol || at_ < eol), "%s: help does not show %s", k->key, joined);
        ds_conf c = defaults();
        snprintf(a, sizeof(a), "%s=no-such-choice", k->key);
        cr_expect_eq(ds_conf_set(&c, a, err, sizeof(err)), -EINVAL);
        snprintf(want, sizeof(want), "--set %s: %s: expected one of %s, found 'no-such-choice'", a,
                 k->key, joined);
        cr_expect_str_eq(err, want);
    }
    free(text);
}

Test(conf, dump_round_trip_every_choice)
{
    for (size_t e = 0; e < NENUM; e++)
        for (size_t i = 0; i < enum_keys[e].n; i++) {
            ds_conf c = with_choice(&enum_keys[e], i, NULL);
            cr_expect_str_eq(dumped(&c, enum_keys[e].key), enum_keys[e].names[i]);
            round_trip(&c);
        }
}

Test(conf, dump_of_an_enum_value_outside_its_list)
{
    ds_conf c = defaults();
    c.gossip.topology = (enum ds_topo_kind)99;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_not_null(f);
    cr_expect_eq(ds_conf_dump(&c, f), -EINVAL);
    fclose(f);
    /* Said in a way the loader refuses too; the other keys are all there. */
    cr_expect_not_null(strstr(text, "\n[gossip]\ntopology = <corrupt value>\nmix = pairwise\n"),
                       "%s", text);
    free(text);
}

/* ---- check ------------------------------------------------------------------- */

static void expect_check(const ds_conf *c, const char *msg)
{
    char err[DS_CONF_ERR_MAX] = "";
    if (!msg) {
        cr_expect_eq(ds_conf_check(c, err, sizeof(err)), 0, "%s", err);
        return;
    }
    cr_expect_eq(ds_conf_check(c, err, sizeof(err)), -EINVAL);
    cr_expect_str_eq(err, msg);
}

static ds_conf with(const char *const *sets)
{
    ds_conf c = defaults();
    char err[DS_CONF_ERR_MAX] = "";
    for (; *sets; sets++)
        cr_assert_eq(ds_conf_set(&c, *sets, err, sizeof(err)), 0, "%s: %s", *sets, err);
    return c;
}

Test(conf, cross_key_crossover_is_dense_only)
{
    ds_conf c = with((const char *const[]){"gossip.mix=crossover", NULL});
    expect_check(&c, "gossip.mix = crossover requires sparsify.method = none (crossover mixing "
                     "is dense only), found sparsify.method = micro");
    c = with((const char *const[]){"gossip.mix=crossover", "sparsify.method=none", NULL});
    expect_check(&c, NULL);
}

Test(conf, cross_key_value_format_needs_gossip)
{
    ds_conf c = with((const char *const[]){"gossip.topology=allreduce", "sparsify.value_format=f16",
                                           NULL});
    expect_check(&c, "sparsify.value_format = f16 requires a gossip topology (the allreduce "
                     "baseline sends f32), found gossip.topology = allreduce");
    c = with((const char *const[]){"gossip.topology=allreduce", NULL});
    expect_check(&c, NULL);
    c = with((const char *const[]){"sparsify.value_format=bf16", NULL});
    expect_check(&c, NULL);
}

Test(conf, cross_key_groups_gossip_between_them)
{
    ds_conf c = with((const char *const[]){"node.group=hostA", "gossip.topology=allreduce", NULL});
    expect_check(&c, "node.group = hostA requires a gossip topology between the groups, found "
                     "gossip.topology = allreduce (every node all-reduces already; leave "
                     "node.group empty)");
    c = with((const char *const[]){"node.group=auto", NULL});
    expect_check(&c, NULL);
}

Test(conf, cross_key_group_overlap_dense)
{
    ds_conf c = with((const char *const[]){"node.group=g0", "group.overlap=true",
                                           "group.sparsify=micro", NULL});
    expect_check(&c, "group.overlap = true requires group.sparsify = none (the layers' "
                     "reductions are dense), found group.sparsify = micro");
    /* auto picks each layer's algorithm from a cost model (rounds.c) */
    c = with((const char *const[]){"node.group=g0", "group.overlap=true", "group.allreduce=auto",
                                   NULL});
    expect_check(&c, NULL);
    c = with((const char *const[]){"node.group=g0", "group.overlap=true", "group.allreduce=ring",
                                   NULL});
    expect_check(&c, NULL);
}

Test(conf, cross_key_plaintext_only_on_loopback)
{
    ds_conf c = with((const char *const[]){"security.mode=none", "node.listen=10.1.2.3:7000", NULL});
    expect_check(&c, "security.mode = none requires loopback addresses only (127.0.0.0/8, ::1 or "
                     "localhost), found node.listen = 10.1.2.3:7000");
    c = with((const char *const[]){"security.mode=none",
                                   "cluster.seeds=127.0.0.1:7000, host1:7000", NULL});
    expect_check(&c, "security.mode = none requires loopback addresses only (127.0.0.0/8, ::1 or "
                     "localhost), found cluster.seeds = host1:7000");
    c = with((const char *const[]){"security.mode=none", "node.listen=128.0.0.1:7000", NULL});
    expect_check(&c, "security.mode = none requires loopback addresses only (127.0.0.0/8, ::1 or "
                     "localhost), found node.listen = 128.0.0.1:7000");
    c = with((const char *const[]){"security.mode=none", "node.listen=LocalHost:7000",
                                   "cluster.seeds=127.255.0.9:1,localhost:2", NULL});
    expect_check(&c, NULL);
    c = with((const char *const[]){"security.mode=none", "node.advertise=[2001:db8::1]:7000",
                                   NULL});
    expect_check(&c, "security.mode = none requires loopback addresses only (127.0.0.0/8, ::1 or "
                     "localhost), found node.advertise = [2001:db8::1]:7000");
    c = with((const char *const[]){"security.mode=none", "node.listen=[::1]:7000",
                                   "node.advertise=[::1]:7001", NULL});
    expect_check(&c, NULL);
    /* Any address is fine once messages are protected. */
    c = with((const char *const[]){"security.mode=auth", "node.listen=10.1.2.3:7000", NULL});
    expect_check(&c, NULL);
}

Test(conf, cross_key_advertise_not_wildcard)
{
    ds_conf c = with((const char *const[]){"node.advertise=0.0.0.0:7000", NULL});
    expect_check(&c, "node.advertise: expected an address peers can dial, found the wildcard "
                     "address '0.0.0.0:7000'");
    c = with((const char *const[]){"node.advertise=[::]:7000", NULL});
    expect_check(&c, "node.advertise: expected an address peers can dial, found the wildcard "
                     "address '[::]:7000'");
    c = with((const char *const[]){"node.listen=0.0.0.0:7000", "node.advertise=10.0.0.5:7000",
                                   NULL});
    expect_check(&c, NULL);
}

Test(conf, cross_key_nesterov_needs_momentum)
{
    ds_conf c = with((const char *const[]){"train.nesterov=true", "train.momentum=0", NULL});
    expect_check(&c, "train.nesterov = true requires train.momentum > 0, found train.momentum = 0");
    c = with((const char *const[]){"train.nesterov=true", "train.momentum=0.5", NULL});
    expect_check(&c, NULL);
    c = with((const char *const[]){"train.nesterov=false", "train.momentum=0", NULL});
    expect_check(&c, NULL);
}

Test(conf, cross_key_model_and_layers)
{
    ds_conf c = with((const char *const[]){"train.model=custom", NULL});
    expect_check(&c, "train.model = custom requires train.layers (a layer list), found it empty");
    c = with((const char *const[]){"train.model=custom", "train.layers=flatten, linear:10", NULL});
    expect_check(&c, NULL);
    c = with((const char *const[]){"train.model=cnn", "train.layers=flatten, linear:10", NULL});
    expect_check(&c, "train.layers applies to train.model = custom only, found train.model = cnn "
                     "and train.layers = 'flatten, linear:10'");
    c = with((const char *const[]){"train.layers=flatten, linear:10", NULL});
    expect_check(&c, "train.layers applies to train.model = custom only, found train.model = mlp "
                     "and train.layers = 'flatten, linear:10'");
    c = with((const char *const[]){"train.model=cnn", NULL});
    expect_check(&c, NULL);
    c = with((const char *const[]){"train.model=cnn", "train.hidden=128", NULL});
    expect_check(&c, "train.hidden applies to train.model = mlp only (leave it at 256, 256), found "
                     "train.model = cnn");
    c = with((const char *const[]){"train.model=custom", "train.hidden=256,256",
                                   "train.layers=flatten, linear:10", NULL});
    expect_check(&c, NULL);
}

Test(conf, layers_errors_name_the_item_and_line)
{
    /* Shapes are checked when the value is read: the line is known. */
    expect_load_error("[train]\nmodel = custom\nlayers = flatten, conv3x3:8, linear:10\n", -EINVAL, 3,
                      "train.layers: expected conv before flatten (conv needs an image), found "
                      "'conv3x3:8' (layer 2)");
    expect_load_error("[train]\nlayers = conv3x3:8, relu, flatten, linear:7\n", -EINVAL, 2,
                      "train.layers: expected the last layer to be linear:10 (one output per "
                      "class), found 'linear:7' (layer 4)");
    expect_load_error("[train]\nlayers = conv2x2:8, flatten, linear:10\n", -EINVAL, 2,
                      "train.layers: expected a square kernel of odd size, conv<K>x<K> with K in "
                      "1, 3, 5, 7, 9, found 'conv2x2:8' (layer 1)");
    expect_load_error("[train]\nlayers = maxpool2, maxpool2, maxpool2, maxpool2, maxpool2, flatten, "
                      "linear:10\n",
                      -EINVAL, 2,
                      "train.layers: expected maxpool2 on an image of at least 2x2 (its input here "
                      "is 1x1x1), found 'maxpool2' (layer 5)");
    ds_conf c = defaults();
    char err[DS_CONF_ERR_MAX];
    cr_expect_eq(ds_conf_set(&c, "train.layers=linear:10", err, sizeof(err)), -EINVAL);
    cr_expect_str_eq(err, "--set train.layers=linear:10: train.layers: expected flatten before "
                          "linear (linear needs a vector), found 'linear:10' (layer 1)");
}

/* ---- issue 16: bounds ----------------------------------------------------------- */

Test(conf, warmup_at_most_steps)
{
    ds_conf c = with((const char *const[]){"train.steps=100", "train.warmup_steps=101", NULL});
    expect_check(&c, "train.warmup_steps: expected at most train.steps (100), found 101");
    c = with((const char *const[]){"train.warmup_steps=9223372036854775807", NULL});
    expect_check(&c, "train.warmup_steps: expected at most train.steps (3000), found "
                     "9223372036854775807");
    c = with((const char *const[]){"train.steps=100", "train.warmup_steps=100", NULL});
    expect_check(&c, NULL);
}

Test(conf, segments_static_bound)
{
    /* 1e9 and 2^63-1 are refused where they are written, naming the key. */
    static const char *const bad[] = {"1000000000", "9223372036854775807", "65537"};
    char text[256], want[256], err[DS_CONF_ERR_MAX] = "";
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(text, sizeof(text), "[gossip]\n\nsegments = %s\n", bad[i]);
        const char *path = write_file("segments.ini", text);
        ds_conf c = defaults();
        cr_expect_eq(ds_conf_load(&c, path, err, sizeof(err)), -EINVAL, "%s", bad[i]);
        snprintf(want, sizeof(want),
                 "gossip.segments: expected an integer in 0..65536, found '%s'", bad[i]);
        cr_expect_str_eq(err, at(path, 3, want));
    }
    ds_conf c = with((const char *const[]){"gossip.segments=65536", NULL});
    expect_check(&c, NULL);
    c = defaults();
    c.gossip.segments = INT64_MAX; /* set by code: the check catches it too */
    expect_check(&c, "gossip.segments: expected an integer in 0..65536, found "
                     "'9223372036854775807'");
}

Test(conf, check_validates_fields_set_by_code)
{
    ds_conf c = defaults();
    c.train.lr = NAN;
    expect_check(&c, "train.lr: expected a number in (0, 10], found 'nan'");
    c = defaults();
    c.gossip.timeout_ms = 0;
    expect_check(&c, "gossip.timeout_ms: expected an integer in 1..600000, found '0'");
    c = defaults();
    c.train.backend = (enum ds_ops_backend)7; /* not a value of the list */
    expect_check(&c, "train.backend: expected one of auto|cpu|cuda, found '7'");
    c = defaults();
    c.security.mode = (enum ds_sec_mode)-1;
    expect_check(&c, "security.mode: expected one of encrypt|auth|none, found '-1'");
    c = defaults();
    strcpy(c.node.data_dir, "/tmp/x ");
    expect_check(&c, "node.data_dir: expected a non-empty path, found '/tmp/x ' (not in canonical form)");
    c = defaults();
    memset(c.node.name, 'a', sizeof(c.node.name));
    expect_check(&c, "node.name: corrupt value (unterminated text or bad count)");
    c = defaults();
    c.train.hidden_count = 17;
    expect_check(&c, "train.hidden: corrupt value (unterminated text or bad count)");
    c = defaults();
    c.train.hidden_count = 0;
    expect_check(&c, "train.hidden: empty value");
    c = defaults();
    strcpy(c.cluster.seeds[0], "nope");
    c.cluster.seeds_count = 1;
    expect_check(&c, "cluster.seeds: expected " HP_WHAT ", found 'nope' (item 1)");
}


/* ---- issue 16: relative paths ---------------------------------------------------- */

static const char *const rel_ini = "[node]\n"
                                   "data_dir = out\n"
                                   "[cluster]\n"
                                   "key_file = ./keys/c.key\n"
                                   "identity_file = /etc/dsnode/id.key\n"
                                   "allowed_keys = .\n"
                                   "[train]\n"
                                   "dataset_dir = ../data\n"
                                   "[status]\n"
                                   "file =\n";

static void expect_resolved(const ds_conf *c, const char *dir)
{
    char want[PATH_MAX + 64];
    snprintf(want, sizeof(want), "%s/out", dir);
    cr_expect_str_eq(c->node.data_dir, want);
    snprintf(want, sizeof(want), "%s/keys/c.key", dir);
    cr_expect_str_eq(c->cluster.key_file, want, "a leading ./ is dropped");
    cr_expect_str_eq(c->cluster.identity_file, "/etc/dsnode/id.key", "absolute: kept");
    cr_expect_str_eq(c->cluster.allowed_keys, dir, ". is the directory itself");
    snprintf(want, sizeof(want), "%s/../data", dir);
    cr_expect_str_eq(c->train.dataset_dir, want, ".. is kept for the kernel to follow");
    cr_expect_str_eq(c->status.file, "", "empty: off, kept");
    /* Keys that are not paths are never touched. */
    cr_expect_str_eq(c->node.name, "node0");
}

Test(conf, relative_paths_resolve_against_the_config_files_directory)
{
    char sub[PATH_MAX], dir[PATH_MAX], err[DS_CONF_ERR_MAX] = "", cwd[PATH_MAX];
    snprintf(sub, sizeof(sub), "%s/sub", tmpdir);
    cr_assert_eq(mkdir(sub, 0755), 0);
    const char *path = write_file("sub/rel.ini", rel_ini);
    cr_assert_not_null(realpath(sub, dir));
    cr_assert_not_null(getcwd(cwd, sizeof(cwd)));

    ds_conf c = defaults();
    cr_assert_eq(ds_conf_load(&c, path, err, sizeof(err)), 0, "%s", err);
    expect_resolved(&c, dir);

    /* The same file named relatively from elsewhere: the same paths. */
    cr_assert_eq(chdir(tmpdir), 0);
    ds_conf d = defaults();
    cr_assert_eq(ds_conf_load(&d, "sub/rel.ini", err, sizeof(err)), 0, "%s", err);
    expect_resolved(&d, dir);
    cr_assert_eq(chdir(sub), 0);
    d = defaults();
    cr_assert_eq(ds_conf_load(&d, "rel.ini", err, sizeof(err)), 0, "%s", err);
    expect_resolved(&d, dir);
    cr_assert_eq(chdir(cwd), 0);
    cr_expect_eq(memcmp(&c, &d, sizeof(c)), 0);

    /* Resolved values are absolute: nothing is left for the working
     * directory, and the check passes. */
    cr_expect_eq(ds_conf_resolve_paths(&d, err, sizeof(err)), 0, "%s", err);
    snprintf(err, sizeof(err), "%s", d.node.data_dir);
    cr_expect_str_neq(err, ".");
}

Test(conf, defaults_and_set_resolve_against_the_working_directory)
{
    char cwd[PATH_MAX], want[PATH_MAX + 64], err[DS_CONF_ERR_MAX] = "";
    cr_assert_eq(chdir(tmpdir), 0);
    cr_assert_not_null(getcwd(cwd, sizeof(cwd)));
    ds_conf c = with((const char *const[]){"status.file=./st.json", "cluster.key_file=k/c.key",
                                           "train.dataset_dir=/data/fmnist", NULL});
    /* ds_conf_set keeps what it is given; the resolution is one step. */
    cr_expect_str_eq(c.status.file, "./st.json");
    cr_expect_eq(ds_conf_resolve_paths(&c, err, sizeof(err)), 0, "%s", err);
    cr_expect_str_eq(c.node.data_dir, cwd, "the default '.' is the working directory");
    snprintf(want, sizeof(want), "%s/st.json", cwd);
    cr_expect_str_eq(c.status.file, want);
    snprintf(want, sizeof(want), "%s/k/c.key", cwd);
    cr_expect_str_eq(c.cluster.key_file, want);
    cr_expect_str_eq(c.train.dataset_dir, "/data/fmnist");
    cr_expect_str_eq(c.cluster.identity_file, "");
    ds_conf again = c;
    cr_expect_eq(ds_conf_resolve_paths(&again, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(memcmp(&c, &again, sizeof(c)), 0, "resolving twice changes nothing");
    cr_expect_eq(ds_conf_check(&c, err, sizeof(err)), 0, "%s", err);
}

Test(conf, relative_path_too_long_once_resolved)
{
    /* 250 characters fit the key as written, not behind the directory. */
    char name[251], text[400], want[PATH_MAX + 512], dir[PATH_MAX], err[DS_CONF_ERR_MAX] = "";
    memset(name, 'd', 250);
    name[250] = '\0';
    snprintf(text, sizeof(text), "[node]\nname = x\ndata_dir = %s\n", name);
    const char *path = write_file("long.ini", text);
    cr_assert_not_null(realpath(tmpdir, dir));
    ds_conf c = defaults(), before = c;
    cr_expect_eq(ds_conf_load(&c, path, err, sizeof(err)), -EINVAL);
    snprintf(want, sizeof(want), "%s:3: node.data_dir: expected at most 255 characters, found '%s/",
             path, dir);
    cr_expect(!strncmp(err, want, strlen(want)), "%s", err);
    cr_expect(strstr(err, "(a relative path, resolved against the config file's directory)"),
              "%s", err);
    cr_expect_eq(memcmp(&c, &before, sizeof(c)), 0, "a failed load changed the config");

    /* The same through --set, against the working directory. */
    cr_assert_eq(chdir(tmpdir), 0);
    snprintf(text, sizeof(text), "node.data_dir=%s", name);
    c = with((const char *const[]){text, NULL});
    before = c;
    cr_expect_eq(ds_conf_resolve_paths(&c, err, sizeof(err)), -EINVAL);
    cr_expect(!strncmp(err, "node.data_dir: expected at most 255 characters", 46), "%s", err);
    cr_expect(strstr(err, "(a relative path, resolved against the working directory)"), "%s",
              err);
    cr_expect_eq(memcmp(&c, &before, sizeof(c)), 0);
}

/* ---- help and examples --------------------------------------------------------- */

Test(conf, help_has_one_line_per_key)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_not_null(f);
    ds_conf_help(f);
    fclose(f);
    size_t lines = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cr_assert_lt(lines, NALL);
        size_t kn = strlen(all_keys[lines]);
        cr_expect(!strncmp(line, all_keys[lines], kn) && line[kn] == ' ', "line %zu: %s", lines,
                  line);
        lines++;
    }
    cr_expect_eq(lines, NALL);
    free(text);
}

static void expect_example(const char *name, void (*more)(const ds_conf *))
{
    char path[512], err[DS_CONF_ERR_MAX] = "";
    snprintf(path, sizeof(path), "%s/%s", DS_CONF_EXAMPLES_DIR, name);
    ds_conf c = defaults();
    cr_assert_eq(ds_conf_load(&c, path, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(ds_conf_check(&c, err, sizeof(err)), 0, "%s: %s", name, err);
    round_trip(&c);
    if (more)
        more(&c);
}

static void single_more(const ds_conf *c)
{
    cr_expect_eq(c->train.backend, DS_OPS_CPU);
    cr_expect_eq(c->train.steps, 3000);
    cr_expect_eq(c->cluster.seeds_count, 0);
}

static void cluster_more(const ds_conf *c)
{
    cr_expect_eq(c->gossip.topology, DS_TOPO_CROSSOVER);
    cr_expect_eq(c->sparsify.method, DS_SPARSIFY_MICRO);
    cr_expect_eq(c->sparsify.density, 0.01);
    cr_expect_gt(c->cluster.seeds_count, 0);
}

static void cnn_more(const ds_conf *c)
{
    cr_expect_eq(c->train.model, DS_MODEL_CNN);
    cr_expect_eq(c->train.lr, 0.03);
    cr_expect_eq(c->train.warmup_steps, 100);
    cr_expect_eq(c->train.steps, 3000);
    cr_expect_eq(c->cluster.seeds_count, 0);
}

static void hier_more(const ds_conf *c)
{
    cr_expect_neq(c->node.group[0], '\0', "hier.ini sets a group");
}

Test(conf, example_single) { expect_example("single.ini", single_more); }
Test(conf, example_cluster) { expect_example("cluster.ini", cluster_more); }
Test(conf, example_hier) { expect_example("hier.ini", hier_more); }
Test(conf, example_cnn) { expect_example("cnn.ini", cnn_more); }

/* train.device = auto|N: what else is refused (how auto resolves:
 * tests/test_conf_choices.c). */
Test(conf, train_device_auto_and_indices)
{
    int d = 7;
    cr_assert_eq(ds_conf_device("auto", &d), 0);
    cr_assert_eq(d, DS_CONF_DEVICE_AUTO);
    cr_assert_eq(ds_conf_device("0", &d), 0);
    cr_assert_eq(d, 0);
    cr_assert_eq(ds_conf_device("1023", &d), 0);
    cr_assert_eq(d, 1023);
    const char *bad[] = {"", "-1", "1024", "01024", "cuda:0", "Auto", "1.5", "99999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(ds_conf_device(bad[i], &d), -EINVAL, "'%s'", bad[i]);
        if (!bad[i][0])
            continue; /* an empty value has its own message */
        char err[512], set[64];
        ds_conf c;
        ds_conf_defaults(&c);
        snprintf(set, sizeof(set), "train.device=%s", bad[i]);
        cr_assert_neq(ds_conf_set(&c, set, err, sizeof(err)), 0, "'%s' accepted", bad[i]);
        cr_assert_not_null(strstr(err, "train.device: expected auto or a device index in 0..1023"),
                           "%s", err);
    }
}
