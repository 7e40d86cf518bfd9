/* A library the agent would put in LD_PRELOAD: each process that loads it appends one line,
   "pid seccomp-mode", to MARK_LOG (set by the compiler). A process outside the guard shows 0. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void mark(void) {
    char buf[8192];
    int fd = open("/proc/self/status", O_RDONLY);
    ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
    if (fd >= 0) close(fd);
    buf[n > 0 ? n : 0] = 0;
    const char *line = strstr(buf, "Seccomp:\t");
    int out = open(MARK_LOG, O_WRONLY | O_APPEND | O_CREAT, 0666);
    if (out < 0) return;
    dprintf(out, "%d %d\n", getpid(), line ? atoi(line + 9) : -1);
    close(out);
}
