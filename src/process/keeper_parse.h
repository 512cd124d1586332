/*
 * The keeper's parsers of what it did not write itself, each a pure function: bytes in, a
 * struct or a refusal out, no allocation, no descriptor, no global. keeper.c includes this
 * file; so do the checks that hold them to the Rust side's grammar (keeper_parse.c: the
 * library's tests, and the fuzz targets of fuzz/, which feed the same bytes to these and to
 * the Rust side's decoders in src/process/keeper/decode.rs and require the same answer).
 *
 *   parse_request    an attempt's request (the runner's, see keeper.c)
 *   parse_hub        a datagram of the hub socket: `attempt` or `lease TOKEN TERM_AT KILL_AT`
 *   parse_lease_file DIR/lease, written by an adopting runner (src/files.rs, write_lease)
 *   control_release  the runner's bytes on an attempt's control socket: `release\n`
 *   parse_exec       `exec NICE IOPRIO MEM PIDS PROGRAM ARGV...`
 */
#ifndef KEEPER_PARSE_H
#define KEEPER_PARSE_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKEN 128
/* A request larger than this is refused (the kernel's own argv + environment bound is 2 MiB
 * to a few; this leaves room and bounds what a runner can make the keeper allocate). */
#define MAX_REQUEST (16u << 20)
#define REQUEST_FIELDS 16

/* What a command's process sets on itself before its exec (0: not set). */
struct manners {
    int has_nice, nice;
    unsigned ioprio;
    uint64_t data_rlimit, nproc_rlimit;
};

/* The numbers are what the runner writes: ASCII digits, a `-` before a negative one, and
 * nothing else (strtoull and strtoll also take spaces and a `+` before, and strtoull a `-`,
 * " -5" read as 2^64 - 5). */

/* The `n` digits at `s` (n > 0, no other byte) in *v; -1 past UINT64_MAX. */
static int digits_u64(const char *s, size_t n, uint64_t *v) {
    uint64_t x = 0;
    if (n == 0) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned d = (unsigned)(unsigned char)s[i] - '0';
        if (d > 9 || x > (UINT64_MAX - d) / 10) return -1;
        x = x * 10 + d;
    }
    *v = x;
    return 0;
}

static int parse_u64(const char *s, uint64_t *v) { return digits_u64(s, strlen(s), v); }

/* An optional number in lo..=hi: empty is none (*has = 0). */
static int parse_opt(const char *s, int64_t lo, int64_t hi, int *has, int64_t *v) {
    *has = 0;
    *v = 0;
    if (!*s) return 0;
    int negative = *s == '-';
    uint64_t x;
    if (digits_u64(s + negative, strlen(s + negative), &x) != 0) return -1;
    /* -2^63 is no limit's bound: a magnitude past INT64_MAX is out of range either way. */
    if (x > INT64_MAX) return -1;
    int64_t signed_x = negative ? -(int64_t)x : (int64_t)x;
    if (signed_x < lo || signed_x > hi) return -1;
    *has = 1;
    *v = signed_x;
    return 0;
}

static int token_ok(const char *t) {
    size_t n = strlen(t);
    if (n == 0 || n > MAX_TOKEN) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = t[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_'))
            return 0;
    }
    return 1;
}

/* An attempt's request (the bytes after its length):
 *
 *   TOKEN DIR JOURNAL CAP MEM DRAIN_MS TERM_AT KILL_AT NICE IOPRIO MEM_MAX PIDS_MAX
 *   CPU_WEIGHT CWD PROGRAM ARGC ARGV... ENV...
 *
 * each NUL-terminated. The strings point into `req`. */
struct request {
    char *field[REQUEST_FIELDS];  /* as they came; field[13] is CWD, field[14] PROGRAM */
    uint64_t cap, mem, drain_ms, term_at, kill_at, argc, envc;
    int has[5];
    int64_t lim[5];               /* nice, ioprio, memory max, pids max, cpu weight */
    char *args;                   /* ARGC strings of argv, then ENVC of the environment */
};

/* 0, or -1 for a request that is not one (EINVAL). */
static int parse_request(char *req, size_t len, struct request *r) {
    memset(r, 0, sizeof *r);
    char *p = req, *end = req + len;
    if (len == 0 || len > MAX_REQUEST || end[-1] != 0) return -1;
    for (int i = 0; i < REQUEST_FIELDS; i++) {
        if (p >= end) return -1;
        r->field[i] = p;
        p += strlen(p) + 1;
    }
    char **f = r->field;
    if (!token_ok(f[0]) || f[1][0] != '/' || f[2][0] != '/' || parse_u64(f[3], &r->cap) ||
        parse_u64(f[4], &r->mem) || parse_u64(f[5], &r->drain_ms) ||
        parse_u64(f[6], &r->term_at) || parse_u64(f[7], &r->kill_at) ||
        parse_opt(f[8], -20, 19, &r->has[0], &r->lim[0]) ||
        parse_opt(f[9], 1, 65535, &r->has[1], &r->lim[1]) ||
        parse_opt(f[10], 1, INT64_MAX, &r->has[2], &r->lim[2]) ||
        parse_opt(f[11], 1, INT64_MAX, &r->has[3], &r->lim[3]) ||
        parse_opt(f[12], 1, 10000, &r->has[4], &r->lim[4]) || parse_u64(f[15], &r->argc) ||
        r->argc == 0 || r->argc > MAX_REQUEST / 2 || r->term_at > INT64_MAX ||
        r->kill_at > INT64_MAX || r->drain_ms > INT32_MAX)
        return -1;
    size_t left = 0;
    for (char *q = p; q < end; q += strlen(q) + 1) left++;
    if (left < r->argc) return -1;
    r->args = p;
    r->envc = left - r->argc;
    return 0;
}

/* Fills argv ([PROGRAM, ARGV..., NULL]: ARGC + 2) and env ([ENV..., NULL]: ENVC + 1) with
 * the request's strings. */
static void request_lists(const struct request *r, char **argv, char **env) {
    char *p = r->args;
    argv[0] = r->field[14];
    for (uint64_t i = 0; i < r->argc; i++) { argv[i + 1] = p; p += strlen(p) + 1; }
    argv[r->argc + 1] = NULL;
    for (uint64_t i = 0; i < r->envc; i++) { env[i] = p; p += strlen(p) + 1; }
    env[r->envc] = NULL;
}

enum { HUB_NONE, HUB_ATTEMPT, HUB_LEASE };

/* `lease TOKEN TERM_AT KILL_AT`: `0 0` disarms the fence. */
struct lease_msg {
    char token[MAX_TOKEN + 1];
    int64_t term_at, kill_at;
};

/* The number of `n` bytes at `s` up to the first `stop` (all of them without one), in
 * *v when it is at most INT64_MAX; the bytes taken, or 0. */
static size_t time_before(const char *s, size_t n, char stop, int64_t *v) {
    const char *at = memchr(s, stop, n);
    size_t len = at ? (size_t)(at - s) : n;
    uint64_t x;
    if (digits_u64(s, len, &x) != 0 || x > INT64_MAX) return 0;
    *v = (int64_t)x;
    return len;
}

/* A hub datagram's `n` bytes: HUB_ATTEMPT, HUB_LEASE (with *l), or HUB_NONE for anything the
 * runner does not write (sscanf took bytes past the times, runs of spaces, signs, and a token
 * past 128 bytes cut there, its rest read as the times). */
static int parse_hub(const char *text, size_t n, struct lease_msg *l) {
    memset(l, 0, sizeof *l);
    if (n == 7 && memcmp(text, "attempt", 7) == 0) return HUB_ATTEMPT;
    if (n < 6 || memcmp(text, "lease ", 6) != 0) return HUB_NONE;
    const char *p = text + 6, *end = text + n;
    const char *space = memchr(p, ' ', (size_t)(end - p));
    if (!space || (size_t)(space - p) > MAX_TOKEN) return HUB_NONE;
    memcpy(l->token, p, (size_t)(space - p));
    l->token[space - p] = 0;
    if (strlen(l->token) != (size_t)(space - p) || !token_ok(l->token)) return HUB_NONE;
    p = space + 1;
    size_t t = time_before(p, (size_t)(end - p), ' ', &l->term_at);
    if (!t || p + t == end) return HUB_NONE;
    p += t + 1;
    size_t k = time_before(p, (size_t)(end - p), ' ', &l->kill_at);
    if (!k || p + k != end) return HUB_NONE;
    return HUB_LEASE;
}

#define LEASE_LINE 63

/* DIR/lease's `n` bytes: "TERM_AT KILL_AT CHECK\n", 20 digits each, CHECK = TERM_AT ^
 * KILL_AT, as the runner writes it and nothing else; 1 when it is that whole line, 0
 * otherwise (a torn read). */
static int parse_lease_file(const char *text, size_t n, int64_t *term_at, int64_t *kill_at) {
    uint64_t v[3];
    if (n != LEASE_LINE || text[LEASE_LINE - 1] != '\n') return 0;
    for (int i = 0; i < 3; i++)
        if ((i < 2 && text[21 * i + 20] != ' ') || digits_u64(text + 21 * i, 20, &v[i]) != 0)
            return 0;
    if ((v[0] ^ v[1]) != v[2] || v[0] > INT64_MAX || v[1] > INT64_MAX) return 0;
    *term_at = (int64_t)v[0];
    *kill_at = (int64_t)v[1];
    return 1;
}

#define RELEASE_LINE "release\n"

/* What an attempt's control socket said so far, after its request: how much of `release\n`
 * (the only bytes a runner sends there), or that it said something else. */
struct control_in {
    unsigned have;
    int other;
};

/* Whether `n` more bytes read from an attempt's control socket end its `release\n` (which
 * may come in more than one read; memmem in each read missed a cut one, and took one after
 * other bytes). */
static int control_release(struct control_in *c, const char *got, size_t n) {
    const size_t len = sizeof RELEASE_LINE - 1;
    for (size_t i = 0; i < n && !c->other && c->have < len; i++) {
        if (got[i] != RELEASE_LINE[c->have]) c->other = 1;
        else if (++c->have == len) return 1;
    }
    return 0;
}

/* `exec NICE IOPRIO MEM PIDS PROGRAM ARGV...` (argv[0] and argv[1] are the keeper's and
 * `exec`): 0 with *m, or -1. PROGRAM is argv[6], the command's argv argv + 7. */
static int parse_exec(int argc, char **argv, struct manners *m) {
    int has[4];
    int64_t lim[4];
    if (argc < 8 || parse_opt(argv[2], -20, 19, &has[0], &lim[0]) ||
        parse_opt(argv[3], 1, 65535, &has[1], &lim[1]) ||
        parse_opt(argv[4], 1, INT64_MAX, &has[2], &lim[2]) ||
        parse_opt(argv[5], 1, INT64_MAX, &has[3], &lim[3]))
        return -1;
    *m = (struct manners){has[0], (int)lim[0], has[1] ? (unsigned)lim[1] : 0,
                          has[2] ? (uint64_t)lim[2] : 0, has[3] ? (uint64_t)lim[3] : 0};
    return 0;
}

#endif
