#include "agent/log.h"

#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>

namespace sbx::agent {

void Log(const char* fmt, ...) {
  int saved = errno;
  char buf[1024];
  int n = snprintf(buf, sizeof buf, "sbx-agent: ");
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(buf + n, sizeof buf - static_cast<size_t>(n) - 1, fmt, ap);
  va_end(ap);
  size_t len = static_cast<size_t>(n) + (m < 0 ? 0 : static_cast<size_t>(m));
  if (len > sizeof buf - 2) len = sizeof buf - 2;
  buf[len++] = '\n';
  ssize_t ignored = ::write(2, buf, len);
  (void)ignored;
  errno = saved;
}

}  // namespace sbx::agent
