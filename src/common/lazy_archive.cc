// libarchive, loaded on first use (dlopen) instead of at every start of sbx.
//
// Linked the usual way, libarchive.so.13 brings libxml2 and ICU with it, and loading and
// relocating them costs every `sbx` invocation about 2.5 ms (an empty C program linked with
// -larchive starts in 2.9 ms, without it in 0.7 ms), even `sbx --version`, `sbx run` and
// `sbx exec`, which never read or write an archive. So nothing links -larchive: the functions
// below have the names and prototypes of <archive.h> and <archive_entry.h> and forward to the
// real ones, looked up in the library the first time any of them is called.
//
// The list must cover every archive_* function the code calls (or takes the address of). One
// that is missing fails the link with an undefined reference: add it here. A prototype that
// differs from the header's does not compile.
#include <archive.h>
#include <archive_entry.h>

#include <cstdarg>
#include <cstdio>
#include <string>

#include "common/lazy_lib.h"

namespace {
constexpr char kLibarchive[] = "libarchive.so.13";
}  // namespace

#define SBX_LAZY(ret, name, params, args) SBX_LAZY_FROM(kLibarchive, ret, name, params, args)

// clang-format reads the parameter lists as expressions (`archive * a`).
// clang-format off
SBX_LAZY(archive*, archive_read_new, (), ())
SBX_LAZY(int, archive_read_support_filter_all, (archive* a), (a))
SBX_LAZY(int, archive_read_support_filter_gzip, (archive* a), (a))
SBX_LAZY(int, archive_read_support_filter_bzip2, (archive* a), (a))
SBX_LAZY(int, archive_read_support_filter_xz, (archive* a), (a))
SBX_LAZY(int, archive_read_support_filter_lzma, (archive* a), (a))
SBX_LAZY(int, archive_read_support_filter_zstd, (archive* a), (a))
SBX_LAZY(int, archive_read_support_format_tar, (archive* a), (a))
SBX_LAZY(int, archive_read_support_format_raw, (archive* a), (a))
SBX_LAZY(int, archive_read_open,
         (archive* a, void* data, archive_open_callback* on_open, archive_read_callback* on_read,
          archive_close_callback* on_close),
         (a, data, on_open, on_read, on_close))
SBX_LAZY(int, archive_read_open_fd, (archive* a, int fd, size_t block), (a, fd, block))
SBX_LAZY(int, archive_read_open_filename, (archive* a, const char* path, size_t block),
         (a, path, block))
SBX_LAZY(int, archive_read_open_memory, (archive* a, const void* buf, size_t size), (a, buf, size))
SBX_LAZY(int, archive_read_next_header, (archive* a, archive_entry** e), (a, e))
SBX_LAZY(int, archive_read_next_header2, (archive* a, archive_entry* e), (a, e))
SBX_LAZY(la_ssize_t, archive_read_data, (archive* a, void* buf, size_t size), (a, buf, size))
SBX_LAZY(int, archive_read_data_block,
         (archive* a, const void** buf, size_t* size, la_int64_t* offset), (a, buf, size, offset))
SBX_LAZY(int, archive_read_free, (archive* a), (a))

SBX_LAZY(archive*, archive_read_disk_new, (), ())
SBX_LAZY(int, archive_read_disk_set_behavior, (archive* a, int flags), (a, flags))
SBX_LAZY(int, archive_read_disk_set_symlink_physical, (archive* a), (a))
SBX_LAZY(int, archive_read_disk_open, (archive* a, const char* path), (a, path))
SBX_LAZY(int, archive_read_disk_descend, (archive* a), (a))

SBX_LAZY(archive*, archive_write_new, (), ())
SBX_LAZY(int, archive_write_add_filter_gzip, (archive* a), (a))
SBX_LAZY(int, archive_write_add_filter_bzip2, (archive* a), (a))
SBX_LAZY(int, archive_write_add_filter_xz, (archive* a), (a))
SBX_LAZY(int, archive_write_add_filter_zstd, (archive* a), (a))
SBX_LAZY(int, archive_write_set_format_pax, (archive* a), (a))
SBX_LAZY(int, archive_write_set_format_pax_restricted, (archive* a), (a))
SBX_LAZY(int, archive_write_set_format_ustar, (archive* a), (a))
SBX_LAZY(int, archive_write_set_format_gnutar, (archive* a), (a))
SBX_LAZY(int, archive_write_set_format_cpio_newc, (archive* a), (a))
SBX_LAZY(int, archive_write_set_format_zip, (archive* a), (a))
SBX_LAZY(int, archive_write_set_format_raw, (archive* a), (a))
SBX_LAZY(int, archive_write_set_bytes_in_last_block, (archive* a, int bytes), (a, bytes))
SBX_LAZY(int, archive_write_open,
         (archive* a, void* data, archive_open_callback* on_open, archive_write_callback* on_write,
          archive_close_callback* on_close),
         (a, data, on_open, on_write, on_close))
SBX_LAZY(int, archive_write_open_fd, (archive* a, int fd), (a, fd))
SBX_LAZY(int, archive_write_open_filename, (archive* a, const char* path), (a, path))
SBX_LAZY(int, archive_write_header, (archive* a, archive_entry* e), (a, e))
SBX_LAZY(la_ssize_t, archive_write_data, (archive* a, const void* buf, size_t size),
         (a, buf, size))
SBX_LAZY(la_ssize_t, archive_write_data_block,
         (archive* a, const void* buf, size_t size, la_int64_t offset), (a, buf, size, offset))
SBX_LAZY(int, archive_write_finish_entry, (archive* a), (a))
SBX_LAZY(int, archive_write_close, (archive* a), (a))
SBX_LAZY(int, archive_write_free, (archive* a), (a))

SBX_LAZY(archive*, archive_write_disk_new, (), ())
SBX_LAZY(int, archive_write_disk_set_options, (archive* a, int flags), (a, flags))

SBX_LAZY(int, archive_free, (archive* a), (a))
SBX_LAZY(int, archive_errno, (archive* a), (a))
SBX_LAZY(const char*, archive_error_string, (archive* a), (a))

SBX_LAZY(archive_entry*, archive_entry_new, (), ())
SBX_LAZY(archive_entry*, archive_entry_clear, (archive_entry* e), (e))
SBX_LAZY(void, archive_entry_free, (archive_entry* e), (e))
SBX_LAZY(const char*, archive_entry_pathname, (archive_entry* e), (e))
SBX_LAZY(const char*, archive_entry_hardlink, (archive_entry* e), (e))
SBX_LAZY(const char*, archive_entry_symlink, (archive_entry* e), (e))
SBX_LAZY(__LA_MODE_T, archive_entry_filetype, (archive_entry* e), (e))
SBX_LAZY(__LA_MODE_T, archive_entry_perm, (archive_entry* e), (e))
SBX_LAZY(la_int64_t, archive_entry_uid, (archive_entry* e), (e))
SBX_LAZY(la_int64_t, archive_entry_gid, (archive_entry* e), (e))
SBX_LAZY(time_t, archive_entry_mtime, (archive_entry* e), (e))
SBX_LAZY(void, archive_entry_set_pathname, (archive_entry* e, const char* s), (e, s))
SBX_LAZY(void, archive_entry_set_hardlink, (archive_entry* e, const char* s), (e, s))
SBX_LAZY(void, archive_entry_set_symlink, (archive_entry* e, const char* s), (e, s))
SBX_LAZY(void, archive_entry_set_filetype, (archive_entry* e, unsigned int t), (e, t))
SBX_LAZY(void, archive_entry_set_perm, (archive_entry* e, __LA_MODE_T m), (e, m))
SBX_LAZY(void, archive_entry_set_uid, (archive_entry* e, la_int64_t id), (e, id))
SBX_LAZY(void, archive_entry_set_gid, (archive_entry* e, la_int64_t id), (e, id))
SBX_LAZY(void, archive_entry_set_uname, (archive_entry* e, const char* s), (e, s))
SBX_LAZY(void, archive_entry_set_gname, (archive_entry* e, const char* s), (e, s))
SBX_LAZY(void, archive_entry_set_size, (archive_entry* e, la_int64_t size), (e, size))
SBX_LAZY(void, archive_entry_set_mtime, (archive_entry* e, time_t sec, long nsec), (e, sec, nsec))
SBX_LAZY(void, archive_entry_set_rdev, (archive_entry* e, dev_t dev), (e, dev))
// clang-format on

#undef SBX_LAZY

// Variadic, and libarchive has no va_list form to forward to: the message is formatted here and
// handed over as one "%s" argument. A null format clears the error, as in libarchive.
extern "C" void archive_set_error(archive* a, int err, const char* fmt, ...) {
  static const auto real = reinterpret_cast<decltype(&archive_set_error)>(
      sbx::LazySymbol(kLibarchive, "archive_set_error"));
  if (fmt == nullptr) return real(a, err, nullptr);
  va_list ap;
  va_start(ap, fmt);
  va_list again;
  va_copy(again, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string text(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  std::vsnprintf(text.data(), text.size() + 1, fmt, again);
  va_end(again);
  real(a, err, "%s", text.c_str());
}
