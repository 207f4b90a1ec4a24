/* node/train/data.c: IDX loading and minibatch sampling (see data.h). */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <libdeflate.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "base/clock.h"
#include "base/file.h"
#include "node/train/data.h"

#define FMNIST_MEAN 0.2860f
#define FMNIST_STD 0.3530f

/* Read exactly len bytes. 0, or a negative errno with the reason in err. */
static int gz_read_exact(gzFile f, const char *path, void *buf, size_t len, const char *what,
                         char *err, size_t err_len)
{
    size_t got = 0;
    while (got < len) {
        size_t want = len - got;
        if (want > (1u << 30))
            want = 1u << 30;
        int r = gzread(f, (char *)buf + got, (unsigned)want);
        if (r < 0) {
            int zerr;
            const char *msg = gzerror(f, &zerr);
            snprintf(err, err_len, "%s: corrupt compressed data while reading %s: %s", path, what,
                     msg ? msg : "unknown zlib error");
            return -EBADMSG;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    if (got < len) {
        int zerr;
        const char *msg = gzerror(f, &zerr);
        if (zerr != Z_OK && zerr != Z_STREAM_END) {
            snprintf(err, err_len, "%s: corrupt compressed data while reading %s: %s", path, what,
                     msg ? msg : "unknown zlib error");
            return -EBADMSG;
        }
        snprintf(err, err_len, "%s: truncated: %s needs %zu bytes, file has %zu", path, what, len,
                 got);
        return -EBADMSG;
    }
    return 0;
}

/* A buffer of tens of MiB that free() releases, backed by transparent
 * huge pages where the kernel gives them on request: 2 MiB per fault
 * instead of 4 KiB, which is most of the cost of filling it here. */
static void *big_alloc(size_t len)
{
    const size_t huge = (size_t)2 << 20;
    const size_t cap = (len + huge - 1) / huge * huge;
    void *p = aligned_alloc(huge, cap);
#ifdef MADV_HUGEPAGE
    if (p)
        madvise(p, cap, MADV_HUGEPAGE); /* advice only: a refusal changes nothing */
#endif
    return p;
}

/*
 * The fast path: a well-formed single-member gzip file, inflated whole by
 * libdeflate (about 3.5x zlib's speed on the training images here, which
 * is most of a node's start-up). It only ever succeeds: on anything it
 * does not take (a plain IDX file, several gzip members, a corrupt or
 * malformed file, a short read) it returns 1 and the zlib reader below
 * loads the file or names what is wrong. 0 with *data and dims set, 1, or
 * -ENOMEM.
 */
static int idx_load_whole(int fd, int ndims, uint32_t *dims, uint8_t **data)
{
    struct stat st;
    if (fstat(fd, &st) || st.st_size < 18 + 4 + 4 * ndims ||
        (uint64_t)st.st_size > DS_DATA_MAX_BYTES)
        return 1;
    const size_t in_len = (size_t)st.st_size;
    /* Mapped and populated at once: faulting pages in one by one costs
     * more than inflating them on some virtual machines. */
    uint8_t *in = mmap(NULL, in_len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (in == MAP_FAILED)
        return 1;
    int ret = 1;
    uint8_t *out = NULL;
    if (in[0] != 0x1f || in[1] != 0x8b)
        goto out;
    /* ISIZE, the last four bytes: the inflated size mod 2^32, exact here
     * since larger files are refused above and below. */
    const uint8_t *t = in + in_len - 4;
    const size_t out_len = (size_t)t[0] | (size_t)t[1] << 8 | (size_t)t[2] << 16 |
                           (size_t)t[3] << 24;
    const size_t hdr = 4 + 4 * (size_t)ndims;
    if (out_len < hdr || out_len - hdr > DS_DATA_MAX_BYTES)
        goto out;
    out = big_alloc(out_len);
    struct libdeflate_decompressor *dd = out ? libdeflate_alloc_decompressor() : NULL;
    if (!dd) {
        ret = -ENOMEM;
        goto out;
    }
    size_t in_used = 0, out_got = 0;
    enum libdeflate_result lr =
        libdeflate_gzip_decompress_ex(dd, in, in_len, out, out_len, &in_used, &out_got);
    libdeflate_free_decompressor(dd);
    if (lr != LIBDEFLATE_SUCCESS || in_used != in_len || out_got != out_len)
        goto out;
    if (out[0] != 0 || out[1] != 0 || out[2] != 0x08 || out[3] != ndims)
        goto out;
    uint64_t total = 1;
    for (int i = 0; i < ndims; i++) {
        const uint8_t *p = out + 4 + 4 * i;
        dims[i] = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
        total *= dims[i];
        if (dims[i] == 0 || total > DS_DATA_MAX_BYTES)
            goto out;
    }
    if (total != out_len - hdr)
        goto out;
    memmove(out, out + hdr, total); /* the allocation keeps hdr bytes spare */
    *data = out;
    out = NULL;
    ret = 0;
out:
    free(out);
    munmap(in, in_len);
    return ret;
}

/*
 * The inflated-data cache (train.dataset_cache). Every node on a host
 * inflates the same 26 MB of gzip into the same 47 MB, and a node that
 * joins a busy host waits for it (docs/benchmarks.md, "Start-up: ofi_rxm's
 * receive pool and the dataset cache"). With a cache directory, the first
 * node to inflate a file also writes what it inflated there, and the
 * others map that file: the pages are the page cache's, shared, and
 * nothing is inflated again.
 *
 * A cache file is named by the source's device and inode and holds a
 * 4 KiB header (magic, the source's size, mtime and ctime, its gzip
 * trailer, the IDX dimensions) and the data. It is used only when all of
 * that matches the source as opened now and the CRC-32 of the IDX header
 * and data (libdeflate's, pclmul: milliseconds) equals the source's gzip
 * trailer, so a stale, torn or tampered file is never read as the data;
 * it is then written again. Only gzip files of at least 1 MiB inflated
 * are cached (the labels are not worth a file). Files are written to a
 * temporary name and renamed, so readers see whole files; the directory
 * is created 0700 and refused unless it is ours and writable by no one
 * else. Whatever goes wrong with the cache, the data is inflated as
 * without one; ds_dataset's cache fields say what happened.
 *
 * Nodes started together all miss the cache at once: each inflated and
 * wrote the same 47 MB (4 nodes on 2 cores: three inflations for
 * nothing). So a miss takes an exclusive flock(2) on "<name>.lock" and
 * looks again under it: the first inflates and writes, the others wait
 * for it and map. The lock goes with its holder's descriptor (a process
 * that dies releases it); a holder that does not let go within
 * CACHE_LOCK_WAIT_MS (frozen) is not waited for longer: the data is then
 * inflated without the lock, as before.
 */
#define CACHE_MAGIC "DSIDXC1\n"
#define CACHE_HDR 4096
#define CACHE_MIN ((size_t)1 << 20)
#define CACHE_LOCK_WAIT_MS 2000

typedef struct cache_hdr {
    char magic[8];
    uint64_t size, ino, dev;
    int64_t mtime_s, mtime_ns, ctime_s, ctime_ns;
    uint32_t gz_crc, gz_isize; /* the source's gzip trailer */
    uint32_t ndims, dims[3];
    uint64_t data_len;
} cache_hdr;

typedef struct cache_ctx {
    int dfd;            /* the directory, or -1: no cache */
    int status;         /* DS_DATA_CACHE_* of the images */
    char note[160];
} cache_ctx;

/* Keep the weightier outcome: a failure over a write over a hit. */
static void cache_note(cache_ctx *cc, int status, const char *what, const char *detail)
{
    if (status > cc->status || status == DS_DATA_CACHE_FAILED) {
        cc->status = status;
        snprintf(cc->note, sizeof(cc->note), "%s%s", what, detail);
    }
}

/* Open (creating it, one level) the cache directory: -1 and a note when
 * it cannot be used. */
static int cache_open_dir(const char *dir, cache_ctx *cc)
{
    if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
        cache_note(cc, DS_DATA_CACHE_FAILED, "cannot create it: ", strerror(errno));
        return -1;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (dfd < 0 || fstat(dfd, &st) < 0) {
        cache_note(cc, DS_DATA_CACHE_FAILED, "cannot open it: ", strerror(errno));
        if (dfd >= 0)
            close(dfd);
        return -1;
    }
    if (st.st_uid != geteuid() || (st.st_mode & 022)) {
        cache_note(cc, DS_DATA_CACHE_FAILED, "",
                   st.st_uid != geteuid() ? "not owned by this user"
                                          : "writable by others (chmod go-w, or another directory)");
        close(dfd);
        return -1;
    }
    return dfd;
}

static void cache_name(const struct stat *st, int ndims, char *buf, size_t len)
{
    snprintf(buf, len, "idx%d-%llx-%llx.bin", ndims, (unsigned long long)st->st_dev,
             (unsigned long long)st->st_ino);
}

/* The header this source (fd, st) would have, from its gzip trailer; -1
 * when it is not a gzip file worth caching. */
static int cache_key(int fd, const struct stat *st, int ndims, cache_hdr *h)
{
    uint8_t head[2], tail[8];
    if (st->st_size < 18 || pread(fd, head, 2, 0) != 2 || head[0] != 0x1f || head[1] != 0x8b ||
        pread(fd, tail, 8, st->st_size - 8) != 8)
        return -1;
    memset(h, 0, sizeof(*h));
    memcpy(h->magic, CACHE_MAGIC, 8);
    h->size = (uint64_t)st->st_size;
    h->ino = (uint64_t)st->st_ino;
    h->dev = (uint64_t)st->st_dev;
    h->mtime_s = st->st_mtim.tv_sec;
    h->mtime_ns = st->st_mtim.tv_nsec;
    h->ctime_s = st->st_ctim.tv_sec;
    h->ctime_ns = st->st_ctim.tv_nsec;
    h->gz_crc = (uint32_t)tail[0] | (uint32_t)tail[1] << 8 | (uint32_t)tail[2] << 16 |
                (uint32_t)tail[3] << 24;
    h->gz_isize = (uint32_t)tail[4] | (uint32_t)tail[5] << 8 | (uint32_t)tail[6] << 16 |
                  (uint32_t)tail[7] << 24;
    h->ndims = (uint32_t)ndims;
    return h->gz_isize >= CACHE_MIN ? 0 : -1;
}

/* The IDX header of dims, as the source file has it inflated. */
static size_t idx_header(const cache_hdr *h, uint8_t *out)
{
    out[0] = out[1] = 0;
    out[2] = 0x08;
    out[3] = (uint8_t)h->ndims;
    for (uint32_t i = 0; i < h->ndims; i++) {
        out[4 + 4 * i] = (uint8_t)(h->dims[i] >> 24);
        out[5 + 4 * i] = (uint8_t)(h->dims[i] >> 16);
        out[6 + 4 * i] = (uint8_t)(h->dims[i] >> 8);
        out[7 + 4 * i] = (uint8_t)h->dims[i];
    }
    return 4 + 4 * (size_t)h->ndims;
}

/* Map the cache file of `want` (its key filled): 0 with *data, dims and
 * the mapping, or -1 (absent, stale, torn: the caller inflates). */
static int cache_map(cache_ctx *cc, const cache_hdr *want, const char *name, uint32_t *dims,
                     uint8_t **data, void **map, size_t *map_len)
{
    int fd = openat(cc->dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -1;
    struct stat st;
    cache_hdr h;
    int ret = -1;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (uint64_t)st.st_size < CACHE_HDR || pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h) ||
        memcmp(&h, want, offsetof(cache_hdr, dims)) != 0 ||
        h.data_len != (uint64_t)st.st_size - CACHE_HDR || h.data_len > DS_DATA_MAX_BYTES) {
        close(fd);
        return -1;
    }
    uint64_t total = 1;
    for (uint32_t i = 0; i < h.ndims && total <= DS_DATA_MAX_BYTES; i++)
        total *= h.dims[i] ? h.dims[i] : DS_DATA_MAX_BYTES + 1;
    if (total != h.data_len) {
        close(fd);
        return -1;
    }
    const size_t len = (size_t)st.st_size;
    void *m = mmap(NULL, len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return -1;
    uint8_t ih[16];
    const size_t ihl = idx_header(&h, ih);
    uint32_t crc = libdeflate_crc32(0, ih, ihl);
    crc = libdeflate_crc32(crc, (const uint8_t *)m + CACHE_HDR, h.data_len);
    if (crc == h.gz_crc && ihl + h.data_len == h.gz_isize) {
        for (uint32_t i = 0; i < h.ndims; i++)
            dims[i] = h.dims[i];
        *data = (uint8_t *)m + CACHE_HDR;
        *map = m;
        *map_len = len;
        ret = 0;
    } else {
        munmap(m, len);
    }
    return ret;
}

static int write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Write what was inflated under the cache name (a temporary file, then a
 * rename over any older one). A failure leaves no file and a note. */
static void cache_write(cache_ctx *cc, cache_hdr *h, const char *name, const uint32_t *dims,
                        const uint8_t *data, size_t len)
{
    char tmp[128];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", name, (long)getpid());
    for (uint32_t i = 0; i < h->ndims; i++)
        h->dims[i] = dims[i];
    h->data_len = len;
    uint8_t page[CACHE_HDR] = {0};
    memcpy(page, h, sizeof(*h));
    /* Ours alone (the name carries our pid): one a dead process of the
     * same pid left would fail the exclusive create. */
    unlinkat(cc->dfd, tmp, 0);
    int fd = openat(cc->dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        cache_note(cc, DS_DATA_CACHE_FAILED, "cannot write to it: ", strerror(errno));
        return;
    }
    int ok = write_all(fd, page, sizeof(page)) == 0 && write_all(fd, data, len) == 0;
    const int werr = errno;
    ok = close(fd) == 0 && ok;
    if (ok && renameat(cc->dfd, tmp, cc->dfd, name) == 0) {
        cache_note(cc, DS_DATA_CACHE_WRITTEN, "written", "");
        return;
    }
    cache_note(cc, DS_DATA_CACHE_FAILED, "cannot write to it: ", strerror(ok ? errno : werr));
    unlinkat(cc->dfd, tmp, 0);
}

/* The exclusive lock of cache file `name` (data.c's top): its descriptor,
 * or -1 (no lock file, or a holder that kept it CACHE_LOCK_WAIT_MS). */
static int cache_lock(const cache_ctx *cc, const char *name)
{
    char lname[128];
    snprintf(lname, sizeof(lname), "%s.lock", name);
    int fd = openat(cc->dfd, lname, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    const uint64_t until = ds_now_ms() + CACHE_LOCK_WAIT_MS;
    while (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        if ((errno != EWOULDBLOCK && errno != EINTR) || ds_now_ms() >= until) {
            close(fd);
            return -1;
        }
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    return fd;
}

/* Parse one IDX file of unsigned bytes with `ndims` dimensions. */
static int idx_load(const char *path, int ndims, uint32_t *dims, uint8_t **data, cache_ctx *cc,
                    void **map, size_t *map_len, char *err, size_t err_len)
{
    /* Opened without blocking, so a FIFO or a device is refused rather
     * than waited on; gzdopen then owns the descriptor. */
    char why[128];
    struct stat st;
    int fd = ds_file_open_regular(path, &st, why, sizeof(why));
    if (fd == -EISDIR) {
        snprintf(err, err_len, "%s: is a directory, expected an IDX file", path);
        return fd;
    }
    if (fd < 0) {
        snprintf(err, err_len, "%s: cannot open: %s", path, why);
        return fd;
    }
    cache_hdr key;
    char cname[96];
    const int cacheable = cc && cc->dfd >= 0 && cache_key(fd, &st, ndims, &key) == 0;
    int lock = -1;
    if (cacheable) {
        cache_name(&st, ndims, cname, sizeof(cname));
        if (cache_map(cc, &key, cname, dims, data, map, map_len) == 0) {
            cache_note(cc, DS_DATA_CACHE_HIT, "mapped", "");
            close(fd);
            return 0;
        }
        /* A miss: another node may be writing it now (the top). */
        lock = cache_lock(cc, cname);
        if (lock >= 0 && cache_map(cc, &key, cname, dims, data, map, map_len) == 0) {
            cache_note(cc, DS_DATA_CACHE_HIT, "mapped", "");
            close(lock);
            close(fd);
            return 0;
        }
    }
    int ret = idx_load_whole(fd, ndims, dims, data);
    if (ret == 0 && cacheable) {
        uint64_t total = 1;
        for (int i = 0; i < ndims; i++)
            total *= dims[i];
        cache_write(cc, &key, cname, dims, *data, (size_t)total);
    }
    if (lock >= 0)
        close(lock); /* (ret > 0, not a whole gzip member: the stream path, not cached) */
    if (ret <= 0) {
        if (ret < 0)
            snprintf(err, err_len, "%s: out of memory while inflating", path);
        close(fd);
        return ret;
    }
    gzFile f = gzdopen(fd, "rb");
    if (!f) {
        close(fd);
        snprintf(err, err_len, "%s: cannot open: %s", path, strerror(ENOMEM));
        return -ENOMEM;
    }
    uint8_t hdr[4];
    if ((ret = gz_read_exact(f, path, hdr, 4, "the IDX magic", err, err_len)) < 0)
        goto out;
    if (hdr[0] != 0 || hdr[1] != 0 || hdr[2] != 0x08 || hdr[3] != ndims) {
        snprintf(err, err_len,
                 "%s: bad IDX magic %02x %02x %02x %02x, expected 00 00 08 %02x (unsigned bytes, "
                 "%d dimensions)",
                 path, hdr[0], hdr[1], hdr[2], hdr[3], ndims, ndims);
        ret = -EBADMSG;
        goto out;
    }
    uint8_t raw[4 * 3];
    if ((ret = gz_read_exact(f, path, raw, 4 * (size_t)ndims, "the dimensions", err, err_len)) < 0)
        goto out;
    uint64_t total = 1;
    for (int i = 0; i < ndims; i++) {
        dims[i] = (uint32_t)raw[4 * i] << 24 | (uint32_t)raw[4 * i + 1] << 16 |
                  (uint32_t)raw[4 * i + 2] << 8 | raw[4 * i + 3];
        if (dims[i] == 0) {
            snprintf(err, err_len, "%s: dimension %d is 0", path, i);
            ret = -EBADMSG;
            goto out;
        }
        total *= dims[i];
        if (total > DS_DATA_MAX_BYTES) {
            snprintf(err, err_len, "%s: declares more than %llu bytes of data", path,
                     (unsigned long long)DS_DATA_MAX_BYTES);
            ret = -EBADMSG;
            goto out;
        }
    }
    *data = malloc(total);
    if (!*data) {
        snprintf(err, err_len, "%s: out of memory for %llu bytes", path, (unsigned long long)total);
        ret = -ENOMEM;
        goto out;
    }
    if ((ret = gz_read_exact(f, path, *data, total, "the data", err, err_len)) < 0)
        goto out_free;
    uint8_t extra;
    int r = gzread(f, &extra, 1);
    if (r != 0) {
        if (r < 0) {
            int zerr;
            snprintf(err, err_len, "%s: corrupt compressed data after the declared size: %s", path,
                     gzerror(f, &zerr));
        } else {
            snprintf(err, err_len, "%s: trailing bytes after the %llu declared by the header", path,
                     (unsigned long long)total);
        }
        ret = -EBADMSG;
        goto out_free;
    }
    gzclose(f);
    return 0;

out_free:
    free(*data);
    *data = NULL;
out:
    gzclose(f);
    return ret;
}

int ds_dataset_load(ds_dataset *d, const char *images_path, const char *labels_path,
                    const char *cache_dir, char *err, size_t err_len)
{
    memset(d, 0, sizeof(*d));
    uint32_t idims[3], ldims[1];
    cache_ctx cc = {.dfd = -1};
    if (cache_dir && *cache_dir)
        cc.dfd = cache_open_dir(cache_dir, &cc);
    int ret = idx_load(images_path, 3, idims, &d->images, &cc, &d->images_map,
                       &d->images_map_len, err, err_len);
    if (cc.dfd >= 0)
        close(cc.dfd);
    d->cache = cc.status;
    snprintf(d->cache_note, sizeof(d->cache_note), "%s", cc.note);
    if (ret < 0)
        return ret;
    if ((ret = idx_load(labels_path, 1, ldims, &d->labels, NULL, NULL, NULL, err, err_len)) < 0)
        goto fail;
    if (idims[0] != ldims[0]) {
        snprintf(err, err_len, "%s: %u labels, but %s has %u images", labels_path, ldims[0],
                 images_path, idims[0]);
        ret = -EINVAL;
        goto fail;
    }
    for (uint32_t i = 0; i < ldims[0]; i++)
        if (d->labels[i] >= DS_DATA_CLASSES) {
            snprintf(err, err_len, "%s: label %u at index %u, expected 0..%d", labels_path,
                     d->labels[i], i, DS_DATA_CLASSES - 1);
            ret = -EINVAL;
            goto fail;
        }
    d->n = idims[0];
    d->rows = (int)idims[1];
    d->cols = (int)idims[2];
    return 0;

fail:
    ds_dataset_free(d);
    return ret;
}

int ds_dataset_load_fmnist(ds_dataset *train, ds_dataset *test, const char *dir,
                           const char *cache_dir, char *err, size_t err_len)
{
    char ip[4096], lp[4096];
    snprintf(ip, sizeof(ip), "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(lp, sizeof(lp), "%s/train-labels-idx1-ubyte.gz", dir);
    int ret = ds_dataset_load(train, ip, lp, cache_dir, err, err_len);
    if (ret < 0)
        return ret;
    snprintf(ip, sizeof(ip), "%s/t10k-images-idx3-ubyte.gz", dir);
    snprintf(lp, sizeof(lp), "%s/t10k-labels-idx1-ubyte.gz", dir);
    if ((ret = ds_dataset_load(test, ip, lp, cache_dir, err, err_len)) < 0) {
        ds_dataset_free(train);
        return ret;
    }
    if (test->rows != train->rows || test->cols != train->cols) {
        snprintf(err, err_len, "%s: images are %dx%d, training images are %dx%d", ip, test->rows,
                 test->cols, train->rows, train->cols);
        ds_dataset_free(train);
        ds_dataset_free(test);
        return -EINVAL;
    }
    return 0;
}

void ds_dataset_free(ds_dataset *d)
{
    if (!d)
        return;
    if (d->images_map)
        munmap(d->images_map, d->images_map_len);
    else
        free(d->images);
    free(d->labels);
    memset(d, 0, sizeof(*d));
}

void ds_dataset_norm(float *scale, float *shift)
{
    *scale = 1.0f / (255.0f * FMNIST_STD);
    *shift = -FMNIST_MEAN / FMNIST_STD;
}

void ds_dataset_gather(const ds_dataset *d, const uint32_t *idx, size_t first, int batch,
                       float *x, int32_t *y)
{
    const size_t dim = (size_t)d->rows * d->cols;
    float scale, shift;
    ds_dataset_norm(&scale, &shift);
    for (int b = 0; b < batch; b++) {
        const size_t i = idx ? idx[b] : first + (size_t)b;
        const uint8_t *p = d->images + i * dim;
        float *o = x + (size_t)b * dim;
        for (size_t j = 0; j < dim; j++)
            o[j] = (float)p[j] * scale + shift;
        y[b] = d->labels[i];
    }
}

static void reshuffle(ds_sampler *s)
{
    for (size_t i = 0; i < s->n; i++)
        s->perm[i] = (uint32_t)i;
    for (size_t i = s->n - 1; i > 0; i--) {
        const uint32_t j = ds_rng_below(&s->rng, (uint32_t)(i + 1));
        const uint32_t t = s->perm[i];
        s->perm[i] = s->perm[j];
        s->perm[j] = t;
    }
    s->pos = 0;
}

int ds_sampler_init(ds_sampler *s, size_t n, uint64_t seed)
{
    memset(s, 0, sizeof(*s));
    if (n == 0 || n > UINT32_MAX)
        return -EINVAL;
    s->perm = malloc(n * sizeof(uint32_t));
    if (!s->perm)
        return -ENOMEM;
    s->n = n;
    ds_rng_seed(&s->rng, seed);
    reshuffle(s);
    return 0;
}

void ds_sampler_next(ds_sampler *s, uint32_t *idx, int batch)
{
    for (int b = 0; b < batch; b++) {
        if (s->pos == s->n) {
            s->epoch++;
            reshuffle(s);
        }
        idx[b] = s->perm[s->pos++];
    }
}

void ds_sampler_free(ds_sampler *s)
{
    if (!s)
        return;
    free(s->perm);
    memset(s, 0, sizeof(*s));
}
