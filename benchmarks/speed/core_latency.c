/* Round-trip latency between two CPUs, sampled for as long as it runs (benchmarks/speed/core_latency.py).
 *
 *   core_latency CPU_A CPU_B INTERVAL_MS
 *
 * Every INTERVAL_MS it prints "UNIX_SECONDS NANOSECONDS": the fastest of 200 batches of 10 round trips of one
 * cache line between a thread pinned to CPU_A and one pinned to CPU_B. The fastest batch, because a benchmark
 * runs beside it: a batch during which either thread was descheduled is slow for that reason alone, and the
 * fastest one is where both ran. On a virtual machine the figure says where the hypervisor has put the two
 * virtual CPUs: sharing a cache (tens of ns) or far apart (hundreds). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static _Atomic int line __attribute__((aligned(64)));
static _Atomic int stop;

static double monotonic(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *answer(void *cpu) {
  if (pin(*(int *)cpu) != 0) {
    fprintf(stderr, "core_latency: cannot run on CPU %d\n", *(int *)cpu);
    exit(2);
  }
  while (!atomic_load(&stop)) {
    int v = atomic_load(&line);
    if (v & 1) atomic_store(&line, v + 1);
  }
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: core_latency CPU_A CPU_B INTERVAL_MS\n");
    return 2;
  }
  int a = atoi(argv[1]), b = atoi(argv[2]), interval_ms = atoi(argv[3]);
  if (pin(a) != 0) {
    fprintf(stderr, "core_latency: cannot run on CPU %d\n", a);
    return 2;
  }
  for (;;) {
    pthread_t other;
    atomic_store(&stop, 0);
    atomic_store(&line, 0);
    pthread_create(&other, NULL, answer, &b);
    double best = 1e9;
    for (int batch = 0; batch < 200; batch++) {
      double t = monotonic();
      for (int i = 0; i < 10; i++) {
        int v = atomic_load(&line);
        atomic_store(&line, v + 1);
        while (atomic_load(&line) == v + 1) {}
      }
      double ns = (monotonic() - t) * 1e8;  /* per round trip: 1e9 / 10 */
      if (ns < best) best = ns;
    }
    atomic_store(&stop, 1);
    pthread_join(other, NULL);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    printf("%.3f %.0f\n", now.tv_sec + 1e-9 * now.tv_nsec, best);
    fflush(stdout);
    usleep(1000 * interval_ms);
  }
}
