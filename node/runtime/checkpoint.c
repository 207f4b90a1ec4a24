/*
 * node/runtime/checkpoint.c: checkpoint.bin, written and read (the format
 * and what it holds: checkpoint.h).
 *
 * The whole file is built in memory (a few MB for the models we train),
 * then written in one go; it is read whole too, and every check (magic,
 * version, length, CRC, config, shapes) passes before any state changes.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "base/log.h"
#include "base/rng.h"
#include "node/runtime/checkpoint.h"
#include "node/runtime/engine_impl.h"

/* ---- the config keys that must match ---------------------------------------- */

static const char *const must_match[] = {
    "cluster.seed", "train.model", "train.hidden", "train.layers",
    "train.batch_size", "train.lr", "train.momentum", "train.weight_decay", "train.nesterov",
    "train.lr_schedule", "train.warmup_steps", "train.steps", "sparsify.method",
    "sparsify.error_feedback", "gossip.segments", "gossip.mix",
};

static int wanted(const ds_conf *c, const char *key)
{
    if (!strcmp(key, "train.steps") && c->train.lr_schedule != DS_LR_COSINE)
        return 0; /* a constant rate does not depend on the run's length */
    for (size_t i = 0; i < sizeof(must_match) / sizeof(must_match[0]); i++)
        if (!strcmp(key, must_match[i]))
            return 1;
    return 0;
}

int ds_ckpt_conf_text(const ds_conf *c, char *out, size_t cap)
{
    char *dump = NULL;
    size_t dump_len = 0;
    FILE *f = open_memstream(&dump, &dump_len);
    if (!f)
        return -ENOMEM;
    const int de = ds_conf_dump(c, f);
    fclose(f);
    if (de < 0) {
        free(dump);
        return de;
    }
    char section[64] = "";
    size_t n = 0;
    int e = 0;
    for (char *save = NULL, *l = strtok_r(dump, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (l[0] == '[') {
            snprintf(section, sizeof(section), "%.*s", (int)strcspn(l + 1, "]"), l + 1);
            continue;
        }
        if (l[0] == '#' || !l[0])
            continue;
        char key[160];
        snprintf(key, sizeof(key), "%s.%.*s", section, (int)strcspn(l, " ="), l);
        if (!wanted(c, key))
            continue;
        const char *v = strchr(l, '=');
        v = v ? v + 1 : "";
        while (*v == ' ')
            v++;
        const int w = snprintf(out + n, n < cap ? cap - n : 0, "%s = %s\n", key, v);
        if (w < 0 || (size_t)w >= (n < cap ? cap - n : 0)) {
            e = -ENOBUFS;
            break;
        }
        n += (size_t)w;
    }
    free(dump);
    return e < 0 ? e : (int)n;
}

/* The first key whose line differs between two conf texts, for the error:
 * "train.lr = 0.1 here, train.lr = 0.05 in the checkpoint". */
static void conf_diff(const char *now, const char *then, size_t then_len, char *out, size_t cap)
{
    char *old = strndup(then, then_len);
    if (!old) {
        snprintf(out, cap, "the config keys differ");
        return;
    }
    snprintf(out, cap, "the config keys differ");
    for (char *save = NULL, *l = strtok_r(old, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        const size_t klen = strcspn(l, " ");
        const char *p = now;
        const char *found = NULL;
        while (*p) {
            const size_t ll = strcspn(p, "\n");
            if (ll > klen && !strncmp(p, l, klen) && p[klen] == ' ') {
                found = p;
                if (ll != strlen(l) || strncmp(p, l, ll))
                    snprintf(out, cap, "%.*s here, %s in the checkpoint", (int)ll, p, l);
                break;
            }
            p += ll + (p[ll] == '\n');
        }
        if (!found)
            snprintf(out, cap, "%s in the checkpoint, unknown here", l);
        if (strcmp(out, "the config keys differ"))
            break;
    }
    free(old);
}

/* ---- writing ------------------------------------------------------------------ */

static int write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        const ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int fsync_dir(const char *dir)
{
    const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    const int e = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return e;
}

int ds_ckpt_write_atomic(const char *dir, const char *name, const void *hdr, size_t hdr_len,
                         const void *body, size_t body_len, char *err, size_t err_len)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        const int e = -errno;
        snprintf(err, err_len, "%s: cannot create: %s", dir, strerror(-e));
        return e;
    }
    int e = 0;
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        e = -errno;
        snprintf(err, err_len, "%s: cannot write: %s", tmp, strerror(-e));
        return e;
    }
    e = write_all(fd, hdr, hdr_len);
    if (!e)
        e = write_all(fd, body, body_len);
    if (!e && fsync(fd) < 0)
        e = -errno;
    if (close(fd) < 0 && !e)
        e = -errno;
    if (e < 0) {
        snprintf(err, err_len, "%s: cannot write: %s", tmp, strerror(-e));
        unlink(tmp);
    } else if (rename(tmp, path) < 0) {
        e = -errno;
        snprintf(err, err_len, "%s: cannot rename to %s: %s", tmp, path, strerror(-e));
        unlink(tmp);
    } else if ((e = fsync_dir(dir)) < 0) {
        snprintf(err, err_len, "%s: cannot flush the directory: %s", dir, strerror(-e));
    }
    return e;
}

/* A cursor over a byte buffer; host order (little-endian, x86-64). */
typedef struct cur {
    uint8_t *p;
    size_t n, at;
    int short_; /* a read ran past the end */
} cur;

static void put(cur *w, const void *v, size_t n)
{
    memcpy(w->p + w->at, v, n);
    w->at += n;
}

static void put64(cur *w, uint64_t v)
{
    put(w, &v, 8);
}

static void put32(cur *w, uint32_t v)
{
    put(w, &v, 4);
}

static void section(cur *w, const char tag[4], uint64_t len)
{
    put(w, tag, 4);
    put32(w, 0);
    put64(w, len);
}

#define SP_STATE_BYTES 56u

static void put_sp(cur *w, const ds_sparsify_state *s)
{
    put64(w, s->rng);
    put32(w, (uint32_t)s->started);
    put(w, &s->delta, 4);
    put(w, &s->mean_prev, 8);
    put(w, &s->micro_ratio, 8);
    put32(w, (uint32_t)s->micro_fed);
    put32(w, 0);
    put64(w, s->micro_group_count);
    put64(w, s->micro_k_group);
}

static uint64_t sec_parm(size_t n)
{
    return 16 + 4 * (uint64_t)n;
}

static uint64_t sec_gosp(size_t n, int n_seg)
{
    return 32 + 8 * (uint64_t)n + (uint64_t)n_seg * (8 + SP_STATE_BYTES);
}

int ds_ckpt_write_model(const char *dir, const float *host, size_t n, char *err, size_t err_len)
{
    uint8_t hdr[16] = "DSMODEL1";
    for (int i = 0; i < 8; i++)
        hdr[8 + i] = (uint8_t)((uint64_t)n >> (8 * i));
    /* The file is little-endian float32, as this host (x86-64; wire.h pins
     * the byte order for the whole node). */
    return ds_ckpt_write_atomic(dir, "model.bin", hdr, sizeof(hdr), host, n * sizeof(float), err,
                                err_len);
}

int ds_ckpt_save(ds_engine *e, int64_t step, const void *prog, size_t prog_len, char *err,
                 size_t err_len)
{
    const ds_conf *c = e->c;
    char conf[4096];
    const int clen = ds_ckpt_conf_text(c, conf, sizeof(conf));
    if (clen < 0) {
        snprintf(err, err_len, "cannot list the config keys: %s", strerror(-clen));
        return clen;
    }
    if (prog_len && !prog) {
        snprintf(err, err_len, "the program's state is NULL with %zu bytes", prog_len);
        return -EINVAL;
    }
    int r;
    if (e->p.pull && (r = e->p.pull(e->p.ctx, DS_ENGINE_PARAMS)) < 0) {
        snprintf(err, err_len, "parameters not read from the device: %s", strerror(-r));
        return r;
    }
    const size_t n = e->p.n;
    const int n_seg = ds_gossip_n_segments(e->gossip);
    const uint64_t body_len = 16 + (uint64_t)clen + 16 + sec_parm(n) + 16 + sec_gosp(n, n_seg) +
                              16 + (uint64_t)prog_len;
    cur w = {.p = malloc(body_len), .n = body_len};
    if (!w.p) {
        snprintf(err, err_len, "out of memory (%llu bytes)", (unsigned long long)body_len);
        return -ENOMEM;
    }
    section(&w, "CONF", (uint64_t)clen);
    put(&w, conf, (size_t)clen);

    section(&w, "PARM", sec_parm(n));
    put64(&w, (uint64_t)step);
    put64(&w, n);
    put(&w, e->p.params, n * sizeof(float));

    section(&w, "GOSP", sec_gosp(n, n_seg));
    put64(&w, e->round0);
    put64(&w, e->round0 + (uint64_t)(step / e->c->gossip.every));
    put64(&w, n);
    put32(&w, (uint32_t)n_seg);
    put32(&w, 0);
    put(&w, ds_gossip_acc_mut(e->gossip), n * sizeof(float));
    put(&w, ds_gossip_snap_mut(e->gossip), n * sizeof(float));
    for (int i = 0; i < n_seg; i++) {
        const ds_sparsifier *sp = ds_gossip_sparsifier(e->gossip, i);
        ds_sparsify_state st = {0};
        if (sp)
            ds_sparsifier_state_get(sp, &st);
        put32(&w, sp != NULL);
        put32(&w, 0);
        put_sp(&w, &st);
    }

    section(&w, "PROG", (uint64_t)prog_len);
    if (prog_len)
        put(&w, prog, prog_len);

    uint8_t hdr[DS_CKPT_HEADER] = {0};
    cur h = {.p = hdr, .n = sizeof(hdr)};
    put(&h, DS_CKPT_MAGIC, 8);
    put32(&h, DS_CKPT_VERSION);
    put32(&h, DS_CKPT_HEADER);
    put64(&h, DS_CKPT_HEADER + body_len);
    put64(&h, ds_rng_hash_str(0, conf));
    put32(&h, (uint32_t)crc32_z(crc32_z(0, NULL, 0), w.p, (size_t)body_len));
    put32(&h, 0);
    r = ds_ckpt_write_atomic(c->node.data_dir, DS_CKPT_NAME, hdr, sizeof(hdr), w.p,
                             (size_t)body_len, err, err_len);
    free(w.p);
    return r;
}

/* ---- reading ------------------------------------------------------------------ */

static const void *get(cur *r, size_t n)
{
    if (r->short_ || n > r->n - r->at) {
        r->short_ = 1;
        return NULL;
    }
    const void *p = r->p + r->at;
    r->at += n;
    return p;
}

static uint64_t get64(cur *r)
{
    uint64_t v = 0;
    const void *p = get(r, 8);
    if (p)
        memcpy(&v, p, 8);
    return v;
}

static uint32_t get32(cur *r)
{
    uint32_t v = 0;
    const void *p = get(r, 4);
    if (p)
        memcpy(&v, p, 4);
    return v;
}

/* The next section, which must be `tag` of exactly `want` bytes (want 0:
 * any length, returned in *len). Its bytes, or NULL with err set. */
static const uint8_t *open_section(cur *r, const char *tag, uint64_t want, uint64_t *len,
                                   const char *path, char *err, size_t err_len)
{
    const char *t = get(r, 4);
    get32(r);
    const uint64_t l = get64(r);
    if (!t || memcmp(t, tag, 4)) {
        snprintf(err, err_len, "%s: corrupt checkpoint: section %s missing", path, tag);
        return NULL;
    }
    if (want && l != want) {
        snprintf(err, err_len, "%s: checkpoint section %s holds %llu bytes, this model and data "
                 "need %llu", path, tag, (unsigned long long)l, (unsigned long long)want);
        return NULL;
    }
    const uint8_t *p = l <= r->n ? get(r, (size_t)l) : NULL;
    if (!p) {
        snprintf(err, err_len, "%s: corrupt checkpoint: section %s runs past the end", path, tag);
        return NULL;
    }
    if (len)
        *len = l;
    return p;
}

static int read_file(const char *path, uint8_t **buf, size_t *len, char *err, size_t err_len)
{
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        const int e = -errno;
        snprintf(err, err_len, "%s: cannot open the checkpoint: %s", path, strerror(-e));
        return e;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, err_len, "%s: not a regular file", path);
        close(fd);
        return -EINVAL;
    }
    uint8_t *b = malloc(st.st_size ? (size_t)st.st_size : 1);
    if (!b) {
        close(fd);
        snprintf(err, err_len, "%s: out of memory", path);
        return -ENOMEM;
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        const ssize_t k = read(fd, b + got, (size_t)st.st_size - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            const int e = k < 0 ? -errno : -EIO;
            snprintf(err, err_len, "%s: cannot read: %s", path, strerror(-e));
            free(b);
            close(fd);
            return e;
        }
        got += (size_t)k;
    }
    close(fd);
    *buf = b;
    *len = got;
    return 0;
}

/* Magic, version, length and CRC. 0 or the errno with err set. */
static int check_header(const char *path, const uint8_t *b, size_t len, uint64_t *hash, char *err,
                        size_t err_len)
{
    if (len < 8 || memcmp(b, DS_CKPT_MAGIC, 8)) {
        snprintf(err, err_len, "%s: not a dsnode checkpoint (bad magic)", path);
        return -EBADMSG;
    }
    if (len < DS_CKPT_HEADER) {
        snprintf(err, err_len, "%s: truncated checkpoint: %zu bytes, the header alone is %u",
                 path, len, DS_CKPT_HEADER);
        return -EBADMSG;
    }
    cur h = {.p = (uint8_t *)b, .n = DS_CKPT_HEADER, .at = 8};
    const uint32_t version = get32(&h), hlen = get32(&h);
    const uint64_t flen = get64(&h);
    *hash = get64(&h);
    const uint32_t crc = get32(&h);
    if (version != DS_CKPT_VERSION || hlen != DS_CKPT_HEADER) {
        snprintf(err, err_len, "%s: checkpoint version %u, this dsnode reads version %u", path,
                 version, DS_CKPT_VERSION);
        return -EPROTO;
    }
    if (flen != len) {
        snprintf(err, err_len, "%s: %s checkpoint: the header says %llu bytes, the file has %zu",
                 path, flen > len ? "truncated" : "corrupt", (unsigned long long)flen, len);
        return -EBADMSG;
    }
    if ((uint32_t)crc32_z(crc32_z(0, NULL, 0), b + DS_CKPT_HEADER, len - DS_CKPT_HEADER) != crc) {
        snprintf(err, err_len, "%s: corrupt checkpoint: checksum mismatch", path);
        return -EBADMSG;
    }
    return 0;
}

static void get_sp(cur *r, ds_sparsify_state *s)
{
    s->rng = get64(r);
    s->started = (int32_t)get32(r);
    const void *p = get(r, 4);
    if (p)
        memcpy(&s->delta, p, 4);
    if ((p = get(r, 8)))
        memcpy(&s->mean_prev, p, 8);
    if ((p = get(r, 8)))
        memcpy(&s->micro_ratio, p, 8);
    s->micro_fed = (int32_t)get32(r);
    get32(r);
    s->micro_group_count = get64(r);
    s->micro_k_group = get64(r);
}

void ds_ckpt_free(ds_ckpt *k)
{
    if (k) {
        free(k->buf);
        memset(k, 0, sizeof(*k));
    }
}

int ds_ckpt_read(const char *path, ds_engine *e, ds_ckpt *k, char *err, size_t err_len)
{
    const ds_conf *c = e->c;
    uint8_t *b = NULL;
    size_t len = 0;
    uint64_t hash = 0;
    memset(k, 0, sizeof(*k));
    int r = read_file(path, &b, &len, err, err_len);
    if (r < 0)
        return r;
    if ((r = check_header(path, b, len, &hash, err, err_len)) < 0)
        goto out;
    r = -EINVAL;
    char conf[4096];
    const int clen = ds_ckpt_conf_text(c, conf, sizeof(conf));
    if (clen < 0) {
        snprintf(err, err_len, "cannot list the config keys: %s", strerror(-clen));
        r = clen;
        goto out;
    }
    cur rd = {.p = b, .n = len, .at = DS_CKPT_HEADER};
    uint64_t conf_len = 0, prog_len = 0;
    const uint8_t *cf = open_section(&rd, "CONF", 0, &conf_len, path, err, err_len);
    if (!cf) {
        r = -EBADMSG;
        goto out;
    }
    if (hash != ds_rng_hash_str(0, conf) || conf_len != (uint64_t)clen ||
        memcmp(cf, conf, (size_t)clen)) {
        char diff[512];
        conf_diff(conf, (const char *)cf, (size_t)conf_len, diff, sizeof(diff));
        snprintf(err, err_len, "%s: the checkpoint was written under another config (hash "
                 "%016llx, this config's %016llx): %s", path, (unsigned long long)hash,
                 (unsigned long long)ds_rng_hash_str(0, conf), diff);
        goto out;
    }
    const size_t n = e->p.n;
    const int n_seg = ds_gossip_n_segments(e->gossip);
    const uint8_t *pa = open_section(&rd, "PARM", sec_parm(n), NULL, path, err, err_len);
    const uint8_t *go = pa ? open_section(&rd, "GOSP", sec_gosp(n, n_seg), NULL, path, err,
                                          err_len)
                           : NULL;
    const uint8_t *pr = go ? open_section(&rd, "PROG", 0, &prog_len, path, err, err_len) : NULL;
    if (!pr)
        goto out;
    if (rd.at != len) {
        snprintf(err, err_len, "%s: corrupt checkpoint: %zu bytes after the last section", path,
                 len - rd.at);
        r = -EBADMSG;
        goto out;
    }

    /* Every check of the engine's part before anything changes. */
    cur cp = {.p = (uint8_t *)pa, .n = sec_parm(n)};
    const int64_t step = (int64_t)get64(&cp);
    const uint64_t pn = get64(&cp);
    cur cg = {.p = (uint8_t *)go, .n = sec_gosp(n, n_seg)};
    const uint64_t round0 = get64(&cg), round = get64(&cg), gn = get64(&cg);
    const uint32_t gseg = get32(&cg);
    get32(&cg);
    if (pn != n || gn != n || gseg != (uint32_t)n_seg) {
        snprintf(err, err_len, "%s: the checkpoint holds %llu parameters in %u segments; this "
                 "node has %zu in %d", path, (unsigned long long)pn, gseg, n, n_seg);
        goto out;
    }
    if (step < 0 || step > c->train.steps) {
        snprintf(err, err_len, "%s: the checkpoint is at step %lld, outside this run's "
                 "train.steps = %lld", path, (long long)step, (long long)c->train.steps);
        goto out;
    }
    cg.at += 2 * n * sizeof(float);
    for (int i = 0; i < n_seg; i++) {
        const uint32_t present = get32(&cg);
        get32(&cg);
        ds_sparsify_state st;
        get_sp(&cg, &st);
        if ((present != 0) != (ds_gossip_sparsifier(e->gossip, i) != NULL)) {
            snprintf(err, err_len, "%s: segment %d's sparsifier %s in the checkpoint, not here",
                     path, i, present ? "is" : "is not");
            goto out;
        }
    }
    *k = (ds_ckpt){.buf = b, .step = step, .round0 = round0, .round = round,
                   .params = pa + 16, .gosp = go, .prog = pr,
                   .prog_len = (size_t)prog_len};
    return 0;
out:
    free(b);
    return r;
}

int ds_ckpt_put_params(ds_engine *e, const ds_ckpt *k, char *err, size_t err_len)
{
    memcpy(e->p.params, k->params, e->p.n * sizeof(float));
    const int r = e->p.push ? e->p.push(e->p.ctx, DS_ENGINE_PARAMS) : 0;
    if (r < 0)
        snprintf(err, err_len, "parameters not copied to the device: %s", strerror(-r));
    return r;
}

void ds_ckpt_apply(ds_engine *e, const ds_ckpt *k)
{
    const size_t n = e->p.n;
    const int n_seg = ds_gossip_n_segments(e->gossip);
    cur cg = {.p = (uint8_t *)k->gosp, .n = sec_gosp(n, n_seg), .at = 32};
    memcpy(ds_gossip_acc_mut(e->gossip), get(&cg, n * sizeof(float)), n * sizeof(float));
    memcpy(ds_gossip_snap_mut(e->gossip), get(&cg, n * sizeof(float)), n * sizeof(float));
    ds_gossip_drop_late(e->gossip);
    for (int i = 0; i < n_seg; i++) {
        get64(&cg);
        ds_sparsify_state st;
        get_sp(&cg, &st);
        ds_sparsifier *sp = ds_gossip_sparsifier(e->gossip, i);
        if (sp)
            ds_sparsifier_state_set(sp, &st);
    }
    e->step = k->step;
    e->round0 = k->round0;
    e->resumed = 1;
    e->resume_round = k->round;
}

/* ---- a resumed node rejoining ------------------------------------------------ */

void ds_ckpt_choose(ds_engine *e)
{
    if (!e->resumed || !e->p.restore)
        return;
    const uint64_t every = (uint64_t)e->c->gossip.every;
    const uint64_t cluster = e->round0 + (uint64_t)e->step / every;
    /* The lag the cluster applies changes with (sized from its peak pace),
     * not one sized from the pace in the snapshot: the rounds right after
     * our crash waited out their timeouts on us, and a CI run measured
     * 12.4 rounds/s there against 94 before (a lag of 62 rounds, not 470),
     * so a restart 1.3 s after the kill was told its checkpoint was too
     * old. */
    const uint64_t lag = e->cluster_lag ? e->cluster_lag : ds_lag_rounds(e->pace.rate);
    if (cluster > e->resume_round + lag) {
        ds_info("state", "our checkpoint (round %llu) is older than the cluster's round %llu "
                "less its lag of %llu rounds: training on from the cluster's state",
                (unsigned long long)e->resume_round, (unsigned long long)cluster,
                (unsigned long long)lag);
        return;
    }
    int64_t step = 0;
    const int r = e->p.restore(e->p.ctx, &step);
    if (r < 0) {
        ds_warn("state", "our checkpoint could not be put back (%s): training on from the "
                "cluster's state", strerror(-r));
        return;
    }
    e->step = step;
    e->round0 = cluster >= (uint64_t)step / every ? cluster - (uint64_t)step / every : 0;
    e->refresh_pending = 0;
    ds_info("state", "our checkpoint (step %lld, round %llu) is within the cluster's lag of "
            "%llu rounds of its round %llu: resuming from it, our rounds numbered from %llu, "
            "training on to our join round %llu", (long long)step,
            (unsigned long long)e->resume_round, (unsigned long long)lag,
            (unsigned long long)cluster, (unsigned long long)e->round0,
            (unsigned long long)e->join_round);
}
