#include "cli/range_flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "cli/units.h"

namespace sbx::cli {

void AddRangeFlags(CLI::App* app, RangeFlags& f, const std::string& whose) {
  struct Flag {
    const char* name;
    std::string* value;
    const char* what;
  };
  for (const Flag& flag : {
           Flag{"--min-memory", &f.min_memory, "Smallest memory limit a create may ask for (16M)"},
           Flag{"--max-memory", &f.max_memory, "Largest memory limit a create may ask for (2G)"},
           Flag{"--min-cpus", &f.min_cpus, "Smallest CPU quota, in cores (0.5)"},
           Flag{"--max-cpus", &f.max_cpus, "Largest CPU quota, in cores (2)"},
           Flag{"--min-pids", &f.min_pids, "Smallest process limit"},
           Flag{"--max-pids", &f.max_pids, "Largest process limit"},
           Flag{"--min-disk", &f.min_disk, "Smallest disk limit (1G)"},
           Flag{"--max-disk", &f.max_disk,
                "Largest disk limit (10G); a create without one then gets this much"},
           Flag{"--min-timeout", &f.min_timeout, "Shortest sandbox timeout (30s)"},
           Flag{"--max-timeout", &f.max_timeout, "Longest sandbox timeout (1h)"},
       })
    app->add_option(flag.name, *flag.value, std::string(flag.what) + ", " + whose);
}

void AddEgressRangeFlags(CLI::App* app, RangeFlags& f, const std::string& whose) {
  app->add_option("--min-egress-mbps", f.min_egress_mbps,
                  "Smallest egress bandwidth limit, Mbit/s (1), " + whose);
  app->add_option("--max-egress-mbps", f.max_egress_mbps,
                  "Largest egress bandwidth limit, Mbit/s (100); a create without one then gets "
                  "this much, " +
                      whose);
}

Result<store::LimitRanges> ParseRangeFlags(const RangeFlags& f) {
  store::LimitRanges r;
  auto bad = [](const char* flag, const std::string& text, const char* want) {
    return Status::Error(std::string(flag) + ": " + want + ", got '" + text + "'", EINVAL);
  };
  auto size = [&](const char* flag, const std::string& text, int64_t* out) -> Status {
    if (text.empty()) return {};
    auto n = ParseSize(text);
    if (!n.ok() || *n <= 0) return bad(flag, text, "a size such as 512M or 2G");
    *out = *n;
    return {};
  };
  auto duration = [&](const char* flag, const std::string& text, int64_t* out) -> Status {
    if (text.empty()) return {};
    auto n = ParseDuration(text);
    if (!n.ok() || *n <= 0) return bad(flag, text, "a duration such as 30s or 1h");
    *out = *n;
    return {};
  };
  auto number = [&](const char* flag, const std::string& text, double* out,
                    const char* want) -> Status {
    if (text.empty()) return {};
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || *end != '\0' || errno != 0 || !std::isfinite(v) || v <= 0)
      return bad(flag, text, want);
    *out = v;
    return {};
  };
  auto cpus = [&](const char* flag, const std::string& text, double* out) {
    return number(flag, text, out, "a number of CPUs such as 0.5 or 2");
  };
  auto mbps = [&](const char* flag, const std::string& text, double* out) {
    return number(flag, text, out, "a rate in Mbit/s such as 8 or 0.5");
  };
  auto count = [&](const char* flag, const std::string& text, int64_t* out) -> Status {
    if (text.empty()) return {};
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (end == text.c_str() || *end != '\0' || errno != 0 || v <= 0)
      return bad(flag, text, "a whole number of processes above 0");
    *out = v;
    return {};
  };
  SBX_RETURN_IF_ERROR(size("--min-memory", f.min_memory, &r.min_memory_bytes));
  SBX_RETURN_IF_ERROR(size("--max-memory", f.max_memory, &r.max_memory_bytes));
  SBX_RETURN_IF_ERROR(cpus("--min-cpus", f.min_cpus, &r.min_cpus));
  SBX_RETURN_IF_ERROR(cpus("--max-cpus", f.max_cpus, &r.max_cpus));
  SBX_RETURN_IF_ERROR(count("--min-pids", f.min_pids, &r.min_pids));
  SBX_RETURN_IF_ERROR(count("--max-pids", f.max_pids, &r.max_pids));
  SBX_RETURN_IF_ERROR(size("--min-disk", f.min_disk, &r.min_disk_bytes));
  SBX_RETURN_IF_ERROR(size("--max-disk", f.max_disk, &r.max_disk_bytes));
  SBX_RETURN_IF_ERROR(duration("--min-timeout", f.min_timeout, &r.min_timeout_ms));
  SBX_RETURN_IF_ERROR(duration("--max-timeout", f.max_timeout, &r.max_timeout_ms));
  SBX_RETURN_IF_ERROR(mbps("--min-egress-mbps", f.min_egress_mbps, &r.min_egress_mbps));
  SBX_RETURN_IF_ERROR(mbps("--max-egress-mbps", f.max_egress_mbps, &r.max_egress_mbps));
  return r;
}

}  // namespace sbx::cli
