/*
 * conf/slurm.c: `dsnode run --slurm`'s derivation (conf/slurm.h).
 */
#include "conf/slurm.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- host lists -------------------------------------------------------- */

/* Expand one item (no top-level comma), len bytes of s, appending to hosts. */
static int expand_item(const char *s, size_t len, ds_slurm_host *hosts, int *n, int max,
                       char *err, size_t err_len)
{
    if (*n >= max)
        return 0;
    const char *open = memchr(s, '[', len);
    if (!open) {
        if (len == 0 || len > DS_HOST_MAX || memchr(s, ']', len)) {
            snprintf(err, err_len, "expected a host name, found '%.*s'", (int)len, s);
            return -EINVAL;
        }
        memcpy(hosts[*n], s, len);
        hosts[*n][len] = '\0';
        (*n)++;
        return 0;
    }
    const char *close = memchr(open, ']', len - (size_t)(open - s));
    if (!close || close == open + 1) {
        snprintf(err, err_len, "expected '[ranges]', found '%.*s'", (int)len, s);
        return -EINVAL;
    }
    const size_t pre = (size_t)(open - s), rest = len - (size_t)(close + 1 - s);
    for (const char *r = open + 1; r < close && *n < max;) {
        const char *end = memchr(r, ',', (size_t)(close - r));
        if (!end)
            end = close;
        /* "a" or "a-b", decimal; a's digits give the width ("01-03"). */
        char lo_txt[24] = "", hi_txt[24] = "";
        const char *dash = memchr(r, '-', (size_t)(end - r));
        const size_t lo_len = (size_t)((dash ? dash : end) - r);
        const size_t hi_len = dash ? (size_t)(end - dash - 1) : lo_len;
        if (lo_len == 0 || lo_len >= sizeof(lo_txt) || hi_len == 0 || hi_len >= sizeof(hi_txt)) {
            snprintf(err, err_len, "expected a range like 01-03 in '%.*s', found '%.*s'",
                     (int)len, s, (int)(end - r), r);
            return -EINVAL;
        }
        memcpy(lo_txt, r, lo_len);
        memcpy(hi_txt, dash ? dash + 1 : r, hi_len);
        char *e1, *e2;
        errno = 0;
        const unsigned long long lo = strtoull(lo_txt, &e1, 10), hi = strtoull(hi_txt, &e2, 10);
        if (*e1 || *e2 || errno || lo_txt[0] == '-' || lo_txt[0] == '+' || hi_txt[0] == '-' ||
            hi_txt[0] == '+' || hi < lo) {
            snprintf(err, err_len, "expected a range like 01-03 in '%.*s', found '%.*s'",
                     (int)len, s, (int)(end - r), r);
            return -EINVAL;
        }
        for (unsigned long long v = lo; v <= hi && *n < max; v++) {
            char buf[2 * DS_HOST_MAX + 64];
            const int k = snprintf(buf, sizeof(buf), "%.*s%0*llu%.*s", (int)pre, s, (int)lo_len,
                                   v, (int)rest, close + 1);
            if (k < 0 || (size_t)k >= sizeof(buf)) {
                snprintf(err, err_len, "expected a host name, found '%.*s...'", (int)pre, s);
                return -EINVAL;
            }
            const int rc = expand_item(buf, (size_t)k, hosts, n, max, err, err_len);
            if (rc < 0)
                return rc;
        }
        r = end + 1;
    }
    return 0;
}

int ds_slurm_hostlist(const char *list, ds_slurm_host *hosts, int max, char *err,
                      size_t err_len)
{
    char sub[DS_CONF_ERR_MAX / 2] = "";
    int n = 0, depth = 0;
    const char *item = list;
    if (!list || !*list) {
        snprintf(err, err_len, "host list: expected host names, found ''");
        return -EINVAL;
    }
    for (const char *p = list;; p++) {
        if (*p == '[')
            depth++;
        else if (*p == ']')
            depth--;
        if (depth < 0 || depth > 1 || (!*p && depth)) {
            snprintf(err, err_len, "host list '%s': expected balanced, unnested brackets", list);
            return -EINVAL;
        }
        if (*p && (*p != ',' || depth))
            continue;
        if (expand_item(item, (size_t)(p - item), hosts, &n, max, sub, sizeof(sub)) < 0) {
            snprintf(err, err_len, "host list '%s': %s", list, sub);
            return -EINVAL;
        }
        if (!*p)
            break;
        item = p + 1;
    }
    return n;
}

/* ---- the derivation ----------------------------------------------------- */

#define NOT_IN_SLURM "(expected in a task started by srun inside a Slurm allocation)"

static int env_str(ds_slurm_getenv_fn env, const char *name, const char **out, char *err,
                   size_t err_len)
{
    *out = env(name);
    if (!*out || !**out) {
        snprintf(err, err_len, "--slurm: %s is not set " NOT_IN_SLURM, name);
        return -EINVAL;
    }
    return 0;
}

static int env_uint(ds_slurm_getenv_fn env, const char *name, long long *out, char *err,
                    size_t err_len)
{
    const char *v;
    if (env_str(env, name, &v, err, err_len) < 0)
        return -EINVAL;
    char *end;
    errno = 0;
    *out = strtoll(v, &end, 10);
    if (*end || errno || *out < 0 || v[0] < '0' || v[0] > '9' || *out > INT32_MAX) {
        snprintf(err, err_len, "--slurm: %s: expected a non-negative integer, found '%s'", name,
                 v);
        return -EINVAL;
    }
    return 0;
}

/* [A-Za-z0-9_.-]{1,63}, what node.name and node.group take. */
static int is_name(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 63)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '.' || *s == '-'))
            return 0;
    return 1;
}

int ds_slurm_derive(const ds_conf *c, ds_slurm_getenv_fn env, ds_slurm_hosts_fn hosts_fn,
                    ds_slurm_resolve_fn resolve, ds_slurm_sets *out, char *err, size_t err_len)
{
    long long procid, localid, nodeid, ntasks;
    const char *jobid, *nodename, *list, *list_var = "SLURM_STEP_NODELIST";
    char sub[DS_CONF_ERR_MAX / 2] = "";
    memset(out, 0, sizeof(*out));
    if (env_str(env, "SLURM_JOB_ID", &jobid, err, err_len) < 0 ||
        env_uint(env, "SLURM_PROCID", &procid, err, err_len) < 0 ||
        env_uint(env, "SLURM_LOCALID", &localid, err, err_len) < 0 ||
        env_uint(env, "SLURM_NODEID", &nodeid, err, err_len) < 0 ||
        env_uint(env, "SLURM_NTASKS", &ntasks, err, err_len) < 0 ||
        env_str(env, "SLURMD_NODENAME", &nodename, err, err_len) < 0)
        return -EINVAL;
    list = env(list_var);
    if (!list || !*list) {
        list_var = "SLURM_JOB_NODELIST";
        list = env(list_var);
    }
    if (!list || !*list) {
        snprintf(err, err_len,
                 "--slurm: neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set " NOT_IN_SLURM);
        return -EINVAL;
    }
    if (procid >= ntasks) {
        snprintf(err, err_len, "--slurm: SLURM_PROCID: expected less than SLURM_NTASKS = %lld, "
                 "found %lld", ntasks, procid);
        return -EINVAL;
    }
    char name[128];
    snprintf(name, sizeof(name), "%s-%lld", jobid, procid);
    if (!is_name(name)) {
        snprintf(err, err_len, "--slurm: SLURM_JOB_ID: expected letters, digits, '_', '.' or "
                 "'-' (node.name = <job>-<task>, 63 at most), found '%s'", jobid);
        return -EINVAL;
    }
    if (!is_name(nodename)) {
        snprintf(err, err_len, "--slurm: SLURMD_NODENAME: expected a name of 1..63 characters "
                 "from A-Z a-z 0-9 _ . - (it becomes node.group), found '%s'", nodename);
        return -EINVAL;
    }
    const long long port = c->slurm.port_base + localid;
    if (port > 65535) {
        snprintf(err, err_len, "--slurm: slurm.port_base + SLURM_LOCALID: expected a port "
                 "<= 65535, found %lld + %lld", (long long)c->slurm.port_base, localid);
        return -EINVAL;
    }
    ds_hostport lhp;
    if (ds_hostport_parse(c->node.listen, &lhp) != 0) {
        snprintf(err, err_len, "--slurm: node.listen: expected host:port, found '%s'",
                 c->node.listen);
        return -EINVAL;
    }
    char listen[DS_HOSTPORT_MAX + 1];
    if (ds_hostport_format(lhp.host, (uint16_t)port, listen, sizeof(listen)) < 0) {
        snprintf(err, err_len, "--slurm: node.listen: cannot format '%s' with port %lld",
                 lhp.host, port);
        return -EINVAL;
    }

    ds_slurm_host hosts[DS_SLURM_HOSTS_MAX];
    const int want = (int)(c->slurm.seeds < DS_SLURM_HOSTS_MAX ? c->slurm.seeds
                                                                : DS_SLURM_HOSTS_MAX);
    int nodeid_max = (int)(nodeid + 1 < DS_SLURM_HOSTS_MAX ? nodeid + 1 : DS_SLURM_HOSTS_MAX);
    const int nh = hosts_fn(list, hosts, want > nodeid_max ? want : nodeid_max, sub,
                            sizeof(sub));
    if (nh < 0) {
        snprintf(err, err_len, "--slurm: %s: %s", list_var, sub);
        return -EINVAL;
    }
    if (!strcmp(list_var, "SLURM_STEP_NODELIST") && nodeid < nh &&
        strcmp(hosts[nodeid], nodename)) {
        snprintf(err, err_len, "--slurm: SLURM_NODEID = %lld: expected the index of "
                 "SLURMD_NODENAME '%s' in SLURM_STEP_NODELIST '%s', found host '%s' there",
                 nodeid, nodename, list, hosts[nodeid]);
        return -EINVAL;
    }
    char seeds[DS_CONF_LIST_MAX * DS_CONF_STR_MAX] = "";
    size_t used = 0;
    for (int i = 0; i < nh && i < want; i++) {
        if (localid == 0 && !strcmp(hosts[i], nodename)) {
            if (i == 0) { /* the first seed itself: it starts the cluster */
                seeds[0] = '\0';
                break;
            }
            continue; /* never its own seed */
        }
        char addr[DS_HOST_MAX + 1], hp[DS_HOSTPORT_MAX + 1];
        if (resolve(hosts[i], addr, sizeof(addr), sub, sizeof(sub)) < 0) {
            snprintf(err, err_len, "--slurm: seed host '%s' of %s: %s", hosts[i], list_var, sub);
            return -EINVAL;
        }
        if (ds_hostport_format(addr, (uint16_t)c->slurm.port_base, hp, sizeof(hp)) < 0) {
            snprintf(err, err_len, "--slurm: seed host '%s' resolved to '%s', not an address",
                     hosts[i], addr);
            return -EINVAL;
        }
        used += (size_t)snprintf(seeds + used, sizeof(seeds) - used, "%s%s", used ? "," : "", hp);
    }
    snprintf(out->set[0], sizeof(out->set[0]), "node.name=%s", name);
    snprintf(out->set[1], sizeof(out->set[1]), "node.group=%s", nodename);
    snprintf(out->set[2], sizeof(out->set[2]), "node.listen=%s", listen);
    snprintf(out->set[3], sizeof(out->set[3]), "cluster.seeds=%s", seeds);
    out->n = 4;
    /* The task's GPU: its local id among the devices Slurm shows it
     * (CUDA_VISIBLE_DEVICES, set by its GPU gres). A per-task binding
     * (--gpus-per-task, --gpu-bind) shows each task one device: device 0,
     * its own; a step that shows every task all of a host's GPUs
     * (--gres=gpu:N) spreads the tasks over them by local id. Without
     * CUDA_VISIBLE_DEVICES Slurm manages no GPU here and train.device is
     * left as configured. */
    const char *cvd = env("CUDA_VISIBLE_DEVICES");
    long long visible = 0;
    if (cvd && *cvd && strcmp(cvd, "NoDevFiles") != 0) {
        visible = 1;
        for (const char *p = cvd; *p; p++)
            visible += *p == ',';
    }
    if (visible > 0)
        snprintf(out->set[out->n++], sizeof(out->set[0]), "train.device=%lld",
                 localid % visible);
    if (c->node.advertise[0]) {
        ds_hostport ahp;
        char adv[DS_HOSTPORT_MAX + 1];
        if (ds_hostport_parse(c->node.advertise, &ahp) != 0 ||
            ds_hostport_format(ahp.host, (uint16_t)port, adv, sizeof(adv)) < 0) {
            snprintf(err, err_len, "--slurm: node.advertise: expected host:port, found '%s'",
                     c->node.advertise);
            return -EINVAL;
        }
        snprintf(out->set[out->n++], sizeof(out->set[0]), "node.advertise=%s", adv);
    }
    if (c->status.listen[0]) {
        ds_hostport shp;
        char st[DS_HOSTPORT_MAX + 1];
        if (ds_hostport_parse(c->status.listen, &shp) != 0) {
            snprintf(err, err_len, "--slurm: status.listen: expected host:port, found '%s'",
                     c->status.listen);
            return -EINVAL;
        }
        if (shp.port + localid > 65535) {
            snprintf(err, err_len, "--slurm: status.listen's port + SLURM_LOCALID: expected a "
                     "port <= 65535, found %u + %lld", (unsigned)shp.port, localid);
            return -EINVAL;
        }
        if (ds_hostport_format(shp.host, (uint16_t)(shp.port + localid), st, sizeof(st)) < 0) {
            snprintf(err, err_len, "--slurm: status.listen: cannot format '%s'", shp.host);
            return -EINVAL;
        }
        snprintf(out->set[out->n++], sizeof(out->set[0]), "status.listen=%s", st);
    }
    return 0;
}
