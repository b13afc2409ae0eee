/* Emulated ranks for `bench_controller.py --ranks N --native-ranks`: the same pair loops as the Python
 * emulator (both members acquire, both get the grant, both release, both get the reply, again), on
 * connections the benchmark already opened, greeted (hello) and declared groups on, and passes here as file
 * descriptors. One epoll loop, no allocation per request: the emulated ranks cost a few microseconds of CPU
 * per request (the Python ones 12-17), so on a 2-core machine the latencies measure the server, not the
 * emulator that shares the cores with it.
 *
 * The lines are ControllerClient's: an acquire carries its op number (op_no), a release not.
 * stdin:  "N ROUNDS WARMUP TIME_LIMIT_S DROP_AFTER_S\n", then N lines "FD RANK KEY JOB" (pairs: lines 2i, 2i+1).
 * stdout: the measured acquires' latencies in seconds (request written -> reply read), native doubles.
 * stderr: one JSON line: wall_s, cpu_s, acquires, dropped, heartbeats, requests.
 * Exit 2 on bad input, 3 when a connection fails (a line on stderr says which). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#define LINE 256
#define HEARTBEAT_S 0.5 /* idle ranks send one (heartbeat_timeout / 4; any request is a sign of life) */

typedef struct {
    int fd, rank, pair;
    long next_id, pending; /* id of the request in flight, 0 if none */
    double sent, last_sent;
    char acquire[LINE], release[LINE]; /* request templates with one %ld for the id */
    char buf[8192];
    int len;
} Rank;

typedef struct {
    int a, b, round, phase, answered, got, done; /* phase 0: acquiring, 1: releasing */
    double latency[2];
} Pair;

static Rank *ranks;
static Pair *pairs;
static int n_ranks, n_pairs, rounds, warmup, pairs_done;
static double deadline, drop_after;
static double *latencies;
static long n_latencies, dropped, heartbeats, requests;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void fail(const char *what, int rank) {
    fprintf(stderr, "emulated rank %d: %s (%s)\n", rank, what, strerror(errno));
    exit(3);
}

static void put(Rank *r, const char *line, int len) {
    if (write(r->fd, line, len) != len) fail("write failed", r->rank);
}

/* One request: the template's first %ld is a fresh id, its second (an acquire's op_no) the pair's round + 1. */
static void send_request(Rank *r, const char *template, long op_no) {
    char line[LINE + 64];
    int len = snprintf(line, sizeof line, template, ++r->next_id, op_no);
    r->pending = r->next_id;
    r->sent = r->last_sent = now();
    requests++;
    put(r, line, len);
}

static void finish(Pair *p) {
    if (!p->done) {
        p->done = 1;
        pairs_done++;
    }
}

static void start(Pair *p) {
    if (p->round >= warmup + rounds || now() > deadline) {
        finish(p);
        return;
    }
    p->phase = p->answered = p->got = 0;
    send_request(&ranks[p->a], ranks[p->a].acquire, p->round + 1);
    send_request(&ranks[p->b], ranks[p->b].acquire, p->round + 1);
}

static void on_reply(Rank *r, int ok, double latency) {
    Pair *p = &pairs[r->pair];
    if (p->done) return;
    p->answered++;
    if (p->phase == 0) {
        if (ok) p->latency[p->got++] = latency;
        if (p->answered < 2) return;
        dropped += 2 - p->got;
        if (p->round >= warmup)
            for (int i = 0; i < p->got; i++) latencies[n_latencies++] = p->latency[i];
        p->phase = 1;
        p->answered = 0;
        send_request(&ranks[p->a], ranks[p->a].release, 0);
        send_request(&ranks[p->b], ranks[p->b].release, 0);
        return;
    }
    if (p->answered < 2) return;
    p->round++;
    start(p);
}

/* Every whole line read: the reply to the request in flight (matched by id), or a heartbeat's reply or a push. */
static void readable(Rank *r, double t) {
    int got = read(r->fd, r->buf + r->len, sizeof r->buf - 1 - r->len);
    if (got <= 0) fail(got == 0 ? "the server closed the connection" : "read failed", r->rank);
    r->len += got;
    r->buf[r->len] = 0;
    char *line = r->buf, *nl;
    while ((nl = memchr(line, '\n', r->buf + r->len - line))) {
        *nl = 0;
        char *id = strstr(line, "\"id\":");
        if (id && r->pending && atol(id + 5) == r->pending) {
            r->pending = 0;
            on_reply(r, strstr(line, "\"ok\":true") != NULL, t - r->sent);
        }
        line = nl + 1;
    }
    r->len = r->buf + r->len - line;
    memmove(r->buf, line, r->len);
}

/* Heartbeats for idle ranks; a pair with a request unanswered for drop_after is stopped, its acquires dropped. */
static void housekeeping(double t) {
    for (int i = 0; i < n_pairs; i++) {
        Pair *p = &pairs[i];
        Rank *a = &ranks[p->a], *b = &ranks[p->b];
        if (p->done) continue;
        if ((a->pending && t - a->sent > drop_after) || (b->pending && t - b->sent > drop_after)) {
            if (p->phase == 0) dropped += (a->pending != 0) + (b->pending != 0);
            a->pending = b->pending = 0;
            finish(p);
        }
    }
    for (int i = 0; i < n_ranks; i++) {
        Rank *r = &ranks[i];
        if (!r->pending && t - r->last_sent >= HEARTBEAT_S) {
            char line[64];
            int len = snprintf(line, sizeof line, "{\"id\":%ld,\"op\":\"heartbeat\"}\n", ++r->next_id);
            r->last_sent = t;
            heartbeats++;
            put(r, line, len);
        }
    }
}

int main(void) {
    double time_limit;
    if (scanf("%d %d %d %lf %lf", &n_ranks, &rounds, &warmup, &time_limit, &drop_after) != 5 || n_ranks < 2 ||
        n_ranks % 2 || rounds < 1 || warmup < 0) {
        fprintf(stderr, "expected \"N ROUNDS WARMUP TIME_LIMIT_S DROP_AFTER_S\" with an even N >= 2\n");
        return 2;
    }
    n_pairs = n_ranks / 2;
    ranks = calloc(n_ranks, sizeof *ranks);
    pairs = calloc(n_pairs, sizeof *pairs);
    latencies = malloc(sizeof *latencies * 2 * (size_t)n_pairs * rounds);
    int ep = epoll_create1(0);
    if (!ranks || !pairs || !latencies || ep < 0) return 3;
    for (int i = 0; i < n_ranks; i++) {
        Rank *r = &ranks[i];
        char key[96], job[96];
        if (scanf("%d %d %95s %95s", &r->fd, &r->rank, key, job) != 4) {
            fprintf(stderr, "line %d: expected \"FD RANK KEY JOB\"\n", i + 2);
            return 2;
        }
        r->pair = i / 2;
        snprintf(r->acquire, LINE,
                 "{\"id\":%%ld,\"op\":\"acquire\",\"job\":\"%s\",\"rank\":%d,\"key\":\"%s\",\"op_no\":%%ld}\n",
                 job, r->rank, key);
        snprintf(r->release, LINE, "{\"id\":%%ld,\"op\":\"release\",\"job\":\"%s\",\"rank\":%d,\"key\":\"%s\"}\n",
                 job, r->rank, key);
        r->next_id = 1000; /* above the set-up requests' ids */
        r->last_sent = now();
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (unsigned)i};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, r->fd, &ev) < 0) fail("not a connection", r->rank);
    }
    for (int i = 0; i < n_pairs; i++) {
        pairs[i].a = 2 * i;
        pairs[i].b = 2 * i + 1;
    }
    double t0 = now(), last_housekeeping = t0;
    deadline = t0 + time_limit;
    clock_t cpu0 = clock();
    for (int i = 0; i < n_pairs; i++) start(&pairs[i]);
    struct epoll_event events[1024];
    while (pairs_done < n_pairs) {
        int ready = epoll_wait(ep, events, 1024, 100);
        if (ready < 0 && errno != EINTR) fail("epoll_wait failed", -1);
        double t = now();
        for (int i = 0; i < ready; i++) readable(&ranks[events[i].data.u32], t);
        if (t - last_housekeeping >= 0.1) {
            last_housekeeping = t;
            housekeeping(t);
        }
    }
    fprintf(stderr, "{\"wall_s\": %.6f, \"cpu_s\": %.6f, \"acquires\": %ld, \"dropped\": %ld, \"heartbeats\": %ld, "
            "\"requests\": %ld}\n", now() - t0, (double)(clock() - cpu0) / CLOCKS_PER_SEC, n_latencies, dropped,
            heartbeats, requests + heartbeats);
    fwrite(latencies, sizeof *latencies, n_latencies, stdout);
    return 0;
}
