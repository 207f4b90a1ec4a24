/*
 * base/clock.h: the process's monotonic clock (CLOCK_MONOTONIC), in
 * milliseconds and nanoseconds, and the wall clock (CLOCK_REALTIME) in
 * milliseconds since 1970 for what is shown to people. Protocol code that must run under test with
 * simulated time does not call these directly: it takes `now_ms` from its
 * caller (membership, the runtime's policies) or a clock through its io
 * seam (gossip).
 */
#ifndef DS_BASE_CLOCK_H
#define DS_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t ds_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t ds_now_ms(void)
{
    return ds_now_ns() / 1000000u;
}

/* Wall clock: for timestamps shown to people, never for durations. */
static inline uint64_t ds_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

#endif
