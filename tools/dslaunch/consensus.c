/*
 * tools/dslaunch/consensus.c: how far apart the nodes' final models are.
 *
 * Every dsnode writes its final parameters to <data_dir>/model.bin
 * ("DSMODEL1", u64 little-endian count n, n little-endian float32). Gossip
 * training should end with the nodes' models close together; the number
 * dslaunch reports for that is the relative consensus distance
 *
 *     (1/m) sum_i ||theta_i - mean||_2 / ||mean||_2,   mean = (1/m) sum_i theta_i
 *
 * over the m models that could be read. It is relative so that one figure
 * means the same for a small and a large model; the absolute mean distance
 * is reported beside it, because the relative one is undefined when the mean
 * is the zero vector.
 *
 * Models can be large and clusters wide, so the files are streamed together
 * in chunks: for each chunk, the mean of that chunk over all models, then
 * each model's squared distance to it, all accumulated in double. Memory is
 * m chunks, whatever the model size. A file is checked whole before that
 * pass (header, exact size, every value finite), so one corrupt or
 * half-written file is left out with a message instead of turning every
 * figure into NaN.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tools/dslaunch/dslaunch.h"

#define CHUNK 16384 /* floats per file per pass step */

_Static_assert(sizeof(float) == 4, "model.bin holds IEEE-754 binary32");

/* model.bin is little-endian, like every host dsnode builds for (x86-64;
 * node/wire/wire.h pins the byte order for the node as a whole). Refuse to
 * misread it anywhere else rather than convert silently. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "model.bin is read natively");

static int open_model(const char *path, FILE **fp, uint64_t *n, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(e));
        return -e;
    }
    unsigned char hdr[DS_MODEL_HDR];
    struct stat st;
    if (fread(hdr, 1, sizeof(hdr), f) != sizeof(hdr) || memcmp(hdr, DS_MODEL_MAGIC, 8) != 0) {
        snprintf(err, errlen, "%s: not a dsnode model file (no DSMODEL1 header)", path);
        fclose(f);
        return -EPROTO;
    }
    uint64_t count = 0;
    for (int i = 0; i < 8; i++)
        count |= (uint64_t)hdr[8 + i] << (8 * i);
    if (fstat(fileno(f), &st) < 0 || count > ((uint64_t)INT64_MAX - DS_MODEL_HDR) / 4 ||
        (uint64_t)st.st_size != DS_MODEL_HDR + 4 * count) {
        snprintf(err, errlen, "%s: header says %llu values but the file has %lld bytes", path,
                 (unsigned long long)count, (long long)st.st_size);
        fclose(f);
        return -EMSGSIZE;
    }
    *fp = f;
    *n = count;
    return 0;
}

int ds_model_check(const char *path, uint64_t *n_params, char *err, size_t errlen)
{
    FILE *f;
    uint64_t n;
    int ret = open_model(path, &f, &n, err, errlen);
    if (ret < 0)
        return ret;
    float *buf = malloc(CHUNK * sizeof(float));
    if (!buf) {
        fclose(f);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    for (uint64_t done = 0; done < n && ret == 0;) {
        size_t want = n - done < CHUNK ? (size_t)(n - done) : CHUNK;
        if (fread(buf, sizeof(float), want, f) != want) {
            snprintf(err, errlen, "%s: read failed at value %llu", path, (unsigned long long)done);
            ret = -EIO;
            break;
        }
        for (size_t i = 0; i < want; i++)
            if (!isfinite(buf[i])) {
                snprintf(err, errlen, "%s: value %llu is not finite", path,
                         (unsigned long long)(done + i));
                ret = -EDOM;
                break;
            }
        done += want;
    }
    free(buf);
    fclose(f);
    if (ret == 0)
        *n_params = n;
    return ret;
}

/* Check every model of paths[0..n): st[i] = 0 for one that enters the
 * figures, else why not (-ENOENT for NULL, -EXDEV for a length other than
 * the first good model's *len; said on warn). Returns how many entered, or
 * -ENOMEM. */
static int check_models(const char *const *paths, int n, int *st, uint64_t *len, FILE *warn)
{
    char err[512];
    int m = 0;
    for (int i = 0; i < n; i++) {
        uint64_t ni;
        if (!paths[i]) {
            st[i] = -ENOENT;
            continue;
        }
        st[i] = ds_model_check(paths[i], &ni, err, sizeof(err));
        if (st[i] == -ENOMEM)
            return -ENOMEM;
        if (st[i] == 0 && m > 0 && ni != *len) {
            snprintf(err, sizeof(err), "%s: %llu values, the first model has %llu", paths[i],
                     (unsigned long long)ni, (unsigned long long)*len);
            st[i] = -EXDEV;
        }
        if (st[i] < 0) {
            if (warn)
                fprintf(warn, "dslaunch: model left out of the consensus distance: %s\n", err);
            continue;
        }
        *len = ni;
        m++;
    }
    return m;
}

int ds_consensus_compute(const char *const *paths, int n, int *status, ds_consensus *out,
                         FILE *warn)
{
    char err[512];
    uint64_t len = 0;
    int m = 0, ret = 0;
    int *st = calloc((size_t)(n > 0 ? n : 1), sizeof(int));
    FILE **files = calloc((size_t)(n > 0 ? n : 1), sizeof(FILE *));
    double *dist2 = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    float *buf = NULL;
    double *mean = malloc(CHUNK * sizeof(double));
    out->n_models = 0;
    out->n_params = 0;
    out->rel = out->abs = out->mean_norm = NAN;
    if (!st || !files || !dist2 || !mean) {
        ret = -ENOMEM;
        goto free_arrays;
    }

    m = check_models(paths, n, st, &len, warn);
    if (m < 0) {
        ret = m;
        goto free_arrays;
    }
    out->n_models = m;
    out->n_params = len;
    if (m < 2)
        goto done;

    buf = malloc((size_t)m * CHUNK * sizeof(float));
    if (!buf) {
        ret = -ENOMEM;
        goto free_arrays;
    }
    /* Open every used model, positioned after its header. The check above
     * read them already; a file that changed since then is an I/O error. */
    for (int i = 0; i < n; i++) {
        uint64_t ni;
        if (st[i] < 0)
            continue;
        if (open_model(paths[i], &files[i], &ni, err, sizeof(err)) < 0 || ni != len) {
            if (warn)
                fprintf(warn, "dslaunch: %s changed while being read\n", paths[i]);
            ret = -EIO;
            goto close_files;
        }
    }
    double norm2 = 0;
    for (uint64_t done = 0; done < len;) {
        const size_t want = len - done < CHUNK ? (size_t)(len - done) : CHUNK;
        int k = 0;
        for (size_t j = 0; j < want; j++)
            mean[j] = 0;
        for (int i = 0; i < n; i++) {
            if (st[i] < 0)
                continue;
            float *b = buf + (size_t)k * CHUNK;
            if (fread(b, sizeof(float), want, files[i]) != want) {
                if (warn)
                    fprintf(warn, "dslaunch: %s: read failed\n", paths[i]);
                ret = -EIO;
                goto close_files;
            }
            for (size_t j = 0; j < want; j++)
                mean[j] += b[j];
            k++;
        }
        for (size_t j = 0; j < want; j++) {
            mean[j] /= m;
            norm2 += mean[j] * mean[j];
        }
        k = 0;
        for (int i = 0; i < n; i++) {
            if (st[i] < 0)
                continue;
            const float *b = buf + (size_t)k * CHUNK;
            double s = 0;
            for (size_t j = 0; j < want; j++) {
                const double d = (double)b[j] - mean[j];
                s += d * d;
            }
            dist2[i] += s;
            k++;
        }
        done += want;
    }
    double sum = 0;
    for (int i = 0; i < n; i++)
        if (st[i] == 0)
            sum += sqrt(dist2[i]);
    out->abs = sum / m;
    out->mean_norm = sqrt(norm2);
    out->rel = out->mean_norm > 0 ? out->abs / out->mean_norm : NAN;

close_files:
    for (int i = 0; i < n; i++)
        if (files[i])
            fclose(files[i]);
done:
    if (status)
        for (int i = 0; i < n; i++)
            status[i] = st[i];
free_arrays:
    free(buf);
    free(mean);
    free(dist2);
    free(files);
    free(st);
    return ret;
}
