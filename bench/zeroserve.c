// sbx-bench-zeroserve: the fast upstream of the network throughput row (docs/benchmarks.md,
// issue 12 item 10). A plain HTTP/1.1 server that answers `GET /bytes/N` with N zero bytes
// written from one static buffer, so that the server is never what limits a download (Node's
// server in tests/network/fakenet.mjs spends more CPU per byte than the paths being compared).
// Every other request gets a short 200. One thread per connection, `Connection: close`.
//
//   sbx-bench-zeroserve ADDR PORT READY_FILE
//       Listens on ADDR:PORT (IPv4), then writes READY_FILE; runs until killed.
#define _GNU_SOURCE  // accept4
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CHUNK (256 * 1024)
#define MAX_BYTES (16LL << 30)

static char zeros[CHUNK];

static int send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static void* serve(void* arg) {
  int fd = (int)(intptr_t)arg;
  char head[16384];
  size_t len = 0;
  // The request head, bounded; what follows it (there is no body) is ignored.
  while (len < sizeof head - 1) {
    ssize_t r = recv(fd, head + len, sizeof head - 1 - len, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) goto out;
    len += (size_t)r;
    head[len] = '\0';
    if (strstr(head, "\r\n\r\n")) break;
  }
  head[len] = '\0';
  long long n = -1;
  if (strncmp(head, "GET /bytes/", 11) == 0) {
    char* end = NULL;
    n = strtoll(head + 11, &end, 10);
    if (end == head + 11 || n < 0 || n > MAX_BYTES) n = -1;
  }
  char hdr[256];
  if (n < 0) {
    const char* body = "zeroserve: GET /bytes/N\n";
    int h = snprintf(hdr, sizeof hdr,
                     "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n%s",
                     strlen(body), body);
    send_all(fd, hdr, (size_t)h);
    goto out;
  }
  int h = snprintf(hdr, sizeof hdr,
                   "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                   "Content-Length: %lld\r\nConnection: close\r\n\r\n",
                   n);
  if (send_all(fd, hdr, (size_t)h) != 0) goto out;
  while (n > 0) {
    size_t part = n > CHUNK ? CHUNK : (size_t)n;
    if (send_all(fd, zeros, part) != 0) break;
    n -= (long long)part;
  }
  shutdown(fd, SHUT_WR);
out:
  close(fd);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: sbx-bench-zeroserve ADDR PORT READY_FILE\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)atoi(argv[2]));
  if (inet_pton(AF_INET, argv[1], &sa.sin_addr) != 1) {
    fprintf(stderr, "zeroserve: bad address %s\n", argv[1]);
    return 2;
  }
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (ls < 0 || bind(ls, (struct sockaddr*)&sa, sizeof sa) != 0 || listen(ls, 128) != 0) {
    fprintf(stderr, "zeroserve: listen on %s:%s: %s\n", argv[1], argv[2], strerror(errno));
    return 1;
  }
  FILE* ready = fopen(argv[3], "w");
  if (ready == NULL || fprintf(ready, "%d\n", getpid()) < 0 || fclose(ready) != 0) {
    fprintf(stderr, "zeroserve: write %s: %s\n", argv[3], strerror(errno));
    return 1;
  }
  for (;;) {
    int fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      fprintf(stderr, "zeroserve: accept: %s\n", strerror(errno));
      return 1;
    }
    pthread_t t;
    if (pthread_create(&t, NULL, serve, (void*)(intptr_t)fd) != 0) {
      close(fd);
      continue;
    }
    pthread_detach(t);
  }
}
