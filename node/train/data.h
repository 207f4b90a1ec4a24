/*
 * node/train/data.h: Fashion-MNIST from IDX files (gzip or plain), and each node's
 * seeded minibatch stream.
 *
 * IDX: a 4-byte magic (0, 0, type 0x08 = unsigned byte, number of dims),
 * then one big-endian u32 per dimension, then the data. Images are 3-D
 * (n, rows, cols), labels 1-D (n). The loader checks magic, dims, declared
 * sizes against bounds, the data length (truncation and trailing bytes), the
 * gzip stream's integrity, that image and label counts match and that every
 * label is a valid class; each error names the file.
 */
#ifndef DS_NODE_DATA_H
#define DS_NODE_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "base/rng.h"

#define DS_DATA_CLASSES 10
/* Refuse IDX files that declare more than this many bytes of data. */
#define DS_DATA_MAX_BYTES ((uint64_t)1 << 31)

/* What the inflated-data cache did for a file's images (ds_dataset.cache). */
enum {
    DS_DATA_CACHE_OFF = 0,     /* no cache directory, or not a file it takes */
    DS_DATA_CACHE_HIT = 1,     /* mapped from the cache: nothing inflated */
    DS_DATA_CACHE_WRITTEN = 2, /* inflated, and written to the cache */
    DS_DATA_CACHE_FAILED = 3,  /* the cache could not be used (cache_note says
                                * why); the data was inflated as without one */
};

typedef struct ds_dataset {
    size_t n;           /* examples */
    int rows, cols;     /* image shape */
    uint8_t *images;    /* n * rows * cols, owned (or inside images_map) */
    uint8_t *labels;    /* n, owned */
    void *images_map;   /* the cache file mapped (read-only), or NULL */
    size_t images_map_len;
    int cache;          /* DS_DATA_CACHE_* */
    char cache_note[160];
} ds_dataset;

/* Load an image file and its label file. cache_dir (NULL or "": none) is
 * the inflated-data cache (train.dataset_cache; data.c says how it is
 * kept and checked); it never changes what is loaded, only how. 0, or
 * -ENOENT / -EIO / -EBADMSG / -ENOMEM / -EINVAL with one line in err
 * naming the file. */
int ds_dataset_load(ds_dataset *d, const char *images_path, const char *labels_path,
                    const char *cache_dir, char *err, size_t err_len);

/* Load dir/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz. */
int ds_dataset_load_fmnist(ds_dataset *train, ds_dataset *test, const char *dir,
                           const char *cache_dir, char *err, size_t err_len);

void ds_dataset_free(ds_dataset *d);

/* Pixels to floats: (p/255 - mean) / std with Fashion-MNIST's statistics,
 * for rows idx[0..batch) (or 0..batch when idx is NULL, from `first`). */
void ds_dataset_gather(const ds_dataset *d, const uint32_t *idx, size_t first, int batch,
                       float *x, int32_t *y);

/* The gather's affine map, x = p * scale + shift, for a backend that
 * gathers from its own copy of the images (kernels.h, gather_images). */
void ds_dataset_norm(float *scale, float *shift);

/* An endless stream of minibatch indices: a fresh seeded permutation per
 * epoch (Fisher-Yates), batches taken in order, wrapping into the next
 * epoch mid-batch. */
typedef struct ds_sampler {
    uint32_t *perm;     /* owned */
    size_t n, pos;
    uint64_t epoch;
    ds_rng rng;
} ds_sampler;

int ds_sampler_init(ds_sampler *s, size_t n, uint64_t seed);
void ds_sampler_next(ds_sampler *s, uint32_t *idx, int batch);
void ds_sampler_free(ds_sampler *s);

#endif
