#include "api/errors.h"

#include <cerrno>
#include <string>

#include "api/http/exchange.h"

namespace sbx::api {

ErrorAnswer AnswerFor(int err) {
  switch (err) {
    case ENOENT:
    case ESRCH:  // no such process
      return {404, "not_found", "not_found"};
    case EINVAL:
    case ENOTDIR:
    case EISDIR:
    case ENAMETOOLONG:
    case E2BIG:
    case ENOTTY:   // resize of a process without a terminal
    case ENXIO:    // a FIFO without a reader, a socket: not a file to open
    case ENOBUFS:  // a reply larger than the daemon takes (a listing too long): ask for less
      return {400, "invalid_argument", "invalid_argument"};
    case EFBIG:  // an upload past its size limit
      return {413, "payload_too_large", "resource_exhausted"};
    case EACCES:
    case EPERM:
      return {403, "permission_denied", "permission_denied"};
    case EBUSY:  // wrong state: a paused sandbox, a create with the same Idempotency-Key in flight
    case EPIPE:  // stdin of a process that exited or closed it
    case EROFS:  // a read-only mount in the box: the request conflicts with the box's state
      return {409, "conflict", "failed_precondition"};
    case EEXIST:
      return {409, "already_exists", "already_exists"};
    case ENOTEMPTY:
      return {409, "not_empty", "already_exists"};
    case EAGAIN:  // over a key's quota, a full process table
    case EMFILE:  // the agent's cap of open writes
      return {429, "rate_limited", "resource_exhausted"};
    case ENOSPC:
    case EDQUOT:
      return {507, "insufficient_storage", "resource_exhausted"};
    case ECONNRESET:    // the agent's connection closed (its sandbox ended)
    case ECONNREFUSED:  // the agent does not answer yet
      return {503, "unavailable", "unavailable"};
    case ETIMEDOUT:
      return {504, "timeout", "deadline_exceeded"};
    case ENOSYS:   // a part this daemon runs without (no template builder)
    case ENOTSUP:  // what this sandbox's runtime cannot do (a snapshot of a vm box's files)
      return {501, "not_implemented", "unimplemented"};
    default:
      return {500, "internal", "internal"};
  }
}

Status BodyReadFailure(const http::Exchange& ex, const Status& read, int64_t received) {
  if (ex.responded()) return read;
  return Status::Error("upload cut short: the client went away after " + std::to_string(received) +
                           " bytes of the body (" + read.message() + ")",
                       kClientGone);
}

}  // namespace sbx::api
