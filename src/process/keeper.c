/*
 * leasehold-keeper: the parent of one attempt's command, which outlives the runner.
 *
 *   leasehold-keeper TOKEN ATTEMPT_DIR CAP_BYTES DRAIN_MS CWD PROGRAM ARGV0 ARGS...
 *   leasehold-keeper probe             says "ready" on fd 3 and exits 0 (a runner's start)
 *
 * fd 3 is a stream socket to the runner ("control"); 0, 1 and 2 are /dev/null. The
 * environment is the command's, without LEASEHOLD_RUN_TOKEN: only the command gets
 * LEASEHOLD_RUN_TOKEN=TOKEN, so a scan of /proc/PID/environ for the token never finds (or
 * kills) the keeper. The runner spawns it in a session of its own; the command gets a
 * process group of its own, so neither a signal to the runner's group nor a teardown of the
 * command's group reaches the keeper.
 *
 * The keeper copies the command's stdout and stderr into ATTEMPT_DIR/stdout and /stderr,
 * capped as src/files.rs describes (each file is created at its stream's first byte: a silent
 * command's attempt has no stream files, which readers take as empty), waits for the command without reaping it (its pid and
 * group id stay reserved while anyone may signal the group), writes ATTEMPT_DIR/outcome
 * atomically (outcome.tmp renamed) and tells the runner on fd 3, one line per message:
 *
 *   started <pid>                      the command runs
 *   failed <chdir|exec|setup> <errno>  it could not start; the keeper exits 127
 *   exited exit <code> <open>          it ended (open: 1 if a pipe was still open at the
 *   exited signal <n> <open>           drain deadline, so the runner kills the leftovers)
 *
 * The runner sends one line, `release`, once it has taken the ending from `exited`, and then
 * closes its end of fd 3. The keeper then reaps the command and exits with its status (128+n
 * for signal n).
 *
 * What is durable when. With a runner connected when the command ends, the outcome is
 * written and renamed into place with no fsync, and `exited` is said at once: the runner's own
 * durable commit of the ending is the record. On a release the keeper exits without ever
 * fsyncing it (a crash of the runner's process loses no page cache, so a successor still
 * reads the outcome; an OS crash or power loss before the runner's commit loses the outcome,
 * and the attempt runs again, as one without a keeper would). On an EOF of fd 3 without a
 * release (the runner died, left with `--on-exit leave`, or dropped its end), the outcome is
 * the record: the keeper fsyncs the file, then the folder, and only then exits. With no
 * runner connected when the command ends, it writes the outcome durably at once (fsync,
 * rename, fsync of the folder). Either way a keeper that is gone without a release has its
 * outcome on disk, which recovery relies on when it checks the keeper before the outcome. An
 * outcome that cannot be written (a full disk) is retried every second until it is on disk,
 * unless the runner released the command.
 *
 * The lease fence. While ATTEMPT_DIR/lease exists (a runner on a PostgreSQL database writes
 * it before the keeper starts and after each renewal; src/files.rs `write_lease`), it says by
 * this host's boot clock when the lease runs out unrenewed: "TERM_AT KILL_AT CHECK\n", 20
 * digits each, CHECK = TERM_AT ^ KILL_AT (a line read while it was being rewritten fails the
 * check and is read again next time). Past TERM_AT the keeper sends SIGTERM to the command's
 * group, past KILL_AT SIGKILL, whatever the leader did meanwhile: a leader that died of the
 * SIGTERM stays unreaped until then, so the group id is still the command's and members that
 * ignore SIGTERM are killed too. Once begun, the fence keeps the times that began it. So a
 * runner frozen, or cut off from the database, has its attempt stopped before its lease runs
 * out and another host's runner may claim the job again. A
 * fenced attempt has no outcome: the keeper reaps the command and exits 3 without writing
 * one or saying `exited`, so whoever looks finds the attempt lost, not failed. A runner that
 * leaves its attempts running on purpose removes the file, and no fence applies.
 */
#define _GNU_SOURCE
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
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif

#define CONTROL 3
/* The one line a runner sends on fd 3: it has taken the ending from `exited`. */
#define RELEASE "release\n"
/* The marker line of dropped bytes, as src/files.rs spells it: prefix, count right-aligned
 * in 20 columns, suffix. 13 + 20 + 16 bytes. */
#define MARK_PREFIX "\n[leasehold: "
#define MARK_SUFFIX " bytes dropped]\n"
#define MARK_WIDTH 20
#define MARK_LEN (sizeof MARK_PREFIX - 1 + MARK_WIDTH + sizeof MARK_SUFFIX - 1)
#define HALF (32 * 1024)

/* The one buffer: pipe reads go to the first half, moves of a file's tail use the second. */
static char buffer[2 * HALF];
static char *const rbuf = buffer;
static char *const mbuf = buffer + HALF;

/* One output stream: its pipe, its file and where the cap stands. */
struct stream {
    int pipe;          /* read end, -1 at EOF */
    const char *name;  /* the file's name in ATTEMPT_DIR */
    int file;          /* the file, -1 until the first byte (or while it cannot be made) */
    uint64_t len;      /* the file's length as written */
    uint64_t head;     /* where the marker is (the end of the kept beginning) */
    int marked;        /* the marker line is in the file */
    uint64_t dropped;  /* bytes not in the file, the marker's count */
};

static uint64_t cap;   /* per stream; 0 = no cap */
static int folder = -1; /* ATTEMPT_DIR, where the streams' files are made */

/* Reads ATTEMPT_DIR/lease into term_at and kill_at; 0 when the file is missing or the line
 * was not whole (then the values are left as they were). */
static int read_lease(int dir, int64_t *term_at, int64_t *kill_at) {
    int fd = openat(dir, "lease", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char text[80];
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    close(fd);
    if (n < 62) return 0;
    text[n] = 0;
    unsigned long long t, k, c;
    if (sscanf(text, "%llu %llu %llu", &t, &k, &c) != 3 || (t ^ k) != c) return 0;
    *term_at = (int64_t)t;
    *kill_at = (int64_t)k;
    return 1;
}

static int64_t now_ms(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Writes all of `n` bytes at `off`; returns how many were written (short on an error). */
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

/* Sends a protocol line to the runner; a runner that is gone is noticed by the next read. */
static void say(int *control, const char *line) {
    if (*control < 0) return;
    size_t n = strlen(line), done = 0;
    while (done < n) {
        ssize_t w = send(*control, line + done, n - done, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        done += (size_t)w;
    }
}

/* (Re)writes the marker at `s->head` with the current count; 0 on success. Writing it in
 * place never grows the file once it is there, so a full disk rarely stops it. */
static int write_marker(struct stream *s) {
    char line[MARK_LEN + 1];
    snprintf(line, sizeof line, "%s%*llu%s", MARK_PREFIX, MARK_WIDTH,
             (unsigned long long)s->dropped, MARK_SUFFIX);
    return pwrite_all(s->file, line, MARK_LEN, s->head) == MARK_LEN ? 0 : -1;
}

/* Puts the marker in at `at`; the bytes it covers are dropped. */
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

/* Appends bytes at the file's end; what cannot be written is dropped and marked. */
static void append(struct stream *s, const char *p, uint64_t n) {
    uint64_t w = pwrite_all(s->file, p, n, s->len);
    s->len += w;
    if (w == n) return;
    s->dropped += n - w;
    if (s->marked) {
        write_marker(s);
    } else if (cap && s->len > cap / 2) {
        place_marker(s, cap / 2);
    } else {
        /* Over the newest bytes, so that it needs no room past the file's end (a full disk
         * is the likely reason the write failed). */
        place_marker(s, s->len >= MARK_LEN ? s->len - MARK_LEN : 0);
    }
}

/* Keeps only the newest `keep` bytes of the tail, moved back to just after the marker. */
static void move_tail(struct stream *s, uint64_t keep) {
    uint64_t start = s->head + MARK_LEN, from = s->len - keep, done = 0;
    s->dropped += from - start;
    while (done < keep) {
        uint64_t n = keep - done < HALF ? keep - done : HALF;
        ssize_t r = pread(s->file, mbuf, n, (off_t)(from + done));
        if (r <= 0 || pwrite_all(s->file, mbuf, (uint64_t)r, start + done) != (uint64_t)r) {
            s->dropped += keep - done; /* the rest is lost; the file ends where it stopped */
            break;
        }
        done += (uint64_t)r;
    }
    s->len = start + done;
    if (ftruncate(s->file, (off_t)s->len) != 0) { /* the stale end is overwritten later */ }
}

/* Makes the stream's file at its first byte, so that a silent stream costs no file (on ext4
 * each create is a journaled metadata write). 0 once it is open. Bytes that came while it
 * could not be made (a full disk, no descriptors) are dropped, and the marker line at its
 * start counts them once it can. */
static int make_file(struct stream *s) {
    if (s->file >= 0) return 0;
    s->file = openat(folder, s->name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (s->file < 0) return -1;
    if (s->dropped) place_marker(s, 0); /* in an empty file it covers no bytes */
    return 0;
}

/* Copies `n` fresh bytes of output into the stream's file, enforcing the cap. */
static void store(struct stream *s, const char *p, uint64_t n) {
    if (make_file(s) != 0) {
        s->dropped += n;
        return;
    }
    if (!s->marked && cap && s->len + n > cap) {
        /* Over the cap: keep the beginning whole, then put the marker in. */
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
        /* The chunk alone fills the tail: all that was there goes, and its own start. */
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

/* Reads what the pipe has; at EOF (or an error) closes it. */
static void pump(struct stream *s) {
    for (int turn = 0; turn < 16; turn++) { /* then the other fds get their turn */
        ssize_t r = read(s->pipe, rbuf, HALF);
        if (r > 0) { store(s, rbuf, (uint64_t)r); continue; }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EAGAIN) return;
        close(s->pipe);
        s->pipe = -1;
        return;
    }
}

/* Writes the outcome: outcome.tmp, renamed to outcome. With `durable`, the file is fsynced
 * before the rename and the folder after it, and closed. Without, nothing is fsynced and the
 * file stays open in *file, for sync_outcome should the runner go without a release. 0 on
 * success. */
static int write_outcome(int dir, const char *token, int status, int64_t ended_at, int durable,
                         int *file) {
    char text[4096];
    int n = snprintf(text, sizeof text, "leasehold-outcome 1\ntoken=%s\n%s=%d\nended_at=%lld\n",
                     token, WIFEXITED(status) ? "exit" : "signal",
                     WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                     (long long)ended_at);
    if (n < 0 || (size_t)n >= sizeof text) return -1;
    int fd = openat(dir, "outcome.tmp", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    int ok = pwrite_all(fd, text, (uint64_t)n, 0) == (uint64_t)n && (!durable || fsync(fd) == 0);
    if (ok && renameat(dir, "outcome.tmp", dir, "outcome") == 0) {
        if (!durable) {
            *file = fd;
            return 0;
        }
        return close(fd) == 0 && fsync(dir) == 0 ? 0 : -1;
    }
    close(fd);
    return -1;
}

/* Makes an outcome written without fsyncs durable: the file (open in *file, closed here), then
 * the folder that names it. 0 on success; on a failure the caller writes it again, durably. */
static int sync_outcome(int dir, int *file) {
    int ok = fsync(*file) == 0;
    ok = close(*file) == 0 && ok;
    *file = -1;
    return ok && fsync(dir) == 0 ? 0 : -1;
}

/* The child: becomes the command, or reports why it could not on `report` and exits 127. */
static void become_command(int out, int err, int report, const char *cwd, char **argv,
                           char **envp, const char *token) {
    int stage = 2, no; /* setup, then 0 chdir, then 1 exec */
    setpgid(0, 0);
    if (dup2(out, 1) < 0 || dup2(err, 2) < 0 || dup3(report, CONTROL, O_CLOEXEC) < 0) goto fail;
    report = CONTROL;
    stage = 0;
    if (syscall(SYS_close_range, CONTROL + 1, ~0U, 0) != 0) {
        struct rlimit rl;
        int max = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 65536 ? (int)rl.rlim_cur
                                                                             : 65536;
        for (int fd = CONTROL + 1; fd < max; fd++) close(fd);
    }
    if (*cwd && chdir(cwd) != 0) goto fail;
    stage = 1;
    /* Nothing of the keeper's signal state passes on: default actions, an empty mask. */
    for (int sig = 1; sig < NSIG; sig++) signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* The environment plus the token; this copy of the keeper's memory is the child's. */
    size_t count = 0;
    while (envp[count]) count++;
    char **env = malloc((count + 2) * sizeof *env);
    char *entry = malloc(strlen(token) + sizeof "LEASEHOLD_RUN_TOKEN=");
    if (!env || !entry) { errno = ENOMEM; goto fail; }
    memcpy(env, envp, count * sizeof *env);
    strcpy(entry, "LEASEHOLD_RUN_TOKEN=");
    strcat(entry, token);
    env[count] = entry;
    env[count + 1] = NULL;
    const char *program = argv[0];
    execve(program, argv + 1, env);
    if (errno == ENOEXEC) {
        /* No #! line: what execvp does, /bin/sh PROGRAM ARGS... (argv[1], the command's
         * argv0, gives way to the program's path). */
        argv[0] = "/bin/sh";
        argv[1] = (char *)program;
        execve("/bin/sh", argv, env);
    }
fail:
    no = errno;
    int msg[2] = {stage, no};
    if (write(report, msg, sizeof msg) < 0) { /* the keeper then sees a plain exit 127 */ }
    _exit(127);
}

/* Reports a failure before the command started and exits 127. */
static void fail(int *control, const char *stage, int no) {
    char line[64];
    snprintf(line, sizeof line, "failed %s %d\n", stage, no);
    say(control, line);
    _exit(127);
}

int main(int argc, char **argv, char **envp) {
    /* The runner's check at its start that a keeper can be exec'ed at all, and speaks. */
    if (argc == 2 && strcmp(argv[1], "probe") == 0 && fcntl(CONTROL, F_GETFD) >= 0) {
        static const char ready[] = "ready\n";
        return write(CONTROL, ready, sizeof ready - 1) == (ssize_t)(sizeof ready - 1) ? 0 : 2;
    }
    if (argc < 8 || fcntl(CONTROL, F_GETFD) < 0) return 2; /* not started by a runner */
    const char *token = argv[1], *dirname = argv[2], *cwd = argv[5];
    cap = strtoull(argv[3], NULL, 10);
    int64_t drain_ms = strtoll(argv[4], NULL, 10);
    int control = CONTROL;
    signal(SIGPIPE, SIG_IGN);
    /* Started from memory, its name would be the descriptor's number: name it for ps and top. */
    prctl(PR_SET_NAME, "lh-keeper", 0, 0, 0);

    int dir = open(dirname, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) fail(&control, "setup", errno);
    folder = dir;
    struct stream s[2] = {{.pipe = -1, .name = "stdout", .file = -1},
                          {.pipe = -1, .name = "stderr", .file = -1}};
    int ends[2][2], report[2];
    for (int i = 0; i < 2; i++) {
        if (pipe2(ends[i], O_CLOEXEC) != 0) fail(&control, "setup", errno);
        s[i].pipe = ends[i][0];
        fcntl(s[i].pipe, F_SETFL, O_NONBLOCK);
    }
    if (pipe2(report, O_CLOEXEC) != 0) fail(&control, "setup", errno);

    pid_t pid = fork();
    if (pid < 0) fail(&control, "setup", errno);
    if (pid == 0)
        become_command(ends[0][1], ends[1][1], report[1], cwd, argv + 6, envp, token);
    setpgid(pid, pid); /* also here, so the group exists before anyone signals it */
    close(ends[0][1]);
    close(ends[1][1]);
    close(report[1]);
    int msg[2];
    ssize_t got;
    while ((got = read(report[0], msg, sizeof msg)) < 0 && errno == EINTR) {}
    close(report[0]);
    if (got == (ssize_t)sizeof msg) {
        waitpid(pid, NULL, 0);
        fail(&control, msg[0] == 0 ? "chdir" : msg[0] == 1 ? "exec" : "setup", msg[1]);
    }
    char line[96];
    snprintf(line, sizeof line, "started %d\n", (int)pid);
    say(&control, line);

    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    int exited = 0, status = 0, open_at_deadline = 0, reported = 0;
    /* The outcome is in place (written), and on disk (durable); `outcome` is its file while
     * it is in place but not yet durable. */
    int written = 0, durable = 0, outcome = -1;
    /* The runner released the command after the end was reported; `heard` counts the bytes
     * of that line read so far. */
    int released = 0;
    size_t heard = 0;
    int64_t ended_at = 0, deadline = 0, retry_at = 0;
    /* The lease fence: the lease's times as last read, and how far the fence went (0: not,
     * 1: SIGTERM sent, 2: SIGKILL sent). */
    int64_t term_at = 0, kill_at = 0, lease_checked = 0;
    int fenced = 0, fence = 0;
    for (;;) {
        int64_t now = now_ms(CLOCK_MONOTONIC);
        if ((!exited || fenced == 1) && now - lease_checked >= 100) {
            lease_checked = now;
            /* Once the fence has begun, the times that began it stand: the attempt is lost
             * whatever a later renewal says, and its group gets its SIGKILL at KILL_AT even
             * when the leader died of the SIGTERM (members that ignore it live on). */
            int leased = fenced || read_lease(dir, &term_at, &kill_at);
            fence = fence || leased; /* a file seen once: a fence applies while it stays */
            if (leased) {
                int64_t boot = now_ms(CLOCK_BOOTTIME);
                if (boot >= kill_at && fenced < 2) {
                    kill(-pid, SIGKILL);
                    fenced = 2;
                } else if (boot >= term_at && fenced < 1) {
                    kill(-pid, SIGTERM);
                    fenced = 1;
                }
            } else if (fence && faccessat(dir, "lease", F_OK, 0) != 0 && errno == ENOENT) {
                fence = 0; /* removed: the runner left the attempt running on purpose */
            }
        }
        if (exited && fenced == 2) {
            /* Stopped by the fence: no outcome, no `exited`: the attempt is lost. The leader
             * was held unreaped until the group's SIGKILL, so the group id was still its. */
            waitpid(pid, NULL, 0);
            return 3;
        }
        int pipes = (s[0].pipe >= 0) + (s[1].pipe >= 0);
        if (exited && !fenced && !reported && (pipes == 0 || now >= deadline)) {
            if (pipes && control < 0 && !open_at_deadline) {
                /* Leftovers hold the pipes and no runner will kill them: the group goes
                 * (its leader is unreaped, so the id is still the command's), then the pipes
                 * get one more second to reach EOF. */
                kill(-pid, SIGKILL);
                open_at_deadline = 1;
                deadline = now + 1000;
                continue;
            }
            open_at_deadline = pipes > 0;
            /* A connected runner takes the ending from the message, so the outcome waits for
             * its fsyncs until the runner goes without a release; with no runner, the outcome
             * is the only record and is made durable at once. */
            written = write_outcome(dir, token, status, ended_at, control < 0, &outcome) == 0;
            durable = written && control < 0;
            retry_at = now + 1000;
            snprintf(line, sizeof line, "exited %s %d %d\n", WIFEXITED(status) ? "exit" : "signal",
                     WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                     open_at_deadline);
            say(&control, line);
            reported = 1;
        }
        if (reported && control < 0) {
            /* Released: the runner holds the ending, and its own durable commit is the record
             * (a process crash loses no page cache; an OS crash before that commit reruns the
             * attempt). Gone without a release: the outcome is the record, so it is made
             * durable BEFORE the exit, for recovery trusts that a gone keeper wrote all it
             * will write. */
            if (released) break;
            if (written && !durable && sync_outcome(dir, &outcome) != 0) {
                written = 0; /* written again, durably, at once and then every second */
                retry_at = now;
            }
            durable = written;
            if (!written && now >= retry_at) {
                written = durable = write_outcome(dir, token, status, ended_at, 1, &outcome) == 0;
                retry_at = now + 1000;
            }
            if (durable) break;
        }
        if (reported && control < 0 && pipes) { /* a released or lost runner: stop reading */
            for (int i = 0; i < 2; i++) if (s[i].pipe >= 0) { close(s[i].pipe); s[i].pipe = -1; }
        }

        struct pollfd fds[4];
        int n = 0, timeout = -1;
        for (int i = 0; i < 2; i++)
            if (s[i].pipe >= 0) fds[n++] = (struct pollfd){.fd = s[i].pipe, .events = POLLIN};
        if (control >= 0) fds[n++] = (struct pollfd){.fd = control, .events = POLLIN};
        if (!exited && pidfd >= 0) fds[n++] = (struct pollfd){.fd = pidfd, .events = POLLIN};
        if (!exited && pidfd < 0) timeout = 50;
        if ((!exited && fence) || fenced == 1) timeout = 100; /* the lease is read again */
        if (exited && !reported && !fenced) timeout = (int)(deadline > now ? deadline - now : 0);
        if (reported && control < 0 && !written) timeout = (int)(retry_at > now ? retry_at - now : 0);
        if (poll(fds, (nfds_t)n, timeout) < 0 && errno != EINTR)
            usleep(50 * 1000); /* a failing poll (it should not fail) must not spin */

        for (int i = 0; i < 2; i++)
            if (s[i].pipe >= 0) pump(&s[i]);
        if (control >= 0) {
            char got[64];
            ssize_t r = recv(control, got, sizeof got, MSG_DONTWAIT);
            for (ssize_t i = 0; i < r; i++) {
                /* A release before the end was reported cannot be one: it is ignored. */
                heard = got[i] == RELEASE[heard] ? heard + 1 : (size_t)(got[i] == RELEASE[0]);
                if (heard == sizeof RELEASE - 1) {
                    released = released || reported;
                    heard = 0;
                }
            }
            if (released || r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                close(control); /* the runner released the command, or is gone */
                control = -1;
                if (reported && (s[0].pipe >= 0 || s[1].pipe >= 0)) kill(-pid, SIGKILL);
            }
        }
        if (!exited) {
            siginfo_t info = {0};
            if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                info.si_pid == pid) {
                exited = 1;
                status = info.si_code == CLD_EXITED ? (info.si_status & 0xff) << 8
                                                    : (info.si_status & 0x7f);
                ended_at = now_ms(CLOCK_REALTIME);
                deadline = now_ms(CLOCK_MONOTONIC) + drain_ms;
            }
        }
    }
    waitpid(pid, NULL, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
