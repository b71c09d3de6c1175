// sbx-bench-launch: times "start a command, wait until its exit status is known", the way a
// caller of sbx / bwrap / runc / crun sees it, without an interpreter in the measured path.
//
//   sbx-bench-launch -c WORKERS -n RUNS_PER_WORKER [-e ERRDIR] [-g CGROUP_SPEC] -- CMD ARG...
//
// WORKERS threads start at the same moment (a barrier) and each runs the command RUNS_PER_WORKER
// times back to back: fork, execv, waitpid. Every occurrence of "{id}" in an argument is replaced
// by a unique id per run (container names for runc/crun). With -e, the child's stderr goes to
// ERRDIR/<worker>-<run>.err (the harness reads `sbx run --timings` and error messages from it);
// otherwise stdout and stderr go to /dev/null.
//
// With -g MEMPATH:PIDSPATH:MEMORY_BYTES:PIDS, each run first makes a fresh cgroup in both v1
// hierarchies (MEMPATH/<id>, PIDSPATH/<id>), writes memory.limit_in_bytes and pids.max, and the
// child joins both before exec; after the exit is known the run removes them. When MEMPATH and
// PIDSPATH are the same directory (cgroup v2), one cgroup gets memory.max and pids.max. This
// gives a peer (bwrap) the same "memory and pids limit" a sbx box has, with the cost inside the
// timed window.
//
// Output, one line per run on stdout: "worker run start_ns duration_ns status", where status is
// the exit code, 128+signal, or -errno when the run could not even start.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  int worker, run;
  int64_t start_ns, dur_ns;
  int status;
} Sample;

static int g_workers = 1, g_runs = 1;
static const char* g_errdir;
static char** g_argv;
static int g_argc;
static char g_mem_parent[512], g_pids_parent[512];
static long long g_mem_limit, g_pids_limit;
static int g_use_cgroup;
static Sample* g_samples;
static pthread_barrier_t g_barrier;

static int64_t NowNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int WriteFile(const char* path, const char* value) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  ssize_t n = write(fd, value, strlen(value));
  int err = n < 0 ? -errno : 0;
  close(fd);
  return err;
}

// Creates the per-run cgroups; returns 0 or -errno.
// cgroup v2 when both parents are the same directory: one cgroup, memory.max and pids.max.
static int MakeCgroups(const char* id, char* mem, char* pids, size_t cap) {
  int v2 = strcmp(g_mem_parent, g_pids_parent) == 0;
  snprintf(mem, cap, "%s/%s", g_mem_parent, id);
  snprintf(pids, cap, "%s/%s", g_pids_parent, id);
  if (mkdir(mem, 0755) != 0) return -errno;
  if (!v2 && mkdir(pids, 0755) != 0) {
    int e = -errno;
    rmdir(mem);
    return e;
  }
  char path[640], val[32];
  snprintf(val, sizeof val, "%lld", g_mem_limit);
  snprintf(path, sizeof path, v2 ? "%s/memory.max" : "%s/memory.limit_in_bytes", mem);
  int rc = WriteFile(path, val);
  snprintf(val, sizeof val, "%lld", g_pids_limit);
  snprintf(path, sizeof path, "%s/pids.max", pids);
  if (rc == 0) rc = WriteFile(path, val);
  if (rc != 0) {
    rmdir(mem);
    if (!v2) rmdir(pids);
  }
  return rc;
}

static void RemoveCgroup(const char* dir) {
  // The child has been reaped, so the cgroup is empty; v1 may still report EBUSY for a moment.
  for (int i = 0; i < 1000; i++) {
    if (rmdir(dir) == 0 || errno != EBUSY) return;
    usleep(1000);
  }
}

static void* Worker(void* arg) {
  int w = (int)(intptr_t)arg;
  char** argv = calloc((size_t)g_argc + 1, sizeof(char*));
  char id[64];
  pthread_barrier_wait(&g_barrier);
  for (int r = 0; r < g_runs; r++) {
    snprintf(id, sizeof id, "b%d-%d-%d", (int)getpid(), w, r);
    // Substitute {id}; the strings are built before the clock starts.
    for (int i = 0; i < g_argc; i++) {
      const char* p = strstr(g_argv[i], "{id}");
      if (!p) {
        argv[i] = g_argv[i];
        continue;
      }
      size_t len = strlen(g_argv[i]) + strlen(id);
      argv[i] = malloc(len);
      snprintf(argv[i], len, "%.*s%s%s", (int)(p - g_argv[i]), g_argv[i], id, p + 4);
    }
    argv[g_argc] = NULL;
    char errpath[600] = "/dev/null";
    if (g_errdir) snprintf(errpath, sizeof errpath, "%s/%d-%d.err", g_errdir, w, r);
    char mem[600], pids[600], procs_mem[640], procs_pids[640];

    Sample* s = &g_samples[w * g_runs + r];
    s->worker = w;
    s->run = r;
    int64_t t0 = NowNs();
    s->start_ns = t0;
    int status = 0;
    int cg = 0;
    if (g_use_cgroup) {
      cg = MakeCgroups(id, mem, pids, sizeof mem);
      snprintf(procs_mem, sizeof procs_mem, "%s/cgroup.procs", mem);
      snprintf(procs_pids, sizeof procs_pids, "%s/cgroup.procs", pids);
    }
    if (cg != 0) {
      status = cg;
    } else {
      pid_t pid = fork();
      if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        int err = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(null, 0);
        dup2(null, 1);
        dup2(err >= 0 ? err : null, 2);
        if (g_use_cgroup &&
            (WriteFile(procs_mem, "0") != 0 ||
             (strcmp(procs_mem, procs_pids) != 0 && WriteFile(procs_pids, "0") != 0))) {
          dprintf(2, "sbx-bench-launch: join cgroup: %s\n", strerror(errno));
          _exit(126);
        }
        execv(argv[0], argv);
        dprintf(2, "sbx-bench-launch: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
      }
      if (pid < 0) {
        status = -errno;
      } else {
        int ws = 0;
        while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
        }
        status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
      }
      if (g_use_cgroup) {
        RemoveCgroup(mem);
        if (strcmp(mem, pids) != 0) RemoveCgroup(pids);
      }
    }
    s->dur_ns = NowNs() - t0;
    s->status = status;
    for (int i = 0; i < g_argc; i++)
      if (argv[i] != g_argv[i]) free(argv[i]);
  }
  free(argv);
  return NULL;
}

static void Usage(void) {
  fprintf(stderr,
          "usage: sbx-bench-launch -c WORKERS -n RUNS [-e ERRDIR] "
          "[-g MEMPATH:PIDSPATH:MEMORY_BYTES:PIDS] -- CMD ARG...\n");
  exit(2);
}

int main(int argc, char** argv) {
  int opt;
  while ((opt = getopt(argc, argv, "+c:n:e:g:")) != -1) {
    switch (opt) {
      case 'c':
        g_workers = atoi(optarg);
        break;
      case 'n':
        g_runs = atoi(optarg);
        break;
      case 'e':
        g_errdir = optarg;
        break;
      case 'g':
        if (sscanf(optarg, "%511[^:]:%511[^:]:%lld:%lld", g_mem_parent, g_pids_parent, &g_mem_limit,
                   &g_pids_limit) != 4)
          Usage();
        g_use_cgroup = 1;
        break;
      default:
        Usage();
    }
  }
  if (optind >= argc || g_workers < 1 || g_runs < 1) Usage();
  g_argv = argv + optind;
  g_argc = argc - optind;
  g_samples = calloc((size_t)g_workers * (size_t)g_runs, sizeof(Sample));
  pthread_barrier_init(&g_barrier, NULL, (unsigned)g_workers);
  pthread_t* threads = calloc((size_t)g_workers, sizeof(pthread_t));
  for (int w = 0; w < g_workers; w++) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    if (pthread_create(&threads[w], &attr, Worker, (void*)(intptr_t)w) != 0) {
      perror("pthread_create");
      return 1;
    }
    pthread_attr_destroy(&attr);
  }
  for (int w = 0; w < g_workers; w++) pthread_join(threads[w], NULL);
  for (int i = 0; i < g_workers * g_runs; i++) {
    Sample* s = &g_samples[i];
    printf("%d %d %lld %lld %d\n", s->worker, s->run, (long long)s->start_ns, (long long)s->dur_ns,
           s->status);
  }
  return 0;
}
