/* base/log.c: see log.h. */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"

static char log_node[64] = "-";
static _Atomic int log_level = DS_LOG_INFO;
static FILE *log_out;
static pthread_mutex_t rl_lock = PTHREAD_MUTEX_INITIALIZER;

#define LEVEL_NAME_(e, v, name) [e] = name,
static const char *const level_names[] = {DS_LOG_LEVELS(LEVEL_NAME_)};
#undef LEVEL_NAME_
#define NLEVELS ((int)(sizeof(level_names) / sizeof(level_names[0])))
/* level_names is indexed by level: each value must be its position. */
#define LEVEL_POS_(e, v, name) POS_##e,
enum { DS_LOG_LEVELS(LEVEL_POS_) };
#undef LEVEL_POS_
#define LEVEL_AT_POS_(e, v, name) \
    _Static_assert((int)e == (int)POS_##e, #e " is not at its position");
DS_LOG_LEVELS(LEVEL_AT_POS_)
#undef LEVEL_AT_POS_

void ds_log_setup(const char *node_name, enum ds_log_level level, FILE *out)
{
    if (node_name && *node_name)
        snprintf(log_node, sizeof(log_node), "%s", node_name);
    atomic_store(&log_level, (int)level);
    log_out = out;
}

int ds_log_level_parse(const char *s)
{
    for (int i = 0; s && i < NLEVELS; i++)
        if (!strcmp(s, level_names[i]))
            return i;
    return -1;
}

int ds_log_enabled(enum ds_log_level level)
{
    return (int)level <= atomic_load(&log_level);
}

static _Thread_local char last_error[1024];

const char *ds_log_last_error(void)
{
    return last_error;
}

void ds_log_error_clear(void)
{
    last_error[0] = 0;
}

void ds_vlog(enum ds_log_level level, const char *component, const char *fmt, va_list ap)
{
    if (level == DS_LOG_ERROR) {
        const int saved = errno;
        va_list aq;
        va_copy(aq, ap);
        vsnprintf(last_error, sizeof(last_error), fmt, aq);
        va_end(aq);
        errno = saved;
    }
    if (!ds_log_enabled(level))
        return;
    const int saved_errno = errno;
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int len = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s %s ",
                       tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                       tm.tm_sec, ts.tv_nsec / 1000000, level_names[level], log_node,
                       component ? component : "-");
    if (len < 0)
        len = 0;
    if ((size_t)len < sizeof(line)) {
        int more = vsnprintf(line + len, sizeof(line) - (size_t)len, fmt, ap);
        if (more > 0)
            len += more;
    }
    if ((size_t)len >= sizeof(line) - 1)
        len = (int)sizeof(line) - 2;
    /* One record, one line: newlines inside a message become spaces. */
    for (int i = 0; i < len; i++)
        if (line[i] == '\n' || line[i] == '\r')
            line[i] = ' ';
    line[len++] = '\n';
    FILE *out = log_out ? log_out : stderr;
    fwrite(line, 1, (size_t)len, out);
    fflush(out);
    errno = saved_errno;
}

void ds_log(enum ds_log_level level, const char *component, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ds_vlog(level, component, fmt, ap);
    va_end(ap);
}

int ds_ratelimit_allow(ds_ratelimit *rl, uint64_t *suppressed)
{
    const uint64_t now = ds_now_ms();
    int ok;
    pthread_mutex_lock(&rl_lock);
    if (now - rl->window_start_ms >= DS_LOG_RL_PERIOD_MS || rl->window_start_ms == 0) {
        rl->window_start_ms = now ? now : 1;
        rl->in_window = 0;
    }
    ok = rl->in_window < DS_LOG_RL_BURST;
    if (ok) {
        rl->in_window++;
        *suppressed = rl->suppressed;
        rl->suppressed = 0;
    } else {
        rl->suppressed++;
    }
    pthread_mutex_unlock(&rl_lock);
    return ok;
}
