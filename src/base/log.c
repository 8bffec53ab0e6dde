/*
 * log.c — the log callback and the monotonic clock. The library never
 * prints: messages go to the installed callback or nowhere.
 */
#include "base.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

static keel_log_fn g_log = NULL;
static void *g_log_user = NULL;
static keel_log_level g_log_min = KEEL_LOG_INFO;

void keel_set_log(keel_log_fn fn, void *user, keel_log_level min_level)
{
    g_log = fn;
    g_log_user = user;
    g_log_min = min_level;
}

void base_log(keel_log_level level, const char *fmt, ...)
{
    if (!g_log || level < g_log_min) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    g_log(g_log_user, level, buf);
}

uint64_t base_time_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t keel_time_ns(void)
{
    return base_time_ns();
}

int keel_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}
