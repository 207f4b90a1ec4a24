/*
 * conf/keys.h: THE list of dsnode's configuration keys (design §8).
 *
 * Everything the configuration system knows about a key is written here once:
 * its section, name, type, default, constraint and help line. conf.h expands
 * the list into the struct ds_conf (one nested struct per section, so code
 * reads c->train.lr); conf.c expands it into the key table that drives the
 * ini handler, the per-key validation, the dump and the help text. Adding a
 * key is one line here, one row in docs/config.md and one case in
 * tests/test_conf.c (the test refuses a key it has no case for); an enum
 * key also needs a consumer case in tests/test_conf_choices.c.
 *
 * Each section has its own list, DS_CONF_KEYS_<section>(X), so the struct can
 * be generated section by section; DS_CONF_SECTIONS(S, X) names the sections
 * in order and hands each one's list to S together with X.
 *
 * Entry forms (X receives the type token first, then section and key):
 *   X(STR,   section, key, "default", CHECK, "help")
 *            CHECK is ANY, NONEMPTY, NAME, NAME_OR_EMPTY, HOSTPORT,
 *            HOSTPORT_OR_EMPTY, PATH or PATH_OR_EMPTY (see conf.c,
 *            check_str). A PATH key's relative value is resolved when it is
 *            loaded: against the config file's directory when the file
 *            writes it, else against the working directory
 *            (ds_conf_resolve_paths)
 *   X(INT,   section, key, "default", min, max, "help")
 *   X(FLOAT, section, key, "default", min, max, "bounds", "help")
 *            bounds is "[]", "(]", "[)" or "()": which ends are inclusive;
 *            max == DBL_MAX means no upper bound
 *   X(BOOL,  section, key, "default", "help")
 *   X(ENUM,  section, key, "default", enum type, LIST, "help")
 *            LIST is the X-macro list of the choices, X(enumerator, value,
 *            "name") each, kept by the module that gives them a meaning
 *            (sparsify/, topology/, kernels/, base/log.h) or, for parts of
 *            node/, in conf/choices.h; enum type is the enum it generates,
 *            the type of the field in ds_conf
 *   X(ILIST, section, key, "default", item_min, item_max, count_min, count_max, "help")
 *   X(SLIST, section, key, "default", CHECK, count_min, count_max, "help")
 *
 * Defaults are written as text and parsed by the same code that parses a
 * config file, so a default can never be something a user could not write.
 * The min/max expressions use <stdint.h> and <float.h> names; the files that
 * expand this list include those headers.
 *
 * The headers below are included for their choice lists and enums only
 * (macros and types): conf/ links none of those modules.
 */
#ifndef DS_CONF_KEYS_H
#define DS_CONF_KEYS_H

#include "base/log.h"           /* DS_LOG_LEVELS */
#include "conf/choices.h"       /* DS_MIXES, DS_SEC_MODES, DS_MODELS, DS_LR_SCHEDULES */
#include "kernels/kernels.h"    /* DS_OPS_BACKENDS */
#include "sparsify/sparsify.h"  /* DS_SPARSIFY_METHODS */
#include "topology/topology.h"  /* DS_TOPO_KINDS */

#define DS_CONF_SECTIONS(S, X) \
    S(node, X) \
    S(cluster, X) \
    S(train, X) \
    S(sparsify, X) \
    S(gossip, X) \
    S(group, X) \
    S(transport, X) \
    S(security, X) \
    S(status, X) \
    S(slurm, X)

#define DS_CONF_KEYS_node(X) \
    X(STR, node, name, "node0", NAME, \
      "this node's name, unique in the cluster (logs, status, handshake, data shuffle)") \
    X(STR, node, listen, "127.0.0.1:7000", HOSTPORT, \
      "address this node listens on for its peers") \
    X(STR, node, advertise, "", HOSTPORT_OR_EMPTY, \
      "address peers are told to dial; empty = node.listen, or for a wildcard node.listen the address of the default route's interface") \
    X(STR, node, group, "", NAME_OR_EMPTY, \
      "nodes with the same group all-reduce gradients every step and gossip as one between " \
      "groups; auto = the host name; empty = a group of its own") \
    X(STR, node, data_dir, ".", PATH, \
      "directory for this node's outputs and state") \
    X(ENUM, node, log_level, "info", enum ds_log_level, DS_LOG_LEVELS, \
      "log threshold")

#define DS_CONF_KEYS_cluster(X) \
    X(STR, cluster, id, "dsnode", NAME, \
      "cluster id, bound into every message's associated data") \
    X(SLIST, cluster, seeds, "", HOSTPORT, 0, 16, \
      "peers to contact when joining; empty = this node starts the cluster") \
    X(INT, cluster, seed, "1", 0, INT64_MAX, \
      "cluster seed for data shuffles and the topology; the same on every node") \
    X(STR, cluster, key_file, "", PATH_OR_EMPTY, \
      "path of the 32-byte cluster pre-shared key (dsnode keygen --cluster)") \
    X(STR, cluster, identity_file, "", PATH_OR_EMPTY, \
      "path of this node's Ed25519 secret key (dsnode keygen)") \
    X(STR, cluster, allowed_keys, "", PATH_OR_EMPTY, \
      "path of the allow-list of node public keys, one per line") \
    X(INT, cluster, min_members, "1", 1, 65536, \
      "wait until this many members are alive before the first training step") \
    X(INT, cluster, join_timeout_s, "120", 1, 86400, \
      "a joining node that no seed lets in, or that sees fewer than cluster.min_members " \
      "alive, within this many seconds exits with an error")

#define DS_CONF_KEYS_train(X) \
    X(ENUM, train, backend, "auto", enum ds_ops_backend, DS_OPS_BACKENDS, \
      "compute backend; auto = CUDA when a device answers, else the CPU") \
    X(STR, train, device, "auto", DEVICE, \
      "CUDA device of the cuda backend (and of auto): an index, or auto = the local rank (DSNODE_RANK, SLURM_LOCALID or LOCAL_RANK; 0 without one) modulo the devices; --slurm: SLURM_LOCALID mod the devices in CUDA_VISIBLE_DEVICES") \
    X(ENUM, train, model, "mlp", enum ds_model_kind, DS_MODELS, \
      "model architecture: mlp (train.hidden), cnn (conv-pool x2, 128, 10) or custom (train.layers)") \
    X(ILIST, train, hidden, "256,256", 1, 65536, 1, 8, \
      "hidden layer sizes of the MLP (train.model = mlp only)") \
    X(STR, train, layers, "", LAYERS_OR_EMPTY, \
      "layer list of train.model = custom, e.g. conv3x3:32, relu, maxpool2, flatten, linear:10") \
    X(STR, train, dataset_dir, "/usr/share/datasets/fashion-mnist", PATH, \
      "directory holding the Fashion-MNIST IDX files (gzip)") \
    X(STR, train, dataset_cache, "", PATH_OR_EMPTY, \
      "directory where the nodes of a host share the inflated images (created 0700); empty = none") \
    X(INT, train, batch_size, "64", 1, 65536, \
      "minibatch size of each node") \
    X(FLOAT, train, lr, "0.05", 0, 10, "(]", \
      "learning rate, reached at the end of the warm-up") \
    X(FLOAT, train, momentum, "0.9", 0, 1, "[)", \
      "SGD momentum; 0 = none") \
    X(FLOAT, train, weight_decay, "0.0001", 0, 1, "[]", \
      "L2 weight decay") \
    X(BOOL, train, nesterov, "false", \
      "Nesterov momentum (needs momentum > 0)") \
    X(ENUM, train, lr_schedule, "cosine", enum ds_lr_schedule, DS_LR_SCHEDULES, \
      "learning rate after the warm-up: constant, or cosine decay to 0 at train.steps") \
    X(INT, train, warmup_steps, "0", 0, INT64_MAX, \
      "steps of linear learning-rate warm-up, at most train.steps; 0 = none") \
    X(INT, train, steps, "3000", 1, INT64_MAX, \
      "training steps") \
    X(INT, train, eval_every, "500", 0, INT64_MAX, \
      "test accuracy every N steps; 0 = only at the end") \
    X(INT, train, log_every, "100", 1, INT64_MAX, \
      "log the training loss every N steps") \
    X(INT, train, threads, "1", 1, 256, \
      "BLAS threads of the CPU backend") \
    X(INT, train, checkpoint_every, "0", 0, INT64_MAX, \
      "write <node.data_dir>/checkpoint.bin every N steps, at exit and on SIGTERM; 0 = none " \
      "(unless train.stop_after or --resume)") \
    X(INT, train, stop_after, "0", 0, INT64_MAX, \
      "pause after N steps of this process: checkpoint, status paused, exit 0; 0 = run to train.steps")

#define DS_CONF_KEYS_sparsify(X) \
    X(ENUM, sparsify, method, "micro", enum ds_sparsify_method, DS_SPARSIFY_METHODS, \
      "sparsifier for what a node sends; none = dense") \
    X(FLOAT, sparsify, density, "0.01", 0, 1, "(]", \
      "fraction of a segment's values sent per exchange") \
    X(BOOL, sparsify, error_feedback, "true", \
      "keep what was not sent and send it later") \
    X(ENUM, sparsify, value_format, "f32", enum ds_value_format, DS_VALUE_FORMATS, \
      "how exchanged values go on the wire: f32, or f16 / bf16 (half the value bytes; the " \
      "rounding stays in the sender's model)") \
    X(FLOAT, sparsify, threshold, "0", 0, DBL_MAX, "[]", \
      "starting threshold; 0 = automatic (exact k-th largest |v| of the first call)")

#define DS_CONF_KEYS_gossip(X) \
    X(ENUM, gossip, topology, "crossover", enum ds_topo_kind, DS_TOPO_KINDS, \
      "who exchanges with whom each round; allreduce = dense all-reduce baseline, no gossip") \
    X(ENUM, gossip, mix, "pairwise", enum ds_mix, DS_MIXES, \
      "mixing rule; crossover is dense only (sparsify.method = none)") \
    X(FLOAT, gossip, weight, "0.3333333333", 0, 0.5, "(]", \
      "pairwise mixing weight w") \
    X(INT, gossip, segments, "0", 0, 65536, \
      "segments of the model per round; 0 = one per layer; at most the model's parameter count") \
    X(INT, gossip, every, "1", 1, INT64_MAX, \
      "gossip every N training steps") \
    X(INT, gossip, timeout_ms, "2000", 1, 600000, \
      "longest wait for a peer in a round (the adaptive deadline is shorter)") \
    X(INT, gossip, min_wait_ms, "10", 1, 600000, \
      "shortest adaptive deadline: a round waits at least this long for its partners (capped at gossip.timeout_ms)") \
    X(BOOL, gossip, overlap, "false", \
      "overlap a round's exchanges with the next step's computation")

#define DS_CONF_KEYS_group(X) \
    X(ENUM, group, sparsify, "none", enum ds_group_sparsify, DS_GROUP_SPARSIFIERS, \
      "what members of a group send of their gradients each step; none = the dense mean, " \
      "micro = MiCRO: rotating owned chunks, threshold and error feedback per member; " \
      "deft = DEFT: layers cut in units, k by the group's unit norms, units bin-packed " \
      "to members, exact top-k in each") \
    X(FLOAT, group, density, "0.01", 0, 1, "(]", \
      "group.sparsify's target: fraction of the gradient the whole group sends per step") \
    X(ENUM, group, allreduce, "direct", enum ds_group_allreduce, DS_GROUP_ALLREDUCES, \
      "algorithm of the group's reduction; direct = reduce-scatter then all-gather to chunk " \
      "owners (2 latencies), ring = chunks passed round the members, butterfly = recursive " \
      "doubling of whole vectors, auto = direct or butterfly, whichever the group's member 0 " \
      "timed faster (median of 8 reductions each) when the group formed (again every 2000; " \
      "with group.overlap, for each reduction's length from a model alpha + beta * floats " \
      "fitted to those timings); ring and butterfly run direct for 16 reductions after one " \
      "fails") \
    X(BOOL, group, overlap, "false", \
      "reduce each layer's gradient on a thread of its own as soon as backward wrote it, " \
      "behind the rest of backward (small layers together, up to 256 KiB; the first layer " \
      "with the step's own reduction); dense groups only (group.sparsify = none)")

#define DS_CONF_KEYS_transport(X) \
    X(STR, transport, provider, "tcp", NONEMPTY, \
      "libfabric provider: tcp, shm, verbs, efa, cxi, ...") \
    X(INT, transport, op_timeout_ms, "5000", 1, 600000, \
      "deadline of every transport operation") \
    X(INT, transport, max_inflight_mb, "8", 1, 65536, \
      "cap on bytes in flight to one peer, in MiB")

#define DS_CONF_KEYS_security(X) \
    X(ENUM, security, mode, "encrypt", enum ds_sec_mode, DS_SEC_MODES, \
      "encrypt = AEAD on every message; auth = authenticate only; none = only if every address is loopback")

#define DS_CONF_KEYS_status(X) \
    X(STR, status, listen, "", HOSTPORT_OR_EMPTY, \
      "HTTP address serving /metrics and /status; empty = off") \
    X(STR, status, file, "", PATH_OR_EMPTY, \
      "file the status JSON is written to; empty = off") \
    X(INT, status, file_interval_ms, "500", 20, 60000, \
      "status.file is rewritten at most this often, in ms")

/* Read only by `dsnode run --slurm` (conf/slurm.h, docs/deploy.md). */
#define DS_CONF_KEYS_slurm(X) \
    X(INT, slurm, port_base, "7000", 1, 65535, \
      "with --slurm: a task listens on this port + SLURM_LOCALID (node.listen's host kept)") \
    X(INT, slurm, seeds, "1", 1, 16, \
      "with --slurm: the first N hosts of the step's node list are the seeds (their local task 0)")

#endif
