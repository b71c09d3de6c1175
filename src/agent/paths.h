// Path helpers for the agent's file operations (docs/agent-protocol.md, "Files"): every path a
// client sends is taken as absolute inside the sandbox and cleaned lexically before use.
#pragma once

#include <string>
#include <string_view>

namespace sbx::agent {

// "a//b/./c/" -> "/a/b/c"; relative paths are taken from "/". ".." is kept for the kernel to
// resolve (inside the sandbox's root it cannot lead anywhere a plain path could not). Returns
// false for an empty path or one containing a NUL byte.
bool CleanPath(std::string_view in, std::string* out);

// "/a/b" -> "/a"; "/a" -> "/"; "/" -> "/".
std::string DirName(std::string_view path);
// "/a/b" -> "b"; "/" -> "/".
std::string BaseName(std::string_view path);
// JoinPath("/a", "b") -> "/a/b"; JoinPath("/", "b") -> "/b".
std::string JoinPath(std::string_view dir, std::string_view name);

}  // namespace sbx::agent
