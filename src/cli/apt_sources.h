// The host's apt sources (sources.list(5): the one-line format of /etc/apt/sources.list and
// sources.list.d/*.list, deb822 stanzas of sources.list.d/*.sources), read for `sbx template
// debian` to build from the Debian mirror the host itself uses (docs/storage.md, "Debian roots").
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sbx::cli {

// One "deb" source: binary packages from `uri` for each of `suites`.
struct AptSource {
  std::string uri;
  std::vector<std::string> suites;
  std::vector<std::string> components;
};

// The "deb" entries of a one-line sources.list text ("deb [opts] URI SUITE COMPONENT..."); deb-src
// lines, comments and malformed lines are skipped.
std::vector<AptSource> ParseSourcesList(std::string_view text);
// The stanzas of a deb822 .sources text whose Types include deb and that are not Enabled: no.
std::vector<AptSource> ParseDeb822Sources(std::string_view text);
// The sources under `etc_apt` (sources.list, then sources.list.d/*.list and *.sources in name
// order); unreadable files are skipped.
std::vector<AptSource> ReadAptSources(const std::string& etc_apt = "/etc/apt");

// The mirror to fetch `suite` from: the first http(s) or file source that lists `suite`, else the
// first that lists a Debian release (a codename, or stable/testing/unstable: not -security or
// -updates, whose archives hold only updates). Trailing '/' removed. nullopt when there is none.
std::optional<std::string> PickDebianMirror(const std::vector<AptSource>& sources,
                                            const std::string& suite);

}  // namespace sbx::cli
