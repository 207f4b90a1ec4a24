/*
 * tests/test_data.c: the IDX loader on the real Fashion-MNIST files and on
 * each class of malformed file (missing, directory, FIFO, wrong magic, truncated,
 * corrupt gzip, trailing bytes, mismatched counts, bad label, oversized
 * declaration); the inflated-data cache (train.dataset_cache); the
 * minibatch sampler.
 * Run: meson test -C build data --verbose
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "kernels/cpu/cpu_kernels.h"
#include "node/train/data.h"

#define FMNIST "/usr/share/datasets/fashion-mnist"

static char dir[256];
static char err[512];

static void mkdir_tmp(void)
{
    snprintf(dir, sizeof(dir), "/tmp/ds_test_data_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void rm_tmp(void)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

TestSuite(data, .init = mkdir_tmp, .fini = rm_tmp);

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = v >> 24;
    p[1] = v >> 16;
    p[2] = v >> 8;
    p[3] = v;
}

/* Write an IDX file (gzip unless raw) with the given header and `len` data
 * bytes (value i*7 for images, i%10 for labels), plus `extra` trailing. */
static void write_idx(const char *name, int ndims, const uint32_t *dims, size_t len, int labels,
                      size_t extra, int raw)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    size_t hl = 4 + 4 * (size_t)ndims;
    uint8_t *buf = malloc(hl + len + extra + 1);
    buf[0] = buf[1] = 0;
    buf[2] = 8;
    buf[3] = (uint8_t)ndims;
    for (int i = 0; i < ndims; i++)
        put_u32(buf + 4 + 4 * i, dims[i]);
    for (size_t i = 0; i < len + extra; i++)
        buf[hl + i] = labels ? (uint8_t)(i % 10) : (uint8_t)(i * 7);
    if (raw) {
        FILE *f = fopen(path, "wb");
        fwrite(buf, 1, hl + len + extra, f);
        fclose(f);
    } else {
        gzFile g = gzopen(path, "wb");
        gzwrite(g, buf, (unsigned)(hl + len + extra));
        gzclose(g);
    }
    free(buf);
}

static const char *p(const char *name)
{
    static char path[2][512];
    static int k;
    k ^= 1;
    snprintf(path[k], sizeof(path[k]), "%s/%s", dir, name);
    return path[k];
}

static void good_pair(uint32_t n)
{
    uint32_t di[3] = {n, 4, 5}, dl[1] = {n};
    write_idx("img.gz", 3, di, (size_t)n * 20, 0, 0, 0);
    write_idx("lab.gz", 1, dl, n, 1, 0, 0);
}

static int load(void)
{
    ds_dataset d;
    int r = ds_dataset_load(&d, p("img.gz"), p("lab.gz"), NULL, err, sizeof(err));
    if (r == 0)
        ds_dataset_free(&d);
    return r;
}

Test(data, real_fashion_mnist)
{
    ds_dataset tr, te;
    int r = ds_dataset_load_fmnist(&tr, &te, FMNIST, NULL, err, sizeof(err));
    cr_assert_eq(r, 0, "%s", err);
    cr_expect_eq(tr.n, 60000);
    cr_expect_eq(te.n, 10000);
    cr_expect_eq(tr.rows, 28);
    cr_expect_eq(tr.cols, 28);
    int count[10] = {0};
    for (size_t i = 0; i < te.n; i++)
        count[te.labels[i]]++;
    for (int c = 0; c < 10; c++)
        cr_expect_eq(count[c], 1000, "class %d has %d test images", c, count[c]);
    ds_dataset_free(&tr);
    ds_dataset_free(&te);
}

/* The real training images inflated by zlib into memory, whole (IDX header
 * included): the reference the loader's two paths are held to. */
static uint8_t *gunzip_all(const char *path, size_t *len)
{
    gzFile g = gzopen(path, "rb");
    cr_assert_not_null(g);
    size_t cap = 64u << 20, n = 0;
    uint8_t *b = malloc(cap);
    cr_assert_not_null(b);
    int r;
    while ((r = gzread(g, b + n, (unsigned)(cap - n))) > 0)
        n += (size_t)r;
    cr_assert_geq(r, 0);
    gzclose(g);
    *len = n;
    return b;
}

/* Write buf as gzip in `members` members split at equal byte counts:
 * several members are valid gzip, which libdeflate's whole-file path does
 * not take, so the loader reads them with zlib. */
static void write_gz_members(const char *name, const uint8_t *buf, size_t len, int members)
{
    FILE *f = fopen(p(name), "wb");
    cr_assert_not_null(f);
    size_t at = 0;
    for (int m = 0; m < members; m++) {
        size_t part = m == members - 1 ? len - at : len / (size_t)members;
        char tmp[600];
        snprintf(tmp, sizeof(tmp), "%s/member.gz", dir);
        gzFile g = gzopen(tmp, "wb");
        cr_assert_eq(gzwrite(g, buf + at, (unsigned)part), (int)part);
        gzclose(g);
        FILE *t = fopen(tmp, "rb");
        char chunk[65536];
        size_t k;
        while ((k = fread(chunk, 1, sizeof(chunk), t)) > 0)
            cr_assert_eq(fwrite(chunk, 1, k, f), k);
        fclose(t);
        at += part;
    }
    fclose(f);
}

/* One gzip member (libdeflate, whole), two members and a plain IDX file
 * (both through zlib) load byte for byte what zlib inflates. */
Test(data, inflated_whole_equals_zlib_and_every_form_loads)
{
    size_t ilen, llen;
    uint8_t *img = gunzip_all(FMNIST "/t10k-images-idx3-ubyte.gz", &ilen);
    uint8_t *lab = gunzip_all(FMNIST "/t10k-labels-idx1-ubyte.gz", &llen);
    cr_assert_eq(ilen, 16 + 10000 * 784);
    cr_assert_eq(llen, 8 + 10000);
    const char *forms[] = {"one member", "two members", "plain"};
    for (int form = 0; form < 3; form++) {
        const char *ip = FMNIST "/t10k-images-idx3-ubyte.gz", *lp = FMNIST "/t10k-labels-idx1-ubyte.gz";
        if (form == 1) {
            write_gz_members("img2.gz", img, ilen, 2);
            write_gz_members("lab2.gz", lab, llen, 2);
            ip = p("img2.gz");
            lp = p("lab2.gz");
        } else if (form == 2) {
            FILE *f = fopen(p("img.raw"), "wb");
            cr_assert_eq(fwrite(img, 1, ilen, f), ilen);
            fclose(f);
            f = fopen(p("lab.raw"), "wb");
            cr_assert_eq(fwrite(lab, 1, llen, f), llen);
            fclose(f);
            ip = p("img.raw");
            lp = p("lab.raw");
        }
        ds_dataset d;
        cr_assert_eq(ds_dataset_load(&d, ip, lp, NULL, err, sizeof(err)), 0, "%s: %s", forms[form], err);
        cr_expect_eq(d.n, 10000, "%s", forms[form]);
        cr_expect_eq(d.rows, 28, "%s", forms[form]);
        cr_expect_eq(d.cols, 28, "%s", forms[form]);
        cr_expect_eq(memcmp(d.images, img + 16, ilen - 16), 0, "%s: images differ", forms[form]);
        cr_expect_eq(memcmp(d.labels, lab + 8, llen - 8), 0, "%s: labels differ", forms[form]);
        ds_dataset_free(&d);
    }
    free(img);
    free(lab);
}

/* train.dataset_cache: the first load inflates and writes the cache, the
 * second maps it, and both give what zlib inflates, byte for byte; a cache
 * file damaged in its data (the CRC against the source's gzip trailer), or
 * a source replaced at the same path, is never read as the data but
 * written again. */
Test(data, cache_written_then_mapped_and_never_stale)
{
    size_t ilen, llen;
    uint8_t *img = gunzip_all(FMNIST "/t10k-images-idx3-ubyte.gz", &ilen);
    uint8_t *lab = gunzip_all(FMNIST "/t10k-labels-idx1-ubyte.gz", &llen);
    write_gz_members("img.gz", img, ilen, 1);
    write_gz_members("lab.gz", lab, llen, 1);
    char cache[300];
    snprintf(cache, sizeof(cache), "%s/cache", dir);
    const int want[] = {DS_DATA_CACHE_WRITTEN, DS_DATA_CACHE_HIT, DS_DATA_CACHE_WRITTEN,
                        DS_DATA_CACHE_HIT, DS_DATA_CACHE_WRITTEN};
    for (int round = 0; round < 5; round++) {
        if (round == 2) {
            /* Flip one byte of the cached images, past the header. */
            char cmd[700];
            snprintf(cmd, sizeof(cmd), "f=$(ls '%s'/idx3-*.bin) && printf '\\377' | dd of=\"$f\" "
                     "bs=1 seek=5000 conv=notrunc status=none", cache);
            cr_assert_eq(system(cmd), 0);
        }
        if (round == 4) {
            /* Another dataset at the same path (a new file, same size:
             * the first image's pixels changed). */
            img[16 + 100] ^= 0x55;
            cr_assert_eq(unlink(p("img.gz")), 0);
            write_gz_members("img.gz", img, ilen, 1);
        }
        ds_dataset d;
        cr_assert_eq(ds_dataset_load(&d, p("img.gz"), p("lab.gz"), cache, err, sizeof(err)), 0,
                     "round %d: %s", round, err);
        cr_expect_eq(d.cache, want[round], "round %d: cache %d (%s), expected %d", round, d.cache,
                     d.cache_note, want[round]);
        cr_expect_eq(d.images_map != NULL, want[round] == DS_DATA_CACHE_HIT, "round %d", round);
        cr_expect_eq(d.n, 10000);
        cr_expect_eq(memcmp(d.images, img + 16, ilen - 16), 0, "round %d: images differ", round);
        cr_expect_eq(memcmp(d.labels, lab + 8, llen - 8), 0, "round %d: labels differ", round);
        ds_dataset_free(&d);
    }
    struct stat st;
    cr_assert_eq(stat(cache, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0700, "the cache directory is %o", st.st_mode & 0777);
    free(img);
    free(lab);
}

/* Nodes started together (data.c's top): four processes load the real
 * training set into one empty cache at the same moment (a pipe holds them
 * until all are forked). Exactly one inflates and writes it; the three
 * others wait on its lock and map what it wrote. Without the lock each
 * missed, inflated and wrote. */
Test(data, cache_nodes_started_together_inflate_once, .timeout = 60)
{
    char cache[300];
    snprintf(cache, sizeof(cache), "%s/together", dir);
    int go[2];
    cr_assert_eq(pipe(go), 0);
    enum { N = 4 };
    pid_t pid[N];
    for (int i = 0; i < N; i++) {
        pid[i] = fork();
        cr_assert_geq(pid[i], 0);
        if (pid[i] == 0) {
            close(go[1]);
            char b;
            if (read(go[0], &b, 1) != 0)
                _exit(20);
            ds_dataset d;
            if (ds_dataset_load(&d, FMNIST "/train-images-idx3-ubyte.gz",
                                FMNIST "/train-labels-idx1-ubyte.gz", cache, err, sizeof(err)) < 0)
                _exit(10);
            const int c = d.cache, n_ok = d.n == 60000;
            ds_dataset_free(&d);
            _exit(n_ok ? c : 11);
        }
    }
    close(go[0]);
    close(go[1]); /* all of them go */
    int count[4] = {0};
    for (int i = 0; i < N; i++) {
        int st;
        cr_assert_eq(waitpid(pid[i], &st, 0), pid[i]);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) <= 3, "loader %d: status %#x", i, st);
        count[WEXITSTATUS(st)]++;
    }
    cr_expect_eq(count[DS_DATA_CACHE_WRITTEN], 1, "%d loaders wrote the cache, %d mapped it",
                 count[DS_DATA_CACHE_WRITTEN], count[DS_DATA_CACHE_HIT]);
    cr_expect_eq(count[DS_DATA_CACHE_HIT], N - 1, "%d loaders wrote the cache, %d mapped it",
                 count[DS_DATA_CACHE_WRITTEN], count[DS_DATA_CACHE_HIT]);
}

/* A holder that keeps the lock (a frozen node) is waited for
 * CACHE_LOCK_WAIT_MS at most: the load then inflates without it. */
Test(data, cache_lock_held_by_a_frozen_loader_is_not_waited_out)
{
    char cache[300], lname[600];
    snprintf(cache, sizeof(cache), "%s/frozen", dir);
    cr_assert_eq(mkdir(cache, 0700), 0);
    struct stat st;
    cr_assert_eq(stat(FMNIST "/t10k-images-idx3-ubyte.gz", &st), 0);
    snprintf(lname, sizeof(lname), "%s/idx3-%llx-%llx.bin.lock", cache,
             (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
    const int fd = open(lname, O_RDWR | O_CREAT, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(flock(fd, LOCK_EX), 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ds_dataset d;
    cr_assert_eq(ds_dataset_load(&d, FMNIST "/t10k-images-idx3-ubyte.gz",
                                 FMNIST "/t10k-labels-idx1-ubyte.gz", cache, err, sizeof(err)),
                 0, "%s", err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    cr_expect_eq(d.cache, DS_DATA_CACHE_WRITTEN, "cache %d (%s)", d.cache, d.cache_note);
    cr_expect_eq(d.n, 10000);
    /* The wait is 2 s; the bound is for a loaded machine's inflate. */
    cr_expect(s >= 1.9 && s < 30.0, "the load took %.2f s with the lock held", s);
    ds_dataset_free(&d);
    close(fd);
}

/* A cache directory others can write to is not used (a planted file
 * would become the training data); the data still loads, and the note
 * says why. Small files are not cached at all. */
Test(data, cache_refused_when_others_can_write_and_small_files_skipped)
{
    char cache[300];
    snprintf(cache, sizeof(cache), "%s/shared", dir);
    cr_assert_eq(mkdir(cache, 0777), 0);
    cr_assert_eq(chmod(cache, 0777), 0);
    ds_dataset d;
    cr_assert_eq(ds_dataset_load(&d, FMNIST "/t10k-images-idx3-ubyte.gz",
                                 FMNIST "/t10k-labels-idx1-ubyte.gz", cache, err, sizeof(err)), 0,
                 "%s", err);
    cr_expect_eq(d.cache, DS_DATA_CACHE_FAILED);
    cr_expect(strstr(d.cache_note, "writable by others"), "%s", d.cache_note);
    cr_expect_eq(d.n, 10000);
    ds_dataset_free(&d);
    good_pair(3);
    snprintf(cache, sizeof(cache), "%s/small", dir);
    cr_assert_eq(ds_dataset_load(&d, p("img.gz"), p("lab.gz"), cache, err, sizeof(err)), 0, "%s",
                 err);
    cr_expect_eq(d.cache, DS_DATA_CACHE_OFF, "a 60-byte file was cached (%d)", d.cache);
    ds_dataset_free(&d);
}

Test(data, small_good_file_and_raw_idx)
{
    good_pair(3);
    cr_expect_eq(load(), 0, "%s", err);
    uint32_t di[3] = {3, 4, 5};
    write_idx("img.gz", 3, di, 60, 0, 0, 1); /* uncompressed IDX is accepted */
    cr_expect_eq(load(), 0, "%s", err);
}

Test(data, missing_file)
{
    good_pair(3);
    ds_dataset d;
    int r = ds_dataset_load(&d, p("nope.gz"), p("lab.gz"), NULL, err, sizeof(err));
    cr_expect_eq(r, -ENOENT);
    cr_expect(strstr(err, "nope.gz: cannot open: No such file or directory"), "%s", err);
}

Test(data, directory_instead_of_file)
{
    good_pair(3);
    ds_dataset d;
    int r = ds_dataset_load(&d, dir, p("lab.gz"), NULL, err, sizeof(err));
    cr_expect_eq(r, -EISDIR);
    cr_expect(strstr(err, "is a directory"), "%s", err);
}

Test(data, fifo_instead_of_file)
{
    /* Refused without blocking (issue 16); alarm() turns a blocking open
     * into a crash of the test rather than a hang. */
    good_pair(3);
    cr_assert_eq(mkfifo(p("fifo.gz"), 0600), 0, "mkfifo: %s", strerror(errno));
    ds_dataset d;
    alarm(10);
    int r = ds_dataset_load(&d, p("fifo.gz"), p("lab.gz"), NULL, err, sizeof(err));
    alarm(0);
    cr_expect_eq(r, -EINVAL);
    cr_expect(strstr(err, "fifo.gz: cannot open: not a regular file (a FIFO)"), "%s", err);
}

Test(data, wrong_magic)
{
    good_pair(3);
    uint32_t dl[1] = {3};
    write_idx("img.gz", 1, dl, 3, 0, 0, 0); /* a label file where images belong */
    cr_expect_eq(load(), -EBADMSG);
    cr_expect(strstr(err, "img.gz: bad IDX magic 00 00 08 01, expected 00 00 08 03"), "%s", err);
}

Test(data, truncated_data)
{
    good_pair(3);
    uint32_t di[3] = {3, 4, 5};
    write_idx("img.gz", 3, di, 59, 0, 0, 0);
    cr_expect_eq(load(), -EBADMSG);
    cr_expect(strstr(err, "img.gz: truncated: the data needs 60 bytes, file has 59"), "%s", err);
}

Test(data, truncated_header)
{
    good_pair(3);
    FILE *f = fopen(p("lab.gz"), "wb");
    fwrite("\0\0\x08", 1, 3, f);
    fclose(f);
    cr_expect_eq(load(), -EBADMSG);
    cr_expect(strstr(err, "lab.gz: truncated: the IDX magic needs 4 bytes"), "%s", err);
}

Test(data, truncated_gzip_stream)
{
    good_pair(2000);
    /* Cut the compressed file in half: zlib reports an unexpected end. */
    struct stat st;
    cr_assert_eq(stat(p("img.gz"), &st), 0);
    cr_assert_eq(truncate(p("img.gz"), st.st_size / 2), 0);
    cr_expect_eq(load(), -EBADMSG);
    cr_expect(strstr(err, "img.gz: ") && (strstr(err, "truncated") || strstr(err, "corrupt")), "%s", err);
}

Test(data, corrupt_gzip_stream)
{
    good_pair(2000);
    FILE *f = fopen(p("img.gz"), "r+b");
    fseek(f, 40, SEEK_SET);
    for (int i = 0; i < 64; i++)
        fputc(0xA5 ^ i, f);
    fclose(f);
    cr_expect_eq(load(), -EBADMSG);
    cr_expect(strstr(err, "img.gz: corrupt compressed data"), "%s", err);
}

Test(data, trailing_bytes)
{
    good_pair(3);
    uint32_t dl[1] = {3};
    write_idx("lab.gz", 1, dl, 3, 1, 5, 0);
    cr_expect_eq(load(), -EBADMSG);
    cr_expect(strstr(err, "lab.gz: trailing bytes after the 3 declared"), "%s", err);
}

Test(data, mismatched_counts)
{
    good_pair(3);
    uint32_t dl[1] = {4};
    write_idx("lab.gz", 1, dl, 4, 1, 0, 0);
    cr_expect_eq(load(), -EINVAL);
    cr_expect(strstr(err, "lab.gz: 4 labels, but ") && strstr(err, "img.gz has 3 images"), "%s", err);
}

Test(data, label_out_of_range)
{
    good_pair(3);
    char path[512];
    snprintf(path, sizeof(path), "%s/lab.gz", dir);
    gzFile g = gzopen(path, "wb");
    const uint8_t b[] = {0, 0, 8, 1, 0, 0, 0, 3, 1, 12, 2};
    gzwrite(g, b, sizeof(b));
    gzclose(g);
    cr_expect_eq(load(), -EINVAL);
    cr_expect(strstr(err, "lab.gz: label 12 at index 1, expected 0..9"), "%s", err);
}

Test(data, oversized_declaration_is_refused_before_allocation)
{
    good_pair(3);
    uint32_t di[3] = {0x7fffffff, 28, 28};
    write_idx("img.gz", 3, di, 16, 0, 0, 0);
    cr_expect_eq(load(), -EBADMSG);
    cr_expect(strstr(err, "img.gz: declares more than 2147483648 bytes"), "%s", err);
}

Test(data, zero_dimension)
{
    good_pair(3);
    uint32_t di[3] = {3, 0, 5};
    write_idx("img.gz", 3, di, 0, 0, 0, 0);
    cr_expect_eq(load(), -EBADMSG);
    cr_expect(strstr(err, "img.gz: dimension 1 is 0"), "%s", err);
}

Test(data, sampler_is_a_permutation_per_epoch_and_seeded)
{
    ds_sampler a, b;
    cr_assert_eq(ds_sampler_init(&a, 1000, 42), 0);
    cr_assert_eq(ds_sampler_init(&b, 1000, 42), 0);
    uint32_t ia[1000], ib[1000];
    ds_sampler_next(&a, ia, 1000);
    ds_sampler_next(&b, ib, 1000);
    cr_expect_eq(memcmp(ia, ib, sizeof(ia)), 0);
    char seen[1000] = {0};
    for (int i = 0; i < 1000; i++)
        seen[ia[i]]++;
    for (int i = 0; i < 1000; i++)
        cr_expect_eq(seen[i], 1);
    /* Next epoch differs, and another seed differs. */
    ds_sampler_next(&a, ib, 1000);
    cr_expect_neq(memcmp(ia, ib, sizeof(ia)), 0);
    cr_expect_eq(a.epoch, 1);
    ds_sampler c;
    cr_assert_eq(ds_sampler_init(&c, 1000, 43), 0);
    ds_sampler_next(&c, ib, 1000);
    cr_expect_neq(memcmp(ia, ib, sizeof(ia)), 0);
    ds_sampler_free(&a);
    ds_sampler_free(&b);
    ds_sampler_free(&c);
    cr_expect_eq(ds_sampler_init(&c, 0, 1), -EINVAL);
}

/* The backend's gather (kernels.h gather_images: a device gathers from its
 * own copy of the images) gives the bits of the host gather, for a batch
 * by indices and one by position, on seeded random pixels with every byte
 * value. The CUDA kernel is compared with the same reference in
 * tests/test_cuda.c. */
Test(data, backend_gather_equals_the_host_gather)
{
    enum { N = 37, ROWS = 5, COLS = 7, B = 11 };
    const size_t dim = (size_t)ROWS * COLS;
    uint8_t images[N * ROWS * COLS], labels[N];
    uint64_t s = 42;
    for (size_t i = 0; i < sizeof(images); i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        images[i] = i < 256 ? (uint8_t)i : (uint8_t)(s >> 56);
    }
    for (int i = 0; i < N; i++)
        labels[i] = (uint8_t)(i % 10);
    ds_dataset d = {.n = N, .rows = ROWS, .cols = COLS, .images = images, .labels = labels};
    const uint32_t idx[B] = {36, 0, 5, 5, 17, 2, 33, 8, 9, 21, 1};
    float scale, shift;
    ds_dataset_norm(&scale, &shift);
    float xh[B * ROWS * COLS], xk[B * ROWS * COLS];
    int32_t yh[B], yk[B];
    for (int by_idx = 0; by_idx < 2; by_idx++) {
        const size_t first = by_idx ? 0 : 20;
        memset(xk, 0xff, sizeof(xk));
        memset(yk, 0xff, sizeof(yk));
        ds_dataset_gather(&d, by_idx ? idx : NULL, first, B, xh, yh);
        ds_gather_images_c(xk, yk, images, labels, by_idx ? idx : NULL, first, B, dim, scale,
                           shift);
        cr_assert_eq(memcmp(xh, xk, sizeof(xh)), 0, "pixels differ (by_idx %d)", by_idx);
        cr_assert_eq(memcmp(yh, yk, sizeof(yh)), 0, "labels differ (by_idx %d)", by_idx);
    }
}
