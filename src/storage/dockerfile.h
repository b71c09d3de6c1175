// The Dockerfile subset sbx builds (issue 13, item 3), parsed into steps that builds run and
// that E2B's template API (steps of `POST /v2/templates/{id}/builds/{buildID}`) maps onto too.
// The parser only reads text: it never touches the filesystem or the network.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace sbx::storage {

struct BuildStep {
  enum class Kind {
    kFrom,
    kRun,
    kCopy,
    kEnv,
    kArg,
    kWorkdir,
    kUser,
    kLabel,
    kExpose,
    kCmd,
    kEntrypoint
  };
  Kind kind = Kind::kRun;
  int line = 0;      // 1-based line of the instruction in the Dockerfile (0: not from one)
  std::string text;  // the instruction as written (continuations joined), for the build log
  // kFrom: {image or template} ; kRun/kCmd/kEntrypoint: argv when exec_form, else {shell line};
  // kCopy: sources..., destination (sources relative to the build context); kEnv/kLabel/kArg:
  // alternating key, value (kArg: value "" when it has no default); kWorkdir/kUser: {value};
  // kExpose: {"8080/tcp", ...}.
  std::vector<std::string> args;
  bool exec_form = false;  // JSON array form of RUN/CMD/ENTRYPOINT
  std::string chown;       // COPY --chown=
  // COPY: a source that is itself a symlink is copied as the link, as E2B's COPY does (its SDK
  // uploads links as links); Docker's COPY, and so a Dockerfile's, follows it inside the context.
  bool copy_links = false;
};

// Parses `text`. `build_args` are --build-arg values (ARG defaults otherwise). Variables
// ($NAME, ${NAME}, ${NAME:-default}) of ENV and ARG are substituted where Docker does. Any
// instruction outside the subset (ONBUILD, HEALTHCHECK, VOLUME, SHELL, STOPSIGNAL, COPY --from,
// ADD of a URL, a heredoc, a second FROM) is EINVAL with a message naming its line:
// "Dockerfile line 7: HEALTHCHECK is not supported by sbx build". The first instruction (after
// ARGs) must be FROM.
Result<std::vector<BuildStep>> ParseDockerfile(
    std::string_view text, const std::map<std::string, std::string>& build_args);

// A build context's `.dockerignore`, with Docker's rules: one pattern per line, `#` starts a
// comment line, a leading `!` re-includes what an earlier pattern excluded. Patterns are
// relative to the context's root (a leading `/` is dropped, `.` and `..` are cleaned as paths);
// `*` and `?` match within one path component, `**` any number of components (none too), `[...]`
// a class, `\` escapes. A path is excluded when the last pattern matching it, or one of its
// parent directories, is not a `!` one. COPY sees only what is not excluded.
class IgnoreRules {
 public:
  // EINVAL naming the line for a file too large (1 MiB) or with too many patterns (10000).
  static Result<IgnoreRules> Parse(std::string_view text);
  // `rel`: a path relative to the context ("a/b", "/a/b" and "./a/b" alike).
  bool Excluded(std::string_view rel) const;
  // Some `!` pattern exists: an excluded directory may hold included files.
  bool HasExceptions() const { return exceptions_; }
  bool empty() const { return rules_.empty(); }

 private:
  struct Rule {
    std::vector<std::string> parts;
    bool exception = false;
  };
  std::vector<Rule> rules_;
  bool exceptions_ = false;
};

}  // namespace sbx::storage
