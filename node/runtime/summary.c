/* node/runtime/summary.c: see summary.h. */
#include "config.h"

#include <stdio.h>

#include "base/log.h"
#include "node/runtime/summary.h"

void ds_run_summary_print(const ds_run_summary *s, const ds_engine_info *in)
{
    const ds_gossip_stats *gs = &in->gossip;
    ds_info("train", "summary status=%s steps=%lld test_acc=%.4f rounds=%llu exchanges_ok=%llu "
            "exchanges_failed=%llu stale=%llu late=%llu dropped=%llu wait_s=%.2f "
            "max_round_s=%.3f values_sent=%llu",
            s->status, (long long)s->steps, s->test_acc, (unsigned long long)in->rounds,
            (unsigned long long)gs->exchanges_ok, (unsigned long long)gs->exchanges_failed,
            (unsigned long long)gs->stale_received, (unsigned long long)gs->late,
            (unsigned long long)gs->dropped, (double)gs->wait_ns * 1e-9,
            (double)gs->max_wait_ns * 1e-9, (unsigned long long)gs->values_sent);
    printf("summary node=%s status=%s steps=%lld loss=%.4f test_acc=%.4f samples_per_s=%.0f "
           "wall_s=%.1f backend=%s bytes_sent=%llu bytes_received=%llu rounds=%llu "
           "max_round_s=%.3f group_max_wait_s=%.3f group=%s\n",
           s->name, s->status, (long long)s->steps, s->loss, s->test_acc, s->samples_per_s,
           s->wall_s, s->backend, (unsigned long long)in->net.bytes_sent,
           (unsigned long long)in->net.bytes_recv, (unsigned long long)in->rounds,
           (double)gs->max_wait_ns * 1e-9, (double)in->group.max_wait_ns * 1e-9,
           in->group_name[0] ? in->group_name : "-");
    fflush(stdout);
}
