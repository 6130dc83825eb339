/*
 * append-variants: the calls of one append request, varied one at a time, to find what
 * in stallwatch's append cycle changes the fdatasync latency (docs/benchmarks/
 * 2026-12-02-runs-11-19.md, runs 16-19).
 *
 *   cc -O2 -o /tmp/append-variants bench/append-variants.c
 *   /tmp/append-variants DIR VARIANT COUNT
 *
 * Each request writes 2300 bytes at the end of DIR/append.log (O_APPEND, a new file per
 * run, removed at the end) and calls fdatasync; only write + fdatasync are timed, on the
 * monotonic clock, back to back. Prints the p50 and p99 of write + fdatasync in µs.
 *
 *   o  descriptor kept open for the run (as fio and a database keep their log)
 *   r  opened before and closed after each request (as stallwatch's append lane)
 *   x  as r, plus statx(STATX_TYPE | STATX_NLINK | STATX_SIZE) before the write: the
 *      calls of stallwatch's cycle
 *   s  as r, plus fstat before the write (asks for the timestamps too)
 *   c  as r, plus statx(STATX_CTIME) before the write
 *   b  as r, plus a 3 µs busy wait before the write (the time of the statx, no call)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BS 2300

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	if (argc != 4 || !strchr("orxscb", argv[2][0])) {
		fprintf(stderr, "usage: %s DIR o|r|x|s|c|b COUNT\n", argv[0]);
		return 2;
	}
	char v = argv[2][0];
	int n = atoi(argv[3]);
	char path[4096];
	snprintf(path, sizeof path, "%s/append.log", argv[1]);
	char buf[BS];
	memset(buf, 'a', sizeof buf);
	double *lat = malloc(n * sizeof *lat);
	int flags = O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC;
	int fd = v == 'o' ? open(path, flags, 0600) : -1;
	for (int i = 0; i < n; i++) {
		if (v != 'o')
			fd = open(path, flags, 0600);
		if (fd < 0) {
			perror(path);
			return 1;
		}
		struct stat st;
		struct statx sx;
		if (v == 'x')
			statx(fd, "", AT_EMPTY_PATH, STATX_TYPE | STATX_NLINK | STATX_SIZE, &sx);
		else if (v == 's')
			fstat(fd, &st);
		else if (v == 'c')
			statx(fd, "", AT_EMPTY_PATH, STATX_CTIME, &sx);
		else if (v == 'b')
			for (double z = now_us(); now_us() - z < 3;)
				;
		double a = now_us();
		if (write(fd, buf, BS) != BS || fdatasync(fd) != 0) {
			perror("write + fdatasync");
			return 1;
		}
		lat[i] = now_us() - a;
		if (v != 'o')
			close(fd);
	}
	if (v == 'o')
		close(fd);
	unlink(path);
	qsort(lat, n, sizeof *lat, cmp);
	printf("%c p50 %.0f p99 %.0f\n", v, lat[n / 2], lat[n * 99 / 100]);
	return 0;
}
