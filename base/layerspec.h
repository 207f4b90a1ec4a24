/*
 * base/layerspec.h: the layer list of train.layers (docs/config.md), a pure
 * parser like the host:port one, so the config loader can refuse a bad list
 * with the key, the line and the bad token, and node/train builds the model
 * from the same parse.
 *
 * Grammar (blanks around items and around ':' are allowed; names in lower
 * case):
 *   list   = layer { "," layer }              at most DS_LAYERSPEC_MAX layers
 *   layer  = "conv" K "x" K ":" C             K x K convolution, stride 1,
 *                                             same padding, C output planes;
 *                                             K odd in 1..9, C in 1..4096
 *          | "maxpool2"                       2x2 max-pool, stride 2
 *          | "relu"
 *          | "flatten"                        planes -> one vector (no copy)
 *          | "linear:" N                      fully connected, N in 1..65536
 *
 * Shapes (ds_layerspec_check) run from the input image, c x h x w: conv and
 * maxpool2 need an image (before any flatten; maxpool2 one of at least
 * 2x2), linear needs a vector (after flatten), and the list ends with
 * linear:<classes>, with at most DS_LAYERSPEC_MAX_PARAM conv and linear
 * items in all. relu comes after a conv, maxpool2 or linear (a flatten
 * between is fine): never on the input, never twice in a row.
 */
#ifndef DS_BASE_LAYERSPEC_H
#define DS_BASE_LAYERSPEC_H

#include <stddef.h>

#define DS_LAYERSPEC_MAX 32
#define DS_LAYERSPEC_MAX_PARAM 16 /* conv and linear items (each one gossip segment) */

/* The spec of train.model = cnn (issue 11). */
#define DS_LAYERSPEC_CNN \
    "conv3x3:32, relu, maxpool2, conv3x3:64, relu, maxpool2, flatten, linear:128, relu, linear:10"

/* The input every model is built for: the Fashion-MNIST image (the only
 * data set, node/train/data.h), 1 x 28 x 28, 10 classes. */
#define DS_FMNIST_C 1
#define DS_FMNIST_H 28
#define DS_FMNIST_W 28
#define DS_FMNIST_CLASSES 10

enum ds_lkind {
    DS_L_CONV = 0,
    DS_L_MAXPOOL = 1,
    DS_L_RELU = 2,
    DS_L_FLATTEN = 3,
    DS_L_LINEAR = 4,
};

typedef struct ds_lspec {
    enum ds_lkind kind;
    int k;      /* conv: kernel size */
    int n;      /* conv: output planes; linear: outputs */
    size_t at, len; /* the item's text in the parsed string (for errors) */
} ds_lspec;

typedef struct ds_layerspec {
    int n;
    ds_lspec l[DS_LAYERSPEC_MAX];
} ds_layerspec;

/* Why a list was refused: "expected <expected>, found '<text[at..at+len)>'
 * (layer <index>)" once the caller adds the key in front; index is 1-based,
 * 0 when the error is about the whole list. */
typedef struct ds_layerspec_err {
    char expected[192];
    size_t at, len;
    int index;
} ds_layerspec_err;

/* Parse s. 0, or -EINVAL with *e filled. */
int ds_layerspec_parse(const char *s, ds_layerspec *out, ds_layerspec_err *e);

/* Follow the shapes from a c x h x w input to `classes` outputs (rules
 * above), refusing a model of more than 2^31 - 1 parameters. 0, or -EINVAL
 * with *e filled (at/len point into the parsed text). */
int ds_layerspec_check(const ds_layerspec *sp, int c, int h, int w, int classes,
                       ds_layerspec_err *e);

/* "conv3x3:32", "maxpool2", "relu", "flatten", "linear:10" */
void ds_lspec_format(const ds_lspec *l, char *out, size_t n);

#endif
