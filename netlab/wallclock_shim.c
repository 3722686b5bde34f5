/* A wall clock of its own for one process, stepped at run time: netlab.wallclock builds this into a shared
 * object and starts processes with it in LD_PRELOAD. CLOCK_REALTIME (and its coarse and TAI forms),
 * gettimeofday() and time() read the real clock plus an offset in nanoseconds, which the lab writes into the
 * 8-byte file named by $NETLAB_WALLCLOCK (mapped shared: a step takes effect at the next read). The monotonic
 * and boot clocks, and every sleep, are untouched: that is the point (a wall clock stepped by NTP or by hand
 * while the process's timers run on), and what libfaketime cannot do for Python 3.11 (its sleeps fail). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t *offset_ns; /* NULL: no file, the real clock */
static int (*real_clock_gettime)(clockid_t, struct timespec *);

__attribute__((constructor)) static void wallclock_init(void) {
    real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    const char *path = getenv("NETLAB_WALLCLOCK");
    if (path == NULL)
        return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    void *map = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map != MAP_FAILED)
        offset_ns = (volatile int64_t *)map;
}

static void shift(struct timespec *ts) {
    if (offset_ns == NULL)
        return;
    int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + *offset_ns;
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
    if (ts->tv_nsec < 0) {
        ts->tv_sec -= 1;
        ts->tv_nsec += 1000000000;
    }
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int rc = real_clock_gettime(clock, ts);
    if (rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE || clock == CLOCK_TAI))
        shift(ts);
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out != NULL)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
