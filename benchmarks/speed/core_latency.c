/* Round-trip latency between two CPUs, sampled for as long as it runs (benchmarks/speed/core_latency.py).
 *
 *   core_latency CPU_A CPU_B INTERVAL_MS
 *
 * Every INTERVAL_MS it prints "UNIX_SECONDS NANOSECONDS": the fastest of up to 200 batches of 10 round trips of
 * one cache line between a thread pinned to CPU_A and one pinned to CPU_B. On a virtual machine the figure says
 * where the hypervisor has put the two virtual CPUs: sharing a cache (tens of ns) or far apart (hundreds).
 *
 * It runs beside a benchmark that keeps both cores busy, and both of its threads spin, so:
 * - the threads ask for the real-time policy (SCHED_FIFO, priority 1), so that each preempts the benchmark at
 *   once and both run together for the sample's fraction of a millisecond. Without it, beside a two-thread
 *   load, a sample spun until the scheduler happened to run the two together: 11% of a core at 500 ms.
 *   Where the policy is not permitted (not root, no CAP_SYS_NICE), it says so once and samples anyway;
 * - a sample stops after BUDGET_S, and is printed only if its fastest batch took under STALLED_NS a round trip:
 *   a batch during which either thread was descheduled takes microseconds to milliseconds, and says nothing
 *   about where the cores are. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define BUDGET_S 0.002
#define STALLED_NS 10000.0

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

static int real_time(void) {
  struct sched_param p = {.sched_priority = 1};
  return pthread_setschedparam(pthread_self(), SCHED_FIFO, &p);
}

static void *answer(void *unused) {
  (void)unused;
  real_time();
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
  if (real_time() != 0) {
    fprintf(stderr, "core_latency: the real-time policy is not permitted; samples beside a busy benchmark "
                    "may be missing\n");
  }
  /* The answer thread starts on CPU_B: created on CPU_A it would wait there behind this real-time thread. */
  pthread_attr_t attr;
  cpu_set_t on_b;
  CPU_ZERO(&on_b);
  CPU_SET(b, &on_b);
  pthread_attr_init(&attr);
  pthread_attr_setaffinity_np(&attr, sizeof on_b, &on_b);
  for (;;) {
    pthread_t other;
    atomic_store(&stop, 0);
    atomic_store(&line, 0);
    if (pthread_create(&other, &attr, answer, NULL) != 0) {
      fprintf(stderr, "core_latency: cannot run on CPU %d\n", b);
      return 2;
    }
    double best = 1e9, start = monotonic();
    int stalled = 0;
    for (int batch = 0; batch < 200 && !stalled && monotonic() - start < BUDGET_S; batch++) {
      double t = monotonic();
      for (int i = 0; i < 10 && !stalled; i++) {
        int v = atomic_load(&line);
        atomic_store(&line, v + 1);
        /* The clock is read every 4096 spins only, so that reading it does not slow a round trip. */
        for (unsigned spins = 1; atomic_load(&line) == v + 1; spins++) {
          if (!(spins & 4095) && monotonic() - start > BUDGET_S) {
            stalled = 1;
            break;
          }
        }
      }
      double ns = (monotonic() - t) * 1e8;  /* per round trip: 1e9 / 10 */
      if (!stalled && ns < best) best = ns;
    }
    atomic_store(&stop, 1);
    pthread_join(other, NULL);
    if (best < STALLED_NS) {
      struct timespec now;
      clock_gettime(CLOCK_REALTIME, &now);
      printf("%.3f %.0f\n", now.tv_sec + 1e-9 * now.tv_nsec, best);
      fflush(stdout);
    }
    usleep(1000 * interval_ms);
  }
}
