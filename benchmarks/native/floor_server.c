/* The native floor for `bench_controller.py --ranks N --native-floor`: the Python floor server's work (read each
 * JSON line, answer ok, answer a pair's two acquires once both arrived) in one epoll loop with no interpreter, no
 * allocation per request and no state beyond the waiting acquires. Its latency is what a native data plane's
 * socket loop could reach on this machine (the kernel's loopback send and receive are all it pays for), the
 * question a native fast path for lit-circuit acquire and release has to answer before it is built.
 *
 * stdout: one ready line, {"host": "127.0.0.1", "port": P}; then it serves until killed.
 * Exit 3 when the socket calls fail (a line on stderr says which). */
#define _GNU_SOURCE /* accept4 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_FD 65536
#define BUF 65536
#define KEY 64
#define SLOTS (1 << 16) /* open addressing; a key's slot is kept (not deleted) once used: keys are few */

typedef struct {
    char buf[BUF];
    int len;
} Conn;

typedef struct {
    char key[KEY];
    int used, waiting, fd;
    long id;
} Slot;

static Conn *conns[MAX_FD];
static Slot slots[SLOTS];

static void fail(const char *what) {
    fprintf(stderr, "floor_server: %s (%s)\n", what, strerror(errno));
    exit(3);
}

/* A reply; a full socket buffer (a rank not reading) is waited out, as the Python floor's transport would. */
static void put(int fd, const char *line, int len) {
    while (len > 0) {
        int n = write(fd, line, len);
        if (n > 0) {
            line += n;
            len -= n;
        } else if (n < 0 && errno == EAGAIN) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            poll(&p, 1, 1000);
        } else {
            return; /* the rank went away: nothing to answer */
        }
    }
}

static Slot *slot(const char *key, int len) {
    unsigned h = 2166136261u; /* FNV-1a */
    for (int i = 0; i < len; i++) h = (h ^ (unsigned char)key[i]) * 16777619u;
    for (unsigned i = h & (SLOTS - 1);; i = (i + 1) & (SLOTS - 1)) {
        Slot *s = &slots[i];
        if (!s->used) {
            s->used = 1;
            memcpy(s->key, key, len);
            s->key[len] = 0;
            return s;
        }
        if ((int)strlen(s->key) == len && memcmp(s->key, key, len) == 0) return s;
    }
}

/* One request line (NUL-terminated): an acquire waits for its pair's other one; anything else is answered ok. */
static void request(int fd, char *line) {
    char reply[96];
    char *p = strstr(line, "\"id\":");
    long id = p ? atol(p + 5) : 0;
    char *key = strstr(line, "\"op\":\"acquire\"") ? strstr(line, "\"key\":\"") : NULL;
    if (key == NULL) {
        put(fd, reply, snprintf(reply, sizeof reply, "{\"id\":%ld,\"ok\":true}\n", id));
        return;
    }
    key += 7;
    char *end = strchr(key, '"');
    if (end == NULL || end - key >= KEY) {
        put(fd, reply, snprintf(reply, sizeof reply, "{\"id\":%ld,\"ok\":false}\n", id));
        return;
    }
    Slot *s = slot(key, (int)(end - key));
    if (!s->waiting) {
        s->waiting = 1;
        s->fd = fd;
        s->id = id;
        return;
    }
    s->waiting = 0;
    put(s->fd, reply, snprintf(reply, sizeof reply, "{\"id\":%ld,\"ok\":true,\"granted\":true}\n", s->id));
    put(fd, reply, snprintf(reply, sizeof reply, "{\"id\":%ld,\"ok\":true,\"granted\":true}\n", id));
}

static void readable(int ep, int fd) {
    Conn *c = conns[fd];
    int got = read(fd, c->buf + c->len, BUF - 1 - c->len);
    if (got <= 0) {
        if (got < 0 && errno == EAGAIN) return;
        epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
        for (int i = 0; i < SLOTS; i++) /* its waiting acquire is dropped: a reused fd is another rank */
            if (slots[i].waiting && slots[i].fd == fd) slots[i].waiting = 0;
        close(fd);
        free(c);
        conns[fd] = NULL;
        return;
    }
    c->len += got;
    c->buf[c->len] = 0;
    char *line = c->buf, *nl;
    while ((nl = memchr(line, '\n', c->buf + c->len - line))) {
        *nl = 0;
        request(fd, line);
        line = nl + 1;
    }
    c->len = c->buf + c->len - line;
    if (c->len == BUF - 1) c->len = 0; /* a line longer than the buffer: dropped (the benchmark sends none) */
    memmove(c->buf, line, c->len);
}

int main(void) {
    int one = 1, lst = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    if (lst < 0 || setsockopt(lst, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(lst, (struct sockaddr *)&a, sizeof a) < 0 || listen(lst, 2048) < 0 ||
        getsockname(lst, (struct sockaddr *)&a, &alen) < 0)
        fail("cannot listen on 127.0.0.1");
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lst};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, lst, &ev) < 0) fail("epoll");
    printf("{\"host\": \"127.0.0.1\", \"port\": %d}\n", ntohs(a.sin_port));
    fflush(stdout);
    struct epoll_event events[1024];
    for (;;) {
        int ready = epoll_wait(ep, events, 1024, -1);
        if (ready < 0 && errno != EINTR) fail("epoll_wait");
        for (int i = 0; i < ready; i++) {
            int fd = events[i].data.fd;
            if (fd != lst) {
                readable(ep, fd);
                continue;
            }
            int c;
            while ((c = accept4(lst, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                if (c >= MAX_FD || (conns[c] = calloc(1, sizeof(Conn))) == NULL) {
                    close(c);
                    continue;
                }
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                struct epoll_event cev = {.events = EPOLLIN, .data.fd = c};
                epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
            }
        }
    }
}
