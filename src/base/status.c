/*
 * status.c — the status table (keel.h KEEL_STATUS_TABLE), version, error
 * strings. Owns no state.
 */
#include "base.h"

#include <stdio.h>

const char *keel_version(void)
{
    return KEEL_VERSION_STRING;
}

const char *keel_strerror(keel_status status)
{
    switch (status) {
#define KEEL_STATUS_MSG_(name, value, msg)                                                         \
    case KEEL_##name:                                                                              \
        return msg;
        KEEL_STATUS_TABLE(KEEL_STATUS_MSG_)
#undef KEEL_STATUS_MSG_
    }
    return "unknown status";
}

const char *keel_status_name(keel_status status)
{
    switch (status) {
#define KEEL_STATUS_NAME_(name, value, msg)                                                        \
    case KEEL_##name:                                                                              \
        return "KEEL_" #name;
        KEEL_STATUS_TABLE(KEEL_STATUS_NAME_)
#undef KEEL_STATUS_NAME_
    }
    return "KEEL_UNKNOWN";
}

keel_status base_err(char *buf, keel_status status, const char *fmt, ...)
{
    if (buf) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, BASE_ERR_CAP, fmt, ap);
        va_end(ap);
    }
    return status;
}
