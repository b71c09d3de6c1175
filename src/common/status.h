// Status and Result<T>: errors as values that name the failing operation, the object it acted on,
// and errno. Exceptions stay out of the fork/exec path and out of the agent, so everything below
// the CLI and API layers reports failure through these types.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <variant>

namespace sbx {

// [[nodiscard]]: a dropped Status is a failure nobody hears of. Where ignoring one is right, say
// why with an explicit (void) and a comment.
class [[nodiscard]] Status {
 public:
  Status() = default;  // OK; costs nothing.

  // A failure: `what` names the operation and its object ("mkdir /var/lib/sbx/x"), `err` is an
  // errno value or 0 when the failure is not a system call's.
  static Status Error(std::string what, int err = 0) { return Status(std::move(what), err); }
  // The failure of a system call that just returned -1: captures errno.
  static Status Errno(std::string what) { return Status(std::move(what), errno); }

  bool ok() const { return !failed_; }
  int err() const { return err_; }
  const std::string& what() const { return what_; }

  // "what: strerror(err)" or just "what".
  std::string message() const {
    if (!failed_) return "ok";
    if (err_ == 0) return what_;
    return what_ + ": " + std::strerror(err_);
  }

  // Adds context in front: Status("open x").Wrap("load template") -> "load template: open x".
  Status Wrap(const std::string& context) const {
    if (!failed_) return *this;
    return Status(context + ": " + what_, err_);
  }

 private:
  Status(std::string what, int err) : failed_(true), err_(err), what_(std::move(what)) {}
  bool failed_ = false;
  int err_ = 0;
  std::string what_;
};

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return v_.index() == 0; }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  Status status() const { return ok() ? Status() : std::get<1>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace sbx

// Returns early from the enclosing function when `expr` (a Status) failed.
#define SBX_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::sbx::Status sbx_status_ = (expr);        \
    if (!sbx_status_.ok()) return sbx_status_; \
  } while (0)
