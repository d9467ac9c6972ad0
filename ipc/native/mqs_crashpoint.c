#include "mqs_crashpoint.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[MQS_CP_COUNT] = {"reserve-locked", "copy-half", "before-done",
                                                 "index-roll", "index-roll-made"};
static int armed = -1; /* the point, or -1 */
static int action;     /* SIGKILL or SIGSTOP */
static long nth = 1;
static long hits;

int mqs_crashpoint_init(char *err, int errlen)
{
    const char *v = getenv("MQSTORE_CRASHPOINT");
    if (v == NULL || *v == '\0')
        return 0;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", v);
    char *point = strtok(buf, ":");
    char *act = strtok(NULL, ":");
    char *count = strtok(NULL, ":");
    int p = point ? mqs_crashpoint_lookup(point) : -1;
    int a = act == NULL ? 0 : strcmp(act, "kill") == 0 ? SIGKILL : strcmp(act, "stop") == 0 ? SIGSTOP : 0;
    char *end = NULL;
    long n = count ? strtol(count, &end, 10) : 1;
    if (p < 0 || a == 0 || n < 1 || (count && *end != '\0')) {
        snprintf(err, (size_t)errlen,
                 "MQSTORE_CRASHPOINT=%s: expected <point>:<kill|stop>[:<nth>] with a point "
                 "among reserve-locked, copy-half, before-done, index-roll, index-roll-made",
                 v);
        return -1;
    }
    armed = p;
    action = a;
    nth = n;
    return 0;
}

int mqs_crashpoint_lookup(const char *name)
{
    for (int i = 0; i < MQS_CP_COUNT; i++)
        if (strcmp(name, names[i]) == 0)
            return i;
    return -1;
}

void mqs_crashpoint_hit(enum mqs_point p)
{
    if ((int)p != armed)
        return;
    if (++hits == nth)
        raise(action);
}
