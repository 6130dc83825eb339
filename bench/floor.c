/*
 * floor: the system calls of stallwatch's default probe cycles and nothing else, the
 * CPU floor that section `floor` of the bench measures the agent against (issue 21).
 *
 *   cc -O2 -pthread -o /tmp/floor bench/floor.c
 *   /tmp/floor [-i INTERVAL_MS] [-b] DIR...        (runs until SIGTERM or SIGINT)
 *
 * For each DIR two threads, one per lane as the agent has (a create lane and an
 * overwrite lane, 4096 bytes + fsync), paced at INTERVAL_MS (default 1000) on absolute
 * CLOCK_MONOTONIC deadlines, the overwrite lane half an interval after the create lane
 * (the agent's stagger: lane i of n starts i/n of an interval after the target). Each
 * cycle makes the calls of the agent's cycle, in its order, as `strace -f` shows them
 * (BENCHMARKS.md, "`floor`"):
 *
 *   ppoll(/proc/self/mountinfo, POLLPRI, 0)          mount table changed? (one fd)
 *   open(DIR, O_RDONLY|O_DIRECTORY|O_NOFOLLOW|O_CLOEXEC)
 *   statx(fd, "", AT_EMPTY_PATH, STATX_MNT_ID)        the mount id check
 *   openat(fd, ".swfloor", O_DIRECTORY ...)           (mkdirat on the first cycle)
 *   statx(dir, TYPE|MODE|UID), statx(fd, TYPE|MODE|UID), geteuid(), close(fd)
 *   create:    getpid(), openat(create.PID.SEQ, O_CREAT|O_EXCL), close, unlinkat, close(dir)
 *   overwrite: openat(overwrite.dat, O_CREAT), statx(TYPE|NLINK|SIZE), pwrite 4096 at 0,
 *              fsync, close, close(dir)
 *
 * timed as the agent times them: the directory's open and checks as one, then each of
 * create, close, unlink; the file's open + statx as one, then pwrite, then fsync; two
 * clock_gettime(CLOCK_MONOTONIC) around each (vDSO: no system call). The latencies are
 * summed per op so none is optimised away; nothing else is done with them.
 *
 * -b (bare): only the calls the probe times and the directory's open and close:
 * no ppoll, no statx, no geteuid, no getpid.
 *
 * Its own directory is DIR/.swfloor (the agent's is DIR/.stallwatch, so the two never
 * share a file); removed with its files on exit. Exit 0 after a signal, 1 on an error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SIZE 4096
#define SUBDIR ".swfloor"
#define DIRF (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)

static volatile sig_atomic_t stop;
static long interval_ns = 1000000000L;
static int bare;
static int mountinfo_fd = -1;
static struct timespec start;

struct lane {
	const char *dir;
	int index, mode; /* mode 0 create, 1 overwrite */
	pthread_t th;
	double sum[4];
	unsigned long cycles, errors;
};

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void add_ns(struct timespec *t, long ns)
{
	t->tv_nsec += ns;
	while (t->tv_nsec >= 1000000000L) {
		t->tv_nsec -= 1000000000L;
		t->tv_sec++;
	}
}

static int fail(struct lane *l, const char *what)
{
	l->errors++;
	if (l->errors <= 3)
		fprintf(stderr, "floor: %s %s: %s\n", l->dir, what, strerror(errno));
	return -1;
}

/* The probe directory, opened and checked as open_probe_dir does; -1 on an error. */
static int open_dir(struct lane *l)
{
	int fd = open(l->dir, DIRF);
	if (fd < 0)
		return fail(l, "open");
	struct statx sx, px;
	if (!bare)
		statx(fd, "", AT_EMPTY_PATH, STATX_MNT_ID, &sx);
	int d = openat(fd, SUBDIR, DIRF);
	if (d < 0 && errno == ENOENT) {
		if (mkdirat(fd, SUBDIR, 0700) != 0 && errno != EEXIST) {
			close(fd);
			return fail(l, "mkdir");
		}
		d = openat(fd, SUBDIR, DIRF);
	}
	if (d < 0) {
		close(fd);
		return fail(l, "open " SUBDIR);
	}
	if (!bare) {
		unsigned mask = STATX_TYPE | STATX_MODE | STATX_UID;
		statx(d, "", AT_EMPTY_PATH, mask, &sx);
		statx(fd, "", AT_EMPTY_PATH, mask, &px);
		if (sx.stx_uid != geteuid() || sx.stx_dev_major != px.stx_dev_major) {
			close(fd);
			close(d);
			errno = EPERM;
			return fail(l, "check " SUBDIR);
		}
	}
	close(fd);
	return d;
}

static void cycle(struct lane *l, unsigned long seq, char *buf)
{
	double t0, t1;
	if (!bare) {
		struct pollfd p = {.fd = mountinfo_fd, .events = POLLPRI};
		struct timespec zero = {0, 0};
		ppoll(&p, 1, &zero, NULL);
	}
	t0 = now_s();
	int d = open_dir(l);
	t1 = now_s();
	l->sum[0] += t1 - t0;
	if (d < 0)
		return;
	if (l->mode == 0) {
		char name[64];
		snprintf(name, sizeof name, "create.%d.%lu", bare ? 0 : (int)getpid(), seq);
		t0 = now_s();
		int fd = openat(d, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		t1 = now_s();
		l->sum[1] += t1 - t0;
		if (fd < 0) {
			fail(l, "create");
		} else {
			t0 = now_s();
			close(fd);
			t1 = now_s();
			l->sum[2] += t1 - t0;
			t0 = now_s();
			if (unlinkat(d, name, 0) != 0)
				fail(l, "unlink");
			t1 = now_s();
			l->sum[3] += t1 - t0;
		}
	} else {
		t0 = now_s();
		int fd = openat(d, "overwrite.dat", O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
		struct statx sx;
		if (fd >= 0 && !bare)
			statx(fd, "", AT_EMPTY_PATH, STATX_TYPE | STATX_NLINK | STATX_SIZE, &sx);
		t1 = now_s();
		l->sum[1] += t1 - t0;
		if (fd < 0) {
			fail(l, "open overwrite.dat");
		} else {
			memset(buf, (int)(seq % 251) + 1, SIZE);
			t0 = now_s();
			if (pwrite(fd, buf, SIZE, 0) != SIZE)
				fail(l, "pwrite");
			t1 = now_s();
			l->sum[2] += t1 - t0;
			t0 = now_s();
			if (fsync(fd) != 0)
				fail(l, "fsync");
			t1 = now_s();
			l->sum[3] += t1 - t0;
			close(fd);
		}
	}
	close(d);
	l->cycles++;
}

static void *run(void *arg)
{
	struct lane *l = arg;
	char *buf = malloc(SIZE);
	struct timespec due = start;
	add_ns(&due, l->mode * (interval_ns / 2));
	for (unsigned long seq = 1; !stop; seq++) {
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &due, NULL) == EINTR && !stop)
			;
		if (stop)
			break;
		add_ns(&due, interval_ns);
		cycle(l, seq, buf);
	}
	free(buf);
	return NULL;
}

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

int main(int argc, char **argv)
{
	int opt;
	while ((opt = getopt(argc, argv, "i:b")) != -1) {
		if (opt == 'i')
			interval_ns = atol(optarg) * 1000000L;
		else if (opt == 'b')
			bare = 1;
		else
			goto usage;
	}
	if (optind >= argc || interval_ns <= 0)
		goto usage;
	int n = argc - optind;
	mountinfo_fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
	struct lane *lanes = calloc(2 * n, sizeof *lanes);
	struct sigaction sa = {.sa_handler = on_signal};
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (int i = 0; i < 2 * n; i++) {
		struct lane *l = &lanes[i];
		l->dir = argv[optind + i / 2];
		l->index = i / 2;
		l->mode = i % 2;
		if (pthread_create(&l->th, NULL, run, l) != 0) {
			perror("pthread_create");
			return 1;
		}
		char name[16];
		snprintf(name, sizeof name, "f%d-%s", l->index, l->mode ? "overwrite" : "create");
		pthread_setname_np(l->th, name);
	}
	/* The signal lands on any thread; the main thread waits for it like the rest. */
	while (!stop)
		pause();
	unsigned long cycles = 0, errors = 0;
	double sum = 0;
	for (int i = 0; i < 2 * n; i++) {
		pthread_kill(lanes[i].th, SIGTERM); /* out of its sleep */
		pthread_join(lanes[i].th, NULL);
		cycles += lanes[i].cycles;
		errors += lanes[i].errors;
		for (int k = 0; k < 4; k++)
			sum += lanes[i].sum[k];
	}
	for (int i = 0; i < n; i++) {
		int fd = open(argv[optind + i], DIRF);
		if (fd < 0)
			continue;
		int d = openat(fd, SUBDIR, DIRF);
		if (d >= 0) {
			unlinkat(d, "overwrite.dat", 0);
			close(d);
		}
		unlinkat(fd, SUBDIR, AT_REMOVEDIR);
		close(fd);
	}
	printf("cycles %lu errors %lu timed %.6f s\n", cycles, errors, sum);
	return errors ? 1 : 0;
usage:
	fprintf(stderr, "usage: %s [-i INTERVAL_MS] [-b] DIR...\n", argv[0]);
	return 2;
}
