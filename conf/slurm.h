/*
 * conf/slurm.h: what `dsnode run --slurm` derives from a Slurm task's
 * environment (issue 13; docs/deploy.md, "Slurm").
 *
 * A task started by srun inside an allocation gets, from the variables
 * Slurm sets:
 *   node.name      <SLURM_JOB_ID>-<SLURM_PROCID>
 *   node.group     SLURMD_NODENAME (the tasks of one Slurm node all-reduce)
 *   node.listen    node.listen's host, port slurm.port_base + SLURM_LOCALID
 *   node.advertise (only when set) its host, the same port
 *   status.listen  (only when set) its host, its port + SLURM_LOCALID
 *   cluster.seeds  the first slurm.seeds hosts of SLURM_STEP_NODELIST (else
 *                  SLURM_JOB_NODELIST), each at slurm.port_base (its local
 *                  task 0), the host resolved to an address; the task that
 *                  is the first of them gets none (it starts the cluster),
 *                  and a task is never its own seed
 * SLURM_NODEID and SLURM_NTASKS are read to check the task against the
 * node list. A missing or malformed variable is an error that names it.
 * The caller applies the assignments to keys the user did not --set
 * (explicit values win).
 *
 * Pure functions: the environment, the host-list expansion and the name
 * resolution come in as callbacks, so tests drive them with tables.
 */
#ifndef DS_CONF_SLURM_H
#define DS_CONF_SLURM_H

#include <stddef.h>

#include "base/hostport.h"
#include "conf/conf.h"

#define DS_SLURM_HOSTS_MAX 16 /* the most hosts a derivation looks at */
#define DS_SLURM_SETS_MAX 7 /* name, group, listen, seeds, device, advertise, status.listen */

typedef char ds_slurm_host[DS_HOST_MAX + 1];

/* Expand Slurm's compressed host list ("node[01-03,07],login2") into its
 * first max names, in order (zero-padded ranges keep their width). Returns
 * how many were stored (the list may name more), or -EINVAL with one line
 * in err. */
int ds_slurm_hostlist(const char *list, ds_slurm_host *hosts, int max, char *err,
                      size_t err_len);

typedef const char *(*ds_slurm_getenv_fn)(const char *name);
/* Expand a host list as ds_slurm_hostlist does (dsnode: scontrol show
 * hostnames, ds_slurm_hostlist when scontrol is missing or fails). */
typedef int (*ds_slurm_hosts_fn)(const char *list, ds_slurm_host *hosts, int max, char *err,
                                 size_t err_len);
/* A host name to an address text (no brackets), 0 or -1 with err. */
typedef int (*ds_slurm_resolve_fn)(const char *host, char *addr, size_t addr_len, char *err,
                                   size_t err_len);

typedef struct ds_slurm_sets {
    int n;
    char set[DS_SLURM_SETS_MAX][DS_CONF_LIST_MAX * DS_CONF_STR_MAX]; /* "section.key=value" */
} ds_slurm_sets;

/* The assignments for the task described by env, given the loaded config
 * c (slurm.port_base, slurm.seeds, node.listen's host). 0, or -EINVAL with
 * one line in err naming the variable and what was expected and found. */
int ds_slurm_derive(const ds_conf *c, ds_slurm_getenv_fn env, ds_slurm_hosts_fn hosts,
                    ds_slurm_resolve_fn resolve, ds_slurm_sets *out, char *err, size_t err_len);

#endif
