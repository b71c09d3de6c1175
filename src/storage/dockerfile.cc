// The Dockerfile subset of dockerfile.h. Follows Docker's own reader (moby/buildkit's
// frontend/dockerfile/parser and shell lexer) where the subset overlaps: parser directives at the
// top, `\` (or the `escape` directive's character) continuing a line, comment lines dropped even
// inside a continuation, the JSON array (exec) form falling back to the shell form when it does
// not parse, and ENV/ARG variables substituted in the instructions Docker substitutes in (not
// RUN, CMD and ENTRYPOINT: their shell does that with the variables in its environment).
//
// Every input is an attacker's: the lexer is iterative except for ${...} nesting (bounded), and
// substitution is bounded in total so that `ENV A=$A$A` repeated cannot grow without end.
#include "storage/dockerfile.h"

#include <fnmatch.h>

#include <cctype>
#include <cstdint>
#include <optional>

namespace sbx::storage {
namespace {

constexpr size_t kMaxSteps = 1000;
constexpr size_t kMaxExpandedBytes = size_t{8} << 20;  // every step's args and text together
constexpr size_t kMaxWordBytes = size_t{1} << 20;
constexpr int kMaxNesting = 32;
constexpr size_t kMaxExposed = 1024;

using Vars = std::map<std::string, std::string>;

Status LineError(int line, const std::string& what) {
  return Status::Error("Dockerfile line " + std::to_string(line) + ": " + what, EINVAL);
}

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}
bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

std::string Upper(std::string_view s) {
  std::string u(s);
  for (char& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return u;
}

// ---- the JSON array of the exec form: strings only ----

void AppendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::optional<uint32_t> Hex4(std::string_view s, size_t i) {
  if (i + 4 > s.size()) return std::nullopt;
  uint32_t v = 0;
  for (size_t k = i; k < i + 4; ++k) {
    char c = s[k];
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= static_cast<uint32_t>(c - '0');
    else if (c >= 'a' && c <= 'f')
      v |= static_cast<uint32_t>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      v |= static_cast<uint32_t>(c - 'A' + 10);
    else
      return std::nullopt;
  }
  return v;
}

// `s` as a JSON array of strings, or nullopt when it is not one (Docker then reads the shell form).
std::optional<std::vector<std::string>> ParseJsonArray(std::string_view s) {
  s = Trim(s);
  if (s.size() < 2 || s.front() != '[' || s.back() != ']') return std::nullopt;
  std::vector<std::string> out;
  size_t i = 1;
  auto skip = [&] {
    while (i < s.size() && IsSpace(s[i])) ++i;
  };
  skip();
  if (i < s.size() && s[i] == ']') return i + 1 == s.size() ? std::optional(out) : std::nullopt;
  for (;;) {
    skip();
    if (i >= s.size() || s[i] != '"') return std::nullopt;
    ++i;
    std::string v;
    for (;;) {
      if (i >= s.size()) return std::nullopt;
      char c = s[i++];
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) return std::nullopt;
      if (c != '\\') {
        v += c;
        continue;
      }
      if (i >= s.size()) return std::nullopt;
      char e = s[i++];
      switch (e) {
        case '"':
          v += '"';
          break;
        case '\\':
          v += '\\';
          break;
        case '/':
          v += '/';
          break;
        case 'b':
          v += '\b';
          break;
        case 'f':
          v += '\f';
          break;
        case 'n':
          v += '\n';
          break;
        case 'r':
          v += '\r';
          break;
        case 't':
          v += '\t';
          break;
        case 'u': {
          auto cp = Hex4(s, i);
          if (!cp) return std::nullopt;
          i += 4;
          if (*cp >= 0xD800 && *cp < 0xDC00) {
            std::optional<uint32_t> lo;
            if (i + 1 < s.size() && s[i] == '\\' && s[i + 1] == 'u') lo = Hex4(s, i + 2);
            if (!lo || *lo < 0xDC00 || *lo >= 0xE000) return std::nullopt;
            i += 6;
            *cp = 0x10000 + ((*cp - 0xD800) << 10) + (*lo - 0xDC00);
          } else if (*cp >= 0xDC00 && *cp < 0xE000) {
            return std::nullopt;
          }
          if (*cp == 0) return std::nullopt;  // argv strings cannot hold NUL
          AppendUtf8(v, *cp);
          break;
        }
        default:
          return std::nullopt;
      }
    }
    out.push_back(std::move(v));
    skip();
    if (i >= s.size()) return std::nullopt;
    if (s[i] == ',') {
      ++i;
      continue;
    }
    if (s[i] == ']' && i + 1 == s.size()) return out;
    return std::nullopt;
  }
}

// ---- words and variable substitution (Docker's shell lexer, the part the subset needs) ----

// Splits `s` on unquoted whitespace, keeping quotes and escapes as written (Docker's
// parseWords: ENV/LABEL/ARG pairs are found before they are substituted).
std::vector<std::string> RawWords(std::string_view s, char esc) {
  std::vector<std::string> words;
  std::string cur;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (quote == 0 && IsSpace(c)) {
      if (in_word) words.push_back(std::move(cur));
      cur.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == esc && quote != '\'' && i + 1 < s.size()) {
      cur += c;
      cur += s[++i];
      continue;
    }
    if (quote == 0 && (c == '"' || c == '\''))
      quote = c;
    else if (c == quote)
      quote = 0;
    cur += c;
  }
  if (in_word) words.push_back(std::move(cur));
  return words;
}

// Substitutes variables in one word and removes its quotes and escapes, as Docker's ProcessWord.
class Expander {
 public:
  // Names are looked up in `first`, then in `second`.
  Expander(const Vars& first, const Vars& second, char esc, size_t* budget)
      : first_(first), second_(second), esc_(esc), budget_(budget) {}

  Result<std::string> Word(std::string_view s) {
    in_ = s;
    pos_ = 0;
    std::string out;
    SBX_RETURN_IF_ERROR(Scan(out, 0, 0));
    return out;
  }

 private:
  Status Add(std::string& out, std::string_view piece) {
    if (out.size() + piece.size() > kMaxWordBytes || piece.size() > *budget_)
      return Status::Error("too large after variable substitution", E2BIG);
    *budget_ -= piece.size();
    out.append(piece);
    return {};
  }

  // Reads until `stop` (unquoted; 0: the end), appending to `out`.
  Status Scan(std::string& out, char stop, int depth) {
    while (pos_ < in_.size()) {
      char c = in_[pos_];
      if (stop != 0 && c == stop) return {};
      ++pos_;
      if (c == esc_) {
        // An escape at the very end stands for itself, as in Docker.
        SBX_RETURN_IF_ERROR(
            Add(out, pos_ < in_.size() ? in_.substr(pos_++, 1) : in_.substr(pos_ - 1, 1)));
      } else if (c == '\'') {
        size_t end = in_.find('\'', pos_);
        if (end == std::string_view::npos) return Status::Error("unterminated single quote");
        SBX_RETURN_IF_ERROR(Add(out, in_.substr(pos_, end - pos_)));
        pos_ = end + 1;
      } else if (c == '"') {
        SBX_RETURN_IF_ERROR(DoubleQuoted(out, depth));
      } else if (c == '$') {
        SBX_RETURN_IF_ERROR(Dollar(out, depth));
      } else {
        SBX_RETURN_IF_ERROR(Add(out, std::string_view(&in_[pos_ - 1], 1)));
      }
    }
    if (stop != 0) return Status::Error("missing '}'");
    return {};
  }

  Status DoubleQuoted(std::string& out, int depth) {
    while (pos_ < in_.size()) {
      char c = in_[pos_++];
      if (c == '"') return {};
      if (c == esc_ && pos_ < in_.size() &&
          (in_[pos_] == '"' || in_[pos_] == '$' || in_[pos_] == esc_)) {
        SBX_RETURN_IF_ERROR(Add(out, in_.substr(pos_++, 1)));
      } else if (c == '$') {
        SBX_RETURN_IF_ERROR(Dollar(out, depth));
      } else {
        SBX_RETURN_IF_ERROR(Add(out, std::string_view(&in_[pos_ - 1], 1)));
      }
    }
    return Status::Error("unterminated double quote");
  }

  // After a '$': $NAME, ${NAME}, ${NAME:-word}, ${NAME-word}, ${NAME:+word}, ${NAME+word},
  // ${NAME:?message}, ${NAME?message}; anything else leaves the '$' as it is.
  Status Dollar(std::string& out, int depth) {
    if (pos_ >= in_.size() || (in_[pos_] != '{' && !IsNameChar(in_[pos_]))) return Add(out, "$");
    if (in_[pos_] != '{') {
      size_t start = pos_;
      while (pos_ < in_.size() && IsNameChar(in_[pos_])) ++pos_;
      const std::string* value = Find(std::string(in_.substr(start, pos_ - start)));
      return value ? Add(out, *value) : Status();
    }
    ++pos_;
    if (depth >= kMaxNesting) return Status::Error("${...} nested too deeply");
    size_t start = pos_;
    while (pos_ < in_.size() && IsNameChar(in_[pos_])) ++pos_;
    std::string name(in_.substr(start, pos_ - start));
    if (name.empty() || pos_ >= in_.size()) return Status::Error("bad substitution");
    const std::string* value = Find(name);
    if (in_[pos_] == '}') {
      ++pos_;
      return value ? Add(out, *value) : Status();
    }
    bool colon = in_[pos_] == ':';
    if (colon) ++pos_;
    if (pos_ >= in_.size()) return Status::Error("bad substitution");
    char op = in_[pos_++];
    if (op != '-' && op != '+' && op != '?') return Status::Error("bad substitution");
    // "set" for ':' forms means set and not empty.
    bool set = value != nullptr && (!colon || !value->empty());
    std::string word;
    SBX_RETURN_IF_ERROR(Scan(word, '}', depth + 1));
    ++pos_;  // the '}' Scan stopped at
    if (op == '-') return set ? Add(out, *value) : Add(out, word);
    if (op == '+') return set ? Add(out, word) : Status();
    if (!set) return Status::Error(name + ": " + (word.empty() ? "is not set" : word));
    return Add(out, *value);
  }

  const std::string* Find(const std::string& name) const {
    if (auto it = first_.find(name); it != first_.end()) return &it->second;
    if (auto it = second_.find(name); it != second_.end()) return &it->second;
    return nullptr;
  }

  const Vars& first_;
  const Vars& second_;
  char esc_;
  size_t* budget_;
  std::string_view in_;
  size_t pos_ = 0;
};

// ---- instructions ----

struct LogicalLine {
  int line = 0;
  std::string text;  // continuations joined, comment lines dropped
};

// Parser directives (`# syntax=...`, `# escape=...`) are only read before anything else; the
// escape character is the one that matters. Returns the logical lines.
std::vector<LogicalLine> SplitLines(std::string_view text, char* esc) {
  std::vector<std::string_view> phys;
  for (size_t pos = 0; pos <= text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    phys.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  size_t i = 0;
  // Directives: "# name=value" lines at the very top, each name once.
  for (bool seen_escape = false; i < phys.size(); ++i) {
    std::string_view l = Trim(phys[i]);
    if (l.empty() || l[0] != '#') break;
    std::string_view d = Trim(l.substr(1));
    size_t eq = d.find('=');
    if (eq == std::string_view::npos) break;
    std::string name = Upper(Trim(d.substr(0, eq)));
    bool word = !name.empty();
    for (char c : name) word = word && (std::isalpha(static_cast<unsigned char>(c)) != 0);
    if (!word) break;
    std::string_view value = Trim(d.substr(eq + 1));
    if (name == "ESCAPE" && !seen_escape && (value == "`" || value == "\\")) {
      *esc = value[0];
      seen_escape = true;
    }
    // `syntax`, `check` and unknown directives change nothing here.
  }
  std::vector<LogicalLine> out;
  std::optional<LogicalLine> cur;
  for (; i < phys.size(); ++i) {
    std::string_view l = phys[i];
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    std::string_view t = Trim(l);
    if (!t.empty() && t[0] == '#') continue;  // a comment, also inside a continuation
    if (t.empty()) {
      if (cur) continue;  // an empty line inside a continuation (Docker allows it)
      continue;
    }
    // A continuation: the escape character, then only whitespace, at the end.
    std::string_view body = l;
    while (!body.empty() && IsSpace(body.back())) body.remove_suffix(1);
    bool continues = !body.empty() && body.back() == *esc;
    if (continues) body.remove_suffix(1);
    if (!cur) cur = LogicalLine{static_cast<int>(i) + 1, ""};
    cur->text.append(body);
    if (!continues) {
      out.push_back(std::move(*cur));
      cur.reset();
    }
  }
  if (cur) out.push_back(std::move(*cur));
  return out;
}

// An instruction's leading --flags (kept in order) and what follows them.
struct Flags {
  std::vector<std::pair<std::string, std::string>> flags;  // name, value ("" without '=')
  std::string_view rest;
};

Flags TakeFlags(std::string_view rest) {
  Flags f;
  rest = Trim(rest);
  while (rest.size() > 2 && rest.substr(0, 2) == "--" && !IsSpace(rest[2])) {
    size_t end = 0;
    while (end < rest.size() && !IsSpace(rest[end])) ++end;
    std::string_view flag = rest.substr(2, end - 2);
    size_t eq = flag.find('=');
    if (eq == std::string_view::npos)
      f.flags.emplace_back(std::string(flag), "");
    else
      f.flags.emplace_back(std::string(flag.substr(0, eq)), std::string(flag.substr(eq + 1)));
    rest = Trim(rest.substr(end));
  }
  f.rest = rest;
  return f;
}

// "<<EOF", "<<-EOF", "<<'EOF'": BuildKit's heredocs (not `$((1<<2))`).
bool HasHeredoc(std::string_view s) {
  for (size_t i = s.find("<<"); i != std::string_view::npos; i = s.find("<<", i + 2)) {
    size_t k = i + 2;
    if (k < s.size() && s[k] == '-') ++k;
    if (k < s.size() && (s[k] == '"' || s[k] == '\'')) ++k;
    if (k < s.size() && (std::isalpha(static_cast<unsigned char>(s[k])) || s[k] == '_'))
      return true;
  }
  return false;
}

// Lexically cleaned absolute path ("/a/./b/../c" -> "/a/c").
std::string CleanAbsolute(const std::string& p) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i <= p.size()) {
    size_t j = p.find('/', i);
    if (j == std::string::npos) j = p.size();
    std::string part = p.substr(i, j - i);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(std::move(part));
    }
    i = j + 1;
  }
  std::string out;
  for (const auto& part : parts) out += "/" + part;
  return out.empty() ? "/" : out;
}

class Parser {
 public:
  Parser(const std::map<std::string, std::string>& build_args) : build_args_(build_args) {}

  Result<std::vector<BuildStep>> Parse(std::string_view text) {
    if (text.find('\0') != std::string_view::npos)
      return Status::Error("Dockerfile: contains a NUL byte", EINVAL);
    for (auto& l : SplitLines(text, &esc_)) {
      line_ = l.line;
      Status s = Instruction(l.text);
      if (!s.ok()) {
        // Lexer errors carry no line yet.
        if (s.what().rfind("Dockerfile", 0) == 0) return s;
        return LineError(line_, s.what());
      }
      if (steps_.size() > kMaxSteps) return LineError(line_, "too many instructions");
    }
    if (!from_seen_) return Status::Error("Dockerfile: no FROM instruction", EINVAL);
    return std::move(steps_);
  }

 private:
  Result<std::string> Expand(std::string_view word) {
    // The variables an instruction sees: ARGs before FROM for FROM; after it, the ENVs and the
    // ARGs declared since, an ENV winning over an ARG of the same name.
    Expander e(from_seen_ ? env_ : meta_, from_seen_ ? args_ : none_, esc_, &budget_);
    return e.Word(word);
  }

  Status Charge(const BuildStep& s) {
    size_t n = s.text.size() + s.chown.size();
    for (const auto& a : s.args) n += a.size();
    if (n > budget_) return Status::Error("too large after variable substitution", E2BIG);
    budget_ -= n;
    return {};
  }

  Status Push(BuildStep s) {
    SBX_RETURN_IF_ERROR(Charge(s));
    steps_.push_back(std::move(s));
    return {};
  }

  Status Instruction(std::string_view logical) {
    std::string_view t = Trim(logical);
    size_t sp = 0;
    while (sp < t.size() && !IsSpace(t[sp])) ++sp;
    std::string kw = Upper(t.substr(0, sp));
    std::string_view rest = Trim(t.substr(sp));
    BuildStep s;
    s.line = line_;
    s.text = std::string(t);
    if (kw == "ARG") return Arg(std::move(s), rest);
    if (!from_seen_ && kw != "FROM") {
      static const char* const kKnown[] = {"RUN",  "COPY",  "ADD",    "ENV", "WORKDIR",
                                           "USER", "LABEL", "EXPOSE", "CMD", "ENTRYPOINT"};
      for (const char* k : kKnown)
        if (kw == k)
          return Status::Error("the first instruction (after ARGs) must be FROM, not " + kw);
    }
    if (kw == "FROM") return From(std::move(s), rest);
    if (kw == "RUN") return Command(std::move(s), BuildStep::Kind::kRun, rest, true);
    if (kw == "CMD") return Command(std::move(s), BuildStep::Kind::kCmd, rest, false);
    if (kw == "ENTRYPOINT") return Command(std::move(s), BuildStep::Kind::kEntrypoint, rest, false);
    if (kw == "COPY" || kw == "ADD") return Copy(std::move(s), rest, kw == "ADD");
    if (kw == "ENV") return Pairs(std::move(s), BuildStep::Kind::kEnv, rest, "ENV");
    if (kw == "LABEL") return Pairs(std::move(s), BuildStep::Kind::kLabel, rest, "LABEL");
    if (kw == "WORKDIR") return Workdir(std::move(s), rest);
    if (kw == "USER") return User(std::move(s), rest);
    if (kw == "EXPOSE") return Expose(std::move(s), rest);
    static const char* const kDocker[] = {
        "ONBUILD",    "HEALTHCHECK",        "VOLUME", "SHELL", "STOPSIGNAL",
        "MAINTAINER", "CROSS_BUILD_ONBUILD"};
    for (const char* k : kDocker)
      if (kw == k) return Status::Error(kw + " is not supported by sbx build");
    std::string shown = kw.size() > 40 ? kw.substr(0, 40) + "..." : kw;
    for (char& c : shown)
      if (!std::isprint(static_cast<unsigned char>(c))) c = '?';
    return Status::Error("unknown instruction " + shown);
  }

  Status NoFlags(const std::string& kw, std::string_view rest) {
    Flags f = TakeFlags(rest);
    if (!f.flags.empty())
      return Status::Error(kw + " --" + f.flags[0].first + " is not supported by sbx build");
    return {};
  }

  Status From(BuildStep s, std::string_view rest) {
    if (from_seen_)
      return Status::Error("a second FROM (multi-stage builds) is not supported by sbx build");
    Flags f = TakeFlags(rest);
    for (const auto& [name, value] : f.flags) {
      if (name != "platform")
        return Status::Error("FROM --" + name + " is not supported by sbx build");
      auto v = Expand(value);
      if (!v.ok()) return v.status();
      if (*v != "linux/amd64" && *v != "linux/x86_64" && *v != "$BUILDPLATFORM" &&
          *v != "$TARGETPLATFORM")
        return Status::Error("FROM --platform=" + *v + ": sbx builds linux/amd64 only");
    }
    std::vector<std::string> words;
    for (const auto& w : RawWords(f.rest, esc_)) {
      auto v = Expand(w);
      if (!v.ok()) return v.status();
      words.push_back(std::move(*v));
    }
    if (words.size() == 3 && Upper(words[1]) == "AS") words.resize(1);  // the stage name: unused
    if (words.size() != 1 || words[0].empty())
      return Status::Error("FROM takes one image or template (FROM NAME [AS STAGE])");
    from_seen_ = true;
    s.kind = BuildStep::Kind::kFrom;
    s.args = {words[0]};
    return Push(std::move(s));
  }

  Status Arg(BuildStep s, std::string_view rest) {
    SBX_RETURN_IF_ERROR(NoFlags("ARG", rest));
    auto words = RawWords(rest, esc_);
    if (words.empty()) return Status::Error("ARG requires at least one argument");
    s.kind = BuildStep::Kind::kArg;
    for (const auto& w : words) {
      size_t eq = w.find('=');
      std::string name = w.substr(0, eq);
      if (name.empty()) return Status::Error("ARG: a name is required before '='");
      for (char c : name)
        if (!IsNameChar(c)) return Status::Error("ARG: invalid name '" + name.substr(0, 64) + "'");
      std::optional<std::string> value;
      if (auto it = build_args_.find(name); it != build_args_.end()) {
        value = it->second;
      } else if (eq != std::string::npos) {
        auto v = Expand(std::string_view(w).substr(eq + 1));
        if (!v.ok()) return v.status();
        value = std::move(*v);
      } else if (auto m = meta_.find(name); from_seen_ && m != meta_.end()) {
        value = m->second;  // `ARG NAME` after FROM takes the default of the one before it
      }
      // Declared without a value: substituted as unset ("" or a ${NAME:-default}).
      Vars& scope = from_seen_ ? args_ : meta_;
      if (value)
        scope[name] = *value;
      else
        scope.erase(name);
      s.args.push_back(name);
      s.args.push_back(value.value_or(""));
    }
    // Before FROM an ARG only serves FROM: it is no step of the build.
    if (!from_seen_) return {};
    return Push(std::move(s));
  }

  Status Command(BuildStep s, BuildStep::Kind kind, std::string_view rest, bool is_run) {
    s.kind = kind;
    const char* kw = kind == BuildStep::Kind::kRun   ? "RUN"
                     : kind == BuildStep::Kind::kCmd ? "CMD"
                                                     : "ENTRYPOINT";
    if (is_run) {
      Flags f = TakeFlags(rest);
      if (!f.flags.empty())
        return Status::Error(std::string("RUN --") + f.flags[0].first +
                             " is not supported by sbx build");
      if (HasHeredoc(rest)) return Status::Error("heredocs (<<EOF) are not supported by sbx build");
    }
    if (auto json = ParseJsonArray(rest)) {
      if (is_run && json->empty()) return Status::Error("RUN requires a command");
      s.exec_form = true;
      s.args = std::move(*json);
    } else {
      if (rest.empty()) return Status::Error(std::string(kw) + " requires at least one argument");
      s.args = {std::string(rest)};
    }
    return Push(std::move(s));
  }

  Status Copy(BuildStep s, std::string_view rest, bool is_add) {
    std::string kw = is_add ? "ADD" : "COPY";
    s.kind = BuildStep::Kind::kCopy;
    Flags f = TakeFlags(rest);
    for (const auto& [name, value] : f.flags) {
      if (name == "chown") {
        auto v = Expand(value);
        if (!v.ok()) return v.status();
        if (v->empty()) return Status::Error(kw + " --chown needs a user[:group]");
        s.chown = std::move(*v);
      } else if (name == "link") {
        // Only changes how BuildKit stores the layer; every sbx layer stands alone anyway.
      } else if (name == "from") {
        return Status::Error(kw + " --from (multi-stage builds) is not supported by sbx build");
      } else {
        return Status::Error(kw + " --" + name + " is not supported by sbx build");
      }
    }
    if (HasHeredoc(f.rest)) return Status::Error("heredocs (<<EOF) are not supported by sbx build");
    std::vector<std::string> raw;
    if (auto json = ParseJsonArray(f.rest))
      raw = std::move(*json);
    else
      raw = RawWords(f.rest, esc_);
    for (const auto& w : raw) {
      auto v = Expand(w);
      if (!v.ok()) return v.status();
      s.args.push_back(std::move(*v));
    }
    if (s.args.size() < 2) return Status::Error(kw + " requires a source and a destination");
    for (size_t i = 0; i + 1 < s.args.size(); ++i) {
      const std::string& src = s.args[i];
      if (src.find("://") != std::string::npos || src.rfind("git@", 0) == 0)
        return Status::Error(kw +
                             " of a URL is not supported by sbx build (fetch it in a RUN step)");
      if (src.empty()) return Status::Error(kw + ": an empty source");
    }
    const std::string& dest = s.args.back();
    if (dest.empty()) return Status::Error(kw + ": an empty destination");
    if (s.args.size() > 2 && dest.back() != '/')
      return Status::Error(kw +
                           " with more than one source needs a destination directory ending in /");
    return Push(std::move(s));
  }

  Status Pairs(BuildStep s, BuildStep::Kind kind, std::string_view rest, const std::string& kw) {
    s.kind = kind;
    SBX_RETURN_IF_ERROR(NoFlags(kw, rest));
    auto words = RawWords(rest, esc_);
    if (words.empty()) return Status::Error(kw + " requires at least one argument");
    if (words[0].find('=') == std::string::npos) {
      // The legacy form: `ENV NAME the rest of the line`.
      std::string_view value = Trim(rest.substr(words[0].size()));
      if (value.empty())
        return Status::Error(kw + " " + words[0].substr(0, 64) + " needs a value (NAME=VALUE)");
      auto k = Expand(words[0]);
      if (!k.ok()) return k.status();
      auto v = Expand(value);
      if (!v.ok()) return v.status();
      s.args = {std::move(*k), std::move(*v)};
    } else {
      for (const auto& w : words) {
        if (w.find('=') == std::string::npos)
          return Status::Error(kw + ": '" + w.substr(0, 64) + "' is not NAME=VALUE");
        auto v = Expand(w);
        if (!v.ok()) return v.status();
        size_t eq = v->find('=');
        if (eq == std::string::npos)
          return Status::Error(kw + ": '" + w.substr(0, 64) + "' is not NAME=VALUE");
        s.args.push_back(v->substr(0, eq));
        s.args.push_back(v->substr(eq + 1));
      }
    }
    for (size_t i = 0; i < s.args.size(); i += 2)
      if (s.args[i].empty()) return Status::Error(kw + ": a name is required before '='");
    if (kind == BuildStep::Kind::kEnv)
      for (size_t i = 0; i + 1 < s.args.size(); i += 2) env_[s.args[i]] = s.args[i + 1];
    return Push(std::move(s));
  }

  Status Workdir(BuildStep s, std::string_view rest) {
    SBX_RETURN_IF_ERROR(NoFlags("WORKDIR", rest));
    auto v = Expand(rest);
    if (!v.ok()) return v.status();
    if (v->empty()) return Status::Error("WORKDIR requires a path");
    workdir_ = CleanAbsolute((*v)[0] == '/' ? *v : workdir_ + "/" + *v);
    s.kind = BuildStep::Kind::kWorkdir;
    s.args = {workdir_};
    return Push(std::move(s));
  }

  Status User(BuildStep s, std::string_view rest) {
    SBX_RETURN_IF_ERROR(NoFlags("USER", rest));
    auto v = Expand(rest);
    if (!v.ok()) return v.status();
    std::string_view u = Trim(*v);
    if (u.empty()) return Status::Error("USER requires a user (USER NAME[:GROUP])");
    for (char c : u)
      if (IsSpace(c)) return Status::Error("USER takes one user (USER NAME[:GROUP])");
    s.kind = BuildStep::Kind::kUser;
    s.args = {std::string(u)};
    return Push(std::move(s));
  }

  static bool ParsePort(std::string_view p, int* out) {
    if (p.empty() || p.size() > 5) return false;
    int v = 0;
    for (char c : p) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + (c - '0');
    }
    *out = v;
    return v >= 1 && v <= 65535;
  }

  Status Expose(BuildStep s, std::string_view rest) {
    SBX_RETURN_IF_ERROR(NoFlags("EXPOSE", rest));
    s.kind = BuildStep::Kind::kExpose;
    for (const auto& w : RawWords(rest, esc_)) {
      auto v = Expand(w);
      if (!v.ok()) return v.status();
      std::string_view spec = *v;
      std::string proto = "tcp";
      if (size_t slash = spec.find('/'); slash != std::string_view::npos) {
        proto = std::string(spec.substr(slash + 1));
        for (char& c : proto) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        spec = spec.substr(0, slash);
      }
      std::string shown = v->substr(0, 64);
      if (proto != "tcp" && proto != "udp" && proto != "sctp")
        return Status::Error("EXPOSE " + shown + ": the protocol must be tcp, udp or sctp");
      int lo = 0, hi = 0;
      size_t dash = spec.find('-');
      bool ok = dash == std::string_view::npos
                    ? ParsePort(spec, &lo) && ParsePort(spec, &hi)
                    : ParsePort(spec.substr(0, dash), &lo) && ParsePort(spec.substr(dash + 1), &hi);
      if (!ok || hi < lo)
        return Status::Error("EXPOSE " + shown + ": not a port or range of ports");
      if (s.args.size() + static_cast<size_t>(hi - lo) >= kMaxExposed)
        return Status::Error("EXPOSE: too many ports");
      for (int p = lo; p <= hi; ++p) s.args.push_back(std::to_string(p) + "/" + proto);
    }
    if (s.args.empty()) return Status::Error("EXPOSE requires at least one port");
    return Push(std::move(s));
  }

  const std::map<std::string, std::string>& build_args_;
  char esc_ = '\\';
  int line_ = 0;
  bool from_seen_ = false;
  Vars meta_, args_, env_, none_;
  std::string workdir_ = "/";
  size_t budget_ = kMaxExpandedBytes;
  std::vector<BuildStep> steps_;
};

// A path's components with "", "." and ".." resolved as a path would be (".." at the top stays
// at the top).
std::vector<std::string> CleanParts(std::string_view path) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    std::string_view p = path.substr(i, j - i);
    if (p == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!p.empty() && p != ".") {
      parts.emplace_back(p);
    }
    i = j + 1;
  }
  return parts;
}

// Whether pattern components `pat` match path components `path` or one of its leading parts
// (a parent directory), `**` standing for any number of components. One table over (pattern,
// path) positions: polynomial whatever the `**`s.
bool MatchesOrParentMatches(const std::vector<std::string>& pat,
                            const std::vector<std::string>& path) {
  size_t np = pat.size(), nq = path.size();
  // at[i][j]: pat[0..i) matches path[0..j).
  std::vector<std::vector<char>> at(np + 1, std::vector<char>(nq + 1, 0));
  at[0][0] = 1;
  for (size_t i = 1; i <= np; ++i) {
    bool any = pat[i - 1] == "**";
    for (size_t j = 0; j <= nq; ++j) {
      if (any)
        at[i][j] = at[i - 1][j] || (j > 0 && at[i][j - 1]);
      else
        at[i][j] =
            j > 0 && at[i - 1][j - 1] && ::fnmatch(pat[i - 1].c_str(), path[j - 1].c_str(), 0) == 0;
    }
  }
  for (size_t j = 1; j <= nq; ++j)
    if (at[np][j]) return true;
  return false;
}

}  // namespace

Result<IgnoreRules> IgnoreRules::Parse(std::string_view text) {
  constexpr size_t kMaxBytes = size_t{1} << 20;
  constexpr size_t kMaxRules = 10000;
  if (text.size() > kMaxBytes) return Status::Error(".dockerignore: larger than 1 MiB", EINVAL);
  IgnoreRules r;
  size_t line_no = 0;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find('\n', i);
    if (j == std::string_view::npos) j = text.size();
    std::string_view line = text.substr(i, j - i);
    i = j + 1;
    ++line_no;
    auto trim = [](std::string_view v) {
      while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front()))) v.remove_prefix(1);
      while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.remove_suffix(1);
      return v;
    };
    line = trim(line);
    if (line.empty() || line.front() == '#') continue;
    Rule rule;
    if (line.front() == '!') {
      rule.exception = true;
      line = trim(line.substr(1));
    }
    rule.parts = CleanParts(line);
    if (rule.parts.empty()) continue;  // "/", "." or "!": names nothing below the root
    if (r.rules_.size() == kMaxRules)
      return Status::Error(
          ".dockerignore line " + std::to_string(line_no) + ": more than 10000 patterns", EINVAL);
    r.exceptions_ = r.exceptions_ || rule.exception;
    r.rules_.push_back(std::move(rule));
  }
  return r;
}

bool IgnoreRules::Excluded(std::string_view rel) const {
  if (rules_.empty()) return false;
  std::vector<std::string> path = CleanParts(rel);
  bool excluded = false;
  for (const auto& rule : rules_) {
    // Only a later pattern can change the answer: skip the ones that cannot.
    if (excluded != rule.exception) continue;
    if (MatchesOrParentMatches(rule.parts, path)) excluded = !rule.exception;
  }
  return excluded;
}

Result<std::vector<BuildStep>> ParseDockerfile(
    std::string_view text, const std::map<std::string, std::string>& build_args) {
  Parser p(build_args);
  return p.Parse(text);
}

}  // namespace sbx::storage
