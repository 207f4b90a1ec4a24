/*
 * tools/dsbench/bench_allreduce.c: `dsbench allreduce` (issue 10): the
 * reduction inside one group, by algorithm, with and without
 * group.overlap, on real dsnode processes (dslaunch local, one group of
 * --nodes members, so no gossip between groups runs and the steps are
 * the model's and the group's alone).
 *
 *   dsbench allreduce [--quick] [--json] [--nodes 2] [--model mlp|cnn|both]
 *       [--steps N] [--rounds 2] [--algos direct,ring,butterfly[,auto]] [--rate RATE]
 *       [--config FILE] [--dslaunch PATH]
 *
 * --algos auto: group.allreduce = auto (with overlap, each reduction's
 * algorithm from member 0's cost model; docs/gossip.md "Layer by layer").
 *
 * --rate RATE (root): every member in a network namespace of its own
 * behind a tc tbf link of RATE (dslaunch --netns-rate, node.group = g0 for
 * all), as members of one rack on their own links; without it the members
 * share loopback, where a reduction costs CPU, not wire.
 *
 * For each model, every algorithm runs with group.overlap false then
 * true, the whole list --rounds times in turn (the machine is shared:
 * neighbours in time compare), and each variant keeps its run of fewest
 * step_ms. Per row:
 *   variant       the algorithm, "+overlap" with group.overlap = true
 *   step_ms       a training step of a node (batch 64 / samples_per_s, the
 *                 node's own log: evaluation and start-up excluded),
 *                 mean over the nodes
 *   exposed_ms    per step, what the step waited for the group's
 *                 reductions (status group.reduce_s / steps)
 *   hidden_ms     per step, what the layers' reductions ran behind
 *                 backward (group.reduce_hidden_s / steps; 0 without
 *                 overlap)
 *   vs_ring       step_ms / the ring's without overlap
 *   final_acc     mean test accuracy at the end
 *   identical     intra-group consensus distance (0: members hold one
 *                 model)
 * Every member of the run must exit 0, else the bench fails.
 */
#include "config.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/dsbench/bench.h"
#include "tools/dsbench/lrun.h"

#define MAX_ALGOS 4

typedef struct ar_opts {
    int json, quick, nodes, steps, rounds, n_models, n_algos;
    char rate[32];
    const char *models[2];
    const char *algos[MAX_ALGOS];
    char config[PATH_MAX], dslaunch[PATH_MAX];
} ar_opts;

typedef struct ar_result {
    double step_ms, exposed_ms, hidden_ms, acc, intra;
    int ok;
} ar_result;

static void ar_usage(FILE *f)
{
    fprintf(f, "usage: dsbench allreduce [--quick] [--json] [--nodes 2] [--model mlp|cnn|both]\n"
               "         [--steps N] [--rounds 2] [--algos direct,ring,butterfly]\n"
               "         [--rate RATE] [--config FILE] [--dslaunch PATH]\n");
}

static double num(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* One run: `nodes` members in one group, the model, the algorithm, the
 * overlap. 0, or -1 (a member failed, or a file was unreadable). */
static int ar_run(const ar_opts *o, const char *model, const char *algo, int overlap,
                  ar_result *res)
{
    char s_model[64], s_steps[64], s_algo[64], s_ov[64], s_warm[64];
    snprintf(s_model, sizeof(s_model), "train.model=%s", model);
    snprintf(s_steps, sizeof(s_steps), "train.steps=%d", o->steps);
    snprintf(s_algo, sizeof(s_algo), "group.allreduce=%s", algo);
    snprintf(s_ov, sizeof(s_ov), "group.overlap=%s", overlap ? "true" : "false");
    /* The config's warm-up, at most a fifth of a short run. */
    snprintf(s_warm, sizeof(s_warm), "train.warmup_steps=%d",
             o->steps / 5 < 100 ? o->steps / 5 : 100);
    const char *args[40] = {"--config", o->config,
                            "--set", "train.backend=cpu", "--set", "train.batch_size=64",
                            "--set", "train.eval_every=0", "--set", "train.log_every=50",
                            "--set", "status.file=status.json",
                            "--set", s_model, "--set", s_steps, "--set", s_algo, "--set", s_ov,
                            "--set", s_warm, "--timeout", "900"};
    int k = 0;
    while (args[k])
        k++;
    /* One group on loopback, or each member in a namespace of its own
     * behind a RATE link, all in group g0. */
    if (o->rate[0]) {
        args[k++] = "--netns-rate";
        args[k++] = o->rate;
        args[k++] = "--set";
        args[k++] = "node.group=g0";
    } else {
        args[k++] = "--groups";
        args[k++] = "1";
    }
    args[k] = NULL;
    ds_lrun r;
    memset(res, 0, sizeof(*res));
    if (ds_lrun_start(&r, "allreduce", o->dslaunch, o->nodes, args) < 0)
        return -1;
    const int code = ds_lrun_wait(&r, 960);
    json_t *rep = ds_lrun_report(&r);
    int ok = code == 0 && rep;
    double sps = 0, exposed = 0, hidden = 0, acc = 0;
    for (int i = 0; ok && i < o->nodes; i++) {
        char name[16];
        snprintf(name, sizeof(name), "n%d", i);
        const double s = ds_lrun_report_num(rep, name, "samples_per_s");
        const double a = ds_lrun_report_num(rep, name, "test_acc");
        json_t *st = ds_lrun_status(&r, name);
        const json_t *g = st ? json_object_get(st, "group") : NULL;
        const double e = g ? num(g, "reduce_s") : NAN, h = g ? num(g, "reduce_hidden_s") : NAN;
        json_decref(st);
        if (!(s > 0) || !isfinite(a) || !isfinite(e) || !isfinite(h)) {
            fprintf(stderr, "dsbench allreduce: %s %s%s: %s has no numbers\n", model, algo,
                    overlap ? "+overlap" : "", name);
            ok = 0;
            break;
        }
        sps += s;
        acc += a;
        exposed += e;
        hidden += h;
    }
    if (ok) {
        const double batch = 64; /* train.batch_size, set above */
        res->step_ms = 1000.0 * batch / (sps / o->nodes);
        res->exposed_ms = 1000.0 * exposed / o->nodes / o->steps;
        res->hidden_ms = 1000.0 * hidden / o->nodes / o->steps;
        res->acc = acc / o->nodes;
        /* dslaunch groups the models by each node's summary (group=g0
         * with --rate, --groups without). */
        const json_t *ic = json_object_get(rep, "intra_group_consensus");
        res->intra = json_is_number(ic) ? json_number_value(ic) : NAN;
        res->ok = 1;
    } else {
        fprintf(stderr, "dsbench allreduce: %s %s%s: dslaunch exit %d; its output:\n", model,
                algo, overlap ? "+overlap" : "", code);
        FILE *f = fopen(r.log, "r");
        char line[512];
        while (f && fgets(line, sizeof(line), f))
            fputs(line, stderr);
        if (f)
            fclose(f);
    }
    json_decref(rep);
    ds_lrun_end(&r, 0);
    return ok ? 0 : -1;
}

static int split(char *s, const char **out, int max)
{
    int n = 0;
    for (char *t = strtok(s, ","); t; t = strtok(NULL, ","))
        if (n < max)
            out[n++] = t;
        else
            return -1;
    return n;
}

static int ar_opts_read(ar_opts *o, int argc, char **argv, char *algos_buf, size_t algos_len)
{
    memset(o, 0, sizeof(*o));
    o->nodes = 2;
    o->rounds = 2;
    o->steps = 0;
    const char *model = "both";
    snprintf(algos_buf, algos_len, "direct,ring,butterfly");
    snprintf(o->config, sizeof(o->config), "%s/../conf/examples/cluster.ini",
             ds_bench_tools_dir());
    ds_lrun_default_dslaunch(o->dslaunch, sizeof(o->dslaunch));
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (!strcmp(a, "--quick")) {
            o->quick = 1;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            ar_usage(stdout);
            return 1;
        }
        if (!v) {
            fprintf(stderr, "dsbench allreduce: unknown option or missing value: '%s'\n", a);
            ar_usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "--nodes"))
            o->nodes = atoi(v);
        else if (!strcmp(a, "--steps"))
            o->steps = atoi(v);
        else if (!strcmp(a, "--rounds"))
            o->rounds = atoi(v);
        else if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--algos"))
            snprintf(algos_buf, algos_len, "%s", v);
        else if (!strcmp(a, "--rate"))
            snprintf(o->rate, sizeof(o->rate), "%s", v);
        else if (!strcmp(a, "--config"))
            snprintf(o->config, sizeof(o->config), "%s", v);
        else if (!strcmp(a, "--dslaunch"))
            snprintf(o->dslaunch, sizeof(o->dslaunch), "%s", v);
        else {
            fprintf(stderr, "dsbench allreduce: unknown option '%s'\n", a);
            ar_usage(stderr);
            return 2;
        }
    }
    if (!strcmp(model, "both")) {
        o->models[0] = "mlp";
        o->models[1] = "cnn";
        o->n_models = 2;
    } else if (!strcmp(model, "mlp") || !strcmp(model, "cnn")) {
        o->models[0] = !strcmp(model, "mlp") ? "mlp" : "cnn";
        o->n_models = 1;
    } else {
        fprintf(stderr, "dsbench allreduce: --model expects mlp, cnn or both, found '%s'\n",
                model);
        return 2;
    }
    if ((o->n_algos = split(algos_buf, o->algos, MAX_ALGOS)) <= 0) {
        fprintf(stderr, "dsbench allreduce: --algos expects a list of direct, ring, butterfly, "
                        "auto\n");
        return 2;
    }
    for (int k = 0; k < o->n_algos; k++)
        if (strcmp(o->algos[k], "direct") && strcmp(o->algos[k], "ring") &&
            strcmp(o->algos[k], "butterfly") && strcmp(o->algos[k], "auto")) {
            fprintf(stderr, "dsbench allreduce: --algos: expected direct, ring, butterfly or "
                            "auto, found '%s'\n", o->algos[k]);
            return 2;
        }
    if (o->quick && !o->steps)
        o->rounds = 1;
    if (o->nodes < 2 || o->nodes > 16 || o->rounds < 1 || o->rounds > 20 || o->steps < 0 ||
        o->steps > 100000) {
        fprintf(stderr, "dsbench allreduce: need 2 <= --nodes <= 16, 1 <= --rounds <= 20, "
                        "--steps <= 100000\n");
        return 2;
    }
    if (o->rate[0] && geteuid() != 0) {
        fprintf(stderr, "dsbench allreduce: --rate needs root (network namespaces)\n");
        return 2;
    }
    if (access(o->dslaunch, X_OK) < 0) {
        fprintf(stderr, "dsbench allreduce: %s: %s (pass --dslaunch)\n", o->dslaunch,
                strerror(errno));
        return 2;
    }
    return 0;
}

int ds_bench_allreduce(int argc, char **argv)
{
    ar_opts o;
    char algos[128];
    int ret = ar_opts_read(&o, argc, argv, algos, sizeof(algos));
    if (ret)
        return ret == 1 ? 0 : ret;
    ds_row row;
    ds_row_table(&row, o.json);
    int failed = 0;
    for (int m = 0; m < o.n_models; m++) {
        const char *model = o.models[m];
        const int steps = o.steps ? o.steps : !strcmp(model, "cnn") ? (o.quick ? 60 : 300)
                                                                    : (o.quick ? 200 : 1000);
        ar_opts om = o;
        om.steps = steps;
        ar_result best[MAX_ALGOS][2];
        memset(best, 0, sizeof(best));
        for (int k = 0; k < o.rounds; k++)
            for (int a = 0; a < o.n_algos; a++)
                for (int ov = 0; ov < 2; ov++) {
                    ar_result res;
                    if (ar_run(&om, model, o.algos[a], ov, &res) < 0) {
                        failed = 1;
                        continue;
                    }
                    fprintf(stderr, "dsbench allreduce: %s %s%s round %d: step %.2f ms, "
                            "exposed %.2f ms, hidden %.2f ms\n", model, o.algos[a],
                            ov ? "+overlap" : "", k + 1, res.step_ms, res.exposed_ms,
                            res.hidden_ms);
                    if (!best[a][ov].ok || res.step_ms < best[a][ov].step_ms)
                        best[a][ov] = res;
                }
        double ring = NAN;
        for (int a = 0; a < o.n_algos; a++)
            if (!strcmp(o.algos[a], "ring") && best[a][0].ok)
                ring = best[a][0].step_ms;
        for (int a = 0; a < o.n_algos; a++)
            for (int ov = 0; ov < 2; ov++) {
                const ar_result *b = &best[a][ov];
                char variant[48];
                snprintf(variant, sizeof(variant), "%s%s", o.algos[a], ov ? "+overlap" : "");
                ds_row_str(&row, "model", model);
                ds_row_str(&row, "variant", variant);
                ds_row_int(&row, "nodes", o.nodes);
                ds_row_str(&row, "link", o.rate[0] ? o.rate : "loopback");
                ds_row_int(&row, "steps", steps);
                ds_row_num(&row, "step_ms", b->ok ? b->step_ms : NAN, 2);
                ds_row_num(&row, "exposed_ms", b->ok ? b->exposed_ms : NAN, 2);
                ds_row_num(&row, "hidden_ms", b->ok ? b->hidden_ms : NAN, 2);
                ds_row_num(&row, "vs_ring", b->ok ? b->step_ms / ring : NAN, 3);
                ds_row_num(&row, "final_acc", b->ok ? b->acc : NAN, 4);
                ds_row_num(&row, "intra_group_consensus", b->ok ? b->intra : NAN, 6);
                if (ds_row_end(&row) < 0)
                    failed = 1;
            }
    }
    return failed ? 1 : 0;
}
