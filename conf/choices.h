/*
 * conf/choices.h: the choices of the enum keys that no library module owns.
 *
 * An enum key's choices are listed once, by whoever gives them a meaning:
 * sparsify.method by sparsify/ (DS_SPARSIFY_METHODS), gossip.topology by
 * topology/ (DS_TOPO_KINDS), train.backend by kernels/ (DS_OPS_BACKENDS),
 * node.log_level by base/log.h (DS_LOG_LEVELS). The others belong to parts
 * of node/, which sit above conf/ and cannot be included by it, so their
 * lists live here and node/ uses the enums generated below:
 *   key                list             enum                 used by
 *   gossip.mix         DS_MIXES         enum ds_mix          node/gossip
 *   security.mode      DS_SEC_MODES     enum ds_sec_mode     node/sec
 *   train.model        DS_MODELS        enum ds_model_kind   node/runtime -> node/train
 *   train.lr_schedule  DS_LR_SCHEDULES  enum ds_lr_schedule  node/runtime -> node/train
 *   sparsify.value_format DS_VALUE_FORMATS enum ds_value_format node/gossip -> node/wire
 *   group.sparsify     DS_GROUP_SPARSIFIERS enum ds_group_sparsify node/runtime (rounds.c)
 *   group.allreduce    DS_GROUP_ALLREDUCES  enum ds_group_allreduce node/gossip (group.c)
 *
 * Every list has the same form, X(enumerator, value, name), in the order
 * the config's help and its errors list the names. The value is written
 * out because some of them are more than config: a security mode's value is
 * the mode byte of the handshake (docs/protocol.md), so it must not change
 * when the list is reordered.
 *
 * This header is plain C with no functions to link: node/ rooms include it
 * for the enums without depending on the config loader.
 */
#ifndef DS_CONF_CHOICES_H
#define DS_CONF_CHOICES_H

/* gossip.mix: how two nodes combine what they exchanged (docs/gossip.md).
 * crossover is dense only (ds_conf_check). */
#define DS_MIXES(X) \
    X(DS_MIX_PAIRWISE, 0, "pairwise") \
    X(DS_MIX_CROSSOVER, 1, "crossover")

/* security.mode: what protects every message (docs/security.md). The values
 * are the hello body's mode byte (docs/protocol.md). */
#define DS_SEC_MODES(X) \
    X(DS_SEC_ENCRYPT, 2, "encrypt") \
    X(DS_SEC_AUTH, 1, "auth") \
    X(DS_SEC_NONE, 0, "none")

/* train.model: the model architecture (docs/config.md): the MLP of
 * train.hidden, the CNN of base/layerspec.h's DS_LAYERSPEC_CNN, or the
 * layer list in train.layers. */
#define DS_MODELS(X) \
    X(DS_MODEL_MLP, 0, "mlp") \
    X(DS_MODEL_CNN, 1, "cnn") \
    X(DS_MODEL_CUSTOM, 2, "custom")

/* train.lr_schedule: the learning rate after the warm-up. */
#define DS_LR_SCHEDULES(X) \
    X(DS_LR_CONSTANT, 0, "constant") \
    X(DS_LR_COSINE, 1, "cosine")

/* sparsify.value_format: how exchanged values go on the wire
 * (docs/sparsify.md). The values are the header's value-format bits
 * (docs/protocol.md; node/wire's enum ds_wire_vfmt). */
#define DS_VALUE_FORMATS(X) \
    X(DS_VALUE_F32, 0, "f32") \
    X(DS_VALUE_F16, 1, "f16") \
    X(DS_VALUE_BF16, 2, "bf16")

/* group.sparsify: what a group's members send of their gradients inside
 * the group (docs/gossip.md, "Hierarchy"): none = the dense mean; micro =
 * MiCRO's rotating owned chunks with error feedback; deft = DEFT's layer
 * units, k shared by the group's norms, bin-packed to members. */
#define DS_GROUP_SPARSIFIERS(X) \
    X(DS_GROUP_SPARSIFY_NONE, 0, "none") \
    X(DS_GROUP_SPARSIFY_MICRO, 1, "micro") \
    X(DS_GROUP_SPARSIFY_DEFT, 2, "deft")

/* group.allreduce: the algorithm of a group's dense reduction
 * (node/gossip/group.h): direct = reduce-scatter then all-gather to chunk
 * owners (2 latencies); ring; butterfly = recursive doubling. The values
 * are enum ds_greduce_algo's. */
#define DS_GROUP_ALLREDUCES(X) \
    X(DS_GROUP_ALLREDUCE_DIRECT, 0, "direct") \
    X(DS_GROUP_ALLREDUCE_RING, 1, "ring") \
    X(DS_GROUP_ALLREDUCE_BUTTERFLY, 2, "butterfly") \
    X(DS_GROUP_ALLREDUCE_AUTO, 3, "auto")

#define DS_CHOICE_ENUMERATOR_(e, v, name) e = v,
enum ds_mix { DS_MIXES(DS_CHOICE_ENUMERATOR_) };
enum ds_sec_mode { DS_SEC_MODES(DS_CHOICE_ENUMERATOR_) };
enum ds_model_kind { DS_MODELS(DS_CHOICE_ENUMERATOR_) };
enum ds_lr_schedule { DS_LR_SCHEDULES(DS_CHOICE_ENUMERATOR_) };
enum ds_value_format { DS_VALUE_FORMATS(DS_CHOICE_ENUMERATOR_) };
enum ds_group_sparsify { DS_GROUP_SPARSIFIERS(DS_CHOICE_ENUMERATOR_) };
enum ds_group_allreduce { DS_GROUP_ALLREDUCES(DS_CHOICE_ENUMERATOR_) };
#undef DS_CHOICE_ENUMERATOR_

/* The name of a gossip.mix value, or "?" for one not in DS_MIXES. */
static inline const char *ds_mix_name(enum ds_mix m)
{
#define DS_CHOICE_CASE_(e, v, name) case e: return name;
    switch (m) {
    DS_MIXES(DS_CHOICE_CASE_)
    }
#undef DS_CHOICE_CASE_
    return "?";
}

/* The name of a group.sparsify value, or "?". */
static inline const char *ds_group_sparsify_name(enum ds_group_sparsify m)
{
#define DS_CHOICE_CASE_(e, v, name) case e: return name;
    switch (m) {
    DS_GROUP_SPARSIFIERS(DS_CHOICE_CASE_)
    }
#undef DS_CHOICE_CASE_
    return "?";
}

#endif
