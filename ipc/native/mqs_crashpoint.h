/* MQSTORE_CRASHPOINT=<point>:<kill|stop>[:<nth>]: the process SIGKILLs or SIGSTOPs itself
 * the nth time (default 1) it reaches <point>. Read once, when the module loads.
 * Points (docs/crash-points.md): reserve-locked, copy-half, before-done (a put, in C);
 * index-roll, index-roll-made (the dispatcher's index roll, in Python, through
 * `_native.crash_point`). */
#ifndef MQS_CRASHPOINT_H
#define MQS_CRASHPOINT_H

enum mqs_point {
    MQS_CP_RESERVE_LOCKED,
    MQS_CP_COPY_HALF,
    MQS_CP_BEFORE_DONE,
    MQS_CP_INDEX_ROLL,
    MQS_CP_INDEX_ROLL_MADE,
    MQS_CP_COUNT
};

/* Parse the environment; -1 (and a message in `err`) when the variable is malformed. */
int mqs_crashpoint_init(char *err, int errlen);

void mqs_crashpoint_hit(enum mqs_point p);

/* The point named `name`, or -1. */
int mqs_crashpoint_lookup(const char *name);

#endif
