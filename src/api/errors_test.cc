// Every errno's answer, pinned: a change here changes what clients of both APIs see, so it
// shows up as a test edit (docs/api.md lists the same rows).
#include "api/errors.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <string>

namespace sbx::api {
namespace {

struct Row {
  int err;
  int status;
  std::string code;
  std::string connect_code;
};

TEST(ErrorsTest, EachErrnoHasOneAnswer) {
  const Row rows[] = {
      {ENOENT, 404, "not_found", "not_found"},
      {ESRCH, 404, "not_found", "not_found"},
      {EINVAL, 400, "invalid_argument", "invalid_argument"},
      {ENOTDIR, 400, "invalid_argument", "invalid_argument"},
      {EISDIR, 400, "invalid_argument", "invalid_argument"},
      {ENAMETOOLONG, 400, "invalid_argument", "invalid_argument"},
      {E2BIG, 400, "invalid_argument", "invalid_argument"},
      {ENOTTY, 400, "invalid_argument", "invalid_argument"},
      {ENXIO, 400, "invalid_argument", "invalid_argument"},
      {ENOBUFS, 400, "invalid_argument", "invalid_argument"},
      {EACCES, 403, "permission_denied", "permission_denied"},
      {EPERM, 403, "permission_denied", "permission_denied"},
      {EFBIG, 413, "payload_too_large", "resource_exhausted"},
      {EBUSY, 409, "conflict", "failed_precondition"},
      {EPIPE, 409, "conflict", "failed_precondition"},
      {EROFS, 409, "conflict", "failed_precondition"},
      {EEXIST, 409, "already_exists", "already_exists"},
      {ENOTEMPTY, 409, "not_empty", "already_exists"},
      {EAGAIN, 429, "rate_limited", "resource_exhausted"},
      {EMFILE, 429, "rate_limited", "resource_exhausted"},
      {ENOSPC, 507, "insufficient_storage", "resource_exhausted"},
      {EDQUOT, 507, "insufficient_storage", "resource_exhausted"},
      {ECONNRESET, 503, "unavailable", "unavailable"},
      {ECONNREFUSED, 503, "unavailable", "unavailable"},
      {ETIMEDOUT, 504, "timeout", "deadline_exceeded"},
      {ENOSYS, 501, "not_implemented", "unimplemented"},
      {ENOTSUP, 501, "not_implemented", "unimplemented"},
      // Unmapped: a bug or a system error nobody expected.
      {0, 500, "internal", "internal"},
      {EIO, 500, "internal", "internal"},
      {EPROTO, 500, "internal", "internal"},
      {ENOMEM, 500, "internal", "internal"},
      {-1, 500, "internal", "internal"},
  };
  for (const Row& r : rows) {
    ErrorAnswer a = AnswerFor(r.err);
    EXPECT_EQ(a.status, r.status) << r.err;
    EXPECT_EQ(a.code, r.code) << r.err;
    EXPECT_EQ(a.connect_code, r.connect_code) << r.err;
  }
}

}  // namespace
}  // namespace sbx::api
