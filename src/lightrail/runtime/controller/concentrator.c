/* The controller's native front end (`lightrail controller serve --frontend native`): a connection concentrator.
 * It owns the rank connections (accept, read, write, close) and carries their bytes to and from the controller
 * over one stream, in batches, so the controller pays a system call per batch instead of a receive and a send per
 * request; the per-connection kernel work runs here, on another core. It decides nothing: every byte is the
 * controller's to frame and answer (line limits, caps, timeouts, identity all stay in Python).
 *
 * argv: LISTEN_FD MUX_FD HIGH_WATER_BYTES (both descriptors inherited; the listening socket already bound).
 * Frames, both ways: u32 id, u8 kind, u32 length (little-endian), then the payload.
 *   to the controller:   'O' a connection opened (payload: "host:port" of the peer), 'D' bytes it sent,
 *                        'C' it is closed (by the peer, an error, or the controller's 'C'); the id is never reused
 *   from the controller: 'D' bytes to write to it, 'C' close it once they are written
 * A connection whose unwritten replies exceed HIGH_WATER_BYTES is not read until they drain (back-pressure, as
 * the asyncio transport's pause_reading); since the controller still answers what it was sent before, one whose
 * replies reach 4 x HIGH_WATER_BYTES is closed (a rank that does not read). Exits when the controller's end
 * closes; 3 on a failing system call. */
#define _GNU_SOURCE /* accept4 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_FD 65536
#define READ 65536
#define HEADER 9
#define FLUSH_BYTES 1024 /* ~12 requests: the controller starts on them while the rest of the turn is read */
#define MUX_TAG 0xffffffffu /* epoll data of the controller's stream; the listener's is MUX_TAG - 1 */

typedef struct {
    uint32_t id;
    int open, closing, paused;
    char *out; /* replies not yet written */
    size_t out_len, out_cap;
} Conn;

typedef struct {
    char *data;
    size_t len, cap, start;
} Buf;

static Conn conns[MAX_FD];
static Buf to_ctl, from_ctl;
static int ep, mux, lst;
static size_t high_water;
static uint32_t next_id = 1;

static void fail(const char *what) {
    fprintf(stderr, "concentrator: %s (%s)\n", what, strerror(errno));
    exit(3);
}

static void reserve(char **data, size_t *cap, size_t need) {
    if (need <= *cap) return;
    size_t cap2 = *cap ? *cap : 4096;
    while (cap2 < need) cap2 *= 2;
    if ((*data = realloc(*data, cap2)) == NULL) fail("out of memory");
    *cap = cap2;
}

static void frame(uint32_t id, char kind, const char *payload, uint32_t len) {
    reserve(&to_ctl.data, &to_ctl.cap, to_ctl.len + HEADER + len);
    char *p = to_ctl.data + to_ctl.len;
    memcpy(p, &id, 4);
    p[4] = kind;
    memcpy(p + 5, &len, 4);
    if (len) memcpy(p + HEADER, payload, len);
    to_ctl.len += HEADER + len;
}

static void watch(int fd, uint32_t events, int op) {
    struct epoll_event ev = {.events = events, .data.u32 = (uint32_t)fd};
    if (epoll_ctl(ep, op, fd, &ev) < 0 && op != EPOLL_CTL_DEL) fail("epoll_ctl");
}

static void events_of(int fd) {
    Conn *c = &conns[fd];
    uint32_t ev = (c->paused ? 0 : EPOLLIN) | (c->out_len ? EPOLLOUT : 0);
    watch(fd, ev, EPOLL_CTL_MOD);
}

static void drop(int fd) {
    Conn *c = &conns[fd];
    if (!c->open) return;
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    frame(c->id, 'C', NULL, 0);
    free(c->out);
    memset(c, 0, sizeof *c);
}

/* Write what is queued for fd; close it if the controller asked and nothing is left. */
static void flush_conn(int fd) {
    Conn *c = &conns[fd];
    while (c->out_len) {
        ssize_t n = write(fd, c->out, c->out_len);
        if (n < 0 && errno == EAGAIN) break;
        if (n <= 0) {
            drop(fd);
            return;
        }
        memmove(c->out, c->out + n, c->out_len - n);
        c->out_len -= n;
    }
    if (!c->out_len && c->closing) {
        drop(fd);
        return;
    }
    c->paused = c->out_len > high_water;
    events_of(fd); /* only connections with a backlog get here: one epoll_ctl each time is cheap enough */
}

static void to_conn(uint32_t id, char kind, const char *data, uint32_t len) {
    int fd = (int)(id & 0xffff);
    Conn *c = &conns[fd];
    if (!c->open || c->id != id) return; /* already closed: its 'C' is on the way to the controller */
    if (kind == 'C') {
        c->closing = 1;
        flush_conn(fd);
        return;
    }
    if (!c->out_len) { /* the common case: written at once */
        ssize_t n = write(fd, data, len);
        if (n == (ssize_t)len) return;
        if (n < 0 && errno != EAGAIN) {
            drop(fd);
            return;
        }
        if (n > 0) {
            data += n;
            len -= n;
        }
    }
    if (c->out_len + len > 4 * high_water) { /* replies in flight when it was paused overran it: a consumer this
                                                 * slow is closed, so no connection holds more than this */
        drop(fd);
        return;
    }
    reserve(&c->out, &c->out_cap, c->out_len + len);
    memcpy(c->out + c->out_len, data, len);
    c->out_len += len;
    flush_conn(fd);
}

static void from_controller(void) {
    reserve(&from_ctl.data, &from_ctl.cap, from_ctl.len + READ);
    ssize_t n = read(mux, from_ctl.data + from_ctl.len, READ);
    if (n == 0) exit(0); /* the controller is gone */
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        fail("read from the controller");
    }
    from_ctl.len += n;
    size_t at = 0;
    while (from_ctl.len - at >= HEADER) {
        uint32_t id, len;
        memcpy(&id, from_ctl.data + at, 4);
        memcpy(&len, from_ctl.data + at + 5, 4);
        if (from_ctl.len - at - HEADER < len) break;
        to_conn(id, from_ctl.data[at + 4], from_ctl.data + at + HEADER, len);
        at += HEADER + len;
    }
    memmove(from_ctl.data, from_ctl.data + at, from_ctl.len - at);
    from_ctl.len -= at;
}

static void from_rank(int fd) {
    Conn *c = &conns[fd];
    char buf[READ];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
        frame(c->id, 'D', buf, (uint32_t)n);
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        drop(fd);
    }
}

static void accept_all(void) {
    int fd, one = 1;
    struct sockaddr_storage a;
    socklen_t alen = sizeof a;
    while ((fd = accept4(lst, (struct sockaddr *)&a, &alen, SOCK_NONBLOCK)) >= 0) {
        if (fd >= MAX_FD) {
            close(fd);
            continue;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        Conn *c = &conns[fd];
        memset(c, 0, sizeof *c);
        c->open = 1;
        c->id = (next_id++ << 16) | (uint32_t)fd;
        if (next_id == 0x10000) next_id = 1;
        char host[INET6_ADDRSTRLEN] = "?", peer[INET6_ADDRSTRLEN + 8];
        int port = 0;
        if (a.ss_family == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)&a)->sin_addr, host, sizeof host);
            port = ntohs(((struct sockaddr_in *)&a)->sin_port);
        } else if (a.ss_family == AF_INET6) {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&a)->sin6_addr, host, sizeof host);
            port = ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
        }
        int len = snprintf(peer, sizeof peer, "%s:%d", host, port);
        frame(c->id, 'O', peer, (uint32_t)len);
        watch(fd, EPOLLIN, EPOLL_CTL_ADD);
        alen = sizeof a;
    }
}

/* The batch read this turn goes to the controller in as few writes as its stream takes. */
static void flush_controller(void) {
    while (to_ctl.start < to_ctl.len) {
        ssize_t n = write(mux, to_ctl.data + to_ctl.start, to_ctl.len - to_ctl.start);
        if (n < 0 && errno == EAGAIN) break;
        if (n <= 0) exit(0); /* the controller is gone */
        to_ctl.start += n;
    }
    if (to_ctl.start == to_ctl.len) to_ctl.start = to_ctl.len = 0;
    struct epoll_event ev = {.events = EPOLLIN | (to_ctl.len ? EPOLLOUT : 0), .data.u32 = MUX_TAG};
    epoll_ctl(ep, EPOLL_CTL_MOD, mux, &ev);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: concentrator LISTEN_FD MUX_FD HIGH_WATER_BYTES\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);         /* a rank gone mid-reply is an EPIPE from write, not the end of this process */
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* dies with the controller: its port is free for the restart at once */
    if (getppid() == 1) return 0;     /* the controller died before that took effect */
    lst = atoi(argv[1]);
    mux = atoi(argv[2]);
    high_water = (size_t)atol(argv[3]);
    if ((ep = epoll_create1(0)) < 0) fail("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = MUX_TAG};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, mux, &ev) < 0) fail("the controller's stream");
    ev.data.u32 = MUX_TAG - 1;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, lst, &ev) < 0) fail("the listening socket");
    static struct epoll_event events[1024];
    for (;;) {
        int ready = epoll_wait(ep, events, 1024, -1);
        if (ready < 0) {
            if (errno == EINTR) continue;
            fail("epoll_wait");
        }
        for (int i = 0; i < ready; i++) {
            uint32_t tag = events[i].data.u32;
            if (tag == MUX_TAG) {
                if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) from_controller();
            } else if (tag == MUX_TAG - 1) {
                accept_all();
            } else {
                if (events[i].events & EPOLLOUT) flush_conn((int)tag);
                if (conns[tag].open && (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) from_rank((int)tag);
                if (to_ctl.len >= FLUSH_BYTES) flush_controller();
            }
        }
        flush_controller();
    }
}
