/*
 * base/log.h: log lines "time level node component message key=value".
 *
 * One line per call, written with a single fwrite so lines from threads do
 * not interleave; errno is preserved across every call. Paths that a peer
 * can drive (decoding, authentication, admission) use ds_log_rl(), which
 * lets a burst of DS_LOG_RL_BURST lines through per call site and then one
 * line per DS_LOG_RL_PERIOD_MS saying how many were suppressed, so a hostile
 * peer cannot flood the log.
 */
#ifndef DS_BASE_LOG_H
#define DS_BASE_LOG_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

/* The levels, most severe first: X(enumerator, value, name). This list is
 * the only place a level is named: it generates the enum below and the
 * names log lines carry, and conf/keys.h takes node.log_level's choices from
 * it. A level's value is its position (log.c checks). */
#define DS_LOG_LEVELS(X) \
    X(DS_LOG_ERROR, 0, "error") \
    X(DS_LOG_WARN, 1, "warn") \
    X(DS_LOG_INFO, 2, "info") \
    X(DS_LOG_DEBUG, 3, "debug")

#define DS_LOG_ENUMERATOR_(e, v, name) e = v,
enum ds_log_level { DS_LOG_LEVELS(DS_LOG_ENUMERATOR_) };
#undef DS_LOG_ENUMERATOR_

/* Set this process's node name (copied), threshold and stream (borrowed;
 * NULL means stderr). Safe to call again to change them. */
void ds_log_setup(const char *node_name, enum ds_log_level level, FILE *out);

/* Parse "error", "warn", "info" or "debug"; returns -1 if unknown. */
int ds_log_level_parse(const char *s);

int ds_log_enabled(enum ds_log_level level);

/* The text of the last error-level message logged on the calling thread,
 * whatever the level threshold (without the time and node prefix); ""
 * after ds_log_error_clear. For a front end that hands errors back as
 * strings (node/api, libdsnode's dsnode_error). */
const char *ds_log_last_error(void);
void ds_log_error_clear(void);

void ds_log(enum ds_log_level level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void ds_vlog(enum ds_log_level level, const char *component, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* Per-call-site rate limit state; zero-initialised. */
typedef struct ds_ratelimit {
    uint64_t window_start_ms;
    uint32_t in_window;
    uint64_t suppressed;
} ds_ratelimit;

#define DS_LOG_RL_BURST 10
#define DS_LOG_RL_PERIOD_MS 1000

/* Returns 1 when a line may be written now; *suppressed receives how many
 * were dropped since the last line that got through. Thread-safe. */
int ds_ratelimit_allow(ds_ratelimit *rl, uint64_t *suppressed);

#define ds_log_rl(level, component, ...) \
    do { \
        static ds_ratelimit ds_rl_site_; \
        uint64_t ds_rl_supp_; \
        if (ds_log_enabled(level) && ds_ratelimit_allow(&ds_rl_site_, &ds_rl_supp_)) { \
            if (ds_rl_supp_) \
                ds_log(level, component, "suppressed=%llu (rate limit)", \
                       (unsigned long long)ds_rl_supp_); \
            ds_log(level, component, __VA_ARGS__); \
        } \
    } while (0)

#define ds_error(comp, ...) ds_log(DS_LOG_ERROR, comp, __VA_ARGS__)
#define ds_warn(comp, ...) ds_log(DS_LOG_WARN, comp, __VA_ARGS__)
#define ds_info(comp, ...) ds_log(DS_LOG_INFO, comp, __VA_ARGS__)
#define ds_debug(comp, ...) \
    do { \
        if (ds_log_enabled(DS_LOG_DEBUG)) \
            ds_log(DS_LOG_DEBUG, comp, __VA_ARGS__); \
    } while (0)

#endif
