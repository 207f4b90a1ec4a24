/*
 * node/run/state.h: `dsnode run`'s own part of a checkpoint: what the
 * trainer's next step depends on beyond the parameters (which libdsnode's
 * checkpoint holds itself). The bytes go to dsnode_checkpoint and come
 * back through dsnode_resume's restore callback.
 *
 * Layout, little-endian (as the checkpoint; x86-64):
 *   samples u64, n u64, momentum f32[n],
 *   examples u64, pos u64, epoch u64, rng u64[4], perm u32[examples]
 * (the optimizer's sample count and momentum; the data order: the
 * epoch's permutation, the position in it, the epoch and the sampler's
 * xoshiro256** state).
 */
#ifndef DS_NODE_RUN_STATE_H
#define DS_NODE_RUN_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "node/train/train.h"

/* The trainer's state as bytes: *out (malloc'ed; the caller frees it) of
 * *len bytes. 0, -ENOMEM, or the device's negative errno (err set). */
int ds_run_state_save(ds_trainer *t, uint8_t **out, size_t *len, char *err, size_t err_len);

/* Check b (len bytes) against the trainer's shapes and put it back, with
 * step. Nothing changes unless every check passes. 0; -EINVAL (shapes
 * differ, or a corrupt data order), or the device's negative errno; err
 * has one line. */
int ds_run_state_load(ds_trainer *t, const void *b, size_t len, int64_t step, char *err,
                      size_t err_len);

#endif
