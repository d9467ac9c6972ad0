/* Producer liveness without trusting bare pids (LMDB's reader-table scheme, with
 * open-file-description locks): every producing process holds a shared lock on the byte
 * at offset = its pid of the store's liveness file for as long as it lives; the kernel
 * drops it when the process dies, whatever kills it. A checker asks F_OFD_GETLK whether
 * anyone holds that byte: a reused pid that is not a producer of this store holds none. */
#ifndef MQS_LIVE_H
#define MQS_LIVE_H

#include <stdint.h>

/* 0, or an errno. */
int mqs_live_hold(int fd, int64_t pid);

/* 1 alive, 0 dead, -errno on error. */
int mqs_live_check(int fd, int64_t pid);

#endif
