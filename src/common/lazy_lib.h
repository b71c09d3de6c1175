// Functions of a shared library loaded on first use (dlopen) instead of at every start of sbx.
// SBX_LAZY_FROM(library, ret, name, params, args) defines `name` with the library's own prototype
// (from its header: a prototype that differs does not compile), forwarding to the real function,
// looked up the first time it is called. A program that never calls one never loads the library.
// Which libraries and why: common/lazy_archive.cc (libarchive), network/lazy_nftables.cc
// (libnftables).
#pragma once

namespace sbx {

// `symbol` of `library` (a soname), opening the library on first use and never closing it. The
// libraries are package dependencies of sbx: one that does not load, or lacks the symbol, is a
// broken installation, so this aborts naming both rather than returning.
void* LazySymbol(const char* library, const char* symbol);

}  // namespace sbx

#define SBX_LAZY_FROM(library, ret, name, params, args)                                            \
  extern "C" ret name params {                                                                     \
    static const auto real = reinterpret_cast<decltype(&(name))>(sbx::LazySymbol(library, #name)); \
    return real args;                                                                              \
  }
