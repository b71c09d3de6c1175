#include "common/lazy_lib.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

namespace sbx {

void* LazySymbol(const char* library, const char* symbol) {
  // dlopen of a library already open only counts a reference: each symbol asks once.
  void* handle = ::dlopen(library, RTLD_NOW | RTLD_LOCAL);
  void* fn = handle != nullptr ? ::dlsym(handle, symbol) : nullptr;
  if (fn == nullptr) {
    const char* why = ::dlerror();
    std::fprintf(stderr, "sbx: cannot load %s from %s: %s (broken installation?)\n", symbol,
                 library, why != nullptr ? why : "unknown error");
    std::abort();
  }
  return fn;
}

}  // namespace sbx
