/*
 * The keeper's parsers (keeper_parse.h) behind a C ABI, each answer written out in one
 * canonical form (NUL-terminated items) that the Rust side's decoders also write
 * (src/process/keeper/decode.rs): the library's tests and the fuzz targets of fuzz/ compare the
 * two byte for byte. Not part of the keeper's program. The fuzz crate builds it again with
 * KP_FUZZ (its own names, and libFuzzer's comparison hooks).
 */
#define _GNU_SOURCE
#include <stdio.h>

#include "keeper_parse.h"

#ifdef KP_FUZZ
#define KP(name) leasehold_fuzz_kp_##name
#else
#define KP(name) leasehold_kp_##name
#endif

struct out {
    uint8_t *p;
    size_t len, cap;
    int over;
};

static void put(struct out *o, const void *b, size_t n) {
    if (o->over || n > o->cap - o->len) {
        o->over = 1;
        return;
    }
    memcpy(o->p + o->len, b, n);
    o->len += n;
}

static void put_str(struct out *o, const char *s) { put(o, s, strlen(s) + 1); }

static void put_u64(struct out *o, uint64_t v) {
    char b[32];
    snprintf(b, sizeof b, "%llu", (unsigned long long)v);
    put_str(o, b);
}

static void put_i64(struct out *o, int64_t v) {
    char b[32];
    snprintf(b, sizeof b, "%lld", (long long)v);
    put_str(o, b);
}

static void put_opt(struct out *o, int has, int64_t v) {
    if (has) put_i64(o, v);
    else put_str(o, "");
}

static long done(struct out *o) { return o->over ? -1 : (long)o->len; }

/* An attempt's request body (the bytes after its length): `refused`, or `ok` and its fields,
 * ARGC, the argv, ENVC and the environment. The output's length, or -1 past `cap`. */
long KP(request)(const uint8_t *in, size_t len, uint8_t *outp, size_t cap) {
    struct out o = {outp, 0, cap, 0};
    char *req = malloc(len ? len : 1);
    if (!req) return -1;
    if (len) memcpy(req, in, len);
    struct request r;
    if (parse_request(req, len, &r) != 0) {
        put_str(&o, "refused");
        free(req);
        return done(&o);
    }
    char **argv = calloc(r.argc + 2, sizeof *argv);
    char **env = calloc(r.envc + 1, sizeof *env);
    if (!argv || !env) {
        free(argv);
        free(env);
        free(req);
        return -1;
    }
    request_lists(&r, argv, env);
    put_str(&o, "ok");
    for (int i = 0; i < 3; i++) put_str(&o, r.field[i]);
    put_u64(&o, r.cap);
    put_u64(&o, r.mem);
    put_u64(&o, r.drain_ms);
    put_u64(&o, r.term_at);
    put_u64(&o, r.kill_at);
    for (int i = 0; i < 5; i++) put_opt(&o, r.has[i], r.lim[i]);
    put_str(&o, r.field[13]);
    put_str(&o, argv[0]);
    put_u64(&o, r.argc);
    for (uint64_t i = 0; i < r.argc; i++) put_str(&o, argv[i + 1]);
    if (argv[r.argc + 1]) put_str(&o, "argv not ended");
    put_u64(&o, r.envc);
    for (uint64_t i = 0; i < r.envc; i++) put_str(&o, env[i]);
    if (env[r.envc]) put_str(&o, "env not ended");
    free(argv);
    free(env);
    free(req);
    return done(&o);
}

/* A hub datagram as read_hub() takes it (at most 511 bytes): `none`, `attempt`, or `lease`
 * with its token and times. */
long KP(hub)(const uint8_t *in, size_t len, uint8_t *outp, size_t cap) {
    struct out o = {outp, 0, cap, 0};
    char text[512];
    size_t n = len < sizeof text - 1 ? len : sizeof text - 1;
    memcpy(text, in, n);
    text[n] = 0;
    struct lease_msg l;
    switch (parse_hub(text, n, &l)) {
    case HUB_ATTEMPT: put_str(&o, "attempt"); break;
    case HUB_LEASE:
        put_str(&o, "lease");
        put_str(&o, l.token);
        put_i64(&o, l.term_at);
        put_i64(&o, l.kill_at);
        break;
    default: put_str(&o, "none");
    }
    return done(&o);
}

/* A lease file as read_lease_file() takes it (its first 79 bytes): `none`, or `lease` and the
 * times. */
long KP(lease_file)(const uint8_t *in, size_t len, uint8_t *outp, size_t cap) {
    struct out o = {outp, 0, cap, 0};
    char text[80];
    size_t n = len < sizeof text - 1 ? len : sizeof text - 1;
    memcpy(text, in, n);
    text[n] = 0;
    int64_t t = 0, k = 0;
    if (parse_lease_file(text, n, &t, &k)) {
        put_str(&o, "lease");
        put_i64(&o, t);
        put_i64(&o, k);
    } else {
        put_str(&o, "none");
    }
    return done(&o);
}

/* The control socket's bytes in reads of `sizes[i]` bytes each (at most 64, as
 * read_control() reads): the index of the read that released the attempt, or -1. */
long KP(control)(const uint8_t *in, const size_t *sizes, size_t reads) {
    struct control_in c;
    memset(&c, 0, sizeof c);
    for (size_t i = 0; i < reads; i++) {
        if (control_release(&c, (const char *)in, sizes[i])) return (long)i;
        in += sizes[i];
    }
    return -1;
}

/* `exec` mode's argv, given as `argc` NUL-terminated strings: `refused`, or `ok`, the manners,
 * PROGRAM and the command's argv. */
long KP(exec)(const uint8_t *in, size_t len, uint8_t *outp, size_t cap) {
    struct out o = {outp, 0, cap, 0};
    char *copy = malloc(len + 1);
    if (!copy) return -1;
    memcpy(copy, in, len);
    copy[len] = 0;
    size_t argc = 0;
    for (size_t i = 0; i < len; i++) argc += copy[i] == 0;
    char **argv = calloc(argc + 1, sizeof *argv);
    if (!argv) {
        free(copy);
        return -1;
    }
    char *p = copy;
    for (size_t i = 0; i < argc; i++) {
        argv[i] = p;
        p += strlen(p) + 1;
    }
    struct manners m;
    if (argc > INT32_MAX || parse_exec((int)argc, argv, &m) != 0) {
        put_str(&o, "refused");
    } else {
        put_str(&o, "ok");
        put_opt(&o, m.has_nice, m.nice);
        put_u64(&o, m.ioprio);
        put_u64(&o, m.data_rlimit);
        put_u64(&o, m.nproc_rlimit);
        put_str(&o, argv[6]);
        for (size_t i = 7; i < argc; i++) put_str(&o, argv[i]);
    }
    free(argv);
    free(copy);
    return done(&o);
}
