// Terse logging for sbx-agent: one line on stderr prefixed "sbx-agent:". The agent links no
// logging library (it is static and PID 1), so this is a vsnprintf + write(2) and nothing more.
#pragma once

namespace sbx::agent {

// printf-style; never allocates, never fails loudly.
void Log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace sbx::agent
