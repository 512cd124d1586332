/*
 * leasehold-keeper: one per runner process, the parent of every attempt's command, which
 * outlives the runner.
 *
 *   leasehold-keeper serve [CGROUP]
 *   leasehold-keeper exec NICE IOPRIO MEM PIDS PROGRAM ARGV...
 *
 * `exec` is the runner's own spawn (`run --no-keepers`) of a command with manners or caps:
 * it applies them as a kept command's child does (below), then execs PROGRAM with ARGV (a
 * file without `#!` under /bin/sh); where that fails it says why on stderr and exits 127.
 *
 * CGROUP, when given, is the runner's cgroup v2 folder: the keeper makes its node
 * CGROUP/leasehold-keeper-PID there, moves itself into the node's `keeper` leaf and starts
 * each command in the node's `a-TOKEN` cgroup (see src/process/cgroup.rs). An attempt's
 * processes are then its cgroup's, whatever they did to their group or environment: the
 * fence and the leftovers' kill write `cgroup.kill`, a leftover is any process still in it
 * after the main process ended, and the cgroup is removed once the attempt is forgotten.
 * Where the node cannot be made or joined, the keeper says why and uses process groups.
 *
 * fd 3 is a SOCK_SEQPACKET socket to the runner process (the "hub"); 0, 1 and 2 are
 * /dev/null; the environment is empty (only a command's own environment carries its run
 * token, so a scan of /proc/PID/environ for a token never finds, or kills, the keeper). The
 * runner spawns it in a session of its own, and it makes itself a child subreaper: every
 * descendant of a command that outlives its parent is re-parented here, not to init, and
 * reaped here once it exits.
 *
 * The hub socket. The keeper says `ready cgroup` (each attempt in a cgroup), `ready groups
 * ERRNO` (the node could not be made or joined) or `ready` (no CGROUP given) once it runs.
 * The runner then sends datagrams:
 *
 *   attempt             with one descriptor (SCM_RIGHTS): a stream socket, the attempt's
 *                       control socket, on which the attempt's request follows
 *   lease TOKEN T K     the attempt's lease fence moves to T and K (see below); `lease TOKEN
 *                       0 0` disarms it for good (the runner leaves the attempt running)
 *
 * Its EOF means the runner process is gone; the keeper goes on until its last attempt ends,
 * then exits 0.
 *
 * An attempt's control socket. The runner writes one request, a 4-byte little-endian length
 * and that many bytes of NUL-terminated fields:
 *
 *   TOKEN DIR JOURNAL CAP MEM DRAIN_MS TERM_AT KILL_AT NICE IOPRIO MEM_MAX PIDS_MAX
 *   CPU_WEIGHT CWD PROGRAM ARGC ARGV... ENV...
 *
 * Manners and caps (each empty for none; see docs/manners.md). The child sets NICE
 * (setpriority) and IOPRIO (ioprio_set, class << 13 | level) before its exec. In the cgroup
 * mode MEM_MAX, PIDS_MAX and CPU_WEIGHT go into the attempt's cgroup (memory.max with
 * memory.swap.max 0 and memory.oom.group 1, pids.max, cpu.weight) where its node has the
 * controller (the keeper enables memory, pids and cpu in its node, and in the node's parent,
 * at its start; a refusal is normal); where a file cannot be written, MEM_MAX becomes the
 * child's RLIMIT_DATA and PIDS_MAX its RLIMIT_NPROC, and CPU_WEIGHT has no stand-in.
 *
 * and the keeper answers one line at a time:
 *
 *   started PID                        the command runs (it leads its own process group)
 *   failed <chdir|exec|setup> ERRNO    it could not start
 *   exited <exit|signal> N OPEN mem OUT ERR    it ended; OUT + ERR bytes of output follow
 *   exited <exit|signal> N OPEN files 0 0      it ended; its output is in DIR's files
 *
 * (OPEN is 1 when a pipe was still open at the drain deadline, or, in the cgroup mode, a
 * process was still in the attempt's cgroup: processes of the attempt outlive its main
 * process, and the runner kills them before it releases. It is 2 when no descendant of any
 * command is left alive: nothing of the attempt outlives it. It is 0 otherwise: the runner
 * looks for members of the command's group that are still alive.) `started` comes as soon as
 * the command's exec succeeded. The runner answers
 * `release` once its own durable commit of the ending is done; the keeper then reaps the
 * command and forgets the attempt. The command is held unreaped until then, so its pid and
 * group id stay the attempt's while anyone may signal the group.
 *
 * Output. Each stream is kept in memory up to MEM bytes (the runner's tail of it in the
 * database): a command that says little leaves no file and no folder. A stream goes to
 * DIR/stdout or DIR/stderr (DIR and its parent made owner-only on demand), capped as
 * src/files.rs describes, once it outgrows MEM, once the attempt has run SPILL_AFTER_MS (so
 * that `jobs logs --follow` of a running job reads it), or once the runner is gone.
 *
 * The journal. When an attempt's control socket reaches EOF without a release, its runner is
 * gone: the keeper writes the output it holds into DIR, and appends to JOURNAL (one file per
 * keeper, beside the database's attempt folders) one line per event, each with a checksum so
 * that a line torn by a crash is told from a whole one:
 *
 *   kept TOKEN PID CHECK                    the runner went while the command ran
 *   outcome TOKEN exit|signal N ENDED_AT CHECK   the command ended (wall clock, ms)
 *   fenced TOKEN CHECK                      the lease fence stopped it: the attempt is lost
 *
 * An `outcome` or `fenced` line is on disk (fdatasync) before the keeper reaps the command
 * and forgets the attempt, so whoever finds the keeper alive can wait for that line, and
 * whoever finds it gone knows the journal holds all it will hold. A journal that cannot be
 * written (a full disk) is retried every second; one whose folder is gone for 5 s is given
 * up, and the attempt forgotten unrecorded (lost, as if the keeper had died).
 *
 * The lease fence. TERM_AT and KILL_AT are this host's boot clock (CLOCK_BOOTTIME, ms): past
 * TERM_AT the keeper sends SIGTERM to the command's group, past KILL_AT SIGKILL, whatever the
 * leader did meanwhile (a leader that died of the SIGTERM stays unreaped until then, so the
 * group id is still the command's and members that ignore SIGTERM are killed too). Once
 * begun, the fence keeps the times that began it. 0 0 is no fence. The runner moves them with
 * `lease` after each renewal; once it is gone, an adopting runner moves them by writing
 * DIR/lease ("TERM_AT KILL_AT CHECK\n", 20 digits each, CHECK = TERM_AT ^ KILL_AT), read every
 * 100 ms. A fenced attempt gets no `exited`: its control socket is closed (or `fenced` is
 * journaled), so whoever looks finds the attempt lost, not failed.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "keeper_parse.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef PR_SET_CHILD_SUBREAPER
#define PR_SET_CHILD_SUBREAPER 36
#endif

#define HUB 3
#define RELEASE "release\n"
#define MARK_PREFIX "\n[leasehold: "
#define MARK_SUFFIX " bytes dropped]\n"
#define MARK_WIDTH 20
#define MARK_LEN (sizeof MARK_PREFIX - 1 + MARK_WIDTH + sizeof MARK_SUFFIX - 1)
#define HALF (32 * 1024)
/* The most a stream keeps in memory, whatever the runner asks. */
#define MAX_MEM (1u << 20)
#define SPILL_AFTER_MS 1000
#define FENCE_CHECK_MS 100
#define JOURNAL_GONE_MS 5000

static char buffer[2 * HALF];
static char *const rbuf = buffer;
static char *const mbuf = buffer + HALF;

struct stream {
    int pipe;          /* read end, -1 at EOF */
    const char *name;  /* the file's name in the attempt's folder */
    char *mem;         /* bytes kept in memory, while `file` is not in use */
    uint64_t mlen, msize;
    int spilled;       /* the stream goes to its file from now on */
    int file;          /* the file, -1 until the first byte there */
    uint64_t len, head, dropped;
    int marked;
    uint64_t cap;
    int *folder;       /* the attempt's folder descriptor (made on demand) */
};

enum { REQUEST, RUNNING, DONE };

struct attempt {
    int state;
    int control;                 /* -1 once released or gone */
    int gone;                    /* the control socket reached EOF without a release */
    char *req;                   /* the request, once its length is known */
    uint32_t req_len, req_have;
    unsigned char lenbuf[4];
    int len_have;
    const char *token, *dirname, *journal;
    uint64_t mem;
    int64_t drain_ms, term_at, kill_at;
    int disarmed;                /* `lease TOKEN 0 0`: no fence from messages any more */
    int fenced;                  /* 0, 1 SIGTERM sent, 2 SIGKILL sent */
    int lost;                    /* the fence began before the command ended: no outcome */
    int64_t lease_checked;
    pid_t pid;
    int pidfd;
    int folder;                  /* the attempt's folder, -1 until made */
    char *cgroup;                /* the attempt's cgroup, NULL in the process-group mode */
    struct stream s[2];
    int exited, status, open_at_deadline, reported, released, journaled;
    int64_t ended_at, deadline, started_mono, retry_at;
    int64_t gone_since;          /* when the journal's folder was first found gone, or 0 */
    char *out;                   /* the outbox: bytes for the runner not sent yet */
    struct control_in said;      /* the runner's bytes after the request */
    size_t out_len, out_off;
};

static struct attempt **attempts;
static size_t count, room;
static int hub_open = 1;
static int journal_fd = -1;
static char journal_path[PATH_MAX];
static char cg_node[PATH_MAX];  /* the keeper's cgroup node; empty: process groups */
static char cg_base[PATH_MAX];  /* the cgroup it was started in */

/* Cgroups of forgotten attempts not removed yet (a process still exiting), retried. */
struct gone_cgroup { char *path; int64_t until; };
static struct gone_cgroup *cg_gone;
static size_t cg_gone_count, cg_gone_room;

static int64_t now_ms(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t pwrite_all(int fd, const char *p, uint64_t n, uint64_t off) {
    uint64_t done = 0;
    while (done < n) {
        ssize_t w = pwrite(fd, p + done, n - done, (off_t)(off + done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        done += (uint64_t)w;
    }
    return done;
}

/* ---- Output files, capped (the layout src/files.rs reads) ---- */

static int write_marker(struct stream *s) {
    char line[MARK_LEN + 1];
    snprintf(line, sizeof line, "%s%*llu%s", MARK_PREFIX, MARK_WIDTH,
             (unsigned long long)s->dropped, MARK_SUFFIX);
    return pwrite_all(s->file, line, MARK_LEN, s->head) == MARK_LEN ? 0 : -1;
}

static void place_marker(struct stream *s, uint64_t at) {
    uint64_t end = s->len < at ? at : s->len < at + MARK_LEN ? s->len : at + MARK_LEN;
    s->head = at;
    s->dropped += end - at;
    if (write_marker(s) == 0) {
        s->marked = 1;
        if (s->len < at + MARK_LEN) s->len = at + MARK_LEN;
    } else {
        s->dropped -= end - at;
    }
}

static void append(struct stream *s, const char *p, uint64_t n) {
    uint64_t w = pwrite_all(s->file, p, n, s->len);
    s->len += w;
    if (w == n) return;
    s->dropped += n - w;
    if (s->marked) {
        write_marker(s);
    } else if (s->cap && s->len > s->cap / 2) {
        place_marker(s, s->cap / 2);
    } else {
        /* Over the newest bytes, so that it needs no room past the file's end. */
        place_marker(s, s->len >= MARK_LEN ? s->len - MARK_LEN : 0);
    }
}

static void move_tail(struct stream *s, uint64_t keep) {
    uint64_t start = s->head + MARK_LEN, from = s->len - keep, done = 0;
    s->dropped += from - start;
    while (done < keep) {
        uint64_t n = keep - done < HALF ? keep - done : HALF;
        ssize_t r = pread(s->file, mbuf, n, (off_t)(from + done));
        if (r <= 0 || pwrite_all(s->file, mbuf, (uint64_t)r, start + done) != (uint64_t)r) {
            s->dropped += keep - done;
            break;
        }
        done += (uint64_t)r;
    }
    s->len = start + done;
    if (ftruncate(s->file, (off_t)s->len) != 0) { /* the stale end is overwritten later */ }
}

/* Makes the attempt's folder and its job's folder (owner-only), once. */
static int make_folder(struct attempt *a) {
    if (a->folder >= 0) return 0;
    char parent[PATH_MAX];
    size_t n = strlen(a->dirname);
    if (n >= sizeof parent) { errno = ENAMETOOLONG; return -1; }
    memcpy(parent, a->dirname, n + 1);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = 0;
        if (mkdir(parent, 0700) != 0 && errno != EEXIST) return -1;
    }
    if (mkdir(a->dirname, 0700) != 0 && errno != EEXIST) return -1;
    a->folder = open(a->dirname, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    return a->folder >= 0 ? 0 : -1;
}

static int make_file(struct stream *s) {
    if (s->file >= 0) return 0;
    if (*s->folder < 0) return -1;
    /* Read too: a move of the tail reads its newest bytes back. */
    s->file = openat(*s->folder, s->name, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (s->file < 0) return -1;
    if (s->dropped) place_marker(s, 0);
    return 0;
}

/* Copies `n` bytes into the stream's file, enforcing the cap. */
static void store_file(struct stream *s, const char *p, uint64_t n) {
    if (make_file(s) != 0) {
        s->dropped += n;
        return;
    }
    uint64_t cap = s->cap;
    if (!s->marked && cap && s->len + n > cap) {
        if (s->len < cap / 2) {
            uint64_t k = cap / 2 - s->len;
            append(s, p, k);
            p += k, n -= k;
        }
        if (!s->marked) place_marker(s, cap / 2);
    }
    if (!s->marked) {
        append(s, p, n);
        return;
    }
    uint64_t start = s->head + MARK_LEN, tail = s->len - start, half = cap / 2;
    if (!cap || tail + n <= cap / 4 * 3) {
        append(s, p, n);
    } else if (n >= half) {
        s->dropped += tail + (n - half);
        s->len = start;
        if (ftruncate(s->file, (off_t)start) != 0) { /* overwritten below */ }
        append(s, p + (n - half), half);
    } else {
        move_tail(s, tail < half - n ? tail : half - n);
        append(s, p, n);
    }
    write_marker(s);
}

/* Moves the stream from memory to its file (made at its first byte). */
static void spill_stream(struct attempt *a, struct stream *s) {
    if (s->spilled) return;
    s->spilled = 1;
    if (s->mlen) {
        if (make_folder(a) != 0) s->dropped += s->mlen;
        else store_file(s, s->mem, s->mlen);
    }
    free(s->mem);
    s->mem = NULL;
    s->mlen = s->msize = 0;
}

static void spill(struct attempt *a) {
    for (int i = 0; i < 2; i++) spill_stream(a, &a->s[i]);
}

static void keep(struct attempt *a, struct stream *s, const char *p, uint64_t n) {
    if (!s->spilled && s->mlen + n > a->mem) spill_stream(a, s);
    if (s->spilled) {
        if (n && *s->folder < 0 && make_folder(a) != 0) { s->dropped += n; return; }
        store_file(s, p, n);
        return;
    }
    if (s->mlen + n > s->msize) {
        uint64_t size = s->msize ? s->msize : 4096;
        while (size < s->mlen + n) size *= 2;
        char *grown = realloc(s->mem, size);
        if (!grown) { spill_stream(a, s); store_file(s, p, n); return; }
        s->mem = grown;
        s->msize = size;
    }
    memcpy(s->mem + s->mlen, p, n);
    s->mlen += n;
}

static void pump(struct attempt *a, struct stream *s) {
    for (int turn = 0; turn < 16; turn++) {
        ssize_t r = read(s->pipe, rbuf, HALF);
        if (r > 0) { keep(a, s, rbuf, (uint64_t)r); continue; }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EAGAIN) return;
        close(s->pipe);
        s->pipe = -1;
        return;
    }
}

/* ---- The journal ---- */

static uint64_t fnv1a(const char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) { h ^= (unsigned char)p[i]; h *= 0x100000001b3ULL; }
    return h;
}

/* Appends `text` (no newline) with its checksum; with `durable`, fdatasyncs. 0 on success. */
static int journal(struct attempt *a, const char *text, int durable) {
    if (journal_fd < 0 || strcmp(journal_path, a->journal) != 0) {
        if (journal_fd >= 0) close(journal_fd);
        journal_fd = open(a->journal, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
        if (journal_fd < 0) return -1;
        snprintf(journal_path, sizeof journal_path, "%s", a->journal);
    }
    char line[512];
    size_t n = strlen(text);
    int m = snprintf(line, sizeof line, "%s %016llx\n", text, (unsigned long long)fnv1a(text, n));
    if (m < 0 || (size_t)m >= sizeof line) return -1;
    ssize_t w = write(journal_fd, line, (size_t)m);
    if (w != m) return -1;
    return durable && fdatasync(journal_fd) != 0 ? -1 : 0;
}

/* ---- Talking to the runner ---- */

/* Queues bytes for the runner; sent as the socket takes them. */
static void say(struct attempt *a, const char *p, size_t n) {
    if (a->control < 0) return;
    char *grown = realloc(a->out, a->out_len + n);
    if (!grown) return; /* the runner then sees no end and finds the attempt lost */
    a->out = grown;
    memcpy(a->out + a->out_len, p, n);
    a->out_len += n;
}

static void flush(struct attempt *a) {
    while (a->control >= 0 && a->out_off < a->out_len) {
        ssize_t w = send(a->control, a->out + a->out_off, a->out_len - a->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return; /* EAGAIN: later; a gone runner is seen by the next read */
        a->out_off += (size_t)w;
    }
    if (a->out_off == a->out_len) { a->out_off = a->out_len = 0; }
}

static void say_line(struct attempt *a, const char *line) { say(a, line, strlen(line)); }

/* ---- Cgroups ---- */

/* Writes `text` to DIR/FILE; 0, or -1 with errno. */
static int cg_write(const char *dir, const char *file, const char *text) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, file) >= (int)sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t n = strlen(text);
    ssize_t w = write(fd, text, n);
    int no = errno;
    close(fd);
    errno = no;
    return w == (ssize_t)n ? 0 : -1;
}

/* Reads DIR/FILE into buf (NUL-terminated); its length, or -1. */
static ssize_t cg_read(const char *dir, const char *file, char *buf, size_t size) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, file) >= (int)sizeof path) return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    if (n < 0) return -1;
    buf[n] = 0;
    return n;
}

/* Whether a live process is in the cgroup (zombies are not). */
static int cg_populated(const char *dir) {
    char text[256];
    return cg_read(dir, "cgroup.events", text, sizeof text) > 0 && strstr(text, "populated 1");
}

/* Sends `sig` to each process in the cgroup. */
static void cg_signal(const char *dir, int sig) {
    static char list[65536];
    if (cg_read(dir, "cgroup.procs", list, sizeof list) <= 0) return;
    for (char *p = list; *p;) {
        char *end;
        long pid = strtol(p, &end, 10);
        if (end == p) break;
        if (pid > 0) kill((pid_t)pid, sig);
        p = end;
        while (*p == '\n') p++;
    }
}

/* Kills every process in the cgroup at once; each in turn where cgroup.kill is missing. */
static void cg_kill(const char *dir) {
    if (cg_write(dir, "cgroup.kill", "1") != 0) cg_signal(dir, SIGKILL);
}

/* Makes the keeper's node in `base` and moves the keeper into its leaf; 0, or the errno. */
static int cg_join(const char *base) {
    char leaf[PATH_MAX];
    if (strlen(base) >= sizeof cg_base) return ENAMETOOLONG;
    strcpy(cg_base, base);
    if (snprintf(cg_node, sizeof cg_node, "%s/leasehold-keeper-%d", base, (int)getpid()) >=
            (int)sizeof cg_node ||
        snprintf(leaf, sizeof leaf, "%s/keeper", cg_node) >= (int)sizeof leaf) {
        cg_node[0] = 0;
        return ENAMETOOLONG;
    }
    int no = 0;
    if (mkdir(cg_node, 0755) != 0 && errno != EEXIST) no = errno;
    else if (mkdir(leaf, 0755) != 0 && errno != EEXIST) no = errno;
    else if (cg_write(leaf, "cgroup.procs", "0") != 0) no = errno;
    if (no) {
        rmdir(leaf);
        rmdir(cg_node);
        cg_node[0] = 0;
        return no;
    }
    /* The controllers of the caps, each on its own (a refusal of one is normal: not
     * delegated, not mounted on v2, or the parent holds processes). */
    static const char *const controllers[] = {"+memory", "+pids", "+cpu"};
    for (int i = 0; i < 3; i++) {
        cg_write(base, "cgroup.subtree_control", controllers[i]);
        cg_write(cg_node, "cgroup.subtree_control", controllers[i]);
    }
    return 0;
}

/* Removes a cgroup and the cgroups below it (a runner run as a job leaves its keeper's node
 * in the attempt's); 0, or -1 while a process is still in one of them. */
static int cg_rmtree(const char *dir, int depth) {
    if (rmdir(dir) == 0 || errno == ENOENT) return 0;
    if ((errno != EBUSY && errno != ENOTEMPTY) || depth > 32) return -1;
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        char sub[PATH_MAX];
        if (e->d_type != DT_DIR || e->d_name[0] == '.') continue;
        if (snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name) >= (int)sizeof sub) continue;
        cg_rmtree(sub, depth + 1);
    }
    closedir(d);
    return rmdir(dir) == 0 || errno == ENOENT ? 0 : -1;
}

/* Removes the forgotten attempts' cgroups that are empty now; gives up on one after its
 * time (a process in uninterruptible sleep), leaving it to the next runner's sweep. */
static void cg_retry(int64_t now) {
    size_t j = 0;
    for (size_t i = 0; i < cg_gone_count; i++) {
        struct gone_cgroup g = cg_gone[i];
        if (cg_rmtree(g.path, 0) == 0 || now >= g.until) {
            free(g.path);
            continue;
        }
        cg_kill(g.path);
        cg_gone[j++] = g;
    }
    cg_gone_count = j;
}

/* The attempt's cgroup, once it is forgotten: whatever is left in it is killed, and it is
 * removed (now, or once its processes are gone). */
static void cg_forget(struct attempt *a) {
    if (!a->cgroup) return;
    if (cg_populated(a->cgroup)) cg_kill(a->cgroup);
    if (cg_rmtree(a->cgroup, 0) == 0) {
        free(a->cgroup);
        a->cgroup = NULL;
        return;
    }
    if (cg_gone_count == cg_gone_room) {
        size_t more = cg_gone_room ? cg_gone_room * 2 : 16;
        struct gone_cgroup *grown = realloc(cg_gone, more * sizeof *grown);
        if (!grown) { /* no memory: left to the next runner's sweep */
            free(a->cgroup);
            a->cgroup = NULL;
            return;
        }
        cg_gone = grown;
        cg_gone_room = more;
    }
    cg_gone[cg_gone_count++] = (struct gone_cgroup){a->cgroup, now_ms(CLOCK_MONOTONIC) + 10000};
    a->cgroup = NULL;
}

/* The keeper's own leaving: back to the cgroup it was started in, its node removed. */
static void cg_leave(void) {
    if (!cg_node[0]) return;
    char leaf[PATH_MAX];
    if (snprintf(leaf, sizeof leaf, "%s/keeper", cg_node) >= (int)sizeof leaf) return;
    if (cg_write(cg_base, "cgroup.procs", "0") != 0) return;
    rmdir(leaf);
    rmdir(cg_node);
}

/* ---- Attempts ---- */

static void reap(struct attempt *a) {
    if (a->pid > 0) waitpid(a->pid, NULL, 0);
    a->pid = -1;
}

static void finish(struct attempt *a) {
    for (int i = 0; i < 2; i++) {
        if (a->s[i].pipe >= 0) close(a->s[i].pipe);
        if (a->s[i].file >= 0) close(a->s[i].file);
        free(a->s[i].mem);
    }
    if (a->control >= 0) close(a->control);
    if (a->pidfd >= 0) close(a->pidfd);
    if (a->folder >= 0) close(a->folder);
    cg_forget(a);
    free(a->req);
    free(a->out);
    a->state = DONE;
}

static struct attempt *add(int control) {
    if (count == room) {
        size_t more = room ? room * 2 : 16;
        struct attempt **grown = realloc(attempts, more * sizeof *grown);
        if (!grown) return NULL;
        attempts = grown;
        room = more;
    }
    struct attempt *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->state = REQUEST;
    a->control = control;
    a->pid = -1;
    a->pidfd = a->folder = -1;
    for (int i = 0; i < 2; i++) {
        a->s[i].pipe = a->s[i].file = -1;
        a->s[i].name = i ? "stderr" : "stdout";
        a->s[i].folder = &a->folder;
    }
    attempts[count++] = a;
    return a;
}

static void fail_start(struct attempt *a, const char *stage, int no) {
    char line[64];
    snprintf(line, sizeof line, "failed %s %d\n", stage, no);
    say_line(a, line);
    flush(a);
    reap(a);
    finish(a);
}

/* Applies `m` to the calling process; 0, or the errno of what failed. */
static int apply_manners(const struct manners *m) {
    if (m->has_nice && setpriority(PRIO_PROCESS, 0, m->nice) != 0) return errno;
    if (m->ioprio && syscall(SYS_ioprio_set, 1 /* IOPRIO_WHO_PROCESS */, 0, (int)m->ioprio) != 0)
        return errno;
    if (m->data_rlimit) {
        struct rlimit r = {m->data_rlimit, m->data_rlimit};
        if (setrlimit(RLIMIT_DATA, &r) != 0) return errno;
    }
    if (m->nproc_rlimit) {
        struct rlimit r = {m->nproc_rlimit, m->nproc_rlimit};
        if (setrlimit(RLIMIT_NPROC, &r) != 0) return errno;
    }
    return 0;
}

/* Why a child could not become its command, for the keeper: the child shares the keeper's
 * memory until its exec (vfork), so it writes here before its _exit and the keeper reads it
 * once vfork returns. `child_stage` is -1 while nothing failed. */
static volatile int child_stage = -1, child_errno;

/* The child: becomes the command, or leaves why it could not in child_stage and child_errno
 * and exits 127. It runs on the keeper's memory (vfork): it writes nothing else of it. */
static void become_command(int out, int err, int cgroup, const char *cwd, char **argv,
                           char **env, const struct manners *m) {
    int stage = 2;
    setpgid(0, 0);
    /* Into the attempt's cgroup before anything runs that could fork. */
    if (cgroup >= 0 && write(cgroup, "0", 1) != 1) goto fail;
    if ((errno = apply_manners(m)) != 0) goto fail;
    if (dup2(out, 1) < 0 || dup2(err, 2) < 0) goto fail;
    if (syscall(SYS_close_range, HUB, ~0U, 0) != 0) {
        struct rlimit rl;
        int max = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 65536 ? (int)rl.rlim_cur
                                                                             : 65536;
        for (int fd = HUB; fd < max; fd++) close(fd);
    }
    stage = 0;
    if (*cwd && chdir(cwd) != 0) goto fail;
    stage = 1;
    for (int sig = 1; sig < NSIG; sig++) signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    const char *program = argv[0];
    execve(program, argv + 1, env);
    if (errno == ENOEXEC) {
        argv[0] = "/bin/sh";
        argv[1] = (char *)program;
        execve("/bin/sh", argv, env);
    }
fail:
    child_errno = errno;
    child_stage = stage;
    _exit(127);
}

/* Starts the command's process: returns once it exec'd its command, or failed to (then
 * child_stage >= 0), or -1 where no process could be made. vfork, not fork: the keeper's
 * page tables are not copied and its pages not faulted in again after, and the start is
 * known for certain when this returns, without a round of the loop. Alone in its function
 * so that nothing of the caller's frame is live across the vfork. */
static __attribute__((noinline)) pid_t spawn_command(int out, int err, int cgroup,
                                                     const char *cwd, char **argv,
                                                     char **env, const struct manners *m) {
    child_stage = -1;
    pid_t pid = vfork();
    if (pid == 0) become_command(out, err, cgroup, cwd, argv, env, m);
    return pid;
}

/* Writes a cap into the attempt's cgroup; 0, or -1 where the controller is not there. */
static int cg_cap(const char *dir, const char *file, int64_t v) {
    char text[32];
    snprintf(text, sizeof text, "%lld", (long long)v);
    return cg_write(dir, file, text);
}

/* Parses the whole request and forks the command. */
static void start(struct attempt *a) {
    struct request r;
    if (parse_request(a->req, a->req_len, &r) != 0) { fail_start(a, "setup", EINVAL); return; }
    char **fields = r.field;
    int *has = r.has;
    int64_t *lim = r.lim; /* nice, ioprio, memory max, pids max, cpu weight */
    /* argv for become_command: [program, argv0, ..., NULL], env: [..., NULL] */
    char **argv = calloc(r.argc + 2, sizeof *argv);
    char **env = calloc(r.envc + 1, sizeof *env);
    if (!argv || !env) { free(argv); free(env); fail_start(a, "setup", ENOMEM); return; }
    request_lists(&r, argv, env);
    a->token = fields[0];
    a->dirname = fields[1];
    a->journal = fields[2];
    a->mem = r.mem < MAX_MEM ? r.mem : MAX_MEM;
    a->drain_ms = (int64_t)r.drain_ms;
    a->term_at = (int64_t)r.term_at;
    a->kill_at = (int64_t)r.kill_at;
    for (int i = 0; i < 2; i++) {
        a->s[i].cap = r.cap;
        if (a->mem == 0) a->s[i].spilled = 1;
    }
    /* The attempt's cgroup; without one (it cannot be made) it runs in its group only. */
    int cgroup = -1;
    size_t cglen = strlen(cg_node) + strlen(a->token) + 4;
    if (cg_node[0] && (a->cgroup = malloc(cglen))) {
        snprintf(a->cgroup, cglen, "%s/a-%s", cg_node, a->token);
        char procs[PATH_MAX];
        if ((mkdir(a->cgroup, 0755) == 0 || errno == EEXIST) &&
            snprintf(procs, sizeof procs, "%s/cgroup.procs", a->cgroup) < (int)sizeof procs)
            cgroup = open(procs, O_WRONLY | O_CLOEXEC);
        if (cgroup < 0) {
            rmdir(a->cgroup);
            free(a->cgroup);
            a->cgroup = NULL;
        }
    }
    /* Caps: into the cgroup where its controller is, else the child's rlimits. */
    struct manners m = {has[0], (int)lim[0], has[1] ? (unsigned)lim[1] : 0, 0, 0};
    if (has[2]) {
        if (a->cgroup && cg_cap(a->cgroup, "memory.max", lim[2]) == 0) {
            cg_write(a->cgroup, "memory.swap.max", "0"); /* none where there is no swap */
            cg_write(a->cgroup, "memory.oom.group", "1");
        } else {
            m.data_rlimit = (uint64_t)lim[2];
        }
    }
    if (has[3] && !(a->cgroup && cg_cap(a->cgroup, "pids.max", lim[3]) == 0))
        m.nproc_rlimit = (uint64_t)lim[3];
    if (has[4] && a->cgroup) cg_cap(a->cgroup, "cpu.weight", lim[4]); /* no stand-in */
    int ends[2][2] = {{-1, -1}, {-1, -1}};
    int ok = pipe2(ends[0], O_CLOEXEC) == 0 && pipe2(ends[1], O_CLOEXEC) == 0;
    pid_t pid = ok ? spawn_command(ends[0][1], ends[1][1], cgroup, fields[13], argv, env, &m)
                   : -1;
    int no = errno;
    if (cgroup >= 0) close(cgroup);
    free(argv);
    free(env);
    for (int i = 0; i < 2; i++) if (ends[i][1] >= 0) close(ends[i][1]);
    if (pid < 0) {
        for (int i = 0; i < 2; i++) if (ends[i][0] >= 0) close(ends[i][0]);
        fail_start(a, "setup", no);
        return;
    }
    a->pid = pid;
    for (int i = 0; i < 2; i++) a->s[i].pipe = ends[i][0];
    if (child_stage >= 0) {
        fail_start(a, child_stage == 0 ? "chdir" : child_stage == 1 ? "exec" : "setup",
                   child_errno);
        return;
    }
    /* The child made its group before its exec, which vfork waited for. */
    for (int i = 0; i < 2; i++) fcntl(a->s[i].pipe, F_SETFL, O_NONBLOCK);
    a->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    a->started_mono = now_ms(CLOCK_MONOTONIC);
    a->state = RUNNING;
    char line[64];
    snprintf(line, sizeof line, "started %d\n", (int)pid);
    say_line(a, line);
}

/* Reads the request's bytes from the control socket. */
static void read_request(struct attempt *a) {
    for (;;) {
        ssize_t r;
        if (a->len_have < 4) {
            r = recv(a->control, a->lenbuf + a->len_have, (size_t)(4 - a->len_have), MSG_DONTWAIT);
        } else {
            r = recv(a->control, a->req + a->req_have, a->req_len - a->req_have, MSG_DONTWAIT);
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EAGAIN) return;
        if (r <= 0) { finish(a); return; } /* the runner went before its request was whole */
        if (a->len_have < 4) {
            a->len_have += (int)r;
            if (a->len_have < 4) continue;
            a->req_len = (uint32_t)a->lenbuf[0] | (uint32_t)a->lenbuf[1] << 8 |
                         (uint32_t)a->lenbuf[2] << 16 | (uint32_t)a->lenbuf[3] << 24;
            if (a->req_len == 0 || a->req_len > MAX_REQUEST ||
                !(a->req = malloc(a->req_len))) {
                fail_start(a, "setup", a->req_len > MAX_REQUEST ? E2BIG : EINVAL);
                return;
            }
        } else {
            a->req_have += (uint32_t)r;
        }
        if (a->len_have == 4 && a->req_have == a->req_len) { start(a); return; }
    }
}

/* The runner's end went without a release: it is gone. */
static void runner_gone(struct attempt *a) {
    if (a->control >= 0) close(a->control);
    a->control = -1;
    if (a->released) return;
    a->gone = 1;
    spill(a);
    if (!a->exited) {
        char text[256];
        snprintf(text, sizeof text, "kept %s %d", a->token, (int)a->pid);
        journal(a, text, 0); /* a hint for whoever looks for the attempt's keeper */
    }
}

/* Reads `release`, or the EOF of a runner that is gone. */
static void read_control(struct attempt *a) {
    char got[64];
    for (;;) {
        ssize_t r = recv(a->control, got, sizeof got, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EAGAIN) return;
        if (r <= 0) { runner_gone(a); return; }
        /* The only line a runner sends; it counts only once the end was reported. */
        if (control_release(&a->said, got, (size_t)r) && a->reported) a->released = 1;
        if (a->released) {
            close(a->control);
            a->control = -1;
            return;
        }
    }
}

/* Reads DIR/lease, which an adopting runner writes; 1 when it holds a whole line. */
static int read_lease_file(struct attempt *a, int64_t *term_at, int64_t *kill_at) {
    /* A quiet command's folder is not the keeper's to make: the adopter makes it. */
    char path[PATH_MAX];
    if (a->folder < 0 && snprintf(path, sizeof path, "%s/lease", a->dirname) >= (int)sizeof path)
        return 0;
    int fd = a->folder >= 0 ? openat(a->folder, "lease", O_RDONLY | O_CLOEXEC)
                            : open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char text[80];
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    close(fd);
    if (n < 0) return 0;
    text[n] = 0;
    return parse_lease_file(text, (size_t)n, term_at, kill_at);
}

/* The fence applies while the attempt is held, whatever its leader did: a leader that
 * ended by itself before the fence began keeps its outcome, but whatever outlives it in the
 * group (leftovers holding the pipes, a runner frozen before its release) is still killed
 * at KILL_AT. */
static void fence(struct attempt *a, int64_t now) {
    if (a->state != RUNNING || a->released || a->fenced == 2) return;
    if (a->gone && !a->fenced && now - a->lease_checked >= FENCE_CHECK_MS) {
        a->lease_checked = now;
        int64_t t, k;
        if (read_lease_file(a, &t, &k) && k > a->kill_at) { a->term_at = t; a->kill_at = k; }
    }
    if (!a->kill_at) return;
    int64_t boot = now_ms(CLOCK_BOOTTIME);
    if (boot >= a->kill_at && a->fenced < 2) {
        kill(-a->pid, SIGKILL);
        if (a->cgroup) cg_kill(a->cgroup);
        a->lost = a->lost || !a->exited;
        a->fenced = 2;
    } else if (boot >= a->term_at && a->fenced < 1) {
        kill(-a->pid, SIGTERM);
        if (a->cgroup) cg_signal(a->cgroup, SIGTERM);
        a->lost = a->lost || !a->exited;
        a->fenced = 1;
    }
}

static void check_exit(struct attempt *a) {
    if (a->state != RUNNING || a->exited) return;
    siginfo_t info = {0};
    if (waitid(P_PID, (id_t)a->pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == a->pid) {
        a->exited = 1;
        a->status = info.si_code == CLD_EXITED ? (info.si_status & 0xff) << 8
                                               : (info.si_status & 0x7f);
        a->ended_at = now_ms(CLOCK_REALTIME);
        a->deadline = now_ms(CLOCK_MONOTONIC) + a->drain_ms;
    }
}

/* Whether a journal line that could not be written is given up: its folder is gone (the
 * database's attempts folder removed) and has stayed gone for JOURNAL_GONE_MS. The attempt is
 * then forgotten unrecorded, as if its keeper had died: whoever reclaims it finds it lost.
 * Any other failure (a full disk) is retried for as long as it lasts. */
static int journal_gone(struct attempt *a, int64_t now) {
    if (errno != ENOENT) {
        a->gone_since = 0;
        return 0;
    }
    if (!a->gone_since) a->gone_since = now;
    return now - a->gone_since >= JOURNAL_GONE_MS;
}

static int reap_orphans(void);

/* Steps the attempt on as far as it can go now. */
static void step(struct attempt *a, int64_t now) {
    if (a->state != RUNNING) return;
    fence(a, now);
    if (a->exited && a->lost && a->fenced == 2) {
        /* Stopped by the fence: no outcome, no `exited`: the attempt is lost. */
        if (a->gone && !a->journaled) {
            char text[256];
            snprintf(text, sizeof text, "fenced %s", a->token);
            if (journal(a, text, 1) != 0 && !journal_gone(a, now)) return; /* next turn */
            a->journaled = 1;
        }
        reap(a);
        finish(a);
        return;
    }
    int pipes = (a->s[0].pipe >= 0) + (a->s[1].pipe >= 0);
    if (!a->exited && !a->gone && now - a->started_mono >= SPILL_AFTER_MS &&
        (a->s[0].mlen || a->s[1].mlen))
        spill(a); /* a running job's output, where `jobs logs --follow` reads it */
    if (a->exited && !a->lost && !a->reported && (pipes == 0 || now >= a->deadline)) {
        int left = pipes > 0 || (a->cgroup && cg_populated(a->cgroup));
        if (left && a->gone && !a->open_at_deadline) {
            /* Leftovers hold the pipes (or the cgroup) and no runner will kill them: the
             * group goes (its leader is unreaped, so the id is still the command's), the
             * cgroup too, then the pipes get one more second. */
            kill(-a->pid, SIGKILL);
            if (a->cgroup) cg_kill(a->cgroup);
            a->open_at_deadline = 1;
            a->deadline = now + 1000;
            return;
        }
        a->open_at_deadline = left;
        a->reported = 1;
        int sig = !WIFEXITED(a->status);
        int n = sig ? WTERMSIG(a->status) : WEXITSTATUS(a->status);
        if (!a->gone) {
            /* OPEN: 1 leftovers, 2 none for certain, 0 the runner looks. Every live
             * descendant of a command whose main process ended is a child of the keeper's
             * (their subreaper) or below one: none left, nothing of the attempt outlives
             * it, and the runner need not look through /proc for its group's members. */
            int open = left ? 1 : reap_orphans() == 0 ? 2 : 0;
            char line[128];
            int in_mem = !a->s[0].spilled && !a->s[1].spilled;
            if (in_mem) {
                snprintf(line, sizeof line, "exited %s %d %d mem %llu %llu\n",
                         sig ? "signal" : "exit", n, open,
                         (unsigned long long)a->s[0].mlen, (unsigned long long)a->s[1].mlen);
                say_line(a, line);
                say(a, a->s[0].mem ? a->s[0].mem : "", a->s[0].mlen);
                say(a, a->s[1].mem ? a->s[1].mem : "", a->s[1].mlen);
            } else {
                spill(a);
                snprintf(line, sizeof line, "exited %s %d %d files 0 0\n",
                         sig ? "signal" : "exit", n, open);
                say_line(a, line);
            }
            flush(a);
        }
    }
    if (a->reported && (a->released || a->gone)) {
        /* Pipes still open once released: leftovers the runner did not kill; they go. */
        int open = a->s[0].pipe >= 0 || a->s[1].pipe >= 0;
        for (int i = 0; i < 2; i++)
            if (a->s[i].pipe >= 0) { close(a->s[i].pipe); a->s[i].pipe = -1; }
        if (a->gone && !a->journaled) {
            /* The outcome is the record: on disk before the command is reaped and the
             * attempt forgotten. Retried every second while it cannot be written. */
            if (now < a->retry_at) return;
            spill(a);
            char text[256];
            snprintf(text, sizeof text, "outcome %s %s %d %lld", a->token,
                     WIFEXITED(a->status) ? "exit" : "signal",
                     WIFEXITED(a->status) ? WEXITSTATUS(a->status) : WTERMSIG(a->status),
                     (long long)a->ended_at);
            if (journal(a, text, 1) != 0 && !journal_gone(a, now)) {
                a->retry_at = now + 1000;
                return;
            }
            a->journaled = 1;
        }
        if (open) kill(-a->pid, SIGKILL);
        reap(a);
        finish(a); /* and whatever is left in the attempt's cgroup is killed */
    }
}

/* The hub's datagrams: a new attempt's socket, or a lease. */
static void read_hub(void) {
    for (;;) {
        char text[512];
        union { struct cmsghdr h; char space[CMSG_SPACE(sizeof(int))]; } ctl;
        struct iovec iov = {text, sizeof text - 1};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.space,
                             .msg_controllen = sizeof ctl.space};
        ssize_t r = recvmsg(HUB, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EAGAIN) return;
        if (r <= 0) { hub_open = 0; return; }
        text[r] = 0;
        int fd = -1;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
                c->cmsg_len == CMSG_LEN(sizeof(int)))
                memcpy(&fd, CMSG_DATA(c), sizeof fd);
        struct lease_msg l;
        int kind = parse_hub(text, (size_t)r, &l);
        if (kind == HUB_ATTEMPT && fd >= 0) {
            if (!add(fd)) close(fd); /* no memory: the runner sees EOF and gives the job back */
            continue;
        }
        if (fd >= 0) close(fd);
        if (kind == HUB_LEASE) {
            for (size_t i = 0; i < count; i++) {
                struct attempt *a = attempts[i];
                if (a->state == DONE || !a->token || strcmp(a->token, l.token) != 0) continue;
                if (a->disarmed || a->fenced) break;
                if (l.term_at == 0 && l.kill_at == 0) a->disarmed = 1;
                a->term_at = l.term_at;
                a->kill_at = l.kill_at;
                break;
            }
        }
    }
}

/* Reaps every child that is not a command held for its attempt: descendants re-parented to
 * the keeper as their subreaper, once they exit. Returns how many such children are left
 * alive (or could not be listed: then 1). */
static int reap_orphans(void) {
    static char list[65536];
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)getpid());
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 1;
    ssize_t n = read(fd, list, sizeof list - 1);
    close(fd);
    if (n < 0) return 1;
    list[n] = 0;
    int alive = 0;
    for (char *p = list; *p;) {
        char *end;
        long pid = strtol(p, &end, 10);
        if (end == p) break;
        p = end;
        while (*p == ' ' || *p == '\n') p++;
        int held = 0;
        for (size_t i = 0; i < count && !held; i++) held = attempts[i]->pid == (pid_t)pid;
        if (!held && waitpid((pid_t)pid, NULL, WNOHANG) == 0) alive++;
    }
    return alive;
}

static void compact(void) {
    size_t j = 0;
    for (size_t i = 0; i < count; i++) {
        if (attempts[i]->state == DONE) free(attempts[i]);
        else attempts[j++] = attempts[i];
    }
    count = j;
}

static int serve(const char *cgroup_base) {
    prctl(PR_SET_NAME, "lh-keeper", 0, 0, 0);
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    signal(SIGPIPE, SIG_IGN);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    int sigfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
    char ready[64] = "ready";
    if (cgroup_base) {
        int no = cg_join(cgroup_base);
        if (no) snprintf(ready, sizeof ready, "ready groups %d", no);
        else snprintf(ready, sizeof ready, "ready cgroup");
    }
    if (send(HUB, ready, strlen(ready), MSG_NOSIGNAL) < 0) return 2;

    struct pollfd *fds = NULL;
    struct attempt **owner = NULL;
    size_t fds_room = 0;
    for (;;) {
        int64_t now = now_ms(CLOCK_MONOTONIC);
        for (size_t i = 0; i < count; i++) step(attempts[i], now);
        compact();
        cg_retry(now);
        if (!hub_open && count == 0 && cg_gone_count == 0) {
            cg_leave();
            return 0;
        }

        size_t want = 2 + count * 5;
        if (want > fds_room) {
            struct pollfd *f = realloc(fds, want * sizeof *f);
            struct attempt **o = realloc(owner, want * sizeof *o);
            if (f) fds = f;
            if (o) owner = o;
            if (!f || !o) { usleep(50 * 1000); continue; }
            fds_room = want;
        }
        size_t n = 0;
        int timeout = cg_gone_count ? FENCE_CHECK_MS : -1;
        if (hub_open) { fds[n] = (struct pollfd){.fd = HUB, .events = POLLIN}; owner[n++] = NULL; }
        if (sigfd >= 0) { fds[n] = (struct pollfd){.fd = sigfd, .events = POLLIN}; owner[n++] = NULL; }
        for (size_t i = 0; i < count; i++) {
            struct attempt *a = attempts[i];
            if (a->control >= 0) {
                short ev = POLLIN | (a->out_off < a->out_len ? POLLOUT : 0);
                fds[n] = (struct pollfd){.fd = a->control, .events = ev};
                owner[n++] = a;
            }
            for (int s = 0; s < 2; s++)
                if (a->s[s].pipe >= 0) { fds[n] = (struct pollfd){.fd = a->s[s].pipe, .events = POLLIN}; owner[n++] = a; }
            if (a->state == RUNNING && !a->exited && a->pidfd >= 0) {
                fds[n] = (struct pollfd){.fd = a->pidfd, .events = POLLIN};
                owner[n++] = a;
            }
            int wait = -1;
            if (a->state == RUNNING && !a->exited && a->pidfd < 0) wait = 50;
            if (a->state == RUNNING && (a->kill_at || a->gone) && a->fenced < 2)
                wait = FENCE_CHECK_MS;
            if (a->state == RUNNING && !a->exited && !a->gone && (a->s[0].mlen || a->s[1].mlen)) {
                int64_t due = a->started_mono + SPILL_AFTER_MS - now;
                int d = due > 0 ? (int)due : 0;
                if (wait < 0 || d < wait) wait = d;
            }
            if (a->exited && !a->reported && !a->lost) {
                int d = a->deadline > now ? (int)(a->deadline - now) : 0;
                if (wait < 0 || d < wait) wait = d;
            }
            if (a->gone && a->reported && !a->journaled) {
                int d = a->retry_at > now ? (int)(a->retry_at - now) : 0;
                if (wait < 0 || d < wait) wait = d;
            }
            if (wait >= 0 && (timeout < 0 || wait < timeout)) timeout = wait;
        }
        if (poll(fds, (nfds_t)n, timeout) < 0 && errno != EINTR) usleep(50 * 1000);

        if (sigfd >= 0) {
            struct signalfd_siginfo info;
            int any = 0;
            while (read(sigfd, &info, sizeof info) == (ssize_t)sizeof info) any = 1;
            if (any) (void)reap_orphans();
        }
        /* Each attempt in turn; new ones from the hub after (they have no fds polled yet). */
        size_t known = count;
        for (size_t i = 0; i < known; i++) {
            struct attempt *a = attempts[i];
            if (a->state == DONE) continue;
            if (a->state == REQUEST) { read_request(a); continue; }
            for (int s = 0; s < 2; s++) if (a->s[s].pipe >= 0) pump(a, &a->s[s]);
            if (a->control >= 0) {
                flush(a);
                read_control(a);
            }
            check_exit(a);
        }
        if (hub_open) read_hub();
    }
}

/* `exec NICE IOPRIO MEM PIDS PROGRAM ARGV...`: see the top of this file. */
static int exec_with_manners(int argc, char **argv) {
    struct manners m;
    if (parse_exec(argc, argv, &m) != 0) return 2;
    const char *program = argv[6];
    int no = apply_manners(&m);
    if (no == 0) {
        execv(program, argv + 7);
        no = errno;
        if (no == ENOEXEC) {
            argv[6] = "/bin/sh";
            argv[7] = (char *)program;
            execv("/bin/sh", argv + 6);
            no = errno;
        }
    }
    char line[PATH_MAX + 128];
    int n = snprintf(line, sizeof line, "leasehold: cannot start %s with its manners: %s\n",
                     program, strerror(no));
    if (n > 0 && write(2, line, (size_t)n) < 0) { /* nothing else can say it */ }
    return 127;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "exec") == 0) return exec_with_manners(argc, argv);
    if (fcntl(HUB, F_GETFD) < 0) return 2; /* not started by a runner */
    if (argc == 2 && strcmp(argv[1], "serve") == 0) return serve(NULL);
    if (argc == 3 && strcmp(argv[1], "serve") == 0 && argv[2][0] == '/') return serve(argv[2]);
    return 2;
}
