#define _GNU_SOURCE
#include "mqs_live.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>

int mqs_live_hold(int fd, int64_t pid)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_RDLCK; /* shared: every client of the process holds it */
    fl.l_whence = SEEK_SET;
    fl.l_start = pid;
    fl.l_len = 1;
    return fcntl(fd, F_OFD_SETLK, &fl) == 0 ? 0 : errno;
}

int mqs_live_check(int fd, int64_t pid)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = pid;
    fl.l_len = 1;
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0)
        return -errno;
    return fl.l_type != F_UNLCK;
}
